// The data-parallel wrapper's math, with ranks as models in one process joined by an in-process
// rendezvous (the network path is covered by the trainer's integration tests).
import { describe, expect, it } from "vitest"
import { loadEngine, type Tf } from "../core/engine.ts"
import { DataParallelModel, type GradientSync } from "../actors/train/worker/data-parallel.ts"
import { clipFlat } from "../actors/train/worker/clipping.ts"
import { ConfigError } from "../core/errors.ts"

/**
 * p ranks in one process: each collective waits for all p contributions. With `buffers`, each
 * rank's sync hands out that rank's buffer as its gradientBuffer.
 */
const localGroup = (p: number, buffers?: Float32Array[]): GradientSync[] => {
  let pending: Array<{ buf: Float32Array; weight: number; resolve: () => void; kind: string }> = []
  const arrive = (rank: number, kind: string, buf: Float32Array, weight: number) =>
    new Promise<void>((resolve) => {
      pending[rank] = { buf, weight, resolve, kind }
      if (pending.filter(Boolean).length < p) return
      const all = pending
      pending = []
      const n = all[0].buf.length
      const out = new Float32Array(n)
      if (kind === "broadcast") out.set(all[0].buf)
      else {
        const total = kind === "grad" ? all.reduce((a, e) => a + e.weight, 0) : 1
        for (const e of all) for (let i = 0; i < n; i++) out[i] += (kind === "grad" ? e.weight / total : 1) * e.buf[i]
      }
      for (const e of all) {
        e.buf.set(out)
        e.resolve()
      }
    })
  return Array.from({ length: p }, (_, rank) => ({
    rank,
    worldSize: p,
    reduceGradients: (flat, _layout, weight) => arrive(rank, "grad", flat, weight),
    broadcast: (buf) => arrive(rank, "broadcast", buf, 1),
    sum: (buf) => arrive(rank, "sum", buf, 1),
    ...(buffers ? { gradientBuffer: (n: number) => (buffers[rank].length === n ? buffers[rank] : undefined) } : {})
  }))
}

const makeModel = (tf: Tf, seed: number) => {
  const m = tf.sequential()
  m.add(tf.layers.dense({ units: 8, inputShape: [4], activation: "tanh", kernelInitializer: tf.initializers.glorotUniform({ seed }) }))
  m.add(tf.layers.dense({ units: 3, activation: "softmax", kernelInitializer: tf.initializers.glorotUniform({ seed: seed + 1 }) }))
  m.compile({ optimizer: tf.train.sgd(0.5), loss: "categoricalCrossentropy" })
  return m
}

const weightsOf = (m: { getWeights(): Array<{ dataSync(): ArrayLike<number> }> }) => m.getWeights().map((w) => Array.from(w.dataSync()))

describe("data-parallel wrapper", () => {
  it("a learning-rate schedule the loop sets itself is followed under warmupSteps and the elastic scale, not set back", async () => {
    const { tf } = await loadEngine("auto")
    const x = tf.randomNormal([8, 4], 0, 1, "float32", 3)
    const y = tf.oneHot(tf.tensor1d([0, 1, 2, 0, 1, 2, 0, 1], "int32"), 3)
    const rates = async (dp: DataParallelModel, model: ReturnType<typeof makeModel>, schedule: Record<number, number>, steps: number) => {
      const out: number[] = []
      for (let step = 0; step < steps; step++) {
        const lr = schedule[step]
        if (lr !== undefined) (model.optimizer as unknown as { setLearningRate(lr: number): void }).setLearningRate(lr)
        await dp.trainStep(x, y)
        out.push(Number(dp.learningRate!.toFixed(6)))
      }
      return out
    }
    // warmupSteps 4 (factor (step + 1) / 4): the loop's 0.1 before step 2 and 0.01 before step 4 are the base from then on.
    const warm = makeModel(tf, 5)
    const warmDp = await DataParallelModel.prepare(tf, warm, localGroup(1)[0]!, { warmupSteps: 4 })
    expect(await rates(warmDp, warm, { 2: 0.1, 4: 0.01 }, 6)).toEqual([0.125, 0.25, 0.075, 0.1, 0.01, 0.01])
    // An elastic group at 1 of its 4 workers under "keep-per-worker" scales the rate by 1/4, the loop's own too.
    const sync = { ...localGroup(1)[0]!, elastic: { maxWorkers: 4, batch: "keep-per-worker" as const } }
    const el = makeModel(tf, 6)
    const elDp = await DataParallelModel.prepare(tf, el, sync)
    expect(await rates(elDp, el, { 1: 0.2 }, 3)).toEqual([0.125, 0.05, 0.05])
    // dp.setLearningRate, the typed form: the base from the next update on; a bad rate is refused.
    warmDp.setLearningRate(0.2)
    await warmDp.trainStep(x, y)
    expect(warmDp.learningRate).toBeCloseTo(0.2, 6)
    elDp.setLearningRate(0.4)
    await elDp.trainStep(x, y)
    expect(elDp.learningRate).toBeCloseTo(0.1, 6)
    expect(() => elDp.setLearningRate(-1)).toThrow(/dp\.setLearningRate.*finite rate >= 0, got -1/)
    expect(() => elDp.setLearningRate(Number.NaN)).toThrow(ConfigError)
    tf.dispose([x, y])
  })

  it("starts every rank from rank 0's weights and equals large-batch SGD", async () => {
    const { tf } = await loadEngine("auto")
    const syncs = localGroup(2)
    const models = [makeModel(tf, 1), makeModel(tf, 99)]
    const reference = makeModel(tf, 1)
    const dps = await Promise.all(models.map((m, r) => DataParallelModel.prepare(tf, m, syncs[r])))
    expect(weightsOf(models[1])).toEqual(weightsOf(models[0]))

    const xs = [tf.randomNormal([5, 4], 0, 1, "float32", 3), tf.randomNormal([3, 4], 0, 1, "float32", 4)]
    const ys = [tf.oneHot(tf.tensor1d([0, 1, 2, 1, 0], "int32"), 3), tf.oneHot(tf.tensor1d([2, 2, 1], "int32"), 3)]
    for (let step = 0; step < 3; step++) await Promise.all(dps.map((dp, r) => dp.trainStep(xs[r], ys[r])))
    const w0 = weightsOf(models[0])
    expect(weightsOf(models[1])).toEqual(w0)

    // The same three steps on the concatenated batch of 8: the weighted mean makes them equal.
    const refDp = await DataParallelModel.prepare(tf, reference, localGroup(1)[0])
    const x = tf.concat(xs)
    const y = tf.concat(ys)
    for (let step = 0; step < 3; step++) await refDp.trainStep(x, y)
    const wr = weightsOf(reference)
    wr.forEach((w, i) => w.forEach((v, j) => expect(w0[i][j]).toBeCloseTo(v, 5)))
  })

  it("reads the gradients into the group's own buffer when it offers one, with the same result", async () => {
    const { tf } = await loadEngine("auto")
    const params = 4 * 8 + 8 + 8 * 3 + 3
    const buffers = [new Float32Array(params), new Float32Array(params)]
    const seen: Float32Array[] = []
    const withBuffers = localGroup(2, buffers).map((s) => ({
      ...s,
      reduceGradients: (flat: Float32Array, layout: ReadonlyArray<{ offset: number; size: number }>, weight: number, step: number) => {
        seen.push(flat)
        return s.reduceGradients(flat, layout as never, weight, step)
      }
    }))
    const run = async (syncs: GradientSync[]) => {
      const dps = await Promise.all([makeModel(tf, 7), makeModel(tf, 8)].map((m, r) => DataParallelModel.prepare(tf, m, syncs[r])))
      const xs = [tf.randomNormal([5, 4], 0, 1, "float32", 5), tf.randomNormal([3, 4], 0, 1, "float32", 6)]
      const ys = [tf.oneHot(tf.tensor1d([0, 1, 2, 1, 0], "int32"), 3), tf.oneHot(tf.tensor1d([2, 2, 1], "int32"), 3)]
      for (let step = 0; step < 3; step++) {
        // whatever the buffers held before must not leak into the step
        for (const b of buffers) b.fill(NaN)
        await Promise.all(dps.map((dp, r) => dp.trainStep(xs[r], ys[r])))
      }
      return weightsOf(dps[0].model)
    }
    const plain = await run(localGroup(2))
    expect(seen).toEqual([])
    const buffered = await run(withBuffers)
    expect(buffered).toEqual(plain)
    // every step of both ranks reduced in place in that rank's buffer
    expect(seen.length).toBe(6)
    expect(seen.filter((f) => f === buffers[0]).length).toBe(3)
    expect(seen.filter((f) => f === buffers[1]).length).toBe(3)
  })

  it("fit() trains on shards and reports metrics over all ranks", async () => {
    const { tf } = await loadEngine("auto")
    const syncs = localGroup(2)
    // A separable toy problem: the class is the index of the largest of the first 3 features.
    const n = 240
    const x = new Float32Array(n * 4).map((_, i) => Math.sin(i * 12.9898) * 0.5 + ((i % 4) === 3 ? 0 : 0))
    const y = new Int32Array(n)
    for (let i = 0; i < n; i++) {
      const a = x.subarray(i * 4, i * 4 + 3)
      y[i] = a[0] >= a[1] && a[0] >= a[2] ? 0 : a[1] >= a[2] ? 1 : 2
    }
    const dataset = { x, y, size: n, featureShape: [4], numClasses: 3 }
    const dps = await Promise.all([makeModel(tf, 5), makeModel(tf, 6)].map((m, r) => DataParallelModel.prepare(tf, m, syncs[r])))
    const seen: number[][] = [[], []]
    const results = await Promise.all(
      dps.map((dp, r) =>
        dp.fit(
          { dataset, rows: (epoch) => Array.from({ length: n / 2 }, (_, i) => ((i * 2 + r + epoch * 2) % n)) },
          { epochs: 15, batchSize: 16, onEpochEnd: (e) => void seen[r].push(e.loss) }
        )
      )
    )
    expect(results[0].at(-1)!.samples).toBe(n)
    expect(results[0].map((e) => e.loss)).toEqual(results[1].map((e) => e.loss))
    expect(results[0].at(-1)!.loss).toBeLessThan(results[0][0].loss)
    expect(results[0].at(-1)!.accuracy).toBeGreaterThan(0.8)
    expect(weightsOf(dps[0].model)).toEqual(weightsOf(dps[1].model))
  })

  it("fit({ seed }) reshuffles an in-memory shard by its seed, and a streamed dataset refuses it (the Trainer's seed orders it)", async () => {
    const { tf } = await loadEngine("auto")
    const [sync] = localGroup(1)
    const dp = await DataParallelModel.prepare(tf, makeModel(tf, 5), sync!)
    const n = 32
    const dataset = { x: new Float32Array(n * 4).map((_, i) => Math.sin(i)), y: new Int32Array(n).map((_, i) => i % 3), size: n, featureShape: [4], numClasses: 3 }
    const seeds: Array<number | undefined> = []
    await dp.fit({ dataset, rows: (_epoch, seed) => (seeds.push(seed), Array.from({ length: n }, (_, i) => i)) }, { epochs: 2, batchSize: 16, seed: 7 })
    await dp.fit({ dataset, rows: (_epoch, seed) => (seeds.push(seed), Array.from({ length: n }, (_, i) => i)) }, { epochs: 1, batchSize: 16 })
    expect(seeds).toEqual([7, 7, undefined])
    const stream = { streaming: true as const, featureShape: [4], numClasses: 3, openEpoch: () => 0, take: () => Promise.reject(new Error("not read")) }
    await expect(dp.fit(stream, { epochs: 1, batchSize: 16, seed: 7 })).rejects.toThrow(/fit\.seed.*a streamed dataset .* give new Trainer\(\{ seed \}\) instead/)
  })

  it("routes the model's own fit and trainOnBatch through the group once prepared (each trained one rank alone), refuses fitDataset, keeps evaluate and predict", async () => {
    const { tf } = await loadEngine("auto")
    const syncs = localGroup(2)
    const models = [makeModel(tf, 11), makeModel(tf, 12)]
    const n = 48
    const x = tf.randomNormal([n, 4], 0, 1, "float32", 7)
    // the class: which of the first three features is largest
    const ids = tf.tidy(() => x.slice([0, 0], [n, 3]).argMax(-1))
    const y = tf.oneHot(ids as import("@tensorflow/tfjs").Tensor1D, 3)
    // before prepareModel the model is the user's own: its fit trains it alone
    const before = weightsOf(models[0])
    await models[0].fit(x, y, { epochs: 1, verbose: 0 })
    expect(weightsOf(models[0])).not.toEqual(before)
    await Promise.all(models.map((m, r) => DataParallelModel.prepare(tf, m, syncs[r])))
    // model.fit: every rank the whole data, the global batch split, the group's metrics; callbacks per epoch
    const seen: number[][] = [[], []]
    const histories = await Promise.all(
      models.map((m, r) => m.fit(x, y, { epochs: 12, batchSize: 8, validationSplit: 0.25, callbacks: { onEpochEnd: async (e) => void seen[r].push(e) } }))
    )
    expect(weightsOf(models[1])).toEqual(weightsOf(models[0]))
    for (const h of histories) {
      expect(h.epoch).toEqual([...Array(12).keys()])
      expect(Object.keys(h.history).sort()).toEqual(["acc", "loss", "val_acc", "val_loss"])
      expect(h.history.loss.at(-1) as number).toBeLessThan(h.history.loss[0] as number)
    }
    expect(histories[1].history).toEqual(histories[0].history)
    expect(seen).toEqual([[...Array(12).keys()], [...Array(12).keys()]])
    // model.trainOnBatch: one step on each rank's own batch, all-reduced
    const w = weightsOf(models[0])
    const losses = await Promise.all(models.map((m, r) => m.trainOnBatch(x.slice(r * 8, 8), y.slice(r * 8, 8))))
    expect(losses.every((l) => typeof l === "number" && Number.isFinite(l))).toBe(true)
    expect(weightsOf(models[1])).toEqual(weightsOf(models[0]))
    expect(weightsOf(models[0])).not.toEqual(w)
    // fitDataset: refused, naming what to call
    const e = await models[1].fitDataset(tf.data.array([]), { epochs: 1 }).then(() => undefined, (err: unknown) => err)
    expect(e).toBeInstanceOf(ConfigError)
    expect((e as ConfigError).message).toMatch(/would train rank 1 alone.*model\.fit\(x, y.*dp\.trainStep\(x, y\)/)
    // arguments it does not take are refused, not ignored
    await expect(models[0].fit(x, y, { stepsPerEpoch: 3 })).rejects.toThrow(/model\.fit\(stepsPerEpoch\).*is not taken/)
    // inference and evaluation are the model's own still
    expect((models[1].predict(x) as import("@tensorflow/tfjs").Tensor).shape).toEqual([n, 3])
    expect(Number.isFinite((models[1].evaluate(x, y) as import("@tensorflow/tfjs").Scalar).dataSync()[0])).toBe(true)
  })

  it("model.fit on a prepared model: class ids, float targets and tf.callbacks.earlyStopping", async () => {
    const { tf } = await loadEngine("auto")
    const m = tf.sequential()
    m.add(tf.layers.dense({ units: 3, inputShape: [4], activation: "softmax" }))
    m.compile({ optimizer: tf.train.sgd(0.5), loss: "sparseCategoricalCrossentropy" })
    await DataParallelModel.prepare(tf, m, localGroup(1)[0])
    const x = tf.randomNormal([40, 4], 0, 1, "float32", 3)
    const ids = tf.tidy(() => x.slice([0, 0], [40, 3]).argMax(-1).cast("float32"))
    const h = await m.fit(x, ids, { epochs: 30, batchSize: 10, validationData: [x, ids], callbacks: [tf.callbacks.earlyStopping({ monitor: "val_loss", patience: 0, minDelta: 10 })] })
    // minDelta 10: no epoch improves on the first by that much, so it stops after patience + 1 more
    expect(h.epoch).toEqual([0, 1])
    expect(h.history.val_acc).toHaveLength(2)
    const r = tf.sequential()
    r.add(tf.layers.dense({ units: 2, inputShape: [4] }))
    r.compile({ optimizer: tf.train.sgd(0.05), loss: "meanSquaredError" })
    await DataParallelModel.prepare(tf, r, localGroup(1)[0])
    const target = tf.tidy(() => x.slice([0, 0], [40, 2]).mul(2))
    const hr = await r.fit(x, target, { epochs: 20, batchSize: 8 })
    expect(hr.history.acc).toBeUndefined()
    expect(hr.history.loss.at(-1) as number).toBeLessThan((hr.history.loss[0] as number) / 2)
  })

  it("fit's and model.fit's classWeight scale each row's loss by its class's weight (as Keras's class_weight)", async () => {
    const { tf } = await loadEngine("auto")
    const n = 96
    const x = new Float32Array(n * 4).map((_, i) => Math.sin(i * 7.31) * 0.7)
    const y = new Int32Array(n).map((_, i) => (x[i * 4]! > 0.2 ? 0 : x[i * 4 + 1]! > 0 ? 1 : 2))
    const dataset = { x, y, size: n, featureShape: [4], numClasses: 3 }
    const source = { dataset, rows: () => Array.from({ length: n }, (_, i) => i) }
    // the same model and optimizer, sparse or one-hot targets: only its loss and classWeight differ
    const fitted = async (loss: string, lr: number, classWeight?: Record<number, number> | number[]): Promise<number[][]> => {
      const m = makeModel(tf, 11)
      m.compile({ optimizer: tf.train.sgd(lr), loss })
      const dp = await DataParallelModel.prepare(tf, m, localGroup(1)[0])
      await dp.fit(source, { epochs: 2, batchSize: 16, ...(classWeight ? { classWeight } : {}) })
      return weightsOf(m)
    }
    const close = (a: number[][], b: number[][]): number => Math.max(...a.flatMap((w, i) => w.map((v, j) => Math.abs(v - b[i]![j]!))))
    for (const loss of ["sparseCategoricalCrossentropy", "categoricalCrossentropy"]) {
      // every class weighing 2 is twice the gradient: SGD at twice the rate
      expect(close(await fitted(loss, 0.2, { 0: 2, 1: 2, 2: 2 }), await fitted(loss, 0.4))).toBeLessThan(1e-5)
      // a class not named weighs 1
      expect(close(await fitted(loss, 0.2, { 1: 1 }), await fitted(loss, 0.2))).toBeLessThan(1e-6)
    }
    // weights by class as an array; every class at 0: nothing moves
    const start = weightsOf(makeModel(tf, 11))
    expect(close(await fitted("sparseCategoricalCrossentropy", 0.2, [0, 0, 0]), start)).toBe(0)
    // class 0 alone weighed differs from the unweighted run
    expect(close(await fitted("sparseCategoricalCrossentropy", 0.2, { 0: 5 }), await fitted("sparseCategoricalCrossentropy", 0.2))).toBeGreaterThan(1e-3)
    // bad weights, and a loss with no classes
    await expect(fitted("sparseCategoricalCrossentropy", 0.2, { 3: 1 })).rejects.toThrow(/names class "3", and the model's classes are 0\.\.2/)
    await expect(fitted("sparseCategoricalCrossentropy", 0.2, { 1: -1 })).rejects.toThrow(/class 1's weight must be a number >= 0/)
    await expect(fitted("meanSquaredError", 0.2, { 1: 2 })).rejects.toThrow(/needs a classification loss named in compile\(\)/)
    // model.fit takes it (tfjs's form too: a list of one map), where it was refused
    const m = makeModel(tf, 11)
    m.compile({ optimizer: tf.train.sgd(0.2), loss: "sparseCategoricalCrossentropy" })
    await DataParallelModel.prepare(tf, m, localGroup(1)[0])
    const xt = tf.tensor2d(x, [n, 4])
    const yt = tf.tensor1d(y, "float32")
    const h = await m.fit(xt, yt, { epochs: 1, batchSize: 16, shuffle: false, classWeight: [{ 0: 0, 1: 0, 2: 0 }] })
    expect(h.history.loss[0]).toBe(0)
    expect(close(weightsOf(m), start)).toBe(0)
    tf.dispose([xt, yt])
  })

  it("sampleWeight (dp.trainStep's, model.fit's) scales each row's loss by its own weight, as Keras's sample_weight", async () => {
    const { tf } = await loadEngine("auto")
    const n = 48
    const x = new Float32Array(n * 4).map((_, i) => Math.cos(i * 3.17) * 0.8)
    const y = new Int32Array(n).map((_, i) => (x[i * 4]! > 0.3 ? 0 : x[i * 4 + 1]! > 0 ? 1 : 2))
    const close = (a: number[][], b: number[][]): number => Math.max(...a.flatMap((w, i) => w.map((v, j) => Math.abs(v - b[i]![j]!))))
    const prepared = async (loss: string, lr: number) => {
      const m = makeModel(tf, 21)
      m.compile({ optimizer: tf.train.sgd(lr), loss })
      return { m, dp: await DataParallelModel.prepare(tf, m, localGroup(1)[0]) }
    }
    const xt = tf.tensor2d(x, [n, 4])
    const ids = tf.tensor1d(y, "float32")
    const targets = tf.tidy(() => tf.oneHot(tf.tensor1d(y, "int32"), 3).toFloat())
    // one step: every row weighing 2 is twice the gradient (a cross-entropy and meanSquaredError; numbers or a tensor)
    for (const [loss, yt] of [["sparseCategoricalCrossentropy", ids], ["meanSquaredError", targets]] as const) {
      const a = await prepared(loss, 0.1)
      await a.dp.trainStep(xt, yt, { sampleWeight: new Array(n).fill(2) })
      const b = await prepared(loss, 0.2)
      await b.dp.trainStep(xt, yt)
      expect(close(weightsOf(a.m), weightsOf(b.m))).toBeLessThan(1e-5)
      const c = await prepared(loss, 0.1)
      const w = tf.fill([n], 2)
      await c.dp.trainStep(xt, yt, { sampleWeight: w })
      expect(w.isDisposed).toBe(false)
      w.dispose()
      expect(close(weightsOf(c.m), weightsOf(a.m))).toBe(0)
    }
    const bad = await prepared("sparseCategoricalCrossentropy", 0.1)
    await expect(bad.dp.trainStep(xt, ids, { sampleWeight: [1, 2] })).rejects.toThrow(/holds 2 weights for a batch of 48 rows/)
    // model.fit: a row's weight its class's is classWeight; every row at 0 moves nothing
    const classW = [0.5, 3, 1]
    const byRow = Array.from(y, (c) => classW[c]!)
    const viaRows = await prepared("sparseCategoricalCrossentropy", 0.2)
    await viaRows.m.fit(xt, ids, { epochs: 2, batchSize: 16, sampleWeight: tf.tensor1d(byRow) } as never)
    const viaClasses = await prepared("sparseCategoricalCrossentropy", 0.2)
    await viaClasses.m.fit(xt, ids, { epochs: 2, batchSize: 16, classWeight: classW } as never)
    expect(close(weightsOf(viaRows.m), weightsOf(viaClasses.m))).toBeLessThan(1e-6)
    const unweighted = await prepared("sparseCategoricalCrossentropy", 0.2)
    await unweighted.m.fit(xt, ids, { epochs: 2, batchSize: 16 })
    expect(close(weightsOf(viaRows.m), weightsOf(unweighted.m))).toBeGreaterThan(1e-3)
    const zero = await prepared("sparseCategoricalCrossentropy", 0.2)
    const start = weightsOf(zero.m)
    await zero.m.fit(xt, ids, { epochs: 1, batchSize: 16, sampleWeight: new Array(n).fill(0) } as never)
    expect(close(weightsOf(zero.m), start)).toBe(0)
    await expect(zero.m.fit(xt, ids, { epochs: 1, batchSize: 16, sampleWeight: [1] } as never)).rejects.toThrow(/sampleWeight.*holds 1 weights for 48 rows/)
    tf.dispose([xt, ids, targets])
  })

  it("clips the reduced gradient by its global norm or by value (prepareModel clipNorm / clipValue), exchanged or in place", async () => {
    const { tf } = await loadEngine("auto")
    const sgd = (seed: number) => {
      const m = makeModel(tf, seed)
      m.compile({ optimizer: tf.train.sgd(1), loss: "categoricalCrossentropy" })
      return m
    }
    const flatOf = (m: ReturnType<typeof sgd>) => weightsOf(m).flat()
    const delta = (a: number[], b: number[]) => a.map((v, i) => v - b[i]!)
    const l2 = (d: number[]) => Math.sqrt(d.reduce((a, v) => a + v * v, 0))
    const x = tf.randomNormal([6, 4], 0, 3, "float32", 9)
    const y = tf.oneHot(tf.tensor1d([0, 1, 2, 2, 1, 0], "int32"), 3)
    // two ranks: the step moves the weights by lr x clipNorm exactly (the gradient is far longer), the same on both
    const syncs = localGroup(2)
    const pair = [sgd(21), sgd(22)]
    await Promise.all(pair.map((m, r) => DataParallelModel.prepare(tf, m, syncs[r], { clipNorm: 1e-3 })))
    const w0 = flatOf(pair[0])
    await Promise.all(pair.map((m) => m.trainOnBatch(x, y)))
    expect(flatOf(pair[1])).toEqual(flatOf(pair[0]))
    expect(l2(delta(flatOf(pair[0]), w0))).toBeCloseTo(1e-3, 6)
    // one rank (gradients applied where they are): the same
    const one = sgd(23)
    await DataParallelModel.prepare(tf, one, localGroup(1)[0], { clipNorm: 1e-3 })
    const w1 = flatOf(one)
    await one.trainOnBatch(x, y)
    expect(l2(delta(flatOf(one), w1))).toBeCloseTo(1e-3, 6)
    // by value: no weight moves by more than lr x clipValue, and some by exactly that
    for (const sync of [localGroup(1)[0], undefined]) {
      const m = sgd(24)
      const syncs2 = localGroup(2)
      const other = sgd(25)
      if (sync) await DataParallelModel.prepare(tf, m, sync, { clipValue: 1e-4 })
      else await Promise.all([m, other].map((mm, r) => DataParallelModel.prepare(tf, mm, syncs2[r], { clipValue: 1e-4 })))
      const before = flatOf(m)
      await Promise.all(sync ? [m.trainOnBatch(x, y)] : [m.trainOnBatch(x, y), other.trainOnBatch(x, y)])
      const d = delta(flatOf(m), before).map(Math.abs)
      expect(Math.max(...d)).toBeLessThanOrEqual(1e-4 * 1.002) // (the weights are float32: their differences round)
      expect(Math.max(...d)).toBeGreaterThan(0.998e-4)
    }
    // without clipping the same step moves the weights far more
    const free = sgd(23)
    await DataParallelModel.prepare(tf, free, localGroup(1)[0])
    const wf = flatOf(free)
    await free.trainOnBatch(x, y)
    expect(l2(delta(flatOf(free), wf))).toBeGreaterThan(0.01)
    // refused: not a positive number, or a strategy that has no whole reduced gradient on each rank
    await expect(DataParallelModel.prepare(tf, sgd(26), localGroup(1)[0], { clipNorm: 0 })).rejects.toThrow(/prepareModel\.clipNorm.*must be a number > 0/)
    await expect(DataParallelModel.prepare(tf, sgd(27), { ...localGroup(1)[0], strategy: "parameter-server" }, { clipNorm: 1 })).rejects.toThrow(/prepareModel\.clipNorm.*strategy "parameter-server" does not have/)
  })

  it("clipFlat: clamps, then scales to the norm only when longer, and returns the norm before", () => {
    const f = Float32Array.from([3, -4, 0])
    expect(clipFlat(f, undefined, 10)).toBeCloseTo(5, 6)
    expect(Array.from(f)).toEqual([3, -4, 0])
    expect(clipFlat(f, undefined, 1)).toBeCloseTo(5, 6)
    expect(Array.from(f).map((v) => Number(v.toFixed(6)))).toEqual([0.6, -0.8, 0])
    const g = Float32Array.from([3, -4, 0.5])
    clipFlat(g, 1, undefined)
    expect(Array.from(g)).toEqual([1, -1, 0.5])
  })

  it("trains a model of several inputs, given as an array or by input name, the same way", async () => {
    const { tf } = await loadEngine("auto")
    const twoInputs = (seed: number) => {
      const a = tf.input({ shape: [3], name: "wide" })
      const b = tf.input({ shape: [2], name: "deep" })
      const h = tf.layers.concatenate().apply([a, b]) as import("@tensorflow/tfjs").SymbolicTensor
      const out = tf.layers.dense({ units: 2, activation: "softmax", kernelInitializer: tf.initializers.glorotUniform({ seed }) }).apply(h) as import("@tensorflow/tfjs").SymbolicTensor
      const m = tf.model({ inputs: [a, b], outputs: out })
      m.compile({ optimizer: tf.train.sgd(0.5), loss: "sparseCategoricalCrossentropy" })
      return m
    }
    const wide = tf.randomNormal([4, 3], 0, 1, "float32", 1)
    const deep = tf.randomNormal([4, 2], 0, 1, "float32", 2)
    const y = tf.tensor1d([0, 1, 1, 0])
    const byArray = [twoInputs(31), twoInputs(32)]
    const byName = [twoInputs(33), twoInputs(34)]
    const a = localGroup(2)
    const b = localGroup(2)
    const dpA = await Promise.all(byArray.map((m, r) => DataParallelModel.prepare(tf, m, a[r])))
    const dpB = await Promise.all(byName.map((m, r) => DataParallelModel.prepare(tf, m, b[r])))
    // the same starting weights for both pairs (rank 0's of each), then the same steps
    byName.forEach((m) => m.setWeights(byArray[0].getWeights()))
    const before = weightsOf(byArray[0])
    const results = await Promise.all(dpA.map((dp) => dp.trainStep([wide, deep], y)))
    await Promise.all(dpB.map((dp) => dp.trainStep({ deep, wide }, y)))
    expect(results[0].samples).toBe(4)
    expect(weightsOf(byArray[1])).toEqual(weightsOf(byArray[0]))
    expect(weightsOf(byArray[0])).not.toEqual(before)
    expect(weightsOf(byName[0])).toEqual(weightsOf(byArray[0]))
    expect(Number.isFinite((await dpA[0].evaluateAsync([wide, deep], y)).loss)).toBe(true)
    // the model's own trainOnBatch too (routed to dp.trainStep)
    const losses = await Promise.all(byArray.map((m) => m.trainOnBatch([wide, deep], y)))
    expect(losses.every((l) => Number.isFinite(l as number))).toBe(true)
    expect(weightsOf(byArray[1])).toEqual(weightsOf(byArray[0]))
    await expect(dpA[0].trainStep({ wide }, y)).rejects.toThrow(/trainStep\(x\).*lack deep/)
  })

  it("evaluateAsync({ distributed: true }): each rank its part of the rows, the whole set's figures on every rank", async () => {
    const { tf } = await loadEngine("auto")
    for (const [p, n] of [[3, 10], [2, 7], [4, 3]] as const) {
      const syncs = localGroup(p)
      const models = Array.from({ length: p }, (_, r) => makeModel(tf, 5 + r))
      const dps = await Promise.all(models.map((m, r) => DataParallelModel.prepare(tf, m, syncs[r])))
      const x = tf.randomNormal([n, 4], 0, 1, "float32", 3)
      const y = tf.oneHot(tf.tensor1d(Array.from({ length: n }, (_, i) => i % 3), "int32"), 3)
      const whole = await dps[0]!.evaluateAsync(x, y)
      const before = tf.memory().numTensors
      const parts = await Promise.all(dps.map((dp) => dp.evaluateAsync(x, y, { distributed: true })))
      expect(tf.memory().numTensors).toBe(before)
      for (const r of parts) {
        expect(r.loss, `p=${p} n=${n}`).toBeCloseTo(whole.loss, 5)
        expect(r.accuracy).toBeCloseTo(whole.accuracy!, 6)
      }
      // each rank's own part differs from the whole (it is a part): the sums made the figures
      if (n >= p) expect(await dps[0]!.evaluateAsync(x.slice(0, Math.floor(n / p)), y.slice(0, Math.floor(n / p)))).not.toEqual(whole)
      tf.dispose([x, y])
    }
  })

  it("refuses a model without optimizer or loss", async () => {
    const { tf } = await loadEngine("auto")
    const m = tf.sequential()
    m.add(tf.layers.dense({ units: 1, inputShape: [2] }))
    await expect(DataParallelModel.prepare(tf, m, localGroup(1)[0])).rejects.toBeInstanceOf(ConfigError)
    await expect(DataParallelModel.prepare(tf, m, localGroup(1)[0], { optimizer: tf.train.sgd(0.1) })).rejects.toThrow(/loss/)
  })
})

describe("a group of one", () => {
  it("lets timers run between steps (a worker's heartbeat goes on during long loops)", async () => {
    const { tf } = await loadEngine("auto")
    const dp = await DataParallelModel.prepare(tf, makeModel(tf, 5), localGroup(1)[0])
    const x = tf.randomNormal([16, 4], 0, 1, "float32", 1)
    const y = tf.oneHot(tf.tensor1d(Array.from({ length: 16 }, (_, i) => i % 3), "int32"), 3)
    let fired = 0
    const timer = setInterval(() => fired++, 10)
    try {
      // Steps for 400 ms, with nothing but the steps awaited.
      const t0 = performance.now()
      let steps = 0
      while (performance.now() - t0 < 400) {
        await dp.trainStep(x, y, { accumulate: steps % 2 === 0 })
        steps++
      }
      expect(steps).toBeGreaterThan(10)
      expect(fired).toBeGreaterThan(2)
    } finally {
      clearInterval(timer)
      tf.dispose([x, y])
    }
  })
})
