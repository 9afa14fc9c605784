// Strategy auto's moves in a hand-written dp.trainStep loop. On the parameter servers each rank
// takes its own steps, so when the group decides to leave them the ranks stand at different steps
// of their loops; the all-reduce then saw one rank's loop end while another still stepped (the run
// failed with call-mismatch). The move waits for the first report() call no rank had made at the
// decision, where every rank's loop stands at the same place.
// GRADWIRE_AUTO_PLAN gives auto's moves (its cost model's choice on two cores is not steady).
// Real embedded nats-server and worker processes, the digits example's loop.
import { describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Trainer } from "../index.ts"
import { digitsTrainerRuns, readEvents, sameWeights } from "./support/trainer-runs.ts"

const STEP_LOOP = path.resolve("test/support/step-loop.ts") + "#stepLoop"
const runs = digitsTrainerRuns("gw-auto-moves-")

describe("strategy auto in a hand-written loop", () => {
  it("moves from SSP back to the all-reduce at a report() call of every rank: the run finishes with the same weights on every rank", { timeout: 150_000 }, async () => {
    // Decision rounds at group steps 24 (to SSP) and 72 (back), of about 12 steps a rank and epoch.
    process.env.GRADWIRE_AUTO_PLAN = "ssp,allreduce"
    try {
      const r = await new Trainer({
        trainLoopPerWorker: STEP_LOOP,
        trainLoopConfig: { epochs: 8 },
        scalingConfig: { numWorkers: 3 },
        collectiveConfig: { strategy: "auto" },
        runConfig: { name: "auto-moves-step", storagePath: runs.storage, progress: false, failureConfig: { maxFailures: 0 } },
        datasets: { train: runs.train, test: runs.test }
      }).fit()
      expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3, 4, 5, 6, 7])
      const strategies = r.metricsHistory.map((m) => m.strategy)
      expect(strategies).toContain("ssp")
      const last = r.metricsPerRank.at(-1)!
      expect(last).toHaveLength(3)
      for (const m of last) expect(m).toMatchObject({ strategy: "allreduce", "strategy/switches": 2 })
      expect(sameWeights(r)).toBe(true)
      // The move back waited for a report() call, which the explanation names.
      const events = await readEvents(r.path)
      const back = events.find((e) => e.type === "explain" && /strategy allreduce \(was ssp\)/.test(String(e.summary)))
      expect(String(back?.summary)).toMatch(/from every rank's report\(\) call (\d+)/)
      const call = Number(/report\(\) call (\d+)/.exec(String(back!.summary))![1])
      // Every rank reported SSP up to that call and the all-reduce after it (the report of call n is metricsPerRank[n - 1]).
      for (const m of r.metricsPerRank[call - 2]!) expect(m.strategy).toBe("ssp")
      for (const m of r.metricsPerRank[call]!) expect(m.strategy).toBe("allreduce")
      expect(await fs.readFile(path.join(r.path, "explain.txt"), "utf8")).toMatch(/strategy: allreduce \(was ssp\) from every rank's report\(\) call \d+/)
    } finally {
      delete process.env.GRADWIRE_AUTO_PLAN
    }
  })
})
