// A whole LSTM recurrence as one webgpu program forward and one backward. With the cell fused
// (lstm-cell.ts) tfjs-layers' loop still records some 13 kernels per time step on webgpu (the
// step's slice of the projected inputs, h·U, the add, the two gate programs; backward the two gate
// programs, two matmuls and the gradient sums), about 420 for a 32-step sequence, and each costs the
// CPU tens of microseconds to record while the GPU waits. The recurrence of one batch row depends
// on that row alone, so here one workgroup per row runs every time step in turn, h and c kept in
// workgroup memory:
//
//   z_t = xw_t + h_{t-1}·U      (xw: the inputs already projected, x·W + b, for every step at once)
//   i, f, g, o from z_t as the cell computes them; c_t = f·c_{t-1} + i·g; h_t = o·tanh(c_t)
//
// and writes [h_t, c_t] for every step ([B, T, 2H]). The backward program walks the steps in
// reverse per row, recomputing z_t from the saved states, and writes dz_t ([B, T, 4H]), which is
// the gradient of xw; dU = Σ_t h_{t-1}ᵀ·dz_t is one matmul over every step. The states start at
// zero (no initial state), as tfjs-layers starts an LSTM that is not stateful.
//
// Used by the LSTM layer (lstm-cell.ts) on webgpu where its cell takes the fused kernels, for a
// layer without masks, initial states, state outputs, statefulness or reversed order, of up to 512
// units (the program's workgroup memory); everywhere else the layer keeps its loop.
import type { Tf } from "../tf.ts"
import { registerFused, type WebGpuArgs, type WebGpuBackend } from "./fused-layers.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** A switch, on unless inside `off(f)`, which runs f with it off (the layers' whole-sequence programs, for tests and benchmarks that compare them with the loop). */
export const sequenceSwitch = (): { readonly on: boolean; off<T>(f: () => T): T } => {
  let on = true
  return {
    get on() {
      return on
    },
    off<T>(f: () => T): T {
      const before = on
      on = false
      try {
        return f()
      } finally {
        on = before
      }
    }
  }
}

/** The recurrent activations the LSTM kernels compute (these and lstm-cell.ts's). */
export type Recurrent = "hardSigmoid" | "sigmoid"

/** The kernels' names in tfjs's registry (gradwire's own). */
export const LSTM_SEQUENCE = "GradwireLSTMSequence"
export const LSTM_SEQUENCE_GRAD = "GradwireLSTMSequenceGrad"

/** The most units the programs take: 6 of 4-byte values per unit in workgroup memory (WebGPU's least limit is 16 KiB). */
export const MAX_SEQUENCE_UNITS = 512
/** Threads per workgroup of the sequence programs (one workgroup per batch row). */
export const SEQUENCE_WORKGROUP = 256
const WORKGROUP = SEQUENCE_WORKGROUP

/** A kernel's recurrent activation from its attributes (hardSigmoid unless "sigmoid"). */
export const recurrentOf = (attrs: Record<string, unknown>): Recurrent => (attrs["recurrent"] === "sigmoid" ? "sigmoid" : "hardSigmoid")

/** WGSL: the recurrent activation, its slope and tanh (tfjs's overflow-safe form), for these programs and the cell's (lstm-cell.ts). */
export const lstmGatesWgsl = (hard: boolean): string => `
  fn gwGate(x : f32) -> f32 { ${hard ? "return clamp(0.2 * x + 0.5, 0.0, 1.0);" : "return 1.0 / (1.0 + exp(-x));"} }
  fn gwGateSlope(x : f32, s : f32) -> f32 { ${hard ? "let y = 0.2 * x + 0.5; if (y >= 0.0 && y <= 1.0) { return 0.2; } return 0.0;" : "return s * (1.0 - s);"} }
  fn gwTanh(x : f32) -> f32 { let e = exp(-2.0 * abs(x)); return sign(x) * (1.0 - e) / (1.0 + e); }
`

/**
 * One workgroup of SEQUENCE_WORKGROUP threads per batch row of a recurrence's projected inputs
 * ([B, T, ...]), writing [B, T, perStep]: `code` defines main, after the gate functions and
 * `constants` (the workgroup arrays' sizes); the step count is read from the output's shape (one
 * pipeline for every sequence length). The LSTM's programs and the GRU's (gru-sequence.ts).
 */
export const rowProgram = (backend: WebGpuBackend, key: string, names: string[], inputs: TensorInfo[], rows: readonly [number, number], perStep: number, hard: boolean, constants: string, code: string): TensorInfo =>
  backend.runWebGPUProgram(
    {
      variableNames: names,
      outputShape: [rows[0], rows[1], perStep],
      workgroupSize: [SEQUENCE_WORKGROUP, 1, 1],
      dispatchLayout: { x: [0, 1, 2] },
      dispatch: [rows[0], 1, 1],
      shaderKey: `${key}_${hard ? "hard" : "sigmoid"}`,
      getUserCode: () => `${lstmGatesWgsl(hard)}
  ${constants}
  ${code}`
    },
    inputs,
    "float32"
  )

/** One of the LSTM's programs over xw ([B, T, 4H]), writing [B, T, perStep·H], with H and 4H as the constants gwUnits and gwGates. */
const program = (backend: WebGpuBackend, name: string, names: string[], inputs: TensorInfo[], xw: TensorInfo, perStep: number, attrs: Record<string, unknown>, code: string): TensorInfo => {
  const [B, T, G] = xw.shape as [number, number, number]
  const H = G / 4
  return rowProgram(backend, `gradwire_lstmseq_${name}_${H}`, names, inputs, [B, T], perStep * H, recurrentOf(attrs) === "hardSigmoid", `const gwUnits = ${H};
  const gwGates = ${4 * H};`, code)
}

const webgpuForward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { xw, u } = inputs as { xw: TensorInfo; u: TensorInfo }
  return program(backend, "forward", ["gxw", "gu"], [xw, u], xw, 2, attrs, `
  var<workgroup> gwZ : array<f32, gwGates>;
  var<workgroup> gwH : array<f32, gwUnits>;
  var<workgroup> gwC : array<f32, gwUnits>;
  fn main(index : i32) {
    let b = i32(workgroupId.x);
    let l = i32(localId.x);
    let gwSteps = uniforms.outShape[1];
    for (var j = l; j < gwUnits; j += ${WORKGROUP}) { gwH[j] = 0.0; gwC[j] = 0.0; }
    workgroupBarrier();
    for (var s = 0; s < gwSteps; s++) {
      let row = b * gwSteps + s;
      for (var j = l; j < gwGates; j += ${WORKGROUP}) {
        var acc = 0.0;
        for (var k = 0; k < gwUnits; k++) { acc += gwH[k] * gu[k * gwGates + j]; }
        gwZ[j] = gxw[row * gwGates + j] + acc;
      }
      workgroupBarrier();
      for (var j = l; j < gwUnits; j += ${WORKGROUP}) {
        let i = gwGate(gwZ[j]);
        let f = gwGate(gwZ[gwUnits + j]);
        let g = gwTanh(gwZ[2 * gwUnits + j]);
        let o = gwGate(gwZ[3 * gwUnits + j]);
        let c = f * gwC[j] + i * g;
        let h = o * gwTanh(c);
        gwC[j] = c;
        gwH[j] = h;
        setOutputAtIndex(row * 2 * gwUnits + j, h);
        setOutputAtIndex(row * 2 * gwUnits + gwUnits + j, c);
      }
      workgroupBarrier();
    }
  }`)
}

const webgpuBackward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { ds, xw, u, s } = inputs as { ds: TensorInfo; xw: TensorInfo; u: TensorInfo; s: TensorInfo }
  return program(backend, "backward", ["gds", "gxw", "gu", "gs"], [ds, xw, u, s], xw, 4, attrs, `
  var<workgroup> gwZ : array<f32, gwGates>;
  var<workgroup> gwDz : array<f32, gwGates>;
  var<workgroup> gwDh : array<f32, gwUnits>;
  var<workgroup> gwDc : array<f32, gwUnits>;
  fn main(index : i32) {
    let b = i32(workgroupId.x);
    let l = i32(localId.x);
    let gwSteps = uniforms.outShape[1];
    for (var j = l; j < gwUnits; j += ${WORKGROUP}) { gwDh[j] = 0.0; gwDc[j] = 0.0; }
    workgroupBarrier();
    for (var step = gwSteps - 1; step >= 0; step--) {
      let row = b * gwSteps + step;
      let prev = row - 1;
      // z of this step again, from the inputs and the state before it (zero before the first).
      for (var j = l; j < gwGates; j += ${WORKGROUP}) {
        var acc = 0.0;
        if (step > 0) {
          for (var k = 0; k < gwUnits; k++) { acc += gs[prev * 2 * gwUnits + k] * gu[k * gwGates + j]; }
        }
        gwZ[j] = gxw[row * gwGates + j] + acc;
      }
      workgroupBarrier();
      for (var j = l; j < gwUnits; j += ${WORKGROUP}) {
        let zi = gwZ[j];
        let zf = gwZ[gwUnits + j];
        let zo = gwZ[3 * gwUnits + j];
        let i = gwGate(zi);
        let f = gwGate(zf);
        let g = gwTanh(gwZ[2 * gwUnits + j]);
        let o = gwGate(zo);
        var cp = 0.0;
        if (step > 0) { cp = gs[prev * 2 * gwUnits + gwUnits + j]; }
        let tc = gwTanh(f * cp + i * g);
        let dh = gds[row * 2 * gwUnits + j] + gwDh[j];
        let dct = gds[row * 2 * gwUnits + gwUnits + j] + gwDc[j] + dh * o * (1.0 - tc * tc);
        let di = dct * g * gwGateSlope(zi, i);
        let df = dct * cp * gwGateSlope(zf, f);
        let dg = dct * i * (1.0 - g * g);
        let dO = dh * tc * gwGateSlope(zo, o);
        gwDz[j] = di;
        gwDz[gwUnits + j] = df;
        gwDz[2 * gwUnits + j] = dg;
        gwDz[3 * gwUnits + j] = dO;
        setOutputAtIndex(row * gwGates + j, di);
        setOutputAtIndex(row * gwGates + gwUnits + j, df);
        setOutputAtIndex(row * gwGates + 2 * gwUnits + j, dg);
        setOutputAtIndex(row * gwGates + 3 * gwUnits + j, dO);
        gwDc[j] = dct * f;
      }
      workgroupBarrier();
      // The gradient reaching h of the step before: dz·Uᵀ.
      for (var k = l; k < gwUnits; k += ${WORKGROUP}) {
        var acc = 0.0;
        for (var j = 0; j < gwGates; j++) { acc += gwDz[j] * gu[k * gwGates + j]; }
        gwDh[k] = acc;
      }
      workgroupBarrier();
    }
  }`)
}

let installed = false

/** Registers the sequence kernels (webgpu) and their gradient. */
export const installLstmSequence = (tf: Tf): void => {
  if (installed) return
  installed = true
  registerFused(tf, LSTM_SEQUENCE, LSTM_SEQUENCE_GRAD, { webgpu: [webgpuForward, webgpuBackward] }, {
    inputsToSave: ["xw", "u"],
    outputsToSave: [true],
    gradFunc: (dy, saved, attrs) => {
      const [xw, u, s] = saved as [Tensor, Tensor, Tensor]
      const [B, T, G] = xw.shape as [number, number, number]
      const H = G / 4
      const dz = tf.engine().runKernel(LSTM_SEQUENCE_GRAD, { ds: dy as Tensor, xw, u, s }, attrs as never) as unknown as Tensor
      return {
        xw: () => dz,
        u: () =>
          tf.tidy(() => {
            if (T === 1) return tf.zeros([H, G])
            // h_{t-1} for every step (zero before the first), against dz_t: one matmul over all of them.
            const before = tf.concat([tf.zeros([B, 1, H]), tf.slice(s, [0, 0, 0], [B, T - 1, H])], 1)
            return tf.matMul(tf.reshape(before, [B * T, H]), tf.reshape(dz, [B * T, G]), true, false)
          })
      }
    }
  })
}

/** Whether the sequence kernels run on the current backend for `units` units. */
export const lstmSequenceFits = (tf: Tf, units: number): boolean => units > 0 && units <= MAX_SEQUENCE_UNITS && tf.getKernel(LSTM_SEQUENCE, tf.getBackend()) !== undefined

/**
 * The LSTM's outputs from inputs already projected (xw = x·W + b, [B, T, 4H]) and the recurrent
 * kernel U ([H, 4H]), states starting at zero: every step's h ([B, T, H]) or the last one's ([B, H]).
 * Differentiable in xw and U.
 */
export const lstmSequence = (tf: Tf, xw: Tensor, u: Tensor, recurrent: Recurrent, returnSequences: boolean): Tensor => {
  const [B, T, G] = xw.shape as [number, number, number]
  const H = G / 4
  const states = tf.engine().runKernel(LSTM_SEQUENCE, { xw, u }, { recurrent }) as unknown as Tensor
  return returnSequences ? tf.slice(states, [0, 0, 0], [B, T, H]) : tf.reshape(tf.slice(states, [0, T - 1, 0], [B, 1, H]), [B, H])
}
