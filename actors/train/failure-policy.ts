// The trainer's failure policy: given what went wrong with the worker group and how many restarts
// were already spent, decide whether to restart from the latest checkpoint or give up. Pure, so
// the controller only carries decisions out.

export type FailureKind =
  /** The worker process died (crash, kill -9, lost node, missed heartbeats). */
  | "died"
  /** The user's loop threw. */
  | "loop-error"
  /** Ranks called report() a different number of times: restarting would do the same again. */
  | "report-mismatch"
  /** The loop cannot start at all (bad module, bad export, invalid config): not retryable. */
  | "config"

export interface GroupFailure {
  readonly kind: FailureKind
  readonly rank: number
  /** The remote error's tag (e.g. "TypeError", "CollectiveTimeout") or the death reason. */
  readonly tag: string
  readonly message: string
  readonly remoteStack?: string
}

export type Decision =
  | { readonly action: "restart"; readonly failuresSoFar: number }
  | { readonly action: "fail"; readonly reason: string }

const RETRYABLE: ReadonlySet<FailureKind> = new Set(["died", "loop-error"])

/** Errors that say the user's code or config is wrong, however often it is retried. */
const NON_RETRYABLE_TAGS: ReadonlySet<string> = new Set(["ConfigError", "SyntaxError", "ERR_MODULE_NOT_FOUND"])

/**
 * `failuresSoFar` counts earlier restarts. maxFailures -1 means no limit (Ray's semantics), 0 means
 * the first failure ends the run.
 */
export const decide = (failure: GroupFailure, failuresSoFar: number, maxFailures: number): Decision => {
  if (!RETRYABLE.has(failure.kind) || NON_RETRYABLE_TAGS.has(failure.tag)) {
    return { action: "fail", reason: `not retryable (${failure.kind === "loop-error" ? failure.tag : failure.kind})` }
  }
  if (maxFailures >= 0 && failuresSoFar >= maxFailures) {
    return {
      action: "fail",
      reason: maxFailures === 0
        ? "failureConfig.maxFailures is 0 (set it above 0, or -1 for no limit, to restart from the latest checkpoint)"
        : `failureConfig.maxFailures (${maxFailures}) restarts already used`
    }
  }
  return { action: "restart", failuresSoFar: failuresSoFar + 1 }
}

/** The trainer's states; transitions are logged and kept in Result.attempts. */
export type TrainerState = "scheduling" | "running" | "restarting" | "finished" | "errored"
