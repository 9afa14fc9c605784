// core/kernels/conv-layer.ts: a linear Conv2D layer whose input depends on no trainable variable (a
// model's first layer) computes no gradient for its input while training, where tfjs-core's fused
// conv2d computed it with the filter's. Against tfjs-layers' own call (withTfjsConvLayer), on wasm
// and cpu: every variable's gradient, a gradient asked of the data itself, inference, the
// convolution input gradients run (one fewer: the first layer's), and which tensors count as
// depending on a trainable variable.
import { beforeAll, describe, expect, it } from "vitest"
import { kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { dependsOnTrainable, withTfjsConvLayer } from "../core/kernels/conv-layer.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel

let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

/** A stem without bias (as a ResNet's) or with one, batch norm, a second linear conv (its input from the first), pooling and a dense layer. */
const model = (bias: boolean, strides: number): LayersModel => {
  const L = tf.layers
  const m = tf.sequential()
  m.add(L.conv2d({ inputShape: [9, 9, 3], filters: 8, kernelSize: 3, strides, padding: "same", useBias: bias, kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }) }))
  m.add(L.batchNormalization({}))
  m.add(L.activation({ activation: "relu" }))
  m.add(L.conv2d({ filters: 8, kernelSize: 3, padding: "valid", useBias: true, kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }) }))
  m.add(L.globalAveragePooling2d({}))
  m.add(L.dense({ units: 4, kernelInitializer: tf.initializers.glorotUniform({ seed: 3 }) }))
  return m
}

const data = (): Tensor => tf.tensor4d(seeded(5 * 9 * 9 * 3, 7), [5, 9, 9, 3])

/** The loss's gradient for every trainable weight of `m`, in order, and the loss. */
const gradients = (m: LayersModel, x: Tensor): Tensor[] => {
  const { value, grads } = tf.variableGrads(() => tf.sum(tf.square(m.apply(x, { training: true }) as Tensor)) as import("@tensorflow/tfjs").Scalar)
  return [value, ...m.trainableWeights.map((w) => grads[w.originalName]!)]
}

describe("a Conv2D layer whose input needs no gradient", () => {
  for (const backend of ["wasm", "cpu"]) {
    for (const [bias, strides] of [
      [false, 1],
      [true, 1],
      [false, 2]
    ] as const) {
      it(`${backend}, first layer ${bias ? "with" : "without"} a bias, stride ${strides}: every weight's gradient as tfjs-layers' own call gives it, one convolution input gradient fewer`, async () => {
        await tf.setBackend(backend)
        const m = model(bias, strides)
        const x = data()
        const ours = gradients(m, x)
        const theirs = withTfjsConvLayer(tf, () => gradients(m, x))
        expect(ours).toHaveLength(m.trainableWeights.length + 1)
        expect(await worst(ours, theirs)).toBeLessThan(1e-6)
        const inputGrads = (names: string[]) => names.filter((k) => k === "Conv2DBackpropInput").length
        const oursRan = await kernelsOf(tf, () => gradients(m, x))
        const theirsRan = await kernelsOf(tf, () => withTfjsConvLayer(tf, () => gradients(m, x)))
        // the second layer's input gradient in both; the first layer's only in tfjs-layers' own
        expect(inputGrads(oursRan)).toBe(1)
        expect(inputGrads(theirsRan)).toBe(2)
        tf.dispose([...ours, ...theirs, x])
        m.dispose()
        await tf.setBackend("wasm")
      })
    }
  }

  it("a gradient asked of the data itself is still computed, and inference is unchanged", async () => {
    const m = model(true, 1)
    const x = data()
    const dx = (): Tensor[] => [tf.grad((input: Tensor) => tf.sum(tf.square(m.apply(input, { training: true }) as Tensor)))(x)]
    const ours = dx()
    const theirs = withTfjsConvLayer(tf, dx)
    expect(await worst(ours, theirs)).toBeLessThan(1e-6)
    expect(Math.max(...(await ours[0]!.data()).map(Math.abs))).toBeGreaterThan(0)
    const y = m.predict(x) as Tensor
    const yTfjs = withTfjsConvLayer(tf, () => m.predict(x) as Tensor)
    expect(await worst([y], [yTfjs])).toBe(0)
    tf.dispose([...ours, ...theirs, x, y, yTfjs])
    m.dispose()
  })

  it("depends on a trainable variable: the variable and what the tape made from it; not the data, what the tape made from the data alone, or a non-trainable variable", () => {
    const w = tf.variable(tf.ones([3, 3]), true, "conv-layer-test-w")
    const frozen = tf.variable(tf.ones([3, 3]), false, "conv-layer-test-frozen")
    const x = tf.ones([2, 3])
    const seen: Record<string, boolean> = {}
    tf.variableGrads(() => {
      const fromData = tf.reshape(tf.mul(x, 2), [3, 2])
      const fromFrozen = tf.matMul(x, frozen)
      const fromW = tf.relu(tf.matMul(x, w))
      const mixed = tf.add(fromFrozen, fromW)
      Object.assign(seen, {
        data: dependsOnTrainable(tf, x),
        fromData: dependsOnTrainable(tf, fromData),
        frozen: dependsOnTrainable(tf, frozen),
        fromFrozen: dependsOnTrainable(tf, fromFrozen),
        w: dependsOnTrainable(tf, w),
        fromW: dependsOnTrainable(tf, fromW),
        mixed: dependsOnTrainable(tf, mixed)
      })
      return tf.sum(mixed) as import("@tensorflow/tfjs").Scalar
    }, [w])
    expect(seen).toEqual({ data: false, fromData: false, frozen: false, fromFrozen: false, w: true, fromW: true, mixed: true })
    tf.dispose([w, frozen, x])
  })
})
