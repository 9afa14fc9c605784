// The two models of the digits example: an MLP and a small CNN over the 8x8 images.
import type { Tf } from "../../index.ts"

export type ModelKind = "mlp" | "cnn"

export const buildModel = (tf: Tf, kind: ModelKind, seed = 1): import("@tensorflow/tfjs").LayersModel => {
  const init = (s: number) => tf.initializers.glorotUniform({ seed: seed * 100 + s })
  const m = tf.sequential()
  if (kind === "cnn") {
    m.add(tf.layers.reshape({ targetShape: [8, 8, 1], inputShape: [64] }))
    m.add(tf.layers.conv2d({ filters: 16, kernelSize: 3, activation: "relu", padding: "same", kernelInitializer: init(1) }))
    m.add(tf.layers.maxPooling2d({ poolSize: 2 }))
    m.add(tf.layers.conv2d({ filters: 32, kernelSize: 3, activation: "relu", padding: "same", kernelInitializer: init(2) }))
    m.add(tf.layers.flatten())
    m.add(tf.layers.dense({ units: 64, activation: "relu", kernelInitializer: init(3) }))
    m.add(tf.layers.dense({ units: 10, activation: "softmax", kernelInitializer: init(4) }))
  } else {
    m.add(tf.layers.dense({ units: 64, activation: "relu", inputShape: [64], kernelInitializer: init(1) }))
    m.add(tf.layers.dense({ units: 10, activation: "softmax", kernelInitializer: init(2) }))
  }
  return m
}

/** A cheap fingerprint of weight values (FNV-1a over their float32 bits). */
const hashValues = (values: ReadonlyArray<ArrayLike<number>>): string => {
  let h = 0x811c9dc5
  for (const v of values) {
    const bits = new Uint32Array(Float32Array.from(v).buffer)
    for (let i = 0; i < bits.length; i++) h = Math.imul(h ^ bits[i], 0x01000193) >>> 0
  }
  return h.toString(16)
}

/** A cheap fingerprint of a model's weights, to compare ranks. */
export const weightsHash = (weights: ReadonlyArray<{ dataSync(): ArrayLike<number> }>): string => hashValues(weights.map((w) => w.dataSync()))

/** The same fingerprint read asynchronously, as a GPU backend (webgpu) needs. */
export const weightsHashAsync = async (weights: ReadonlyArray<{ data(): Promise<ArrayLike<number>> }>): Promise<string> =>
  hashValues(await Promise.all(weights.map((w) => w.data())))
