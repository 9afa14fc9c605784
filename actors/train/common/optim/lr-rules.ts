// Learning-rate rules for data-parallel training (prepareModel(model, { lrScaling,
// referenceBatchSize, warmupSteps })): the optimizer's own learning rate is the one tuned for
// referenceBatchSize samples per update; the rule scales it by the global batch actually used
// (samples over every rank, times the accumulation steps):
//   "linear"  lr * G / ref        (Goyal et al. 2017, "Accurate, Large Minibatch SGD")
//   "sqrt"    lr * sqrt(G / ref)  (the square-root rule, Krizhevsky 2014; Hoffer et al. 2017)
//   "none"    lr
// and ramps it up linearly over the first warmupSteps updates: update t (from 0) uses
// min(1, (t + 1) / warmupSteps) of it, as DeepSpeed's WarmupLR and PyTorch's LinearLR warmups do.
// Pure: the data-parallel model asks it for the rate of every update.
import { ConfigError } from "../../../../core/errors.ts"

export type LrScaling = "linear" | "sqrt" | "none"

export interface LrRuleOptions {
  /** How the learning rate follows the global batch. Default "none". */
  readonly lrScaling?: LrScaling
  /** The global batch the optimizer's learning rate was tuned for (required with "linear" or "sqrt"). */
  readonly referenceBatchSize?: number
  /** Updates over which the learning rate rises linearly to its scaled value. Default 0 (none). */
  readonly warmupSteps?: number
}

export interface LrRule {
  readonly scaling: LrScaling
  readonly referenceBatchSize: number | undefined
  readonly warmupSteps: number
  /** The factor on the base learning rate for update `step` (from 0) with a global batch of `globalBatch` samples. */
  factor(step: number, globalBatch: number): number
}

/** Validates the options (ConfigError naming the field); undefined when no rule is asked for. */
export const lrRuleOf = (o: LrRuleOptions): LrRule | undefined => {
  const scaling = o.lrScaling ?? "none"
  if (scaling !== "linear" && scaling !== "sqrt" && scaling !== "none") {
    throw new ConfigError({ field: "prepareModel.lrScaling", reason: `must be "linear", "sqrt" or "none", got ${JSON.stringify(o.lrScaling)}` })
  }
  const ref = o.referenceBatchSize
  if (scaling !== "none" && (ref === undefined || !Number.isFinite(ref) || ref <= 0)) {
    throw new ConfigError({
      field: "prepareModel.referenceBatchSize",
      reason: `lrScaling "${scaling}" scales the learning rate against the global batch it was tuned for: pass referenceBatchSize > 0 (got ${String(ref)})`
    })
  }
  if (scaling === "none" && ref !== undefined && (!Number.isFinite(ref) || ref <= 0)) {
    throw new ConfigError({ field: "prepareModel.referenceBatchSize", reason: `must be a number > 0, got ${String(ref)}` })
  }
  const warmup = o.warmupSteps ?? 0
  if (!Number.isInteger(warmup) || warmup < 0) {
    throw new ConfigError({ field: "prepareModel.warmupSteps", reason: `must be an integer >= 0, got ${String(o.warmupSteps)}` })
  }
  if (scaling === "none" && warmup === 0) return undefined
  return {
    scaling,
    referenceBatchSize: ref,
    warmupSteps: warmup,
    factor(step, globalBatch) {
      const ratio = scaling === "none" ? 1 : globalBatch / (ref as number)
      const scale = scaling === "linear" ? ratio : scaling === "sqrt" ? Math.sqrt(ratio) : 1
      return warmup > 0 ? scale * Math.min(1, (step + 1) / warmup) : scale
    }
  }
}
