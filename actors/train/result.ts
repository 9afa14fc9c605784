// What fit() gives back: the Result of a run (metrics history, checkpoints, run directory), and
// TrainingFailed, the error a failed run ends with.
import type { GroupFailure } from "./failure-policy.ts"

export interface CheckpointInfo {
  readonly path: string
  readonly metrics: Record<string, unknown>
}

/** Why fit() ended without finishing. */
export class TrainingFailed extends Error {
  readonly _tag = "TrainingFailed"
  readonly rank: number
  readonly kind: GroupFailure["kind"]
  readonly remoteTag: string
  readonly remoteStack: string
  readonly attempts: number
  constructor(failure: GroupFailure, attempts: number, decision: string) {
    super(
      `training failed on rank ${failure.rank} (${failure.kind === "loop-error" ? `${failure.tag} in the training loop` : failure.kind}): ` +
        `${failure.message}; giving up: ${decision}`
    )
    this.name = "TrainingFailed"
    this.rank = failure.rank
    this.kind = failure.kind
    this.remoteTag = failure.tag
    this.remoteStack = failure.remoteStack ?? ""
    this.attempts = attempts
  }
}

export interface Result {
  /** Rank 0's last reported metrics. */
  readonly metrics: Record<string, unknown> | undefined
  /** Rank 0's metrics, one entry per report round (as Ray keeps them). */
  readonly metricsHistory: ReadonlyArray<Record<string, unknown>>
  /** Every rank's metrics per round: metricsPerRank[round][rank]. */
  readonly metricsPerRank: ReadonlyArray<ReadonlyArray<Record<string, unknown>>>
  /** The latest checkpoint. */
  readonly checkpoint: CheckpointInfo | undefined
  /** Kept checkpoints, best first by checkpointConfig.scoreAttribute (newest first without one). */
  readonly bestCheckpoints: ReadonlyArray<CheckpointInfo>
  readonly error: TrainingFailed | undefined
  /** The run directory: metrics, config, logs, checkpoints. */
  readonly path: string
  /** Worker-group restarts after failures. */
  readonly restarts: number
}

