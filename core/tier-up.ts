// How soon V8 optimizes the code of a worker that joins a running group (a standby, a replacement).
//
// V8 runs a function in its interpreter, then its baseline compiler's code, and optimizes it with
// TurboFan once it has used a budget of about --invocation-count-for-turbofan calls (3000 in Node
// 22's V8). tfjs's kernels are called many times a step and get there within a second, but a
// training step's own functions (the step, the batch, the gradient reduction, the optimizer's
// update, the collectives' framing) run once a step: a fresh worker reached them only after some
// 3000 steps. On the digits MLP with 3 workers (2 cores) the last of them were optimized some
// 400 epochs (25-30 s) into the run (`--trace-opt`), a rank's epoch falling from about 100 to 40 ms
// over that time, and a replacement that joined a warm group held it to its own pace as long.
//
// The count is read when a function's budget is set, at its first calls, so setting it as the
// loop is imported (worker-run.ts prepare) applies to the step's functions and leaves the
// start-up's, already called, at V8's own. Only a joining worker sets it: for a group that starts
// together the sooner compiles cost about what they save, and a short job more than that (the
// demo, 4 workers for a few seconds, took 9.8-10.3 s wall with every worker at 500 against
// 7.9-9.4 s at V8's count, three runs each, alternated).
// A parameter server that takes a lost server's place (a spare started ahead, or a replacement)
// sets it at its start (ps-server.ts): its push path runs a few times a step and would otherwise
// stay unoptimized as long, where the other servers' is warm.
// GRADWIRE_TURBOFAN_AFTER=0 leaves V8's own count everywhere.
import * as v8 from "node:v8"
import { turbofanAfter } from "./settings.ts"

/** Sets V8's TurboFan invocation count from GRADWIRE_TURBOFAN_AFTER; the count set, or undefined when V8's own is left. */
export const tierUpSooner = (): number | undefined => {
  const n = turbofanAfter.read()
  if (n <= 0) return undefined
  v8.setFlagsFromString(`--invocation-count-for-turbofan=${n}`)
  return n
}
