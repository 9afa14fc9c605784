// core/kernels/fused-adam.ts: tfjs's Adam update as one in-place pass per variable on wasm is bit
// for bit optimizer.applyGradients, weights and optimizer state (moments, accBeta1/2, iterations),
// over several steps and shapes; and it declines where it must not write in place.
import { beforeAll, describe, expect, it, onTestFinished } from "vitest"
import { loadEngine, type Tf } from "../core/engine.ts"
import { fusedAdamStep } from "../core/kernels/fused-adam.ts"
import { useHeapKernels } from "../core/kernels/heap-simd.ts"

let tf: Tf
beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

const SHAPES = [[17, 9], [9], [3, 3, 2, 5], [1]]
let made = 0
const variables = (seed: number) =>
  SHAPES.map((s, i) => tf.tidy(() => tf.variable(tf.randomNormal(s, 0, 1, "float32", seed + i), true, `fused_adam_${made++}`)))

describe("the fused Adam step on wasm", () => {
  // By the heap's SIMD kernel (four weights at a time, the rest one by one) and by the JavaScript loop.
  for (const simd of [true, false]) it(`equals tfjs's applyGradients bit for bit, weights and state, over 6 steps${simd ? "" : ", without the heap kernels"}`, async () => {
    useHeapKernels(simd)
    onTestFinished(() => useHeapKernels(true))
    const a = variables(1)
    const b = variables(1)
    const oa = tf.train.adam(0.01, 0.8, 0.95, 1e-6)
    const ob = tf.train.adam(0.01, 0.8, 0.95, 1e-6)
    for (let step = 0; step < 6; step++) {
      const gs = SHAPES.map((s, i) => tf.randomNormal(s, 0, 1, "float32", 100 + 10 * step + i))
      oa.applyGradients(Object.fromEntries(a.map((v, i) => [v.name, gs[i]!])) as Record<string, import("@tensorflow/tfjs").Variable>)
      expect(fusedAdamStep(tf, ob, Object.fromEntries(b.map((v, i) => [v.name, gs[i]!])))).toBe(true)
      tf.dispose(gs)
    }
    a.forEach((v, i) => expect(Array.from(b[i]!.dataSync())).toEqual(Array.from(v.dataSync())))
    const [wa, wb] = [await oa.getWeights(), await ob.getWeights()]
    expect(wb.length).toBe(wa.length)
    wa.forEach((w, i) => expect(Array.from(wb[i]!.tensor.dataSync())).toEqual(Array.from(w.tensor.dataSync())))
    expect(ob.iterations).toBe(oa.iterations)
  })

  it("trains a model the same as tfjs's Adam: the weights' new buffers reach the matmuls (wasm caches packed weights per buffer)", () => {
    const build = () => {
      const m = tf.sequential()
      m.add(tf.layers.dense({ units: 16, activation: "relu", inputShape: [8], kernelInitializer: tf.initializers.glorotUniform({ seed: 3 }) }))
      m.add(tf.layers.dense({ units: 4, kernelInitializer: tf.initializers.glorotUniform({ seed: 4 }) }))
      return { m, opt: tf.train.adam(0.05), vars: m.trainableWeights.map((w) => w.read() as import("@tensorflow/tfjs").Variable) }
    }
    const a = build()
    const b = build()
    for (let step = 0; step < 4; step++) {
      const x = tf.randomNormal([6, 8], 0, 1, "float32", 50 + step)
      const y = tf.randomNormal([6, 4], 0, 1, "float32", 60 + step)
      const loss = (m: import("@tensorflow/tfjs").LayersModel) => () => tf.losses.meanSquaredError(y, m.apply(x) as import("@tensorflow/tfjs").Tensor) as import("@tensorflow/tfjs").Scalar
      const ga = a.opt.computeGradients(loss(a.m), a.vars).grads
      const gb = b.opt.computeGradients(loss(b.m), b.vars).grads
      a.opt.applyGradients(ga as Record<string, import("@tensorflow/tfjs").Variable>)
      expect(fusedAdamStep(tf, b.opt, gb)).toBe(true)
      tf.dispose([x, y, ...Object.values(ga), ...Object.values(gb)])
    }
    a.vars.forEach((v, i) => expect(Array.from(b.vars[i]!.dataSync())).toEqual(Array.from(v.dataSync())))
  })

  it("declines another optimizer, and a variable whose buffer another tensor shares", () => {
    const [v] = variables(5)
    const g = { [v!.name]: tf.onesLike(v!) }
    expect(fusedAdamStep(tf, tf.train.sgd(0.1), g)).toBe(false)
    // A reshape and a clone (Identity) share the variable's buffer on wasm.
    for (const share of [() => v!.reshape([-1]), () => v!.clone()]) {
      const alias = share()
      const before = Float32Array.from(alias.dataSync())
      expect(fusedAdamStep(tf, tf.train.adam(0.1), g)).toBe(false)
      alias.dispose()
      expect(fusedAdamStep(tf, tf.train.adam(0.1), g)).toBe(true)
      expect(Array.from(v!.dataSync())).not.toEqual(Array.from(before))
    }
  })
})
