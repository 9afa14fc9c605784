// core/kernels/saved-tensors.ts: the tensors a kernel keeps for its gradient saved as second
// references to their buffers instead of Identity kernels, on wasm and cpu: the same gradients as
// with tfjs's clones, no Identity kernel and no tensor left behind, a disposed input's saved copy
// still readable by its gradient, and a second-order gradient (where the clone's tape node matters)
// still right.
import { beforeAll, afterEach, describe, expect, it } from "vitest"
import { farthest, kernelsOf, seeded } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { savedTensorStats, useSharedSaves } from "../core/kernels/saved-tensors.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})
afterEach(async () => {
  useSharedSaves(true)
  await tf.setBackend("wasm")
})

/** A small dense network's loss (relu, tanh, a product of two weights) and its gradients in both weights. */
const lossAndGrads = (w1: Tensor, w2: Tensor, x: Tensor): Tensor[] => {
  const f = (a: Tensor, b: Tensor): Tensor => tf.sum(tf.mul(tf.tanh(tf.matMul(tf.relu(tf.matMul(x, a)), b)), tf.sigmoid(b.sum())))
  const { value, grads } = tf.valueAndGrads(f)([w1, w2])
  return [value, ...grads]
}

describe("tensors kept for a gradient as second references", () => {
  for (const backend of ["wasm", "cpu"]) {
    it(`${backend}: the same gradients as with tfjs's clones, without their Identity kernels or a tensor left`, async () => {
      await tf.setBackend(backend)
      const x = tf.tensor2d(seeded(8 * 6, 1, 1), [8, 6])
      const w1 = tf.tensor2d(seeded(6 * 5, 2, 0.5), [6, 5])
      const w2 = tf.tensor2d(seeded(5 * 3, 3, 0.5), [5, 3])
      useSharedSaves(false)
      const cloned = lossAndGrads(w1, w2, x)
      const withClones = await kernelsOf(tf, () => lossAndGrads(w1, w2, x))
      useSharedSaves(true)
      const before = savedTensorStats.shared
      const tensorsBefore = tf.memory().numTensors
      const shared = lossAndGrads(w1, w2, x)
      expect(savedTensorStats.shared - before).toBeGreaterThan(4)
      for (let i = 0; i < shared.length; i++) expect(farthest(shared[i]!.dataSync(), cloned[i]!.dataSync())).toBe(0)
      tf.dispose(shared)
      // every kept tensor released with the backward pass
      expect(tf.memory().numTensors).toBe(tensorsBefore)
      const withShares = await kernelsOf(tf, () => lossAndGrads(w1, w2, x))
      expect(withClones.filter((k) => k === "Identity").length).toBeGreaterThan(4)
      expect(withShares.filter((k) => k === "Identity")).toHaveLength(0)
      tf.dispose([x, w1, w2, ...cloned])
    })
  }

  it("a gradient reads what was saved even where the caller disposed the input in the forward pass", () => {
    const w = tf.tensor1d([0.5, -1, 2])
    const g = tf.grad((v: Tensor) => {
      const t = tf.mul(v, 3)
      const y = tf.sum(tf.square(t))
      t.dispose() // square saved t: its second reference keeps the buffer
      return y
    })(w)
    // d/dv Σ (3v)² = 18 v
    expect(Array.from(g.dataSync())).toEqual([9, -18, 36])
    tf.dispose([w, g])
  })

  it("a second-order gradient keeps tfjs's clones and is right", () => {
    const before = savedTensorStats.cloned
    const x = tf.tensor1d([0.3, -0.7, 1.2])
    // d²/dx² Σ sin²(x), elementwise: the outer gradient flows through what the inner one saved (Square's and Sin's inputs)
    const g2 = tf.grad((v: Tensor) => tf.sum(tf.grad((u: Tensor) => tf.sum(tf.square(tf.sin(u))))(v)))(x)
    expect(savedTensorStats.cloned - before).toBeGreaterThan(0)
    const f2 = (u: number): number => 2 * Math.cos(2 * u)
    const got = g2.dataSync()
    ;[0.3, -0.7, 1.2].forEach((u, i) => expect(got[i]!).toBeCloseTo(f2(u), 4))
    tf.dispose([x, g2])
  })
})
