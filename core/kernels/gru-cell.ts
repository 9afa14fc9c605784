// A GRU time step's gates as two kernels, and their gradients as two more. tfjs-layers' GRUCell
// computes a step from about 30 kernels (the input projection's and the recurrent kernel's splits,
// hardSigmoid as a multiply, an add and a clip for each of two gates, tanh, the blend of the old and
// new state) and its backward pass from about 40 more; a GRU over 40 time steps is some 2800 kernels
// per training step, and on wasm each costs the engine and backend far more than its arithmetic (a
// [32, 40] sequence into GRU(64): 46 ms a step). With mx = x·W + b ([B, 3H]: the update, reset and
// candidate blocks), inner = h·U_zr ([B, 2H]) and σ the recurrent activation:
//
//   z = σ(mx_z + inner_z)   r = σ(mx_r + inner_r)                          (GRU_RESET: r·h)
//   hh = tanh(mx_h + (r·h)·U_h)   h' = z·h + (1 − z)·hh                     (GRU_UPDATE: h')
//
// The product (r·h)·U_h between the two kernels stays tfjs's matmul, as do x·W + b and h·U_zr; the
// GRU layer projects every time step's inputs in one matmul and splits U once per sequence. The
// backward passes recompute the gates from their inputs (nothing more is kept). Float32 rounding
// follows tfjs's order of operations in the forward pass (tanh and exp are JavaScript's, within a
// float32 ulp or two of the backends'; on wasm, for H a multiple of 4, the heap's SIMD kernels with
// Cephes' float32 tanh and exp, as the LSTM cell's); hardSigmoid's gradient is 0.2 inside its clip, bounds
// included, as tfjs's clipByValue gives.
//
// On webgpu each kernel is one program per output (two forward, seven backward a time step, where
// tfjs-layers' cell records some 60: a 7-step tagger's training step 491 -> 206 programs), and the
// GRU layer runs its whole recurrence as one program each way where it can (gru-sequence.ts).
//
// GRUCell.call (tfjs-layers) is replaced for cells with a tanh activation, a hardSigmoid or sigmoid
// recurrent activation, no dropout while training and 2-d float32 inputs, on wasm, cpu and webgpu;
// every other cell keeps tfjs-layers' own. Installed once the engine's backend is up
// (`../engine.ts`).
import type { Tf } from "../tf.ts"
import { hostKernels, patchLayerCall, registerFused, withTfjsCalls, type WebGpuArgs, type WebGpuBackend } from "./fused-layers.ts"
import { fusedRecurrent, gate, gateProgram, gateSlope, layerRecurrent, projectSequence, type RecurrentCellLike } from "./lstm-cell.ts"
import { gruSequence, gruSequenceFits, installGruSequence } from "./gru-sequence.ts"
import { recurrentOf, sequenceSwitch, type Recurrent } from "./lstm-sequence.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernels' names in tfjs's registry (gradwire's own: no tfjs kernel has them). */
export const GRU_RESET = "GradwireGRUReset"
export const GRU_RESET_GRAD = "GradwireGRUResetGrad"
export const GRU_UPDATE = "GradwireGRUUpdate"
export const GRU_UPDATE_GRAD = "GradwireGRUUpdateGrad"

/** Steps the kernels ran in this process (for tests). */
export const gruCellStats = { steps: 0, heap: 0 }

const f32 = Math.fround

/** r·h of a step: mx [B, 3H], inner [B, 2H], h [B, H]. */
export const gruResetForward = (mx: Float32Array, inner: Float32Array, h: Float32Array, H: number, recurrent: Recurrent, rh: Float32Array): void => {
  const hard = recurrent === "hardSigmoid"
  const B = h.length / H
  for (let b = 0; b < B; b++) {
    for (let j = 0; j < H; j++) {
      const r = gate(f32(mx[b * 3 * H + H + j]! + inner[b * 2 * H + H + j]!), hard)
      rh[b * H + j] = f32(r * h[b * H + j]!)
    }
  }
}

/** d mx, d inner and dh of the reset kernel from d(r·h) (only the reset blocks of d mx and d inner are not 0). */
export const gruResetBackward = (drh: Float32Array, mx: Float32Array, inner: Float32Array, h: Float32Array, H: number, recurrent: Recurrent, dmx: Float32Array, dinner: Float32Array, dh: Float32Array): void => {
  const hard = recurrent === "hardSigmoid"
  const B = h.length / H
  dmx.fill(0)
  dinner.fill(0)
  for (let b = 0; b < B; b++) {
    for (let j = 0; j < H; j++) {
      const pre = f32(mx[b * 3 * H + H + j]! + inner[b * 2 * H + H + j]!)
      const r = gate(pre, hard)
      const d = drh[b * H + j]!
      const dpre = d * h[b * H + j]! * gateSlope(pre, r, hard)
      dmx[b * 3 * H + H + j] = dpre
      dinner[b * 2 * H + H + j] = dpre
      dh[b * H + j] = d * r
    }
  }
}

/** h' of a step: mx [B, 3H], inner [B, 2H], h [B, H], rec = (r·h)·U_h [B, H]. */
export const gruUpdateForward = (mx: Float32Array, inner: Float32Array, h: Float32Array, rec: Float32Array, H: number, recurrent: Recurrent, hNext: Float32Array): void => {
  const hard = recurrent === "hardSigmoid"
  const B = h.length / H
  for (let b = 0; b < B; b++) {
    for (let j = 0; j < H; j++) {
      const z = gate(f32(mx[b * 3 * H + j]! + inner[b * 2 * H + j]!), hard)
      const hh = f32(Math.tanh(f32(mx[b * 3 * H + 2 * H + j]! + rec[b * H + j]!)))
      hNext[b * H + j] = f32(f32(z * h[b * H + j]!) + f32(f32(1 - z) * hh))
    }
  }
}

/** d mx, d inner, dh and d rec of the update kernel from dh' (the reset block of d mx and of d inner is 0). */
export const gruUpdateBackward = (
  dhn: Float32Array,
  mx: Float32Array,
  inner: Float32Array,
  h: Float32Array,
  rec: Float32Array,
  H: number,
  recurrent: Recurrent,
  dmx: Float32Array,
  dinner: Float32Array,
  dh: Float32Array,
  drec: Float32Array
): void => {
  const hard = recurrent === "hardSigmoid"
  const B = h.length / H
  dmx.fill(0)
  dinner.fill(0)
  for (let b = 0; b < B; b++) {
    for (let j = 0; j < H; j++) {
      const pre = f32(mx[b * 3 * H + j]! + inner[b * 2 * H + j]!)
      const z = gate(pre, hard)
      const hh = f32(Math.tanh(f32(mx[b * 3 * H + 2 * H + j]! + rec[b * H + j]!)))
      const d = dhn[b * H + j]!
      const hp = h[b * H + j]!
      const dz = d * (hp - hh) * gateSlope(pre, z, hard)
      const dhh = d * (1 - z) * (1 - hh * hh)
      dmx[b * 3 * H + j] = dz
      dinner[b * 2 * H + j] = dz
      dmx[b * 3 * H + 2 * H + j] = dhh
      drec[b * H + j] = dhh
      dh[b * H + j] = d * z
    }
  }
}

const unitsOf = (inputs: Record<string, { shape: readonly number[] }>): number => inputs["h"]!.shape[1]!
/** Whether the heap's SIMD kernels take the step: H a multiple of 4, at least one row and unit. */
const onHeap = (inputs: Record<string, { shape: readonly number[] }>): boolean => unitsOf(inputs) % 4 === 0 && unitsOf(inputs) > 0 && inputs["h"]!.shape[0]! > 0
/** [B, H] of the step. */
const sizes = (inputs: Record<string, { shape: readonly number[] }>): [number, number] => [inputs["h"]!.shape[0]!, unitsOf(inputs)]
const hardOf = (attrs: Record<string, unknown>): number => (recurrentOf(attrs) === "hardSigmoid" ? 1 : 0)

const resetForward = hostKernels({
  names: ["mx", "inner", "h"],
  shapes: ({ h }) => [[...h!.shape]],
  compute: ([mx, inner, h], [rh], attrs, ins) => {
    gruCellStats.steps++
    gruResetForward(mx!, inner!, h!, unitsOf(ins), recurrentOf(attrs), rh!)
  },
  heap: (k, [mx, inner, h], [rh], attrs, ins) => {
    if (!onHeap(ins)) return false
    gruCellStats.steps++
    gruCellStats.heap++
    k.gruReset(mx!, inner!, h!, rh!, ...sizes(ins), hardOf(attrs))
    return true
  }
})
const resetBackward = hostKernels({
  names: ["drh", "mx", "inner", "h"],
  shapes: ({ mx, inner, h }) => [[...mx!.shape], [...inner!.shape], [...h!.shape]],
  compute: ([drh, mx, inner, h], [dmx, dinner, dh], attrs, ins) => gruResetBackward(drh!, mx!, inner!, h!, unitsOf(ins), recurrentOf(attrs), dmx!, dinner!, dh!),
  heap: (k, [drh, mx, inner, h], [dmx, dinner, dh], attrs, ins) => onHeap(ins) && (k.gruResetGrad(drh!, mx!, inner!, h!, dmx!, dinner!, dh!, ...sizes(ins), hardOf(attrs)), true)
})
const updateForward = hostKernels({
  names: ["mx", "inner", "h", "rec"],
  shapes: ({ h }) => [[...h!.shape]],
  compute: ([mx, inner, h, rec], [hn], attrs, ins) => gruUpdateForward(mx!, inner!, h!, rec!, unitsOf(ins), recurrentOf(attrs), hn!),
  heap: (k, [mx, inner, h, rec], [hn], attrs, ins) => onHeap(ins) && (k.gruUpdate(mx!, inner!, h!, rec!, hn!, ...sizes(ins), hardOf(attrs)), true)
})
const updateBackward = hostKernels({
  names: ["dhn", "mx", "inner", "h", "rec"],
  shapes: ({ mx, inner, h }) => [[...mx!.shape], [...inner!.shape], [...h!.shape], [...h!.shape]],
  compute: ([dhn, mx, inner, h, rec], [dmx, dinner, dh, drec], attrs, ins) => gruUpdateBackward(dhn!, mx!, inner!, h!, rec!, unitsOf(ins), recurrentOf(attrs), dmx!, dinner!, dh!, drec!),
  heap: (k, [dhn, mx, inner, h, rec], [dmx, dinner, dh, drec], attrs, ins) =>
    onHeap(ins) && (k.gruUpdateGrad(dhn!, mx!, inner!, h!, rec!, dmx!, dinner!, dh!, drec!, ...sizes(ins), hardOf(attrs)), true)
})

// webgpu: one program per output, one thread per element (the gates recomputed where needed), with
// the LSTM's gate functions (lstm-sequence.ts: gwGate, gwGateSlope, gwTanh).
/** A program over every element of an output of `shape` (gateProgram): `body` sees index, row, col and H (units, from h). */
const gpu = (backend: WebGpuBackend, name: string, names: string[], inputs: TensorInfo[], shape: number[], hard: boolean, body: string): TensorInfo =>
  gateProgram(backend, `gru_${name}`, names, inputs, shape, hard, "uniforms.ghShape[1]", body)
/** The reset gate of unit j in `row`: pr (its input) and r. */
const resetGateWgsl = `
      let pr = gmx[row * 3 * H + H + j] + ginner[row * 2 * H + H + j];
      let r = gwGate(pr);`
/** The update gate and the candidate of unit j in `row`: pz, z, hh and hp (the old state). */
const updateGateWgsl = `
      let pz = gmx[row * 3 * H + j] + ginner[row * 2 * H + j];
      let z = gwGate(pz);
      let hh = gwTanh(gmx[row * 3 * H + 2 * H + j] + grec[row * H + j]);
      let hp = gh[row * H + j];`
const webgpuResetForward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { mx, inner, h } = inputs as { mx: TensorInfo; inner: TensorInfo; h: TensorInfo }
  return gpu(backend, "reset", ["gmx", "ginner", "gh"], [mx, inner, h], [...h.shape], recurrentOf(attrs) === "hardSigmoid", `
      let j = col;
      ${resetGateWgsl}
      setOutputAtIndex(index, r * gh[index]);`)
}
const webgpuResetBackward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo[] => {
  const { drh, mx, inner, h } = inputs as { drh: TensorInfo; mx: TensorInfo; inner: TensorInfo; h: TensorInfo }
  const hard = recurrentOf(attrs) === "hardSigmoid"
  const names = ["gdrh", "gmx", "ginner", "gh"]
  const ins = [drh, mx, inner, h]
  /** The gradient reaching the reset gate's input, for the reset block of an output (v = 0 elsewhere). */
  const block = `
      let block = col / H;
      let j = col - block * H;
      var v = 0.0;
      if (block == 1) {
        ${resetGateWgsl}
        v = gdrh[row * H + j] * gh[row * H + j] * gwGateSlope(pr, r);
      }
      setOutputAtIndex(index, v);`
  const dmx = gpu(backend, "reset_dmx", names, ins, [...mx.shape], hard, block)
  const dinner = gpu(backend, "reset_dinner", names, ins, [...inner.shape], hard, block)
  const dh = gpu(backend, "reset_dh", names, ins, [...h.shape], hard, `
      let j = col;
      ${resetGateWgsl}
      _ = gh[index]; // every input read (the pipeline's layout binds only those)
      setOutputAtIndex(index, gdrh[index] * r);`)
  return [dmx, dinner, dh]
}
const webgpuUpdateForward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { mx, inner, h, rec } = inputs as { mx: TensorInfo; inner: TensorInfo; h: TensorInfo; rec: TensorInfo }
  return gpu(backend, "update", ["gmx", "ginner", "gh", "grec"], [mx, inner, h, rec], [...h.shape], recurrentOf(attrs) === "hardSigmoid", `
      let j = col;
      ${updateGateWgsl}
      setOutputAtIndex(index, z * hp + (1.0 - z) * hh);`)
}
const webgpuUpdateBackward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo[] => {
  const { dhn, mx, inner, h, rec } = inputs as { dhn: TensorInfo; mx: TensorInfo; inner: TensorInfo; h: TensorInfo; rec: TensorInfo }
  const hard = recurrentOf(attrs) === "hardSigmoid"
  const names = ["gdhn", "gmx", "ginner", "gh", "grec"]
  const ins = [dhn, mx, inner, h, rec]
  /** dmx (3 blocks) or dinner (2): the update gate's input's gradient in block 0, the candidate's in block 2, 0 in the reset block. */
  const blocks = `
      let block = col / H;
      let j = col - block * H;
      ${updateGateWgsl}
      let d = gdhn[row * H + j];
      var v = 0.0;
      if (block == 0) { v = d * (hp - hh) * gwGateSlope(pz, z); }
      else if (block == 2) { v = d * (1.0 - z) * (1.0 - hh * hh); }
      setOutputAtIndex(index, v);`
  const dmx = gpu(backend, "update_dmx", names, ins, [...mx.shape], hard, blocks)
  const dinner = gpu(backend, "update_dinner", names, ins, [...inner.shape], hard, blocks)
  const dh = gpu(backend, "update_dh", names, ins, [...h.shape], hard, `
      let j = col;
      ${updateGateWgsl}
      setOutputAtIndex(index, gdhn[index] * z);`)
  const drec = gpu(backend, "update_drec", names, ins, [...h.shape], hard, `
      let j = col;
      ${updateGateWgsl}
      setOutputAtIndex(index, gdhn[index] * (1.0 - z) * (1.0 - hh * hh));`)
  return [dmx, dinner, dh, drec]
}

interface GruCellLike extends RecurrentCellLike {
  units: number
  useBias: boolean
  kernel: { read(): Tensor }
  recurrentKernel: { read(): Tensor }
  bias: { read(): Tensor } | null
  /** Set by the GRU layer while its cell runs: the inputs already projected (x·W + b), U split once. */
  [PREPARED]?: { uzr: Tensor; uh: Tensor }
}
const PREPARED = Symbol.for("gradwire.gruCell.prepared")
interface GruLike {
  cell: GruCellLike
  stateful: boolean
  goBackwards: boolean
  returnState: boolean
  returnSequences: boolean
}

let installed = false

/** Registers the kernels and their gradients, and makes tfjs-layers' GRUCell use them where it can. Returns whether the cell is patched. */
export const installGruCell = (tf: Tf): boolean => {
  if (installed) return true
  registerFused(tf, GRU_RESET, GRU_RESET_GRAD, { wasm: [resetForward[0], resetBackward[0]], cpu: [resetForward[1], resetBackward[1]], webgpu: [webgpuResetForward, webgpuResetBackward] }, {
    inputsToSave: ["mx", "inner", "h"],
    gradFunc: (dy, saved, attrs) => {
      const [mx, inner, h] = saved as [Tensor, Tensor, Tensor]
      const [dmx, dinner, dh] = tf.engine().runKernel(GRU_RESET_GRAD, { drh: dy as Tensor, mx, inner, h }, attrs as never) as unknown as [Tensor, Tensor, Tensor]
      return { mx: () => dmx, inner: () => dinner, h: () => dh }
    }
  })
  registerFused(tf, GRU_UPDATE, GRU_UPDATE_GRAD, { wasm: [updateForward[0], updateBackward[0]], cpu: [updateForward[1], updateBackward[1]], webgpu: [webgpuUpdateForward, webgpuUpdateBackward] }, {
    inputsToSave: ["mx", "inner", "h", "rec"],
    gradFunc: (dy, saved, attrs) => {
      const [mx, inner, h, rec] = saved as [Tensor, Tensor, Tensor, Tensor]
      const [dmx, dinner, dh, drec] = tf.engine().runKernel(GRU_UPDATE_GRAD, { dhn: dy as Tensor, mx, inner, h, rec }, attrs as never) as unknown as [Tensor, Tensor, Tensor, Tensor]
      return { mx: () => dmx, inner: () => dinner, h: () => dh, rec: () => drec }
    }
  })
  const fitting = (c: GruCellLike, x: Tensor, training: boolean): Recurrent | undefined => fusedRecurrent(tf, c, x, training, GRU_UPDATE)
  installed = patchLayerCall<GruCellLike>(tf, "GRUCell", (own) =>
    function (inputs, kwargs) {
      const list = Array.isArray(inputs) ? inputs : [inputs]
      const recurrent = list.length === 2 && list[0]!.rank === 2 && list[1]!.rank === 2 && list.every((t) => t.dtype === "float32") ? fitting(this, list[0]!, kwargs?.training === true) : undefined
      const prepared = this[PREPARED]
      if (recurrent === undefined) {
        // The layer (below) hands a cell projected inputs only after checking the same conditions.
        if (prepared) throw new Error("gradwire's GRU layer projected the inputs for a cell that cannot take them")
        return own.call(this, inputs, kwargs)
      }
      return tf.tidy(() => {
        const [x, h] = list as [Tensor, Tensor]
        const H = this.units
        let mx = x
        if (!prepared) {
          mx = tf.matMul(x, this.kernel.read())
          if (this.useBias && this.bias) mx = tf.add(mx, this.bias.read())
        }
        const [uzr, uh] = prepared ? [prepared.uzr, prepared.uh] : (tf.split(this.recurrentKernel.read(), [2 * H, H], 1) as [Tensor, Tensor])
        const inner = tf.matMul(h, uzr)
        const rh = tf.engine().runKernel(GRU_RESET, { mx, inner, h }, { recurrent } as never) as Tensor
        const rec = tf.matMul(rh, uh)
        const hNext = tf.engine().runKernel(GRU_UPDATE, { mx, inner, h, rec }, { recurrent } as never) as Tensor
        return [hNext, hNext]
      })
    }
  )
  // The GRU layer: every time step's x·W + b as one matmul before the recurrence, and the recurrent
  // kernel split once, instead of per step (forward, and their gradients backward), when its cell
  // takes the kernels. On webgpu the recurrence is then one program each way where the layer asks
  // nothing of the loop (gru-sequence.ts); elsewhere, and for masks, initial and stateful states and
  // going backwards, the loop stays tfjs-layers' own, on the projected inputs.
  installGruSequence(tf)
  patchLayerCall<GruLike>(tf, "GRU", (own) =>
    function (inputs, kwargs) {
      const cell = this.cell
      const fits = layerRecurrent(tf, cell, inputs, kwargs, GRU_UPDATE)
      if (!fits) return own.call(this, inputs, kwargs)
      const H = cell.units
      const T = fits.x.shape[1]!
      const whole =
        sequence.on && kwargs?.["mask"] == null && kwargs?.["initialState"] == null && !this.stateful && !this.goBackwards && !this.returnState && T > 0 && gruSequenceFits(tf, H)
      return tf.tidy(() => {
        const projected = projectSequence(tf, fits.x, cell.kernel.read(), cell.useBias && cell.bias ? cell.bias.read() : undefined)
        if (whole) return gruSequence(tf, projected, cell.recurrentKernel.read(), fits.recurrent, this.returnSequences)
        const [uzr, uh] = tf.split(cell.recurrentKernel.read(), [2 * H, H], 1) as [Tensor, Tensor]
        cell[PREPARED] = { uzr, uh }
        try {
          return own.call(this, projected, kwargs)
        } finally {
          cell[PREPARED] = undefined
        }
      })
    }
  )
  return installed
}

const sequence = sequenceSwitch()
/** Runs `f` with the GRU layer stepping through its loop with the fused cell, not the whole-sequence programs (for tests and benchmarks that compare them). */
export const withoutGruSequence = <T>(f: () => T): T => sequence.off(f)

/** Runs `f` with tfjs-layers' own GRUCell.call (for tests and benchmarks that compare the two). */
export const withTfjsGruCell = <T>(tf: Tf, f: () => T): T => withTfjsCalls(tf, ["GRUCell", "GRU"], f)
