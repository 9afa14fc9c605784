// How soon V8 optimizes the code of a process gradwire starts (workers, parameter servers).
//
// V8 runs a function in its interpreter, then its baseline compiler's code, and optimizes it with
// TurboFan once it has used a budget of about --invocation-count-for-turbofan calls (3000 in Node
// 22's V8). tfjs's kernels are called many times a step and get there within a second, but a
// training step's own functions (the step, the batch, the gradient reduction, the optimizer's
// update, the collectives' framing) run once a step: a fresh worker reached them only after some
// 3000 steps. On the digits MLP with 3 workers (2 cores) the last of them were optimized some
// 400 epochs (25-30 s) into the run, and a rank's epoch took 100 ms at the start and about 40 ms
// once they were (`--trace-opt`); a replacement that joined a group held its warm peers to its
// pace for as long. At 500 the same job reached 40-45 ms an epoch by epoch 150-250 instead of
// 400-550, and finished 13% sooner (median of three alternated pairs; docs/benchmarks.md).
//
// Set through v8.setFlagsFromString as the process starts (host.ts), before its code gets hot:
// the count is read whenever a function's budget is set, so it applies to everything that runs
// afterwards. GRADWIRE_TURBOFAN_AFTER=0 leaves V8's own.
import * as v8 from "node:v8"
import { turbofanAfter } from "./settings.ts"

/** Sets V8's TurboFan invocation count from GRADWIRE_TURBOFAN_AFTER; the count set, or undefined when V8's own is left. */
export const tierUpSooner = (): number | undefined => {
  const n = turbofanAfter.read()
  if (n <= 0) return undefined
  v8.setFlagsFromString(`--invocation-count-for-turbofan=${n}`)
  return n
}
