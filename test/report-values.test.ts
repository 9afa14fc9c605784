// What report() makes of the ways a new user calls it: a metric kept as a tensor of one element is
// its number (it used to arrive as the tensor object's fields), a bigint or a Date what JSON can hold, a larger tensor is a ConfigError
// that says what to report instead, and a report the loop does not await still counts (the last one
// was lost when the loop returned before it was sent). Real nats-server and worker processes.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, TrainingFailed } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"

const LOOP = path.resolve("test/support/report-loop.ts") + "#reportLoop"
let storage: string

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-report-values-"))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

const fit = (mode: string, epochs: number, maxFailures = 0, name = `report-${mode}`) =>
  new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { mode, epochs },
    scalingConfig: { numWorkers: 2 },
    runConfig: { name, storagePath: storage, progress: false, failureConfig: { maxFailures } }
  }).fit()

/** A run expected to fail: its TrainingFailed. */
const failure = async (mode: string, epochs: number, maxFailures = 0): Promise<TrainingFailed> => {
  const e = await fit(mode, epochs, maxFailures).then(
    () => new Error("fit() resolved"),
    (err: unknown) => err
  )
  expect(e).toBeInstanceOf(TrainingFailed)
  return e as TrainingFailed
}

describe("report()", () => {
  it("reads a metric that is a tensor of one element as its number, on every rank", { timeout: 60_000 }, async () => {
    const r = await fit("scalar", 2)
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
    for (const round of r.metricsPerRank) for (const m of round) expect(typeof m.loss === "number" && Number.isFinite(m.loss), JSON.stringify(m)).toBe(true)
    // a bigint is its number (a string past 2^53), a Date its ISO string, undefined left out; the
    // run's files hold them (a bigint had crashed the driver writing metrics.jsonl)
    expect(r.metrics).toMatchObject({ epoch: 1, steps: 2, huge: "1180591620717411303424", at: "2026-01-01T00:00:00.000Z" })
    expect("gone" in r.metrics!).toBe(false)
    const lines = (await fs.readFile(path.join(r.path, "metrics.jsonl"), "utf8")).trim().split("\n")
    expect(JSON.parse(lines.at(-1)!)).toMatchObject({ steps: 2, huge: "1180591620717411303424" })
  })

  it("refuses a metric that is a tensor of several elements with a ConfigError naming it", { timeout: 60_000 }, async () => {
    const e = await failure("vector", 2)
    expect(e.kind).toBe("config")
    expect(e.message).toMatch(/report\(metrics\)\.losses.*is a tensor of shape \[3\]/)
  })

  it("refuses a metric named report or time (metrics.jsonl's report number and stamp, which a loop's would overwrite); metrics_per_rank.jsonl's rows say their attempt", { timeout: 90_000 }, async () => {
    const e = await failure("reserved", 2)
    expect(e.kind).toBe("config")
    expect(e.message).toMatch(/report\(metrics\)\.report.*"report" is the name of metrics\.jsonl's report number.*rename the metric, e\.g\. "train_report"/)
    expect(e.result.restarts).toBe(0)
    const t = await failure("reserved-time", 1)
    expect(t.kind).toBe("config")
    expect(t.message).toMatch(/report\(metrics\)\.time.*"time" is the name of the time metrics\.jsonl stamps each report with.*rename the metric/)
    expect(t.result.restarts).toBe(0)
    const r = await fit("scalar", 2, 0, "report-attempts")
    const rows = (await fs.readFile(path.join(r.path, "metrics_per_rank.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
    expect(rows.map((row) => [row.report, row.attempt])).toEqual([
      [0, 0],
      [1, 0]
    ])
  })

  it("a dataset the Trainer was not given fails the run as a ConfigError at once, not retried as a loop error", { timeout: 60_000 }, async () => {
    const failed = await failure("no-dataset", 1, 2)
    expect(failed.kind).toBe("config")
    expect(failed.message).toMatch(/no dataset "train" was given to the Trainer.*not retryable/)
    expect(failed.result.restarts).toBe(0)
  })

  it("a prepared model used without await fails as a ConfigError that says to await it (not 'dp.trainStep is not a function')", { timeout: 60_000 }, async () => {
    const failed = await failure("no-await", 1, 2)
    expect(failed.kind).toBe("config")
    expect(failed.message).toMatch(/ctx\.prepareModel\(model\).*returns a Promise, and its \.trainStep was read without awaiting it: write `const x = await ctx\.prepareModel\(model\)`/)
    expect(failed.result.restarts).toBe(0)
    // the Promise it never awaited rejected as the rank closed its group: handled, not a crash of the
    // worker's process printed after the run's error
    const logs = path.join(failed.result.path, "logs")
    for (const f of await fs.readdir(logs)) expect(await fs.readFile(path.join(logs, f), "utf8"), f).not.toMatch(/CommunicatorClosed|^.*Node\.js v\d+/m)
  })

  it("a tensor of the wrong shape fails the run at once, named as tfjs's argument check, not retried from the checkpoint", { timeout: 60_000 }, async () => {
    // tfjs throws plain Errors for these (and tfjs-layers a ValueError named "Error"): before, they
    // were retried maxFailures times, each restart meeting the same shape at the same step
    for (const [mode, tag, what] of [
      ["shape", "ValueError", "Input 0 is incompatible with layer"],
      ["keras-shape", "ValueError", "Input 0 is incompatible with layer"],
      ["op-shape", "InvalidArgumentError", "Error in matMul: inner shapes \\(4\\) and \\(3\\)"]
    ] as const) {
      const failed = await failure(mode, 1, 2)
      expect(failed.kind, mode).toBe("loop-error")
      expect(failed.message, mode).toMatch(new RegExp(`\\(${tag} in the training loop\\): ${what}`))
      expect(failed.message, mode).toMatch(new RegExp(`not retryable \\(${tag}: tfjs refused a tensor's shape`))
      expect(failed.result.restarts, mode).toBe(0)
    }
  })

  it("says when a loop ends with micro-batches it accumulated and no update applied (their gradients dropped)", { timeout: 60_000 }, async () => {
    const r = await fit("accumulated", 2)
    const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
    const said = events.filter((e) => e.type === "unapplied-accumulation")
    // once per run, with the first rank to finish so
    expect(said).toEqual([expect.objectContaining({ microBatches: 2, samples: 6 })])
    const summary = JSON.parse(await fs.readFile(path.join(r.path, "summary.json"), "utf8")) as { incidents?: Array<{ kind: string; text: string }> }
    expect(summary.incidents?.filter((i) => i.kind === "accumulation").map((i) => i.text)).toEqual([
      expect.stringMatching(/loop ended with 2 micro-batch\(es\) \(6 samples\) that trainStep\(x, y, \{ accumulate: true \}\) added and no update applied/)
    ])
    // a loop whose last step applies what it accumulated says nothing
    const fine = await fit("scalar", 2)
    expect(await fs.readFile(path.join(fine.path, "events.jsonl"), "utf8")).not.toMatch(/unapplied-accumulation/)
  })

  it("sends the reports the loop did not await before the rank counts as finished", { timeout: 60_000 }, async () => {
    const r = await fit("unawaited", 3)
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 0, 1, 1, 2, 2])
    // the loop disposed each report's tensor right after the call: the report read its own hold on it
    expect(r.metricsHistory.every((m) => typeof m.loss === "number" && Number.isFinite(m.loss))).toBe(true)
    expect(r.metricsPerRank.every((round) => round.length === 2)).toBe(true)
  })
})
