// A whole GRU recurrence as one webgpu program forward and one backward, as lstm-sequence.ts does
// for the LSTM. With the cell's gates fused (gru-cell.ts) tfjs-layers' loop still records some 20
// programs per time step on webgpu (the step's slice of the projected inputs, h·U_zr, the reset
// program, (r·h)·U_h, the update program; backward seven gate programs, four matmuls and the
// gradient sums), and each costs the CPU tens of microseconds to record while the GPU waits: on an
// H200 the zoo's GRU(64) tagger over 32 steps took 19 ms a step at batch 32, 8.25x PyTorch's time
// per sample, where the LSTM's one-program recurrence took 1x. The recurrence of one batch row
// depends on that row alone, so one workgroup per row runs every time step in turn, h kept in
// workgroup memory. With mx = x·W + b ([B, T, 3H]: update, reset and candidate blocks), U = [U_z,
// U_r, U_h] ([H, 3H]) and σ the recurrent activation (tfjs-layers' GRU: the reset gate before the
// recurrent product):
//
//   z = σ(mx_z + h·U_z)   r = σ(mx_r + h·U_r)   hh = tanh(mx_h + (r·h)·U_h)   h' = z·h + (1 − z)·hh
//
// and writes h_t for every step ([B, T, H]). The backward program walks the steps in reverse per row,
// recomputing the gates from the saved states, and writes d mx_t and r_t·h_{t-1} ([B, T, 4H]): d mx
// is the gradient of the projected inputs, and dU = [Σ_t h_{t-1}ᵀ·d mx_zr, Σ_t (r·h)ᵀ·d mx_h] is two
// matmuls over every step. The state starts at zero (no initial state), as tfjs-layers starts a GRU
// that is not stateful.
//
// Used by the GRU layer (gru-cell.ts) on webgpu where its cell takes the fused kernels, for a layer
// without masks, initial states, state outputs, statefulness or reversed order, of up to 256 units
// (the backward program's workgroup memory: 11 values of 4 bytes per unit, under WebGPU's least
// limit of 16 KiB); everywhere else the layer keeps its loop.
import type { Tf } from "../tf.ts"
import { registerFused, type WebGpuArgs, type WebGpuBackend } from "./fused-layers.ts"
import { recurrentOf, rowProgram, SEQUENCE_WORKGROUP, type Recurrent } from "./lstm-sequence.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernels' names in tfjs's registry (gradwire's own). */
export const GRU_SEQUENCE = "GradwireGRUSequence"
export const GRU_SEQUENCE_GRAD = "GradwireGRUSequenceGrad"

/** The most units the programs take (workgroup memory, above). */
export const MAX_GRU_SEQUENCE_UNITS = 256
const WORKGROUP = SEQUENCE_WORKGROUP

/** One of the GRU's programs over mx ([B, T, 3H]), writing [B, T, perStep·H], with H, 2H and 3H as the constants gwUnits, gwTwo and gwThree. */
const program = (backend: WebGpuBackend, name: string, names: string[], inputs: TensorInfo[], mx: TensorInfo, perStep: number, attrs: Record<string, unknown>, code: string): TensorInfo => {
  const [B, T, G] = mx.shape as [number, number, number]
  const H = G / 3
  return rowProgram(backend, `gradwire_gruseq_${name}_${H}`, names, inputs, [B, T], perStep * H, recurrentOf(attrs) === "hardSigmoid", `const gwUnits = ${H};
  const gwTwo = ${2 * H};
  const gwThree = ${3 * H};`, code)
}

const webgpuForward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { mx, u } = inputs as { mx: TensorInfo; u: TensorInfo }
  return program(backend, "forward", ["gmx", "gu"], [mx, u], mx, 1, attrs, `
  var<workgroup> gwH : array<f32, gwUnits>;
  var<workgroup> gwZ : array<f32, gwUnits>;
  var<workgroup> gwRH : array<f32, gwUnits>;
  fn main(index : i32) {
    let b = i32(workgroupId.x);
    let l = i32(localId.x);
    let gwSteps = uniforms.outShape[1];
    for (var j = l; j < gwUnits; j += ${WORKGROUP}) { gwH[j] = 0.0; }
    workgroupBarrier();
    for (var s = 0; s < gwSteps; s++) {
      let row = b * gwSteps + s;
      // The update and reset gates: column j of h·[U_z, U_r].
      for (var j = l; j < gwTwo; j += ${WORKGROUP}) {
        var acc = 0.0;
        for (var k = 0; k < gwUnits; k++) { acc += gwH[k] * gu[k * gwThree + j]; }
        let g = gwGate(gmx[row * gwThree + j] + acc);
        if (j < gwUnits) { gwZ[j] = g; } else { gwRH[j - gwUnits] = g * gwH[j - gwUnits]; }
      }
      workgroupBarrier();
      for (var j = l; j < gwUnits; j += ${WORKGROUP}) {
        var acc = 0.0;
        for (var k = 0; k < gwUnits; k++) { acc += gwRH[k] * gu[k * gwThree + gwTwo + j]; }
        let hh = gwTanh(gmx[row * gwThree + gwTwo + j] + acc);
        let z = gwZ[j];
        let h = z * gwH[j] + (1.0 - z) * hh;
        gwH[j] = h;
        setOutputAtIndex(row * gwUnits + j, h);
      }
      workgroupBarrier();
    }
  }`)
}

const webgpuBackward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { ds, mx, u, s } = inputs as { ds: TensorInfo; mx: TensorInfo; u: TensorInfo; s: TensorInfo }
  return program(backend, "backward", ["gds", "gmx", "gu", "gs"], [ds, mx, u, s], mx, 4, attrs, `
  var<workgroup> gwHp : array<f32, gwUnits>;
  var<workgroup> gwPre : array<f32, gwTwo>;
  var<workgroup> gwG : array<f32, gwTwo>;
  var<workgroup> gwRH : array<f32, gwUnits>;
  var<workgroup> gwD : array<f32, gwThree>;
  var<workgroup> gwDirect : array<f32, gwUnits>;
  var<workgroup> gwDh : array<f32, gwUnits>;
  fn main(index : i32) {
    let b = i32(workgroupId.x);
    let l = i32(localId.x);
    let gwSteps = uniforms.outShape[1];
    let gwOut = 4 * gwUnits;
    for (var j = l; j < gwUnits; j += ${WORKGROUP}) { gwDh[j] = 0.0; }
    for (var step = gwSteps - 1; step >= 0; step--) {
      let row = b * gwSteps + step;
      // The state before this step (zero before the first).
      for (var k = l; k < gwUnits; k += ${WORKGROUP}) {
        var hp = 0.0;
        if (step > 0) { hp = gs[(row - 1) * gwUnits + k]; }
        gwHp[k] = hp;
      }
      workgroupBarrier();
      // The update and reset gates again, and r·h.
      for (var j = l; j < gwTwo; j += ${WORKGROUP}) {
        var acc = 0.0;
        for (var k = 0; k < gwUnits; k++) { acc += gwHp[k] * gu[k * gwThree + j]; }
        let pre = gmx[row * gwThree + j] + acc;
        let g = gwGate(pre);
        gwPre[j] = pre;
        gwG[j] = g;
        if (j >= gwUnits) {
          let rh = g * gwHp[j - gwUnits];
          gwRH[j - gwUnits] = rh;
          setOutputAtIndex(row * gwOut + gwThree + j - gwUnits, rh);
        }
      }
      workgroupBarrier();
      // The candidate again; the gradients of the update gate's and the candidate's inputs.
      for (var j = l; j < gwUnits; j += ${WORKGROUP}) {
        var acc = 0.0;
        for (var k = 0; k < gwUnits; k++) { acc += gwRH[k] * gu[k * gwThree + gwTwo + j]; }
        let hh = gwTanh(gmx[row * gwThree + gwTwo + j] + acc);
        let z = gwG[j];
        let dh = gds[row * gwUnits + j] + gwDh[j];
        let dz = dh * (gwHp[j] - hh) * gwGateSlope(gwPre[j], z);
        let dc = dh * (1.0 - z) * (1.0 - hh * hh);
        gwD[j] = dz;
        gwD[gwTwo + j] = dc;
        gwDirect[j] = dh * z;
        setOutputAtIndex(row * gwOut + j, dz);
        setOutputAtIndex(row * gwOut + gwTwo + j, dc);
      }
      workgroupBarrier();
      // d(r·h) = dc·U_hᵀ: the reset gate's input's gradient, and r·d(r·h) into h.
      for (var k = l; k < gwUnits; k += ${WORKGROUP}) {
        var acc = 0.0;
        for (var j = 0; j < gwUnits; j++) { acc += gwD[gwTwo + j] * gu[k * gwThree + gwTwo + j]; }
        let r = gwG[gwUnits + k];
        let dr = acc * gwHp[k] * gwGateSlope(gwPre[gwUnits + k], r);
        gwD[gwUnits + k] = dr;
        gwDirect[k] = gwDirect[k] + acc * r;
        setOutputAtIndex(row * gwOut + gwUnits + k, dr);
      }
      workgroupBarrier();
      // The gradient reaching h of the step before: the direct paths and [dz, dr]·[U_z, U_r]ᵀ.
      for (var k = l; k < gwUnits; k += ${WORKGROUP}) {
        var acc = 0.0;
        for (var j = 0; j < gwTwo; j++) { acc += gwD[j] * gu[k * gwThree + j]; }
        gwDh[k] = gwDirect[k] + acc;
      }
      workgroupBarrier();
    }
  }`)
}

let installed = false

/** Registers the sequence kernels (webgpu) and their gradient. */
export const installGruSequence = (tf: Tf): void => {
  if (installed) return
  installed = true
  registerFused(tf, GRU_SEQUENCE, GRU_SEQUENCE_GRAD, { webgpu: [webgpuForward, webgpuBackward] }, {
    inputsToSave: ["mx", "u"],
    outputsToSave: [true],
    gradFunc: (dy, saved, attrs) => {
      const [mx, , s] = saved as [Tensor, Tensor, Tensor]
      const [B, T, G] = mx.shape as [number, number, number]
      const H = G / 3
      const out = tf.engine().runKernel(GRU_SEQUENCE_GRAD, { ds: dy as Tensor, mx, u: saved[1]!, s }, attrs as never) as unknown as Tensor
      const dmx = tf.slice(out, [0, 0, 0], [B, T, G])
      return {
        mx: () => dmx,
        u: () =>
          tf.tidy(() => {
            const flat = tf.reshape(out, [B * T, 4 * H])
            // h_{t-1} for every step (zero before the first) against d mx_zr, and r·h against d mx_h.
            const before = T === 1 ? tf.zeros([B * T, H]) : tf.reshape(tf.concat([tf.zeros([B, 1, H]), tf.slice(s, [0, 0, 0], [B, T - 1, H])], 1), [B * T, H])
            const zr = tf.matMul(before, tf.slice(flat, [0, 0], [B * T, 2 * H]), true, false)
            const hh = tf.matMul(tf.slice(flat, [0, 3 * H], [B * T, H]), tf.slice(flat, [0, 2 * H], [B * T, H]), true, false)
            return tf.concat([zr, hh], 1)
          })
      }
    }
  })
}

/** Whether the sequence kernels run on the current backend for `units` units. */
export const gruSequenceFits = (tf: Tf, units: number): boolean => units > 0 && units <= MAX_GRU_SEQUENCE_UNITS && tf.getKernel(GRU_SEQUENCE, tf.getBackend()) !== undefined

/**
 * The GRU's outputs from inputs already projected (mx = x·W + b, [B, T, 3H]) and the recurrent
 * kernel U ([H, 3H]), the state starting at zero: every step's h ([B, T, H]) or the last one's
 * ([B, H]). Differentiable in mx and U.
 */
export const gruSequence = (tf: Tf, mx: Tensor, u: Tensor, recurrent: Recurrent, returnSequences: boolean): Tensor => {
  const [B, T] = mx.shape as [number, number, number]
  const states = tf.engine().runKernel(GRU_SEQUENCE, { mx, u }, { recurrent }) as unknown as Tensor
  if (returnSequences) return states
  const H = states.shape[2]!
  return tf.reshape(tf.slice(states, [0, T - 1, 0], [B, 1, H]), [B, H])
}
