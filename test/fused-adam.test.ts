// core/kernels/fused-adam.ts: tfjs's Adam update as one in-place pass per variable on wasm is bit
// for bit optimizer.applyGradients, weights and optimizer state (moments, accBeta1/2, iterations),
// over several steps and shapes; and it declines where it must not write in place.
import { beforeAll, describe, expect, it } from "vitest"
import { loadEngine, type Tf } from "../core/engine.ts"
import { fusedAdamStep } from "../core/kernels/fused-adam.ts"

let tf: Tf
beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

const SHAPES = [[17, 9], [9], [3, 3, 2, 5], [1]]
let made = 0
const variables = (seed: number) =>
  SHAPES.map((s, i) => tf.tidy(() => tf.variable(tf.randomNormal(s, 0, 1, "float32", seed + i), true, `fused_adam_${made++}`)))

describe("the fused Adam step on wasm", () => {
  it("equals tfjs's applyGradients bit for bit, weights and state, over 6 steps", async () => {
    const a = variables(1)
    const b = variables(1)
    const oa = tf.train.adam(0.01, 0.8, 0.95, 1e-6)
    const ob = tf.train.adam(0.01, 0.8, 0.95, 1e-6)
    for (let step = 0; step < 6; step++) {
      const gs = SHAPES.map((s, i) => tf.randomNormal(s, 0, 1, "float32", 100 + 10 * step + i))
      oa.applyGradients(Object.fromEntries(a.map((v, i) => [v.name, gs[i]!])))
      expect(fusedAdamStep(tf, ob, Object.fromEntries(b.map((v, i) => [v.name, gs[i]!])))).toBe(true)
      tf.dispose(gs)
    }
    a.forEach((v, i) => expect(Array.from(b[i]!.dataSync())).toEqual(Array.from(v.dataSync())))
    const [wa, wb] = [await oa.getWeights(), await ob.getWeights()]
    expect(wb.length).toBe(wa.length)
    wa.forEach((w, i) => expect(Array.from(wb[i]!.tensor.dataSync())).toEqual(Array.from(w.tensor.dataSync())))
    expect(ob.iterations).toBe(oa.iterations)
  })

  it("declines another optimizer, and a variable whose buffer another tensor shares", () => {
    const [v] = variables(5)
    const g = { [v!.name]: tf.onesLike(v!) }
    expect(fusedAdamStep(tf, tf.train.sgd(0.1), g)).toBe(false)
    // A reshape shares the variable's buffer on wasm (clone copies it).
    const alias = v!.reshape([-1])
    expect(fusedAdamStep(tf, tf.train.adam(0.1), g)).toBe(false)
    alias.dispose()
    expect(fusedAdamStep(tf, tf.train.adam(0.1), g)).toBe(true)
  })
})
