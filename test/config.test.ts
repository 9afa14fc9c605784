import { describe, expect, it } from "vitest"
import * as os from "node:os"
import * as path from "node:path"
import { CollectiveConfig, RunConfig, ScalingConfig, parseTrainLoopRef } from "../core/config.ts"
import { decodeConfig } from "../core/validate.ts"
import { ConfigError } from "../core/errors.ts"
import { resolveTrainerOptions } from "../actors/train/driver/trainer.ts"
import { fromFiles } from "../core/data/file-spec.ts"
import { allReduceAlgorithmNames, allowedAlgorithms } from "../collectives/algorithms/index.ts"
import { registerStrategy } from "../actors/train/worker/strategies/index.ts"
import { sumMean } from "./support/throwaway/sum-mean.ts"

const fails = (f: () => unknown): ConfigError => {
  try {
    f()
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError)
    return e as ConfigError
  }
  throw new Error("expected a ConfigError")
}

describe("config validation", () => {
  it("accepts a full, valid scaling config", () => {
    const c = decodeConfig(ScalingConfig, { numWorkers: 4, useGpu: false, placementStrategy: "SPREAD", resourcesPerWorker: { CPU: 1 } }, "scalingConfig")
    expect(c.numWorkers).toBe(4)
    expect(c.placementStrategy).toBe("SPREAD")
  })

  it("refuses a trainLoopConfig the workers would not get as given: a function, a class instance, a Map, a tensor, a cycle", () => {
    const base = { trainLoopPerWorker: "./t.ts#f", scalingConfig: { numWorkers: 1 } }
    const at = (trainLoopConfig: unknown) => fails(() => resolveTrainerOptions({ ...base, trainLoopConfig }))
    expect(at({ lr: 0.1, schedule: (e: number) => e * 2 })).toMatchObject({ field: "trainLoopConfig.schedule" })
    expect(at({ lr: 0.1, schedule: (e: number) => e * 2 }).message).toMatch(/is a function: .*make it in the loop/)
    class Hp {
      lr = 0.1
      get double(): number {
        return this.lr * 2
      }
    }
    const hp = at({ nested: [{ hp: new Hp() }] })
    expect(hp.field).toBe("trainLoopConfig.nested[0].hp")
    expect(hp.message).toMatch(/is a Hp instance: the workers would get its fields alone/)
    expect(at({ m: new Map([[1, 2]]) }).message).toMatch(/is a Map/)
    class Tensor {
      readonly shape = [2]
      dataSync(): Float32Array {
        return new Float32Array(2)
      }
    }
    expect(at({ w: new Tensor() }).message).toMatch(/is a tensor: pass its values/)
    const cyclic: Record<string, unknown> = { a: 1 }
    cyclic.self = { back: cyclic }
    expect(at(cyclic)).toMatchObject({ field: "trainLoopConfig.self.back" })
    // what msgpack carries as it is: numbers, strings, nested plain data, typed arrays, Dates,
    // RegExps, Sets, bigints, an object met twice (not a cycle), null and undefined
    const shared = { k: 1 }
    const ok = { a: [1, "x", null, undefined, true], t: new Float32Array(2), d: new Date(0), r: /x/, s: new Set([1]), b: 5n, one: shared, two: shared, o: Object.create(null) }
    expect(resolveTrainerOptions({ ...base, trainLoopConfig: ok }).loopConfig).toBe(ok)
  })

  it("takes ~ in storagePath for the home directory, as a shell would", () => {
    const base = { trainLoopPerWorker: "./t.ts#f", scalingConfig: { numWorkers: 1 } }
    const dir = (storagePath: string) => resolveTrainerOptions({ ...base, runConfig: { name: "n", storagePath } }).runDir
    expect(dir("~/results")).toBe(path.join(os.homedir(), "results", "n"))
    expect(dir("~")).toBe(path.join(os.homedir(), "n"))
    // not a user's home (~other), nor a ~ inside a path
    expect(dir("~other/r")).toBe(path.resolve("~other/r", "n"))
    expect(dir("/tmp/~/r")).toBe(path.join("/tmp/~/r", "n"))
  })

  it("takes resumeFromCheckpoint as a result's checkpoint, a directory (~ for home) or a URL, and says what it takes otherwise", () => {
    const base = { trainLoopPerWorker: "./t.ts#f", scalingConfig: { numWorkers: 1 } }
    const from = (resumeFromCheckpoint: unknown) => resolveTrainerOptions({ ...base, resumeFromCheckpoint } as never).resumeFrom
    expect(from({ path: "/runs/a/checkpoint_000003", metrics: {} })).toBe("/runs/a/checkpoint_000003")
    expect(from("~/runs/a/checkpoint_000003")).toBe(path.join(os.homedir(), "runs/a/checkpoint_000003"))
    expect(from("runs/c")).toBe(path.resolve("runs/c"))
    expect(from("file:///runs/b/checkpoint_000001")).toBe("/runs/b/checkpoint_000001")
    expect(from("nats-obj://ckpts/run/checkpoint_000002")).toBe("nats-obj://ckpts/run/checkpoint_000002")
    expect(from(undefined)).toBeUndefined()
    expect(fails(() => from({ metrics: {} })).message).toMatch(/resumeFromCheckpoint.*takes a checkpoint: another run's result\.checkpoint.*got an object without a path/)
    expect(fails(() => from(3)).field).toBe("resumeFromCheckpoint")
  })

  it("names the field and the allowed values", () => {
    const e = fails(() => decodeConfig(ScalingConfig, { numWorkers: 2, placementStrategy: "EVERYWHERE" }, "scalingConfig"))
    expect(e.field).toBe("scalingConfig.placementStrategy")
    expect(e.message).toContain('"STRICT_SPREAD"')
    expect(e.message).toContain('"EVERYWHERE"')
  })

  it("rejects non-integer and non-positive worker counts", () => {
    expect(fails(() => decodeConfig(ScalingConfig, { numWorkers: 0 }, "scalingConfig")).field).toBe("scalingConfig.numWorkers")
    expect(fails(() => decodeConfig(ScalingConfig, { numWorkers: 1.5 }, "scalingConfig")).message).toContain("integer")
  })

  it("refuses unknown options instead of ignoring a typo", () => {
    const e = fails(() => decodeConfig(ScalingConfig, { numWorkers: 1, numWorker: 4 }, "scalingConfig"))
    expect(e.field).toBe("scalingConfig.numWorker")
    expect(e.message).toContain("unknown option")
  })

  it("reports every problem, the first as the field", () => {
    const e = fails(() => decodeConfig(RunConfig, { name: "has space", failureConfig: { maxFailures: -2 } }, "runConfig"))
    expect(e.field).toBe("runConfig.name")
    expect(e.message).toContain("runConfig.failureConfig.maxFailures")
  })

  it("accepts maxFailures -1 (no limit) and checks collective options", () => {
    expect(decodeConfig(RunConfig, { failureConfig: { maxFailures: -1 } }, "runConfig").failureConfig?.maxFailures).toBe(-1)
    expect(fails(() => decodeConfig(CollectiveConfig, { algorithm: "Butter fly" }, "collectiveConfig")).field).toBe("collectiveConfig.algorithm")
    // the name itself is checked against the all-reduce registry, which lists what is allowed
    const e = fails(() => resolveTrainerOptions({ trainLoopPerWorker: "./t.ts#f", scalingConfig: { numWorkers: 1 }, collectiveConfig: { algorithm: "butterfly" } }))
    expect(e.field).toBe("collectiveConfig.algorithm")
    expect(e.message).toContain(`"auto" or a registered all-reduce algorithm (${allowedAlgorithms()}), got "butterfly"`)
    for (const name of ["auto", ...allReduceAlgorithmNames()]) {
      expect(resolveTrainerOptions({ trainLoopPerWorker: "./t.ts#f", scalingConfig: { numWorkers: 1 }, collectiveConfig: { algorithm: name } }).collective.algorithm).toBe(name)
    }
  })

  it("failureConfig.spares: a whole number, and only where failures recover from the peers", () => {
    const base = { trainLoopPerWorker: "./t.ts#f", scalingConfig: { numWorkers: 2 } }
    expect(resolveTrainerOptions({ ...base, runConfig: { failureConfig: { spares: 1 } } }).spares).toBe(1)
    expect(resolveTrainerOptions(base).spares).toBe(0)
    expect(fails(() => resolveTrainerOptions({ ...base, runConfig: { failureConfig: { spares: -1 } } })).field).toBe("runConfig.failureConfig.spares")
    expect(fails(() => resolveTrainerOptions({ ...base, runConfig: { failureConfig: { spares: 1.5 } } })).field).toBe("runConfig.failureConfig.spares")
    const e = fails(() => resolveTrainerOptions({ ...base, runConfig: { failureConfig: { spares: 1, recoverFrom: "checkpoint" } } }))
    expect(e.field).toBe("runConfig.failureConfig.spares")
    expect(e.message).toMatch(/restarts every worker from the checkpoint.*leave spares at 0/)
    // A strategy whose state no survivor holds defaults to the checkpoint: the message says why.
    registerStrategy({ ...sumMean, name: "rank-own-state", peersCannot: () => "each rank's state is its own" })
    const z = fails(() => resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "rank-own-state" }, runConfig: { failureConfig: { spares: 1 } } }))
    expect(z.message).toMatch(/the default here: each rank's state is its own/)
    // ... and so does each restart of such a run (controller.ts recoveryFor); not where the run asked for it.
    expect(resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "rank-own-state" } })).toMatchObject({ recoverFrom: "checkpoint", recoverFromWhy: "each rank's state is its own" })
    expect(resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "rank-own-state" }, runConfig: { failureConfig: { recoverFrom: "checkpoint" } } }).recoverFromWhy).toBeUndefined()
    expect(resolveTrainerOptions(base).recoverFromWhy).toBeUndefined()
    // Strategy auto recovers from the peers (on the all-reduce and local SGD; on the servers a
    // regroup falls back to the checkpoint at run time): spares may wait beside it.
    expect(resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "auto" }, runConfig: { failureConfig: { spares: 1 } } })).toMatchObject({ recoverFrom: "peers", spares: 1 })
    // ZeRO (any stage) and parameter servers recover from the peers: spares may wait beside them.
    expect(resolveTrainerOptions({ ...base, collectiveConfig: { zeroStage: 2 }, runConfig: { failureConfig: { spares: 1 } } }).spares).toBe(1)
    expect(resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "parameter-server" }, runConfig: { failureConfig: { spares: 1 } } }).recoverFrom).toBe("peers")
    // A file dataset recovers from the peers (dp.fit plans its epoch again), so spares may wait beside it.
    const files = { ...base, datasets: { train: fromFiles("/data/*.csv", { label: "y" }) }, runConfig: { failureConfig: { spares: 1 } } }
    expect(resolveTrainerOptions(files).recoverFrom).toBe("peers")
    expect(resolveTrainerOptions(files).spares).toBe(1)
  })

  it("refuses a closure for the loop and shows the module form", () => {
    const e = fails(() => parseTrainLoopRef(async () => {}))
    expect(e.field).toBe("trainLoopPerWorker")
    expect(e.message).toContain("export async function")
  })

  it("parses module references", () => {
    expect(parseTrainLoopRef("./train.ts#loop")).toEqual({ module: "./train.ts", export: "loop" })
    expect(parseTrainLoopRef("./train.ts")).toEqual({ module: "./train.ts", export: "default" })
    expect(parseTrainLoopRef({ module: "file:///x/train.ts", export: "go" })).toEqual({ module: "file:///x/train.ts", export: "go" })
    expect(fails(() => parseTrainLoopRef({ module: "" })).field).toBe("trainLoopPerWorker.module")
  })
})
