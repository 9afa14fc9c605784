// core/kernels/train-layers.ts: Conv2D and Conv1D layers while training as one kernel forward (bias
// and ReLU in the same pass) whose gradient tfjs computes per input, so a model's first layer
// computes no gradient for its data (tfjs-core's fused conv2d computed it with the filter's).
// Against tfjs-layers' own calls (withTfjsTrainLayers), on wasm and cpu: every variable's gradient,
// the kernels run (no convolution input gradient for the data, no separate ReLU), a gradient asked
// of the data itself, and inference. The webgpu backend's runs in
// test/webgpu-layer-coverage.test.ts (every layer's gradients against the cpu backend's).
import { beforeAll, describe, expect, it } from "vitest"
import { kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { CONV2D_TRAIN, withTfjsTrainLayers } from "../core/kernels/train-layers.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel

let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

interface Case {
  readonly name: string
  readonly bias: boolean
  readonly strides: number
  readonly activation: "linear" | "relu"
}

const CASES: Case[] = [
  { name: "a linear stem without a bias (a ResNet's)", bias: false, strides: 1, activation: "linear" },
  { name: "a linear stem with a bias, stride 2", bias: true, strides: 2, activation: "linear" },
  { name: "a ReLU stem with a bias (LeNet's)", bias: true, strides: 1, activation: "relu" }
]

/** The case's stem, batch norm, a second ReLU conv with a bias (its input from the first), pooling and a dense layer. */
const model2d = (c: Case): LayersModel => {
  const L = tf.layers
  const m = tf.sequential()
  m.add(L.conv2d({ inputShape: [9, 9, 3], filters: 8, kernelSize: 3, strides: c.strides, padding: "same", useBias: c.bias, activation: c.activation, kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }), biasInitializer: tf.initializers.randomNormal({ seed: 5, stddev: 0.1 }) }))
  m.add(L.batchNormalization({}))
  m.add(L.conv2d({ filters: 8, kernelSize: 3, padding: "valid", activation: "relu", kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }), biasInitializer: tf.initializers.randomNormal({ seed: 6, stddev: 0.1 }) }))
  m.add(L.globalAveragePooling2d({}))
  m.add(L.dense({ units: 4, kernelInitializer: tf.initializers.glorotUniform({ seed: 3 }) }))
  return m
}

/** The zoo embedding model's shape: an embedding, a ReLU conv1d (its input from the embedding), pooling, a dense layer. */
const model1d = (strides: number): LayersModel => {
  const L = tf.layers
  const m = tf.sequential()
  m.add(L.embedding({ inputDim: 17, outputDim: 8, inputLength: 20, inputShape: [20], embeddingsInitializer: tf.initializers.randomNormal({ seed: 7 }) }))
  m.add(L.conv1d({ filters: 6, kernelSize: 5, strides, activation: "relu", kernelInitializer: tf.initializers.glorotUniform({ seed: 8 }), biasInitializer: tf.initializers.randomNormal({ seed: 9, stddev: 0.1 }) }))
  m.add(L.globalMaxPooling1d({}))
  m.add(L.dense({ units: 4, kernelInitializer: tf.initializers.glorotUniform({ seed: 10 }) }))
  return m
}

const images = (): Tensor => tf.tensor4d(seeded(5 * 9 * 9 * 3, 7), [5, 9, 9, 3])
const tokens = (): Tensor => tf.tensor2d(Int32Array.from(seeded(5 * 20, 11), (v) => Math.floor((v + 1) * 8.5)), [5, 20], "int32")

/** The loss and its gradient for every trainable weight of `m`, in order. */
const gradients = (m: LayersModel, x: Tensor): Tensor[] => {
  const { value, grads } = tf.variableGrads(() => tf.sum(tf.square(m.apply(x, { training: true }) as Tensor)) as import("@tensorflow/tfjs").Scalar)
  return [value, ...m.trainableWeights.map((w) => grads[w.originalName]!)]
}

const count = (names: string[], kernel: string): number => names.filter((k) => k === kernel).length

describe("convolution layers while training", () => {
  for (const backend of ["wasm", "cpu"]) {
    for (const c of CASES) {
      it(`${backend}, ${c.name}: every weight's gradient as tfjs-layers' own calls give it, no convolution input gradient for the data, no separate ReLU`, async () => {
        await tf.setBackend(backend)
        const m = model2d(c)
        const x = images()
        const ours = gradients(m, x)
        const theirs = withTfjsTrainLayers(tf, () => gradients(m, x))
        expect(ours).toHaveLength(m.trainableWeights.length + 1)
        expect(await worst(ours, theirs)).toBeLessThan(1e-5)
        const oursRan = await kernelsOf(tf, () => gradients(m, x))
        const theirsRan = await kernelsOf(tf, () => withTfjsTrainLayers(tf, () => gradients(m, x)))
        expect(count(oursRan, CONV2D_TRAIN)).toBe(2)
        expect(count(theirsRan, CONV2D_TRAIN)).toBe(0)
        // the second layer's input gradient in both; the first layer's in tfjs-layers' own where it
        // is linear (fused conv2d's gradient; a ReLU layer runs tfjs-core's plain conv2d while training)
        expect(count(oursRan, "Conv2DBackpropInput")).toBe(1)
        expect(count(theirsRan, "Conv2DBackpropInput")).toBe(c.activation === "linear" ? 2 : 1)
        expect(count(oursRan, "Relu")).toBe(0)
        expect(count(theirsRan, "Relu")).toBe(c.activation === "relu" ? 2 : 1)
        tf.dispose([...ours, ...theirs, x])
        m.dispose()
        await tf.setBackend("wasm")
      })
    }
    for (const strides of [1, 2]) {
      it(`${backend}, Conv1D after an embedding, stride ${strides}: every weight's gradient as tfjs-layers' own call gives it`, async () => {
        await tf.setBackend(backend)
        const m = model1d(strides)
        const x = tokens()
        const ours = gradients(m, x)
        const theirs = withTfjsTrainLayers(tf, () => gradients(m, x))
        expect(await worst(ours, theirs)).toBeLessThan(1e-5)
        // the embedding's gradient flows through the conv's input gradient
        expect(Math.max(...(await ours[1]!.data()).map(Math.abs))).toBeGreaterThan(0)
        const oursRan = await kernelsOf(tf, () => gradients(m, x))
        expect(count(oursRan, CONV2D_TRAIN)).toBe(1)
        expect(count(oursRan, "Conv2DBackpropInput")).toBe(1)
        tf.dispose([...ours, ...theirs, x])
        m.dispose()
        await tf.setBackend("wasm")
      })
    }
  }

  it("a gradient asked of the data itself is still computed, and inference runs tfjs-layers' own call", async () => {
    const m = model2d(CASES[2]!)
    const x = images()
    const dx = (): Tensor[] => [tf.grad((input: Tensor) => tf.sum(tf.square(m.apply(input, { training: true }) as Tensor)))(x)]
    const ours = dx()
    const theirs = withTfjsTrainLayers(tf, dx)
    expect(await worst(ours, theirs)).toBeLessThan(1e-5)
    expect(Math.max(...(await ours[0]!.data()).map(Math.abs))).toBeGreaterThan(0)
    const predicted = await kernelsOf(tf, () => [m.predict(x) as Tensor])
    expect(count(predicted, CONV2D_TRAIN)).toBe(0)
    tf.dispose([...ours, ...theirs, x])
    m.dispose()
  })
})
