// The trainer's failure policy: given what went wrong with the worker group and how many restarts
// were already spent, decide whether to restart or give up. Pure, so the controller
// (controller.ts) only carries decisions out.
//
// What counts toward failureConfig.maxFailures: failures of the job itself (a worker that crashed
// or hung, an exception in the loop). Failures of the infrastructure (a lost node, a NATS outage)
// do not: they are bounded by their own deadlines (placementTimeoutMs to get capacity back,
// natsOutageTimeoutMs for the bus), and spot machines leaving must not use up a run's restarts.
// An infrastructure failure does count when it repeats without progress in between: after
// MAX_INFRA_RESTARTS_WITHOUT_PROGRESS such restarts with no completed report round, the next one
// is counted like any other failure, so a flapping cluster cannot loop forever.

export type FailureKind =
  /** The worker process died (crash, kill -9, missed heartbeats). */
  | "died"
  /** The node a worker ran on was lost (its agent stopped heartbeating or left). */
  | "node-lost"
  /** The NATS connection was lost while the group ran. */
  | "bus"
  /**
   * Regrouping the survivors of an earlier failure did not work out (a joiner's loop did not line
   * up with theirs, a survivor did not take its place): the group restarts from the checkpoint.
   */
  | "recovery"
  /** The user's loop threw. */
  | "loop-error"
  /** Ranks called report() a different number of times: restarting would do the same again. */
  | "report-mismatch"
  /** Ranks called different collectives at the same point (uneven steps between reports): restarting would do the same again. */
  | "call-mismatch"
  /** The loop cannot start at all (bad module, bad export, invalid config): not retryable. */
  | "config"
  /** The driver was stopped (Ctrl-C, SIGTERM): the run ends interrupted, not errored. */
  | "interrupted"

export interface GroupFailure {
  readonly kind: FailureKind
  readonly rank: number
  /** The remote error's tag (e.g. "TypeError", "CollectiveTimeout") or the death reason. */
  readonly tag: string
  readonly message: string
  readonly remoteStack?: string
  /** A lost parameter server's shard index, when another server keeps a replica of its shard (two servers or more). */
  readonly server?: number
}

export type Decision =
  | { readonly action: "restart"; readonly counted: boolean; readonly failuresSoFar: number }
  | { readonly action: "fail"; readonly reason: string }

const RETRYABLE: ReadonlySet<FailureKind> = new Set(["died", "loop-error", "node-lost", "bus", "recovery"])
/** Not the job's fault, so not counted (the failure that led to a regroup was counted already). */
const INFRASTRUCTURE: ReadonlySet<FailureKind> = new Set(["node-lost", "bus", "recovery"])

/** Infrastructure restarts in a row without a completed report round before they count. */
export const MAX_INFRA_RESTARTS_WITHOUT_PROGRESS = 3

/** Errors that say the user's code or config is wrong, however often it is retried. */
const NON_RETRYABLE_TAGS: ReadonlySet<string> = new Set([
  "ConfigError", "SyntaxError", "ERR_MODULE_NOT_FOUND", "ModuleNotAllowed", "EnvNotAllowed", "UnsupportedKernel",
  // a bug in the loop's code, and a batch the backend's memory cannot hold: a restart meets them again
  "TypeError", "ReferenceError", "RangeError", "HeapExhausted",
  // a checkpoint's data position saved for other files: the restart would read it again
  "DataPositionMismatch",
  // tfjs's checks of a tensor's shape, rank or dtype (actors/train/worker/loop-errors.ts)
  "ValueError", "InvalidArgumentError"
])

/** Why a failure of tag `tag` is not retried, for the run's closing line. */
const notRetryable = (tag: string): string =>
  tag === "TypeError" || tag === "ReferenceError" || tag === "RangeError" || tag === "SyntaxError"
    ? `not retryable (${tag}: an error in the loop's code, which a restart would run into again; fix it and run again)`
    : tag === "ValueError" || tag === "InvalidArgumentError"
      ? `not retryable (${tag}: tfjs refused a tensor's shape, rank or dtype, which a restart would meet again at the same step; fix the loop or its data and run again)`
      : tag === "HeapExhausted"
      ? `not retryable (${tag}: the same batch would not fit again)`
      : tag === "DataPositionMismatch"
      ? `not retryable (${tag}: the checkpoint's data position is of other files, and a restart would resume from it again)`
      : `not retryable (${tag})`

export const isInfrastructure = (failure: GroupFailure): boolean => INFRASTRUCTURE.has(failure.kind)

/**
 * `failuresSoFar` counts earlier counted restarts. maxFailures -1 means no limit (Ray's semantics),
 * 0 means the first counted failure ends the run.
 */
export const decide = (
  failure: GroupFailure,
  failuresSoFar: number,
  maxFailures: number,
  context: { readonly infrastructureRestartsWithoutProgress?: number } = {}
): Decision => {
  if (!RETRYABLE.has(failure.kind) || NON_RETRYABLE_TAGS.has(failure.tag)) {
    return { action: "fail", reason: failure.kind === "loop-error" ? notRetryable(failure.tag) : `not retryable (${failure.kind})` }
  }
  if (isInfrastructure(failure) && (context.infrastructureRestartsWithoutProgress ?? 0) < MAX_INFRA_RESTARTS_WITHOUT_PROGRESS) {
    return { action: "restart", counted: false, failuresSoFar }
  }
  if (maxFailures >= 0 && failuresSoFar >= maxFailures) {
    const repeated = isInfrastructure(failure)
      ? `; the ${failure.kind === "bus" ? "NATS bus" : "cluster"} failed ${MAX_INFRA_RESTARTS_WITHOUT_PROGRESS + 1} times without a completed report round in between`
      : ""
    return {
      action: "fail",
      reason:
        (maxFailures === 0
          ? "failureConfig.maxFailures is 0 (set it above 0, or -1 for no limit, to recover: from the surviving workers where it can, else from the latest checkpoint)"
          : `failureConfig.maxFailures (${maxFailures}) restarts already used`) + repeated
    }
  }
  return { action: "restart", counted: true, failuresSoFar: failuresSoFar + 1 }
}

/**
 * The trainer's states. Every transition is written to events.jsonl and passed to the
 * onStateChange callbacks. "interrupted": the run stopped on SIGINT or SIGTERM (fit() rejects with
 * Interrupted); "errored": on a failure.
 */
export type TrainerState = "scheduling" | "running" | "restarting" | "resizing" | "finished" | "errored" | "interrupted"

/** Whether the trainer's run has ended (no transition out). */
export const isEndState = (s: TrainerState): boolean => s === "finished" || s === "errored" || s === "interrupted"
