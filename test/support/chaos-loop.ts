// The digits example's training loop with two additions for the chaos suite and the recovery
// benchmark: every rank first writes its pid to <pidDir>/<attempt>-<rank>.pid, so that a test can
// kill -9 a worker it started by pid and check at the end that none of them survived; and
// `minEpochMs` makes each epoch last at least that long (report() waits out the rest), so that a
// fault schedule measured in seconds (a 10 s link cut, an agent starting) maps to a bounded number
// of epochs on a fast machine too.
import { writeFileSync } from "node:fs"
import * as path from "node:path"
import type { TrainContext } from "../../index.ts"
import { trainLoop as digitsLoop, type DigitsConfig } from "../../examples/digits/train.ts"

export interface ChaosLoopConfig extends DigitsConfig {
  readonly pidDir: string
  readonly minEpochMs?: number
}

/** `ctx` with report() held back until `minMs` have passed since the previous report. */
const paced = (ctx: TrainContext, minMs: number): TrainContext => {
  let last = Date.now()
  const report: TrainContext["report"] = async (metrics, options) => {
    const wait = last + minMs - Date.now()
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
    await ctx.report(metrics, options)
    last = Date.now()
  }
  // Methods are bound to the real context (its private fields do not exist on the proxy).
  return new Proxy(ctx, {
    get: (target, key) => {
      if (key === "report") return report
      const value = Reflect.get(target, key, target) as unknown
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value
    }
  })
}

export async function trainLoop(config: ChaosLoopConfig, ctx: TrainContext): Promise<void> {
  writeFileSync(path.join(config.pidDir, `${ctx.attempt}-${ctx.worldRank}.pid`), String(process.pid))
  await digitsLoop(config, config.minEpochMs ? paced(ctx, config.minEpochMs) : ctx)
}
