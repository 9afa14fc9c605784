// A context call that returns a Promise, used without `await`: `const dp = ctx.prepareModel(model)`
// then `dp.trainStep(x, y)` read a method of the Promise and failed with "dp.trainStep is not a
// function" (Node runs TypeScript without checking it). The Promise answers the members its value
// has with a ConfigError that says to await it (and the Promise's own rejection, once the loop has
// failed so, is handled).
import { ConfigError } from "../../../core/errors.ts"

/**
 * `p`, whose members `members` (those of the value it resolves to) throw a ConfigError naming
 * `call` and the missing await when read from the Promise itself.
 */
export const withAwaitHint = <T>(p: Promise<T>, call: string, members: ReadonlyArray<string>): Promise<T> => {
  for (const m of members) {
    Object.defineProperty(p, m, {
      configurable: true,
      enumerable: false,
      get(): never {
        // the loop fails with this error: the Promise it never awaited may still reject (its
        // collective cut short as the rank closes), which must not crash the process as unhandled
        p.catch(() => {})
        throw new ConfigError({ field: call, reason: `returns a Promise, and its .${m} was read without awaiting it: write \`const x = await ${call}\`, then x.${m}` })
      }
    })
  }
  return p
}

/** What a loop reads of a prepared model (DataParallelModel). */
export const PREPARED_MEMBERS = ["fit", "trainStep", "evaluate", "evaluateAsync", "model", "parameterCount", "globalStep", "learningRate", "syncWeights", "memoryStats"] as const
/** What a loop reads of a dataset shard or stream. */
export const SHARD_MEMBERS = ["rows", "size", "dataset", "map", "featureShape", "labelShape", "numClasses", "openEpoch", "take"] as const
/** What a loop reads of a pipelined model. */
export const PIPELINE_MEMBERS = ["trainStep", "evaluate", "isFirstStage", "isLastStage", "parameterCount", "memoryStats"] as const
