// What a parameter-server worker pushes when adaptive batching splits dp.fit()'s global batch
// unequally: async and SSP apply every push as an optimizer step of its own, so a rank pushes its
// gradient scaled by its share of the step against an equal one (a one-row batch no longer takes a
// full step); sync weights by samples already and gets the step's total for its quota. The
// exchange runs against a recording stand-in for the servers (the servers' side is ps-shard's).
import * as tf from "@tensorflow/tfjs"
import { describe, expect, it } from "vitest"
import { ParameterServerWorker } from "../actors/train/worker/strategies/parameter-server.ts"
import type { StrategyHost } from "../actors/train/worker/strategies/strategy.ts"

interface Pushed {
  readonly grad: Float32Array
  readonly weight: number
  readonly stepWeight: number | undefined
}

const N = 6

const workerOn = (mode: "sync" | "async" | "ssp", pushed: Pushed[]): ParameterServerWorker => {
  const ps = {
    numServers: 1,
    mode,
    backupWorkers: mode === "sync" ? 1 : 0,
    pushPull: async (_worker: number, _step: number, grad: Float32Array, weight: number, _lr: number | undefined, stepWeight?: number) => {
      pushed.push({ grad: grad.slice(), weight, stepWeight })
      return { params: new Float32Array(N), staleness: 0, dropped: false, version: 1, serverMs: undefined }
    }
  }
  const host = {
    sync: { zeroStage: 0, ps, worldSize: 2, rank: 1 },
    optimizer: tf.train.sgd(0.1),
    learningRate: 0.1,
    inFit: true,
    step: 0,
    global: 0
  }
  return new ParameterServerWorker(host as unknown as StrategyHost)
}

const gradient = (): Float32Array => Float32Array.from({ length: N }, (_, i) => (i - 2.5) / 3)

describe("a parameter-server worker's push under unequal batches", () => {
  for (const mode of ["async", "ssp"] as const) {
    it(`${mode}: the gradient is scaled by the rank's samples over its equal share; equal batches and loops without a global batch push it as it is`, async () => {
      const pushed: Pushed[] = []
      const w = workerOn(mode, pushed)
      const recompute = async () => gradient()
      await w.exchange(gradient(), { step: 0, samples: 127, globalSamples: 128, recompute })
      await w.exchange(gradient(), { step: 1, samples: 1, globalSamples: 128, recompute })
      await w.exchange(gradient(), { step: 2, samples: 64, globalSamples: 128, recompute })
      await w.exchange(gradient(), { step: 3, samples: 5, recompute })
      const g = gradient()
      expect(pushed.map((p) => p.weight)).toEqual([127, 1, 64, 5])
      expect(Array.from(pushed[0]!.grad)).toEqual(Array.from(g, (v) => Math.fround(v * ((127 * 2) / 128))))
      expect(Array.from(pushed[1]!.grad)).toEqual(Array.from(g, (v) => Math.fround(v * (2 / 128))))
      expect(pushed[2]!.grad).toEqual(g)
      expect(pushed[3]!.grad).toEqual(g)
      expect(pushed.every((p) => p.stepWeight === undefined)).toBe(true)
    })
  }

  it("sync: the gradient goes as it is (the step's mean is weighted by samples), with the step's total for the servers' quota", async () => {
    const pushed: Pushed[] = []
    const w = workerOn("sync", pushed)
    await w.exchange(gradient(), { step: 0, samples: 127, globalSamples: 128, recompute: async () => gradient() })
    await w.exchange(gradient(), { step: 1, samples: 32, recompute: async () => gradient() })
    expect(pushed[0]).toMatchObject({ weight: 127, stepWeight: 128 })
    expect(pushed[0]!.grad).toEqual(gradient())
    expect(pushed[1]).toMatchObject({ weight: 32, stepWeight: undefined })
  })
})
