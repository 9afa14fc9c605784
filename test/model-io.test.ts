import { describe, expect, it } from "vitest"
import { execFileSync } from "node:child_process"
import * as path from "node:path"
import { encodeMessage } from "../core/wire.ts"
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

describe("optimizer state files", () => {
  it("round-trips Adam's moments so training continues exactly as without the interruption", async () => {
    const { tf } = await loadEngine("auto")
    const { optimizerToFile, loadOptimizerFrom, modelToFiles: toFiles, loadWeightsInto: loadInto } = await import("../core/model-io.ts")
    const make = () => {
      const m = tf.sequential()
      // Same layer names in every copy, as in a worker that rebuilds its model after a restart.
      m.add(tf.layers.dense({ units: 3, inputShape: [4], name: "opt_dense", kernelInitializer: tf.initializers.glorotUniform({ seed: 3 }) }))
      m.compile({ optimizer: tf.train.adam(0.05), loss: "meanSquaredError" })
      return m
    }
    const x = tf.randomNormal([8, 4], 0, 1, "float32", 1)
    const y = tf.randomNormal([8, 3], 0, 1, "float32", 2)
    const a = make()
    await a.fit(x, y, { epochs: 3, batchSize: 8, verbose: 0 })
    const weights = await toFiles(tf, a)
    const before = tf.memory().numTensors
    const opt = await optimizerToFile(a.optimizer)
    // Saving leaves no tensor behind (getWeights() makes a fresh step-count scalar each call).
    expect(tf.memory().numTensors).toBe(before)
    await optimizerToFile(a.optimizer)
    expect(tf.memory().numTensors).toBe(before)
    // b continues from a's checkpoint (weights + optimizer); c only from the weights.
    const b = make()
    const c = make()
    // Create the optimizers' slots before loading state into them.
    await b.fit(x, y, { epochs: 1, batchSize: 8, verbose: 0 })
    await c.fit(x, y, { epochs: 1, batchSize: 8, verbose: 0 })
    loadInto(tf, b, weights)
    loadInto(tf, c, weights)
    await loadOptimizerFrom(tf, b.optimizer, opt)
    await a.fit(x, y, { epochs: 2, batchSize: 8, verbose: 0 })
    await b.fit(x, y, { epochs: 2, batchSize: 8, verbose: 0 })
    await c.fit(x, y, { epochs: 2, batchSize: 8, verbose: 0 })
    const flat = (m: typeof a) => m.getWeights().flatMap((w) => [...w.dataSync()])
    const wa = flat(a)
    const maxDiff = (w: number[]) => Math.max(...w.map((v, i) => Math.abs(v - wa[i])))
    // With the optimizer state: the same trajectory (up to summation order); without it, Adam's
    // moments restart and the weights go elsewhere.
    expect(maxDiff(flat(b))).toBeLessThan(1e-5)
    expect(maxDiff(flat(c))).toBeGreaterThan(1e-3)
    const sgd = tf.sequential({ layers: [tf.layers.dense({ units: 3, inputShape: [4] })] })
    sgd.compile({ optimizer: tf.train.sgd(0.1), loss: "meanSquaredError" })
    await expect(loadOptimizerFrom(tf, sgd.optimizer, opt)).rejects.toBeInstanceOf(ConfigError)
  })
})

describe("optimizer state files, read back", () => {
  /** An optimizer file as optimizerToFile writes it, with `dtype` for its one weight. */
  const file = (dtype: string) => encodeMessage({ optimizer: "Adam", weights: [{ name: "opt_dense/kernel/m", shape: [2], dtype, data: new Float32Array([1, 2]) }] })

  it("gives each weight's dtype as tfjs's own literal, not the string decoded from the file (V8's internalized copy)", () => {
    // In a child with V8's natives syntax: the decoded string is a fresh one; what readOptimizerFile
    // returns is the literal, as a tensor made in the process has.
    const script = `
      import { readOptimizerFile } from ${JSON.stringify(path.resolve("core/model-io.ts"))}
      import { decodeMessage, encodeMessage } from ${JSON.stringify(path.resolve("core/wire.ts"))}
      const bytes = encodeMessage({ optimizer: "Adam", weights: [{ name: "w", shape: [1], dtype: "float32", data: new Float32Array([1]) }] })
      const decoded = decodeMessage(bytes).weights[0].dtype
      const [read] = await readOptimizerFile(bytes, "Adam")
      const internalized = new Function("s", "return %IsInternalizedString(s)")
      console.log(JSON.stringify({ decoded: internalized(decoded), read: internalized(read.dtype), dtype: read.dtype }))`
    const out = JSON.parse(execFileSync(process.execPath, ["--allow-natives-syntax", "--input-type=module", "-e", script], { encoding: "utf8", timeout: 20_000 }))
    expect(out).toEqual({ decoded: false, read: true, dtype: "float32" })
  })

  it("refuses a weight whose dtype is not tfjs's, saying which", async () => {
    const { readOptimizerFile } = await import("../core/model-io.ts")
    expect((await readOptimizerFile(file("int32"), "Adam"))[0]!.dtype).toBe("int32")
    await expect(readOptimizerFile(file("float64"), "Adam")).rejects.toThrow(/"opt_dense\/kernel\/m" has dtype "float64"/)
    await expect(readOptimizerFile(file("toString"), "Adam")).rejects.toBeInstanceOf(ConfigError)
  })
})
