// core/kernels/train-layers.ts, Dense: a dense layer while training as one kernel forward (the
// backend's _FusedMatMul with the bias and a ReLU) whose gradient tfjs computes per input, against
// tfjs-layers' own call (useDenseTrain(false)), on wasm and cpu: every variable's gradient and the
// loss for ReLU, linear, softmax and tanh layers, with and without a bias, on rank-2 and rank-3
// inputs; the kernels a step runs (no gradient for the data, fewer kernels); inference unchanged; a
// gradient asked of the data itself. The webgpu backend's runs in test/webgpu-layer-coverage.test.ts.
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { farthest, kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { DENSE_TRAIN, useDenseTrain } from "../core/kernels/train-layers.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel

let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})
afterEach(async () => {
  useDenseTrain(true)
  await tf.setBackend("wasm")
})

/** Dense layers of every kind the kernel takes or hands on: relu with a bias, linear without, tanh, softmax last. */
const mlp = (inputShape: number[]): LayersModel => {
  const L = tf.layers
  const init = (s: number) => tf.initializers.glorotUniform({ seed: s })
  const bias = (s: number) => tf.initializers.randomNormal({ seed: s, stddev: 0.2 })
  const m = tf.sequential()
  m.add(L.dense({ inputShape, units: 12, activation: "relu", kernelInitializer: init(1), biasInitializer: bias(11) }))
  m.add(L.dense({ units: 8, useBias: false, kernelInitializer: init(2) }))
  m.add(L.dense({ units: 8, activation: "tanh", kernelInitializer: init(3), biasInitializer: bias(13) }))
  m.add(L.dense({ units: 5, activation: "softmax", kernelInitializer: init(4), biasInitializer: bias(14) }))
  return m
}

/** The loss Σ w·output and every variable's gradient (and, with `ofData`, the data's). */
const lossAndGrads = (m: LayersModel, x: Tensor, ofData = false): Tensor[] => {
  const out = m.outputs[0]!.shape
  const w = tf.tensor(seeded(x.shape.slice(0, -1).reduce((a, b) => a * b, 1) * (out[out.length - 1] as number), 3, 1), [...x.shape.slice(0, -1), out[out.length - 1] as number])
  const f = () => tf.sum(tf.mul(m.apply(x, { training: true }) as Tensor, w)) as import("@tensorflow/tfjs").Scalar
  const { value, grads } = tf.variableGrads(f, m.trainableWeights.map((v) => (v as unknown as { val: import("@tensorflow/tfjs").Variable }).val))
  const all = [value, ...Object.values(grads)]
  if (ofData) all.push(tf.grad((xx: Tensor) => tf.sum(tf.mul(m.apply(xx, { training: true }) as Tensor, w)))(x))
  w.dispose()
  return all
}

describe("dense layers while training as one kernel", () => {
  for (const backend of ["wasm", "cpu"]) {
    for (const shape of [[6], [3, 6]]) {
      it(`${backend}, inputs of rank ${shape.length + 1}: the loss and every gradient as tfjs-layers' own call gives them, in fewer kernels, none for the data`, async () => {
        await tf.setBackend(backend)
        const m = mlp(shape)
        const x = tf.tensor(seeded(7 * shape.reduce((a, b) => a * b, 1), 5, 1.5), [7, ...shape])
        useDenseTrain(false)
        const theirs = lossAndGrads(m, x)
        const theirKernels = await kernelsOf(tf, () => lossAndGrads(m, x))
        useDenseTrain(true)
        const ours = lossAndGrads(m, x)
        const ourKernels = await kernelsOf(tf, () => lossAndGrads(m, x))
        expect(await worst(ours, theirs)).toBeLessThan(1e-5)
        // the gradients are not zero: the loss depends on every layer
        for (const g of ours.slice(1)) expect(Math.max(...Array.from(await g.abs().data()))).toBeGreaterThan(1e-4)
        expect(ourKernels.filter((k) => k === DENSE_TRAIN)).toHaveLength(4)
        expect(theirKernels).not.toContain(DENSE_TRAIN)
        // 4 layers' forward products and 3 data gradients (none for the first layer's input), 4 kernel gradients
        expect(ourKernels.filter((k) => k === "BatchMatMul")).toHaveLength(7)
        expect(ourKernels.length).toBeLessThan(theirKernels.length - 12)
        tf.dispose([...ours, ...theirs, x])
        m.dispose()
      })
    }
  }

  it("inference runs tfjs-layers' own call, and a gradient of the data itself is still computed and right", async () => {
    const m = mlp([6])
    const x = tf.tensor2d(seeded(4 * 6, 9, 1), [4, 6])
    const kernels = await kernelsOf(tf, () => [m.predict(x) as Tensor])
    expect(kernels).not.toContain(DENSE_TRAIN)
    useDenseTrain(false)
    const theirs = lossAndGrads(m, x, true)
    useDenseTrain(true)
    const ours = lossAndGrads(m, x, true)
    expect(farthest(ours[ours.length - 1]!.dataSync(), theirs[theirs.length - 1]!.dataSync())).toBeLessThan(1e-5)
    expect(Math.max(...Array.from(ours[ours.length - 1]!.abs().dataSync()))).toBeGreaterThan(1e-4)
    tf.dispose([...ours, ...theirs, x])
    m.dispose()
  })

  it("a model trained by fit() with the kernel ends where tfjs-layers' own call ends", async () => {
    const x = tf.tensor2d(seeded(32 * 6, 21, 1), [32, 6])
    const y = tf.oneHot(tf.tensor1d(Int32Array.from(seeded(32, 22), (v) => Math.floor(((v + 1) / 2) * 5) % 5), "int32"), 5)
    const run = async (on: boolean): Promise<{ loss: number; weights: Tensor[] }> => {
      useDenseTrain(on)
      const m = mlp([6])
      m.compile({ optimizer: tf.train.sgd(0.3), loss: "categoricalCrossentropy" })
      const h = await m.fit(x, y, { epochs: 8, batchSize: 8, shuffle: false, verbose: 0 })
      const weights = m.getWeights().map((w) => w.clone())
      m.dispose()
      return { loss: h.history.loss!.at(-1) as number, weights }
    }
    const a = await run(true)
    const b = await run(false)
    expect(Math.abs(a.loss - b.loss)).toBeLessThan(1e-5)
    expect(await worst(a.weights, b.weights)).toBeLessThan(1e-4)
    tf.dispose([x, y, ...a.weights, ...b.weights])
  })
})
