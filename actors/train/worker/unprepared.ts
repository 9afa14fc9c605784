// Training that bypasses the group: a model the loop never passed to ctx.prepareModel() trains
// through tfjs's own optimizer (model.fit, model.trainOnBatch, optimizer.minimize), so its
// gradients are not all-reduced and each rank trains it alone, silently, with weights that drift
// apart. gradwire's own steps apply gradients without optimizer.minimize, so every call of it in a
// worker is such an update: counted here, said in the rank's next report (UNPREPARED_METRIC), and
// by the driver once per run (events.jsonl, the progress line).
import type { Tf } from "../../../core/engine.ts"

const COUNTED = Symbol.for("gradwire.unprepared.counted")
let updates = 0

/** Counts this process's optimizer.minimize calls from now on (once per process: later calls do nothing). */
export const countUnpreparedUpdates = (tf: Tf): void => {
  const proto = (tf.Optimizer as unknown as { prototype: Record<PropertyKey, unknown> }).prototype
  if (proto[COUNTED] === true) return
  const minimize = proto.minimize as (this: unknown, ...args: unknown[]) => unknown
  proto.minimize = function (this: unknown, ...args: unknown[]): unknown {
    updates++
    return minimize.apply(this, args)
  }
  proto[COUNTED] = true
}

/** The optimizer.minimize calls counted since the last call of this. */
export const takeUnpreparedUpdates = (): number => {
  const n = updates
  updates = 0
  return n
}
