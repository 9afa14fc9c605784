// The digits example's training loop with three additions for the chaos suite and the recovery
// benchmark: every rank first writes its pid to <pidDir>/<attempt>-<rank>.pid, so that a test can
// kill -9 a worker it started by pid and check at the end that none of them survived;
// `minEpochMs` makes each epoch last at least that long (report() waits out the rest), so that a
// fault schedule measured in seconds (a 10 s link cut, an agent starting) maps to a bounded number
// of epochs on a fast machine too; and with `trackSteps` rank 0 writes "<epoch> <step> <steps per
// epoch>" to <pidDir>/<attempt>.step after every step (progress messages come only every 250 ms),
// so the benchmark knows exactly how far a generation got before it died. With `holdFile`, a group
// smaller than the number written in that file slows each step while the file exists (hold.ts):
// a test holds a short group back while something slow happens outside it (an agent starting, a
// standby replacement loading on a loaded machine), so the run cannot end before the group grows
// back, whatever the load. With `positions`
// every rank records where it got after each step (positions.ts) for the chaos benchmark. With
// `recordNice` every rank writes <pidDir>/<attempt>-<rank>.nice, a JSON object: `lowered`, the nice
// value the worker's host lowered it to while it prepared (core/priority.ts backgroundNice; null
// when it never lowered it), `atImport` and `atStart`, the highest nice value among its threads
// when this module was imported (a standby imports it while it prepares, lowered unless its limit
// gave its priority back already) and when its loop started (after it joined); `schedIdle`, whether
// its host's lowering also put it on SCHED_IDLE (backgroundSchedIdle), and `idleAtStart`, whether
// any of its threads was still on SCHED_IDLE when its loop started. With `stepLog` every process
// appends "<attempt> <epoch> <step>" to <pidDir>/<pid>.steps for each step it trains (stepLog()
// reads them back), so a test can tell a step skipped or trained twice. With `lagRank` one rank of
// the first group waits a while after each step, so on the parameter servers it falls behind.
import { appendFileSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import * as path from "node:path"
import type { TrainContext } from "../../index.ts"
import { trainLoop as digitsLoop, type DigitsConfig } from "../../examples/digits/train.ts"
import { PositionFile } from "./positions.ts"
import { holdStep } from "./hold.ts"
import { highestNice, SCHED_IDLE, threadPolicies } from "./nice.ts"
import { backgroundNice, backgroundSchedIdle } from "../../core/priority.ts"

const niceAtImport = highestNice()

export interface ChaosLoopConfig extends DigitsConfig {
  readonly pidDir: string
  readonly recordNice?: boolean
  readonly minEpochMs?: number
  readonly trackSteps?: boolean
  readonly holdFile?: string
  readonly positions?: boolean
  readonly stepLog?: boolean
  /** Rank `rank` of the first group waits `ms` after each step: on the parameter servers it falls behind the others. */
  readonly lagRank?: { readonly rank: number; readonly ms: number }
}

/** `ctx` with report() paced (`minMs`) and prepareModel() wrapped to record steps (`stepFile`). */
const instrumented = (ctx: TrainContext, minMs: number, stepFile: string | undefined, holdFile: string | undefined, positions: PositionFile | undefined, stepLog: string | undefined, lag: ChaosLoopConfig["lagRank"]): TrainContext => {
  let last = Date.now()
  const report: TrainContext["report"] = async (metrics, options) => {
    const wait = last + minMs - Date.now()
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
    await ctx.report(metrics, options)
    last = Date.now()
  }
  const prepareModel: TrainContext["prepareModel"] = async (...args) => {
    const dp = await ctx.prepareModel(...args)
    // dp.fit's step callback, then `after` (awaited: the next step waits for it)
    const afterFitStep = (after: () => Promise<void>): void => {
      const fit = dp.fit.bind(dp)
      dp.fit = (source, opts) =>
        fit(source, {
          ...opts,
          onStep: async (s) => {
            await opts.onStep?.(s)
            await after()
          }
        })
    }
    if (lag !== undefined && ctx.attempt === 0 && ctx.worldRank === lag.rank) afterFitStep(() => new Promise((resolve) => setTimeout(resolve, lag.ms)))
    if (holdFile !== undefined) afterFitStep(() => holdStep(holdFile, ctx.worldSize))
    if (stepFile !== undefined) {
      const progress = dp.onStep
      dp.onStep = (info) => {
        writeFileSync(stepFile, `${info.epoch} ${info.step} ${info.stepsPerEpoch}`)
        progress?.(info)
      }
    }
    if (stepLog !== undefined) {
      const progress = dp.onStep
      dp.onStep = (info) => {
        if (info.samples > 0) appendFileSync(stepLog, `${ctx.attempt} ${info.epoch} ${info.step}\n`)
        progress?.(info)
      }
    }
    if (positions !== undefined) {
      const progress = dp.onStep
      dp.onStep = (info) => {
        if (info.samples > 0) positions.step(ctx.attempt, ctx.worldRank, info.epoch, info.step, info.stepsPerEpoch)
        progress?.(info)
      }
    }
    return dp
  }
  // Methods are bound to the real context (its private fields do not exist on the proxy).
  return new Proxy(ctx, {
    get: (target, key) => {
      if (key === "report") return report
      if (key === "prepareModel") return prepareModel
      const value = Reflect.get(target, key, target) as unknown
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value
    }
  })
}

export async function trainLoop(config: ChaosLoopConfig, ctx: TrainContext): Promise<void> {
  writeFileSync(path.join(config.pidDir, `${ctx.attempt}-${ctx.worldRank}.pid`), String(process.pid))
  if (config.recordNice) writeFileSync(path.join(config.pidDir, `${ctx.attempt}-${ctx.worldRank}.nice`), JSON.stringify({ lowered: backgroundNice() ?? null, atImport: niceAtImport, atStart: highestNice(), schedIdle: backgroundSchedIdle() ?? null, idleAtStart: threadPolicies().includes(SCHED_IDLE) }))
  const stepFile = config.trackSteps && ctx.worldRank === 0 ? path.join(config.pidDir, `${ctx.attempt}.step`) : undefined
  const positions = config.positions ? new PositionFile(config.pidDir) : undefined
  const stepLog = config.stepLog ? path.join(config.pidDir, `${process.pid}.steps`) : undefined
  const paced = config.minEpochMs || stepFile || config.holdFile || positions || stepLog || config.lagRank
  try {
    await digitsLoop(config, paced ? instrumented(ctx, config.minEpochMs ?? 0, stepFile, config.holdFile, positions, stepLog, config.lagRank) : ctx)
  } finally {
    positions?.close()
  }
}

/** The steps each process of a run with `stepLog` trained, in order: [attempt, epoch, step] per step, by pid. */
export const stepLog = (pidDir: string): Map<number, Array<readonly [number, number, number]>> => {
  const out = new Map<number, Array<readonly [number, number, number]>>()
  for (const f of readdirSync(pidDir)) {
    if (!f.endsWith(".steps")) continue
    const lines = readFileSync(path.join(pidDir, f), "utf8").trim().split("\n").filter((l) => l !== "")
    out.set(Number(f.slice(0, -".steps".length)), lines.map((l) => l.split(" ").map(Number) as unknown as readonly [number, number, number]))
  }
  return out
}
