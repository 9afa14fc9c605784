// An LSTM time step's gates as one kernel, and their gradient as one more. tfjs-layers' LSTMCell
// computes a step from about 24 kernels (the gates' four slices; hardSigmoid as a multiply, an add
// and a clip for each of three gates; two tanh; the products and the sum of the new state), and its
// backward pass from about 50 more; an LSTM over 32 time steps is some 2300 kernels per training
// step, and on wasm and webgpu each costs the engine and backend far more than its arithmetic.
// Here, per time step and element, from z = x·W + h·U + b (four gate blocks: input, forget, cell,
// output) and the previous carry c:
//
//   i = σ(z_i)  f = σ(z_f)  g = tanh(z_g)  o = σ(z_o)     c' = f·c + i·g     h = o·tanh(c')
//
// with σ the cell's recurrent activation (tfjs's hardSigmoid, clip(0.2·x + 0.5, 0, 1), whose
// gradient is 0.2 inside [-2.5, 2.5] bounds included, as tfjs's clip gives; or the logistic
// sigmoid). The backward pass recomputes the gates from z and c (nothing more is kept) and gives
// dz and dc from dh and dc'. Float32 rounding follows tfjs's order of operations in the forward
// pass; tanh and exp are JavaScript's (within a float32 ulp or two of the backends'). On wasm, where
// H is a multiple of 4, the same loops run as gradwire's SIMD kernels on the heap (heap-simd.ts),
// with Cephes' float32 tanh and exp (within about 2 ulp) and every product in float32.
//
// LSTMCell.call (tfjs-layers) is replaced for cells with a tanh activation, a hardSigmoid or
// sigmoid recurrent activation, no dropout while training and 2-d inputs, on a backend that has the
// kernels (wasm, cpu and webgpu); every other cell, and every other backend, keeps tfjs-layers' own.
// The matmuls and the bias stay tfjs's kernels. Installed once the engine's backend is up
// (`../engine.ts`).
import type { Tf } from "../tf.ts"
import { hostKernels, isPatchedCall, oneInput, patchLayerCall, registerFused, runWgsl, withTfjsCalls, type WebGpuArgs, type WebGpuBackend } from "./fused-layers.ts"
import { installLstmSequence, lstmGatesWgsl, lstmSequence, lstmSequenceFits, recurrentOf, sequenceSwitch, type Recurrent } from "./lstm-sequence.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernels' names in tfjs's registry (gradwire's own: no tfjs kernel has them). */
export const LSTM_CELL = "GradwireLSTMCell"
export const LSTM_CELL_GRAD = "GradwireLSTMCellGrad"

export type { Recurrent } from "./lstm-sequence.ts"

const f32 = Math.fround
const POINT_TWO = f32(0.2)

/** σ(x) as tfjs computes it: hardSigmoid clip(0.2·x + 0.5, 0, 1) (tfjs's rounding) or the logistic sigmoid. */
export const gate = (x: number, hard: boolean): number => {
  if (hard) {
    const y = f32(f32(x * POINT_TWO) + 0.5)
    return y < 0 ? 0 : y > 1 ? 1 : y
  }
  return f32(1 / (1 + Math.exp(-x)))
}
/** dσ/dx at x, from x and σ(x). */
export const gateSlope = (x: number, s: number, hard: boolean): number => {
  if (hard) {
    const y = f32(f32(x * POINT_TWO) + 0.5)
    return y >= 0 && y <= 1 ? POINT_TWO : 0
  }
  return s * (1 - s)
}

/** h and c' of a step: z is [B, 4H], c is [B, H]. */
export const cellForward = (z: Float32Array, c: Float32Array, H: number, recurrent: Recurrent, h: Float32Array, cNext: Float32Array): void => {
  const hard = recurrent === "hardSigmoid"
  const B = c.length / H
  for (let b = 0; b < B; b++) {
    const zr = b * 4 * H
    const sr = b * H
    for (let j = 0; j < H; j++) {
      const i = gate(z[zr + j]!, hard)
      const f = gate(z[zr + H + j]!, hard)
      const g = f32(Math.tanh(z[zr + 2 * H + j]!))
      const o = gate(z[zr + 3 * H + j]!, hard)
      const cn = f32(f32(f * c[sr + j]!) + f32(i * g))
      cNext[sr + j] = cn
      h[sr + j] = f32(o * f32(Math.tanh(cn)))
    }
  }
}

/** dz and dc of a step from dh and dc' (the gradients of its outputs h and c'). */
export const cellBackward = (
  dh: Float32Array,
  dcNext: Float32Array,
  z: Float32Array,
  c: Float32Array,
  H: number,
  recurrent: Recurrent,
  dz: Float32Array,
  dc: Float32Array
): void => {
  const hard = recurrent === "hardSigmoid"
  const B = c.length / H
  for (let b = 0; b < B; b++) {
    const zr = b * 4 * H
    const sr = b * H
    for (let j = 0; j < H; j++) {
      const zi = z[zr + j]!
      const zf = z[zr + H + j]!
      const zo = z[zr + 3 * H + j]!
      const i = gate(zi, hard)
      const f = gate(zf, hard)
      const g = f32(Math.tanh(z[zr + 2 * H + j]!))
      const o = gate(zo, hard)
      const cp = c[sr + j]!
      const tc = Math.tanh(f32(f32(f * cp) + f32(i * g)))
      const dhj = dh[sr + j]!
      // All the ways c' reaches the loss: on to the next step, and through h.
      const dct = dcNext[sr + j]! + dhj * o * (1 - tc * tc)
      dz[zr + j] = dct * g * gateSlope(zi, i, hard)
      dz[zr + H + j] = dct * cp * gateSlope(zf, f, hard)
      dz[zr + 2 * H + j] = dct * i * (1 - g * g)
      dz[zr + 3 * H + j] = dhj * tc * gateSlope(zo, o, hard)
      dc[sr + j] = dct * f
    }
  }
}

// wasm and cpu: the functions above on the backend's arrays.
const hostForward = hostKernels({
  names: ["z", "c"],
  shapes: ({ c }) => [[...c!.shape], [...c!.shape]],
  compute: ([z, c], [h, cn], attrs, { c: ci }) => cellForward(z!, c!, ci!.shape[1]!, recurrentOf(attrs), h!, cn!),
  heap: (k, [z, c], [h, cn], attrs, { c: ci }) => {
    const [B, H] = ci!.shape as [number, number]
    if (H % 4 !== 0 || H === 0) return false
    k.lstmCellForward(z!, c!, h!, cn!, B, H, recurrentOf(attrs) === "hardSigmoid" ? 1 : 0)
    return true
  }
})
const hostBackward = hostKernels({
  names: ["dh", "dc", "z", "c"],
  shapes: ({ z, c }) => [[...z!.shape], [...c!.shape]],
  compute: ([dh, dc, z, c], [dz, dcPrev], attrs, { c: ci }) => cellBackward(dh!, dc!, z!, c!, ci!.shape[1]!, recurrentOf(attrs), dz!, dcPrev!),
  heap: (k, [dh, dc, z, c], [dz, dcPrev], attrs, { c: ci }) => {
    const [B, H] = ci!.shape as [number, number]
    if (H % 4 !== 0 || H === 0) return false
    k.lstmCellBackward(dh!, dc!, z!, c!, dz!, dcPrev!, B, H, recurrentOf(attrs) === "hardSigmoid" ? 1 : 0)
    return true
  }
})

// webgpu: two small programs each way (one output per program).
/**
 * A program over every element of a 2-d output of `shape` with the gate functions (lstmGatesWgsl);
 * `body` sees index, row, col and H (the units, from the WGSL expression `hFrom`). `name` keys the
 * pipeline with the recurrent activation (the GRU's kernels use it too).
 */
export const gateProgram = (backend: WebGpuBackend, name: string, names: string[], inputs: TensorInfo[], shape: number[], hard: boolean, hFrom: string, body: string): TensorInfo =>
  runWgsl(backend, {
    key: `gradwire_${name}_${hard ? "hard" : "sigmoid"}`,
    names,
    inputs,
    outputShape: shape,
    threads: shape[0]! * shape[1]!,
    size: true,
    code: `${lstmGatesWgsl(hard)}
  fn main(index : i32) {
    if (index < uniforms.size) {
      let H = ${hFrom};
      let row = index / uniforms.outShape[1];
      let col = index - row * uniforms.outShape[1];
      ${body}
    }
  }`
  })
const webgpuForward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo[] => {
  const { z, c } = inputs as { z: TensorInfo; c: TensorInfo }
  const hard = recurrentOf(attrs) === "hardSigmoid"
  const shape = [...c.shape]
  const cNext = gateProgram(backend, "lstm_c", ["gz", "gc"], [z, c], shape, hard, "uniforms.gcShape[1]", `
      let zr = row * 4 * H;
      let i = gwGate(gz[zr + col]);
      let f = gwGate(gz[zr + H + col]);
      let g = gwTanh(gz[zr + 2 * H + col]);
      setOutputAtIndex(index, f * gc[index] + i * g);`)
  const h = gateProgram(backend, "lstm_h", ["gz", "gcn"], [z, cNext], shape, hard, "uniforms.gcnShape[1]", `
      let o = gwGate(gz[row * 4 * H + 3 * H + col]);
      setOutputAtIndex(index, o * gwTanh(gcn[index]));`)
  return [h, cNext]
}
const webgpuBackward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo[] => {
  const { dh, dc, z, c } = inputs as { dh: TensorInfo; dc: TensorInfo; z: TensorInfo; c: TensorInfo }
  const hard = recurrentOf(attrs) === "hardSigmoid"
  // Shared by both programs: the gates of element (row, j) and the gradient reaching c' there.
  const gates = `
      let zr = row * 4 * H;
      let sr = row * H + j;
      let zi = gz[zr + j];
      let zf = gz[zr + H + j];
      let zo = gz[zr + 3 * H + j];
      let i = gwGate(zi);
      let f = gwGate(zf);
      let g = gwTanh(gz[zr + 2 * H + j]);
      let o = gwGate(zo);
      let cp = gc[sr];
      let tc = gwTanh(f * cp + i * g);
      let dhj = gdh[sr];
      let dct = gdc[sr] + dhj * o * (1.0 - tc * tc);`
  const names = ["gdh", "gdc", "gz", "gc"]
  const ins = [dh, dc, z, c]
  const dz = gateProgram(backend, "lstm_dz", names, ins, [...z.shape], hard, "uniforms.gcShape[1]", `
      let block = col / H;
      let j = col - block * H;
      ${gates}
      var v = 0.0;
      if (block == 0) { v = dct * g * gwGateSlope(zi, i); }
      else if (block == 1) { v = dct * cp * gwGateSlope(zf, f); }
      else if (block == 2) { v = dct * i * (1.0 - g * g); }
      else { v = dhj * tc * gwGateSlope(zo, o); }
      setOutputAtIndex(index, v);`)
  const dcPrev = gateProgram(backend, "lstm_dc", names, ins, [...c.shape], hard, "uniforms.gcShape[1]", `
      let j = col;
      ${gates}
      setOutputAtIndex(index, dct * f);`)
  return [dz, dcPrev]
}

/** Backends with both kernels, and their kernel functions. */
const KERNELS: Record<string, readonly [unknown, unknown]> = {
  wasm: [hostForward[0], hostBackward[0]],
  cpu: [hostForward[1], hostBackward[1]],
  webgpu: [webgpuForward, webgpuBackward]
}

/** [h, c'] of a step from z ([B, 4H]) and c ([B, H]); differentiable in both. */
export const lstmGates = (tf: Tf, z: Tensor, c: Tensor, recurrent: Recurrent): [Tensor, Tensor] =>
  tf.engine().runKernel(LSTM_CELL, { z, c }, { recurrent }) as unknown as [Tensor, Tensor]

interface Activation {
  getClassName?(): string
  constructor: { className?: string }
}
/** What the fused cells read of a tfjs-layers recurrent cell (LSTMCell, GRUCell) to tell whether they can take it. */
export interface RecurrentCellLike {
  activation: Activation
  recurrentActivation: Activation
  dropout: number
  recurrentDropout: number
}
interface LstmCellLike extends RecurrentCellLike {
  useBias: boolean
  kernel: { read(): Tensor }
  recurrentKernel: { read(): Tensor }
  bias: { read(): Tensor } | null
  /** Set by the LSTM layer while its cell runs on inputs already projected (x·W + b). */
  [PROJECTED]?: boolean
}

const PROJECTED = Symbol.for("gradwire.lstmCell.projected")
interface LstmLike {
  cell: LstmCellLike
  stateful: boolean
  goBackwards: boolean
  returnState: boolean
  returnSequences: boolean
}
const nameOf = (a: Activation): string | undefined => a.constructor?.className ?? a.getClassName?.()

/**
 * The recurrent activation when a recurrent layer (LSTM, GRU) over `inputs` can hand its cell, whose
 * call gradwire has patched, projected inputs for fused kernels `kernel`: one 3-d input and a
 * fitting cell (fusedRecurrent); else undefined (the layer's own call).
 */
export const layerRecurrent = (tf: Tf, cell: RecurrentCellLike, inputs: Tensor | Tensor[], kwargs: Record<string, unknown> | undefined, kernel: string): { x: Tensor; recurrent: Recurrent } | undefined => {
  const x = oneInput(inputs)
  if (!x || x.rank !== 3 || !isPatchedCall((Object.getPrototypeOf(cell) as { call?: unknown }).call)) return undefined
  const recurrent = fusedRecurrent(tf, cell, x, kwargs?.training === true, kernel)
  return recurrent === undefined ? undefined : { x, recurrent }
}

/** Every time step's x·W (+ bias) of a [B, T, D] sequence as one matmul: [B, T, W's columns]. */
export const projectSequence = (tf: Tf, x: Tensor, W: Tensor, bias: Tensor | undefined): Tensor => {
  const [B, T, D] = x.shape as [number, number, number]
  const flat = tf.reshape(x, [B * T, D])
  return tf.reshape(bias ? tf.fused.matMul({ a: flat, b: W, bias }) : tf.matMul(flat, W), [B, T, W.shape[1]!])
}

/**
 * The recurrent activation when cell `c` can take fused kernels for input `x`: a tanh activation, a
 * hardSigmoid or sigmoid recurrent one, no dropout while training, float32, and `kernel` registered
 * on the backend that runs; else undefined (tfjs-layers' own cell).
 */
export const fusedRecurrent = (tf: Tf, c: RecurrentCellLike, x: Tensor, training: boolean, kernel: string): Recurrent | undefined => {
  const recurrent = nameOf(c.recurrentActivation)
  const ok =
    nameOf(c.activation) === "tanh" &&
    (recurrent === "hardSigmoid" || recurrent === "sigmoid") &&
    (!training || (!(c.dropout > 0 && c.dropout < 1) && !(c.recurrentDropout > 0 && c.recurrentDropout < 1))) &&
    x.dtype === "float32" &&
    tf.getKernel(kernel, tf.getBackend()) !== undefined
  return ok ? (recurrent as Recurrent) : undefined
}

let installed = false

/**
 * Registers the kernels and their gradient, and makes tfjs-layers' LSTMCell (and the LSTM layer) use
 * them where it can. Returns whether the cell is patched.
 */
export const installLstmCell = (tf: Tf): boolean => {
  if (installed) return true
  registerFused(tf, LSTM_CELL, LSTM_CELL_GRAD, KERNELS, {
    inputsToSave: ["z", "c"],
    gradFunc: (dys, saved, attrs) => {
      const [dh, dc] = dys as Tensor[]
      const [z, c] = saved as [Tensor, Tensor]
      const [dz, dcPrev] = tf.engine().runKernel(LSTM_CELL_GRAD, { dh: dh!, dc: dc!, z, c }, attrs as never) as unknown as [Tensor, Tensor]
      return { z: () => dz, c: () => dcPrev }
    }
  })
  const fitting = (c: LstmCellLike, x: Tensor, training: boolean): Recurrent | undefined => fusedRecurrent(tf, c, x, training, LSTM_CELL)
  const cellPatched = patchLayerCall<LstmCellLike>(tf, "LSTMCell", (own) =>
    function (inputs, kwargs) {
      const list = Array.isArray(inputs) ? inputs : [inputs]
      const projected = this[PROJECTED] === true
      const recurrent = list.length === 3 && list[0]!.rank === 2 && list.every((t) => t.dtype === "float32") ? fitting(this, list[0]!, kwargs?.training === true) : undefined
      if (recurrent === undefined) {
        // The layer (below) hands a cell projected inputs only after checking the same conditions.
        if (projected) throw new Error("gradwire's LSTM layer projected the inputs for a cell that cannot take them")
        return own.call(this, inputs, kwargs)
      }
      return tf.tidy(() => {
        const [x, h, c] = list as [Tensor, Tensor, Tensor]
        // Projected: x is already x·W + b (the layer's one matmul for every time step).
        let z = projected ? x : tf.matMul(x, this.kernel.read())
        z = tf.add(z, tf.matMul(h, this.recurrentKernel.read()))
        if (!projected && this.useBias && this.bias) z = tf.add(z, this.bias.read())
        const [hNext, cNext] = lstmGates(tf, z, c, recurrent)
        return [hNext, hNext, cNext]
      })
    }
  )
  // The LSTM layer: every time step's x·W + b as one matmul before the recurrence, instead of one
  // per step (forward, and the two gradient matmuls and the sums backward), when its cell takes the
  // kernels. On webgpu the recurrence is then one program each way where the layer asks nothing of
  // the loop (lstm-sequence.ts); elsewhere, and for masks, initial and stateful states and going
  // backwards, it stays tfjs-layers' own loop, on the projected inputs.
  installLstmSequence(tf)
  patchLayerCall<LstmLike>(tf, "LSTM", (own) =>
    function (inputs, kwargs) {
      const cell = this.cell
      const fits = layerRecurrent(tf, cell, inputs, kwargs, LSTM_CELL)
      if (!fits) return own.call(this, inputs, kwargs)
      const { x, recurrent } = fits
      const T = x.shape[1]!
      const W = cell.kernel.read()
      const H = W.shape[1]! / 4
      // The whole recurrence as one program each way (lstm-sequence.ts), where nothing of the loop's
      // own is asked for: no mask, initial state, state output, statefulness or reversed order.
      const whole =
        sequence.on && kwargs?.["mask"] == null && kwargs?.["initialState"] == null && !this.stateful && !this.goBackwards && !this.returnState && T > 0 && lstmSequenceFits(tf, H)
      return tf.tidy(() => {
        const xw = projectSequence(tf, x, W, cell.useBias && cell.bias ? cell.bias.read() : undefined)
        if (whole) return lstmSequence(tf, xw, cell.recurrentKernel.read(), recurrent, this.returnSequences)
        cell[PROJECTED] = true
        try {
          return own.call(this, xw, kwargs)
        } finally {
          cell[PROJECTED] = false
        }
      })
    }
  )
  installed = cellPatched
  return installed
}

const sequence = sequenceSwitch()
/** Runs `f` with the LSTM layer stepping through its loop with the fused cell, not the whole-sequence programs (for tests and benchmarks that compare them). */
export const withoutLstmSequence = <T>(f: () => T): T => sequence.off(f)

/** Runs `f` with tfjs-layers' own LSTMCell.call and LSTM.call (for tests and benchmarks that compare them). */
export const withTfjsLstmCell = <T>(tf: Tf, f: () => T): T => withTfjsCalls(tf, ["LSTMCell", "LSTM"], f)
