// core/kernels/gru-cell.ts: a GRU step's gates as two kernels and their gradients as two more, in
// place of tfjs-layers' GRUCell composition, on wasm (its JavaScript loops, and its SIMD kernels on
// the heap for units a multiple of 4) and cpu. Checked against tfjs-layers' own cell and layer on
// the same weights and inputs: the loss and every weight's and the input's gradient, for both
// recurrent activations, with and without a bias, forwards and backwards in time; the kernels alone
// against the same formulas written in tfjs ops, at hardSigmoid's clip bounds and where tanh
// saturates; and the cells it must leave to tfjs (dropout while training).
import { beforeAll, describe, expect, it } from "vitest"
import { kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { GRU_RESET, GRU_RESET_GRAD, GRU_UPDATE, GRU_UPDATE_GRAD, gruCellStats, withTfjsGruCell } from "../core/kernels/gru-cell.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

interface Case {
  recurrentActivation: "hardSigmoid" | "sigmoid"
  returnSequences: boolean
  useBias: boolean
  goBackwards: boolean
  /** Units: 7 takes wasm's JavaScript loops, 8 its SIMD kernels on the heap (four units at a time). */
  units: number
}
const CASES: Case[] = [
  { recurrentActivation: "hardSigmoid", returnSequences: true, useBias: true, goBackwards: false, units: 7 },
  { recurrentActivation: "sigmoid", returnSequences: false, useBias: false, goBackwards: false, units: 7 },
  { recurrentActivation: "hardSigmoid", returnSequences: true, useBias: true, goBackwards: false, units: 8 },
  { recurrentActivation: "sigmoid", returnSequences: true, useBias: true, goBackwards: true, units: 8 },
  { recurrentActivation: "hardSigmoid", returnSequences: false, useBias: false, goBackwards: true, units: 12 }
]

const T = 6
/** A GRU layer's loss, and the gradients of its weights and of its input. */
const lossAndGrads = (c: Case, seed: number) => {
  const [B, D, H] = [3, 5, c.units]
  const layer = tf.layers.gru({
    units: H,
    returnSequences: c.returnSequences,
    useBias: c.useBias,
    goBackwards: c.goBackwards,
    recurrentActivation: c.recurrentActivation,
    kernelInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed }),
    recurrentInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: seed + 1 }),
    biasInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: seed + 2 })
  })
  // Inputs large enough that some gates saturate (hardSigmoid's clip, tanh near ±1).
  const x = tf.tensor(seeded(B * T * D, seed + 3, 2.5), [B, T, D])
  const weights = tf.tensor(seeded((c.returnSequences ? T : 1) * H, seed + 4), c.returnSequences ? [1, T, H] : [1, H])
  tf.dispose(layer.apply(x) as Tensor)
  const run = (): Tensor[] => {
    const f = (input: Tensor): Tensor => (layer.apply(input, { training: true }) as Tensor).mul(weights).sum()
    const { value, grads } = tf.variableGrads(() => f(x) as import("@tensorflow/tfjs").Scalar, layer.trainableWeights.map((w) => (w as unknown as { val: import("@tensorflow/tfjs").Variable }).val))
    const dx = tf.grad(f)(x)
    return [value, ...Object.values(grads), dx]
  }
  return { run, layer, dispose: () => tf.dispose([x, weights]) }
}

describe("a GRU cell's gates as two kernels", () => {
  for (const backend of ["wasm", "cpu"]) {
    for (const c of CASES) {
      it(`${backend}, ${c.units} units, ${c.recurrentActivation}${c.useBias ? "" : ", no bias"}${c.returnSequences ? ", every step's output" : ", the last output"}${c.goBackwards ? ", backwards in time" : ""}: the loss and every gradient as tfjs-layers' own cell gives them`, async () => {
        await tf.setBackend(backend)
        const { run, layer, dispose } = lossAndGrads(c, 21)
        const heapBefore = gruCellStats.heap
        const fused = run()
        // the heap's SIMD kernels on wasm for 4 units at a time, the JavaScript loops otherwise
        expect(gruCellStats.heap > heapBefore).toBe(backend === "wasm" && c.units % 4 === 0)
        const own = withTfjsGruCell(tf, run)
        expect(fused.length).toBe(layer.trainableWeights.length + 2)
        expect(await worst(fused, own)).toBeLessThan(1e-4)
        const names = await kernelsOf(tf, run)
        const tfjsNames = await kernelsOf(tf, () => withTfjsGruCell(tf, run))
        for (const k of [GRU_RESET, GRU_RESET_GRAD, GRU_UPDATE, GRU_UPDATE_GRAD]) expect(names).toContain(k)
        expect(tfjsNames).not.toContain(GRU_UPDATE)
        // The point of it: far fewer kernels per training step, the inputs projected in one matmul.
        expect(names.length).toBeLessThan(tfjsNames.length * 0.5)
        tf.dispose([...fused, ...own])
        dispose()
        await tf.setBackend("wasm")
      })
    }

    it(`${backend}: the kernels and their gradients match the formulas in tfjs ops at hardSigmoid's bounds and where tanh saturates`, async () => {
      await tf.setBackend(backend)
      for (const H of [6, 8]) {
        // Gate inputs at -2.5 and 2.5 exactly (the clip's bounds: tfjs's gradient counts them inside), just outside, 0, and far out.
        const row = [-2.5, 2.5, -2.5000002, 2.5000002, 0, 30, -30, 1]
        const mx = tf.tensor(Float32Array.from({ length: 2 * 3 * H }, (_, k) => (k < 3 * H ? row[k % row.length]! : seeded(1, k)[0]! * 4)), [2, 3 * H])
        const inner = tf.zeros([2, 2 * H])
        const h = tf.tensor(seeded(2 * H, 5, 1), [2, H])
        const uh = tf.tensor(seeded(H * H, 6, 0.5), [H, H])
        const w = tf.tensor(seeded(2 * H, 7), [2, H])
        for (const recurrent of ["hardSigmoid", "sigmoid"] as const) {
          const act = (t: Tensor): Tensor => (recurrent === "hardSigmoid" ? tf.clipByValue(tf.add(0.5, tf.mul(0.2, t)), 0, 1) : tf.sigmoid(t))
          const ours = (m: Tensor, i: Tensor, hp: Tensor): Tensor => {
            const rh = tf.engine().runKernel(GRU_RESET, { mx: m, inner: i, h: hp }, { recurrent } as never) as Tensor
            const rec = tf.matMul(rh, uh)
            return tf.engine().runKernel(GRU_UPDATE, { mx: m, inner: i, h: hp, rec }, { recurrent } as never) as Tensor
          }
          const reference = (m: Tensor, i: Tensor, hp: Tensor): Tensor => {
            const [xz, xr, xh] = tf.split(m, 3, 1) as [Tensor, Tensor, Tensor]
            const [iz, ir] = tf.split(i, 2, 1) as [Tensor, Tensor]
            const z = act(tf.add(xz, iz))
            const r = act(tf.add(xr, ir))
            const hh = tf.tanh(tf.add(xh, tf.matMul(tf.mul(r, hp), uh)))
            return tf.add(tf.mul(z, hp), tf.mul(tf.add(1, tf.neg(z)), hh))
          }
          const loss = (f: (m: Tensor, i: Tensor, hp: Tensor) => Tensor) => (m: Tensor, i: Tensor, hp: Tensor) => tf.sum(tf.mul(f(m, i, hp), w))
          const a = [ours(mx, inner, h), ...tf.grads(loss(ours))([mx, inner, h])]
          const b = [reference(mx, inner, h), ...tf.grads(loss(reference))([mx, inner, h])]
          expect(await worst(a, b), `${H} units, ${recurrent}`).toBeLessThan(1e-5)
          tf.dispose([...a, ...b])
        }
        tf.dispose([mx, inner, h, uh, w])
      }
      await tf.setBackend("wasm")
    })
  }

  it("leaves a cell with dropout to tfjs-layers while training, and computes it at inference, where dropout does nothing", async () => {
    const layer = tf.layers.gru({ units: 4, dropout: 0.3, recurrentDropout: 0.2, returnSequences: true, kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }) })
    const x = tf.tensor(seeded(2 * 3 * 5, 9), [2, 3, 5])
    const training = await kernelsOf(tf, () => [layer.apply(x, { training: true }) as Tensor])
    expect(training).not.toContain(GRU_UPDATE)
    const inference = await kernelsOf(tf, () => [layer.apply(x, { training: false }) as Tensor])
    expect(inference).toContain(GRU_UPDATE)
    const ours = layer.apply(x, { training: false }) as Tensor
    const theirs = withTfjsGruCell(tf, () => layer.apply(x, { training: false }) as Tensor)
    expect(await worst([ours], [theirs])).toBeLessThan(1e-6)
    tf.dispose([x, ours, theirs])
  })
})
