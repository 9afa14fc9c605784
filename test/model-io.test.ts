import { describe, expect, it } from "vitest"
import { loadEngine } from "../core/engine.ts"
import { loadWeightsInto, modelFromFiles, modelToFiles } from "../core/model-io.ts"
import { ConfigError } from "../core/errors.ts"

describe("model checkpoint files", () => {
  it("round-trips a model's topology and weights, and restores weights by name", async () => {
    const { tf, backend } = await loadEngine("auto")
    expect(["wasm", "tensorflow", "tensorflow-gpu", "cpu"]).toContain(backend)
    const make = () => {
      const m = tf.sequential()
      m.add(tf.layers.dense({ units: 5, inputShape: [3], activation: "relu", name: "d1" }))
      m.add(tf.layers.dense({ units: 2, name: "d2" }))
      return m
    }
    const a = make()
    const files = await modelToFiles(tf, a)
    const b = await modelFromFiles(tf, files)
    const c = make()
    loadWeightsInto(tf, c, files)
    const wa = a.getWeights().map((w) => [...w.dataSync()])
    expect(b.getWeights().map((w) => [...w.dataSync()])).toEqual(wa)
    expect(c.getWeights().map((w) => [...w.dataSync()])).toEqual(wa)
    const other = tf.sequential()
    other.add(tf.layers.dense({ units: 4, inputShape: [3], name: "d1" }))
    expect(() => loadWeightsInto(tf, other, files)).toThrow(ConfigError)
    expect(() => loadWeightsInto(tf, c, {})).toThrow(ConfigError)
  })
})
