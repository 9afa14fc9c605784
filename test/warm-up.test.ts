// A standby worker's warm-up (actors/train/worker/warm-up.ts): it trains, within its bounds, and
// leaves the process as it found it: no tensor or variable left, no draw from Math.random, and a model the loop builds after
// it gets the same layer and weight names (its optimizer's slots included) as in a fresh process.
// Each case runs in a fresh process: tfjs's layer names are counted per process.
import { describe, expect, it } from "vitest"
import { execFileSync } from "node:child_process"
import { fileURLToPath } from "node:url"

const ROOT = fileURLToPath(new URL("..", import.meta.url))

interface Outcome {
  readonly runs: ReadonlyArray<{ readonly steps: number; readonly ms: number }>
  readonly left: { readonly tensors: number; readonly variables: number }
  /** Math.random's draws during the warm-ups (tfjs's unseeded initializers draw on it). */
  readonly draws: number
  readonly names: ReadonlyArray<string>
  readonly optimizerNames: ReadonlyArray<string>
  /** The name tfjs gives a variable made without one after all that. */
  readonly unnamed: string
}

/** In a fresh process on `backend`: the warm-up with each of `bounds`, then the digits MLP built, compiled and trained one batch. */
const run = (backend: string, bounds: ReadonlyArray<{ maxMs: number; maxSteps: number }>): Outcome => {
  const script = `
    import { loadEngine } from "./core/engine.ts"
    import { warmUpTraining } from "./actors/train/worker/warm-up.ts"
    import { buildModel } from "./examples/digits/model.ts"
    const { tf } = await loadEngine(${JSON.stringify(backend)})
    const runs = []
    const random = Math.random
    let draws = 0
    Math.random = () => (draws++, random())
    for (const b of ${JSON.stringify(bounds)}) runs.push(await warmUpTraining(tf, b))
    Math.random = random
    const left = { tensors: tf.memory().numTensors, variables: Object.keys(tf.engine().registeredVariables).length }
    const model = buildModel(tf, "mlp")
    model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
    await model.trainOnBatch(tf.zeros([4, 64]), tf.oneHot(tf.tensor1d([0, 1, 2, 3], "int32"), 10))
    const optimizerNames = (await model.optimizer.getWeights()).map((w) => w.name)
    const unnamed = tf.variable(tf.zeros([2])).name
    console.log(JSON.stringify({ runs, left, draws, names: model.weights.map((w) => w.name), optimizerNames, unnamed }))`
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: ROOT, encoding: "utf8", timeout: 90_000 })
  return JSON.parse(out.trim().split("\n").pop()!) as Outcome
}

describe("a standby worker's warm-up", () => {
  it("trains within its bounds on wasm and leaves no tensor, no variable and no name behind", { timeout: 120_000 }, () => {
    const warmed = run("wasm", [
      { maxMs: 60_000, maxSteps: 40 },
      { maxMs: 300, maxSteps: 1_000_000 },
      { maxMs: 0, maxSteps: 10 }
    ])
    const fresh = run("wasm", [])
    // Bounded by steps (its time far off), by time (steps far off), and off at 0 ms.
    expect(warmed.runs[0]!.steps).toBe(40)
    expect(warmed.runs[1]!.steps).toBeGreaterThan(0)
    expect(warmed.runs[1]!.steps).toBeLessThan(1_000_000)
    expect(warmed.runs[1]!.ms).toBeGreaterThanOrEqual(300)
    expect(warmed.runs[2]).toEqual({ steps: 0, ms: 0 })
    expect(warmed.left).toEqual({ tensors: 0, variables: 0 })
    expect(warmed.draws).toBe(0)
    // The loop's model, built after the warm-up, is named as in a process that never warmed up.
    expect(fresh.names.length).toBeGreaterThan(0)
    expect(warmed.names).toEqual(fresh.names)
    expect(fresh.optimizerNames.length).toBeGreaterThan(fresh.names.length)
    expect(warmed.optimizerNames).toEqual(fresh.optimizerNames)
    expect(warmed.unnamed).toEqual(fresh.unnamed)
  })

  it("on the cpu backend too (tfjs's own Adam there)", { timeout: 120_000 }, () => {
    const warmed = run("cpu", [{ maxMs: 60_000, maxSteps: 12 }])
    const fresh = run("cpu", [])
    expect(warmed.runs[0]!.steps).toBe(12)
    expect(warmed.left).toEqual({ tensors: 0, variables: 0 })
    expect(warmed.names).toEqual(fresh.names)
    expect(warmed.optimizerNames).toEqual(fresh.optimizerNames)
    expect(warmed.unnamed).toEqual(fresh.unnamed)
  })
})
