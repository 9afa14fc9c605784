// A training strategy added through the registry alone: one module (support/throwaway/sum-mean.ts)
// plus its registration line (support/throwaway/register.ts), which no other file knows. Registered
// here and in the workers (their loop, support/throwaway/strategy-loop.ts, imports the same
// registration by path), it is a valid collectiveConfig.strategy, listed in the error texts, and
// trains the digits example over a real embedded NATS cluster like "allreduce" does.
import { describe, expect, it } from "vitest"
import * as path from "node:path"
import "./support/throwaway/register.ts"
import { Trainer } from "../index.ts"
import { allowedStrategies, benchVariants, registerStrategy, resolveStrategy, strategies, strategyNames, StrategyRegistrationError } from "../actors/train/worker/strategies/index.ts"
import { resolveTrainerOptions } from "../actors/train/driver/options.ts"
import { allreduce } from "../actors/train/worker/strategies/allreduce.ts"
import { auto } from "../actors/train/worker/strategies/auto.ts"
import { localSgd } from "../actors/train/worker/strategies/local-sgd.ts"
import { parameterServer } from "../actors/train/worker/strategies/parameter-server.ts"
import { sumMean } from "./support/throwaway/sum-mean.ts"
import { digitsTrainerRuns, sameWeights } from "./support/trainer-runs.ts"

const STRATEGY = "sum-mean"
const LOOP = path.resolve("test/support/throwaway/strategy-loop.ts") + "#trainLoop"
const runs = digitsTrainerRuns("gw-strategy-registry-")

describe("a strategy registered by a test alone", () => {
  it("is in the registry's lists after the built-ins, which are registered by their modules' entries", () => {
    const builtIns = [allreduce, parameterServer, auto, localSgd]
    expect(strategies().slice(0, builtIns.length)).toEqual(builtIns)
    expect(strategyNames().at(-1)).toBe(STRATEGY)
    expect(allowedStrategies()).toContain(`"${STRATEGY}"`)
    expect(strategies().map((e) => e.name)).toContain("pipeline")
  })

  it("config validation accepts it, refuses unknown names listing the registered ones, and takes its recoveries from the entry", () => {
    const base = { trainLoopPerWorker: LOOP, scalingConfig: { numWorkers: 2 } }
    const r = resolveTrainerOptions({ ...base, collectiveConfig: { strategy: STRATEGY } })
    expect(r.collective.strategy).toBe(STRATEGY)
    expect(r.recoverFrom).toBe("checkpoint")
    expect(() => resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "nope" } })).toThrow(new RegExp(`collectiveConfig.strategy.*"${STRATEGY}"`))
    expect(() => resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "pipeline" } })).toThrow(/ctx.preparePipeline/)
    expect(() => resolveTrainerOptions({ ...base, collectiveConfig: { strategy: STRATEGY }, runConfig: { failureConfig: { recoverFrom: "peers" } } })).toThrow(/sum-mean does not follow regroups/)
    expect(resolveStrategy(STRATEGY)).toBe(sumMean)
  })

  it("the strategy bench compares its variant after the built-ins', the all-reduce first, and an opt-in variant only with its flag", () => {
    const names = (flags: string[]) => benchVariants(flags).map((v) => v.name)
    expect(names([])[0]).toBe("all-reduce")
    expect(names([]).at(-1)).toBe(STRATEGY)
    expect(benchVariants([]).at(-1)!.collective(1)).toEqual({ strategy: STRATEGY })
    const optIn = strategies().flatMap((e) => e.benchVariants ?? []).filter((v) => v.optIn !== undefined)
    expect(optIn.length).toBeGreaterThan(0)
    for (const v of optIn) {
      expect(names([])).not.toContain(v.name)
      expect(names([v.optIn!])).toContain(v.name)
    }
  })

  it("the registry refuses a taken or malformed name, and an entry without its worker side", () => {
    expect(() => registerStrategy({ ...sumMean, name: "allreduce" })).toThrow(StrategyRegistrationError)
    expect(() => registerStrategy({ ...sumMean, name: "Sum Mean" })).toThrow(StrategyRegistrationError)
    const { create: _, ...noWorker } = sumMean
    expect(() => registerStrategy({ ...noWorker, name: "no-worker" })).toThrow(/needs create/)
  })

  it("trains the digits example over NATS with two workers", async () => {
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs: 2 },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "sum-mean", storagePath: runs.storage, progress: false },
      datasets: { train: runs.train, test: runs.test },
      collectiveConfig: { strategy: STRATEGY }
    }).fit()
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
    const last = r.metricsPerRank.at(-1)!
    // Every rank exchanged through the throwaway strategy, once per step, and holds the same weights.
    for (const m of last) expect(m["sum-mean/exchanges"] as number).toBeGreaterThan(10)
    expect(sameWeights(r)).toBe(true)
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.85)
  }, 180_000)
})
