// Every layer @tensorflow/tfjs-layers exports trains on the default (wasm) backend: the list comes
// from tf.layers itself, so a tfjs upgrade that adds a layer fails here until the layer has an
// entry in support/layer-cases.ts. Each entry builds a small model around the layer with trainable weights on both sides
// of it (so the gradient flows through the layer's own backward kernels), takes three optimizer
// steps on wasm, and compares every weight's gradient on wasm with the cpu backend's from the same
// weights and batch: |wasm - cpu| <= 1e-3 * (1 + |cpu|) for each element (float32 summation order
// differs between the backends; a wrong kernel is off by far more).
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine, type Tf } from "../core/engine.ts"
import { fallbackKernelsUsed } from "../core/kernels/fallback.ts"
import { TOL, batchFor, caseNames, cases, gradientTensors, modelFor, numericGradients } from "./support/layer-cases.ts"

let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

afterAll(async () => {
  await tf.setBackend("wasm")
})

describe("every tfjs layer trains on the wasm backend, with the cpu backend's gradients", () => {
  it("has an entry for every layer tfjs-layers exports (a new layer needs one here)", async () => {
    const { tf: t } = await loadEngine("wasm")
    const listed = Object.keys(cases(t)).sort()
    expect(Object.keys(t.layers).sort()).toEqual(listed)
  })

  for (const name of caseNames()) {
    it(name, async () => {
      await tf.setBackend("wasm")
      const c = cases(tf)[name]
      if (typeof c === "string") {
        expect(c.length).toBeGreaterThan(0)
        return
      }
      const raw = batchFor(tf, c)
      const x = c.eager ? c.eager(tf, raw) : raw
      const model = modelFor(tf, c.eager ? { ...c, input: x.shape.slice(1) } : c)
      // Three optimizer steps on wasm, in training mode (random layers draw their noise).
      const opt = tf.train.adam(0.01)
      for (let s = 0; s < 3; s++) {
        const loss = opt.minimize(() => (model.apply(x, { training: true }) as TfType.Tensor).square().mean() as TfType.Scalar, true)
        expect(Number.isFinite(loss!.dataSync()[0])).toBe(true)
      }
      const training = !c.random
      const onWasm = gradientTensors(tf, model, x, training).map((g) => g.dataSync() as Float32Array)
      expect(onWasm.some((g) => g.length > 0)).toBe(true)
      await tf.setBackend("cpu")
      const onCpu = c.numeric ? [] : gradientTensors(tf, model, x, training).map((g) => g.dataSync() as Float32Array)
      await tf.setBackend("wasm")
      // Finite differences carry float32 rounding of the loss: a looser bound, still far below a wrong kernel's error.
      const ref = c.numeric ? await numericGradients(tf, model, x, training) : onCpu
      const tol = c.numeric ? 2e-2 : TOL
      expect(ref.length).toBe(onWasm.length)
      for (let i = 0; i < ref.length; i++) {
        expect(onWasm[i].length, `${model.trainableWeights[i].name}`).toBe(ref[i].length)
        let worst = 0
        for (let j = 0; j < ref[i].length; j++) if (!Number.isNaN(ref[i][j])) worst = Math.max(worst, Math.abs(onWasm[i][j] - ref[i][j]) / (1 + Math.abs(ref[i][j])))
        expect(worst, `${name}: gradient of ${model.trainableWeights[i].name}`).toBeLessThanOrEqual(tol)
      }
    })
  }

  it("no layer needed the cpu fallback (every gradient kernel they use runs natively on wasm)", () => {
    expect(fallbackKernelsUsed()).toEqual([])
  })
})
