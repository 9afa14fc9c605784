// core/kernels/prob-cross-entropy.ts: a compiled model's cross-entropy on probabilities (one-hot,
// soft or class-id targets; each row's loss or their mean) as one kernel and its gradient as one more,
// and softmax's gradient as one kernel, on wasm and cpu, against tfjs-layers' own
// categoricalCrossentropy and tfjs's softmax gradient: the loss and the gradient in the logits under
// a softmax, for rows of 10 and 37 classes, saturated probabilities (the clip), rank-3 outputs,
// soft targets and a sigmoid's rows (which do not sum to 1); the kernels a step runs; a data-parallel step's loss and new weights against the
// same step with tfjs-layers' loss; and the typed error for mismatched targets.
import { beforeAll, describe, expect, it } from "vitest"
import { farthest, kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { CORRECT_COUNT, PROB_CROSS_ENTROPY, PROB_CROSS_ENTROPY_GRAD, SOFTMAX_GRAD, correctPredictions, probCrossEntropy, probCrossEntropyStats } from "../core/kernels/prob-cross-entropy.ts"
import { DataParallelModel } from "../actors/train/worker/data-parallel.ts"
import type { GradientSync } from "../actors/train/worker/gradient-sync.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

interface Case {
  name: string
  /** Logits' shape (the last axis the classes). */
  shape: number[]
  scale: number
  sparse: boolean
  soft?: boolean
  mean: boolean
  /** Probabilities by a sigmoid (rows that do not sum to 1: the loss's own normalization) instead of a softmax. */
  sigmoid?: boolean
}

const cases: Case[] = [
  { name: "10 classes, one-hot, the mean", shape: [21, 10], scale: 2, sparse: false, mean: true },
  { name: "37 classes, class ids, each row's loss", shape: [9, 37], scale: 3, sparse: true, mean: false },
  { name: "saturated rows (logits about 40: the clip at ε and 1 − ε)", shape: [16, 10], scale: 40, sparse: false, mean: true },
  { name: "rank 3, class ids, the mean", shape: [4, 5, 7], scale: 2, sparse: true, mean: true },
  { name: "soft targets, each row's loss", shape: [6, 12], scale: 2, sparse: false, soft: true, mean: false },
  { name: "rows that do not sum to 1 (a sigmoid's), the mean", shape: [8, 6], scale: 3, sparse: false, mean: true, sigmoid: true }
]

/** Logits, targets (ids, one-hot or soft rows) and an upstream gradient for each row's loss. */
const inputsOf = (c: Case, seed: number): { z: Tensor; ids: Tensor; dense: Tensor; dy: Tensor } => {
  const C = c.shape[c.shape.length - 1]!
  const lead = c.shape.slice(0, -1)
  const rows = lead.reduce((a, b) => a * b, 1)
  const z = tf.tensor(seeded(rows * C, seed, c.scale), c.shape)
  const ids = tf.tensor(Int32Array.from(seeded(rows, seed + 1), (v) => Math.floor(((v + 1) / 2) * C) % C), lead, "int32")
  const dense = c.soft ? tf.softmax(tf.tensor(seeded(rows * C, seed + 2, 2), c.shape)) : tf.oneHot(tf.reshape(ids, [rows]), C).reshape(c.shape)
  const dy = tf.tensor(seeded(rows, seed + 3, 1, 1.5), lead)
  return { z, ids, dense, dy }
}

/** The loss and the logits' gradient through a softmax, by `loss`. */
const lossAndGrad = (c: Case, seed: number, loss: (targets: Tensor, probs: Tensor) => Tensor): Tensor[] => {
  const { z, ids, dense, dy } = inputsOf(c, seed)
  const targets = c.sparse ? ids : dense
  const f = (logits: Tensor): Tensor => {
    const l = loss(targets, c.sigmoid ? tf.sigmoid(logits) : tf.softmax(logits))
    return c.mean ? l : tf.sum(tf.mul(l, dy))
  }
  const value = tf.tidy(() => f(z))
  const grad = tf.grad(f)(z)
  tf.dispose([z, ids, dense, dy])
  return [value, grad]
}

const ours = (c: Case) => (t: Tensor, p: Tensor) => probCrossEntropy(tf, t, p, { sparse: c.sparse, mean: c.mean })
const theirs = (c: Case) => (t: Tensor, p: Tensor) => {
  const C = p.shape[p.rank - 1]!
  const rows = tf.metrics.categoricalCrossentropy(c.sparse ? tf.oneHot(t.flatten(), C).reshape(p.shape) : t, p)
  return c.mean ? rows.mean() : rows
}

describe("a compiled model's cross-entropy on probabilities as one kernel", () => {
  for (const backend of ["wasm", "cpu"]) {
    for (const [i, c] of cases.entries()) {
      it(`${backend}, ${c.name}: the loss and the logits' gradient through the output's activation as tfjs-layers' categoricalCrossentropy gives them`, async () => {
        await tf.setBackend(backend)
        try {
          const before = { ...probCrossEntropyStats }
          const a = lossAndGrad(c, 11 + i, ours(c))
          const b = lossAndGrad(c, 11 + i, theirs(c))
          expect(await worst(a, b)).toBeLessThan(2e-5)
          // the loss is not a constant: a NaN-free value well above 0 (the saturated case's wrong rows clip at −log ε)
          expect(Number.isFinite((await a[0]!.data())[0]!)).toBe(true)
          expect(probCrossEntropyStats.forward - before.forward).toBeGreaterThanOrEqual(2)
          expect(probCrossEntropyStats.backward - before.backward).toBe(1)
          // softmax's gradient is one kernel under either loss
          expect(probCrossEntropyStats.softmaxGrad - before.softmaxGrad).toBe(c.sigmoid ? 0 : 2)
          tf.dispose([...a, ...b])
        } finally {
          await tf.setBackend("wasm")
        }
      })
    }
    it(`${backend}: one kernel forward, one for its gradient and one for softmax's, where tfjs took some forty`, async () => {
      await tf.setBackend(backend)
      try {
        const c = cases[0]!
        const a = await kernelsOf(tf, () => lossAndGrad(c, 5, ours(c)))
        const b = await kernelsOf(tf, () => lossAndGrad(c, 5, theirs(c)))
        expect(a.filter((k) => k === PROB_CROSS_ENTROPY)).toHaveLength(2)
        expect(a.filter((k) => k === PROB_CROSS_ENTROPY_GRAD)).toHaveLength(1)
        expect(a.filter((k) => k === SOFTMAX_GRAD)).toHaveLength(1)
        expect(b).not.toContain(PROB_CROSS_ENTROPY)
        expect(a.length).toBeLessThan(b.length / 2)
      } finally {
        await tf.setBackend("wasm")
      }
    })
  }

  it("softmax's gradient as one kernel: y · (dy − Σ dy · y) per row, for a rank-3 softmax and any upstream gradient", async () => {
    const z = tf.tensor3d(seeded(2 * 3 * 6, 3, 2), [2, 3, 6])
    const w = tf.tensor3d(seeded(2 * 3 * 6, 4, 1), [2, 3, 6])
    const before = probCrossEntropyStats.softmaxGrad
    const g = tf.grad((x: Tensor) => tf.sum(tf.mul(tf.softmax(x), w)))(z)
    expect(probCrossEntropyStats.softmaxGrad - before).toBe(1)
    const y = await tf.softmax(z).data()
    const wv = await w.data()
    const expected = new Float32Array(36)
    for (let r = 0; r < 6; r++) {
      let dot = 0
      for (let j = 0; j < 6; j++) dot += wv[r * 6 + j]! * y[r * 6 + j]!
      for (let j = 0; j < 6; j++) expected[r * 6 + j] = y[r * 6 + j]! * (wv[r * 6 + j]! - dot)
    }
    expect(farthest((await g.data()) as Float32Array, expected)).toBeLessThan(1e-6)
    tf.dispose([z, w, g])
  })

  it("says what is wrong when the targets do not fit the probabilities", () => {
    const p = tf.softmax(tf.tensor2d(seeded(12, 9), [3, 4]))
    expect(() => probCrossEntropy(tf, tf.tensor1d([0, 1], "int32"), p, { sparse: true, mean: true })).toThrow(/3 rows of 4 probabilities .* one class id per row/)
    expect(() => probCrossEntropy(tf, tf.ones([3, 5]), p, { sparse: false, mean: true })).toThrow(/rows of 4/)
    // a float class id counts as its integer part, as tfjs's toInt makes it
    const a = probCrossEntropy(tf, tf.tensor1d([0.7, 3.2, 2]), p, { sparse: true, mean: false })
    const b = probCrossEntropy(tf, tf.tensor1d([0, 3, 2], "int32"), p, { sparse: true, mean: false })
    expect(farthest(a.dataSync(), b.dataSync())).toBe(0)
    tf.dispose([p, a, b])
  })
})

describe("correct predictions as one kernel", () => {
  for (const backend of ["wasm", "cpu"]) {
    it(`${backend}: the count tfjs's argMax, equal and sum give, for one-hot rows, soft rows, class ids (float ids too) and ties`, async () => {
      await tf.setBackend(backend)
      try {
        const N = 40
        const C = 7
        // every fifth row ties two classes at its maximum: the first one counts, as tfjs's argMax
        const values = seeded(N * C, 31, 1)
        for (let r = 0; r < N; r += 5) values[r * C + 4] = values[r * C + 2] = 5
        const p = tf.tensor2d(values, [N, C])
        const ids = tf.tensor1d(Int32Array.from(seeded(N, 32), (v, r) => (r % 3 === 0 ? tf.argMax(p.slice([r, 0], [1, C]), 1).dataSync()[0]! : Math.floor(((v + 1) / 2) * C) % C)), "int32")
        const tfjs = async (t: Tensor): Promise<number> => (await p.argMax(-1).equal(t.rank > 1 && t.shape[t.rank - 1]! > 1 ? t.argMax(-1) : t.flatten().toInt()).sum().data())[0]!
        const soft = tf.softmax(tf.tensor2d(seeded(N * C, 33, 3), [N, C]))
        for (const t of [ids, tf.oneHot(ids, C), soft, tf.add(tf.cast(ids, "float32"), 0.4), tf.reshape(ids, [N, 1])]) {
          const before = probCrossEntropyStats.correct
          const got = correctPredictions(tf, p, t)!
          expect(probCrossEntropyStats.correct - before).toBe(1)
          const want = await tfjs(t)
          expect((await got.data())[0]).toBe(want)
          // every third row's id is its prediction: counted rows, not a constant
          if (t !== soft) expect(want).toBeGreaterThan(N / 3 - 1)
        }
        // rank 3 with one-hot rows per position
        const seq = tf.reshape(p, [5, 8, C])
        expect((await correctPredictions(tf, seq, tf.reshape(tf.oneHot(ids, C), [5, 8, C]))!.data())[0]).toBe(await tfjs(ids))
        // targets that fit neither form: left to the caller
        expect(correctPredictions(tf, p, tf.ones([N, C + 1]))).toBeUndefined()
        expect(await kernelsOf(tf, () => [correctPredictions(tf, p, ids)!])).toEqual(expect.arrayContaining([CORRECT_COUNT]))
        tf.dispose([p, ids, soft, seq])
      } finally {
        await tf.setBackend("wasm")
      }
    })
  }
})

describe("a data-parallel step with a compiled categoricalCrossentropy", () => {
  const solo: GradientSync = { rank: 0, worldSize: 1, reduceGradients: async () => {}, broadcast: async () => {}, sum: async () => {} } as never
  const model = (loss: unknown) => {
    const init = (s: number) => tf.initializers.glorotUniform({ seed: s })
    const m = tf.sequential()
    m.add(tf.layers.dense({ units: 16, activation: "relu", inputShape: [8], kernelInitializer: init(1) }))
    m.add(tf.layers.dense({ units: 5, activation: "softmax", kernelInitializer: init(2) }))
    m.compile({ optimizer: tf.train.sgd(0.5), loss: loss as never })
    return m
  }

  it("takes the step tfjs-layers' loss takes: the same losses and weights after 20 steps, in fewer kernels", async () => {
    const x = tf.tensor2d(seeded(32 * 8, 21, 2), [32, 8])
    const ids = tf.tensor1d(Int32Array.from(seeded(32, 22), (v) => Math.floor(((v + 1) / 2) * 5) % 5), "int32")
    const y = tf.oneHot(ids, 5)
    const a = await DataParallelModel.prepare(tf, model("categoricalCrossentropy"), solo)
    const b = await DataParallelModel.prepare(tf, model("categoricalCrossentropy"), solo, { loss: ((yt: Tensor, yp: Tensor) => tf.metrics.categoricalCrossentropy(yt, yp).mean()) as never })
    a.exchangeAlone = true
    b.exchangeAlone = true
    const la: number[] = []
    const lb: number[] = []
    for (let i = 0; i < 20; i++) {
      la.push((await a.trainStep(x, y)).loss)
      lb.push((await b.trainStep(x, y)).loss)
    }
    // training moved: the loss fell
    expect(la[19]!).toBeLessThan(la[0]! * 0.9)
    expect(farthest(la, lb)).toBeLessThan(1e-5)
    const wa = a.model.getWeights()
    const wb = b.model.getWeights()
    expect(await worst(wa, wb)).toBeLessThan(1e-5)
    const step = async (dp: DataParallelModel) => (await tf.profile(async () => void (await dp.trainStep(x, y)))).kernels.length
    expect(await step(a)).toBeLessThan((await step(b)) - 20)
    tf.dispose([x, ids, y])
  })
})
