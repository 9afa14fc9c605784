// What fit() gives back: the Result of a run (metrics history, checkpoints, restarts, resizes, the
// run directory). fit() has one failure channel: it resolves with a Result only when training
// completed, and otherwise rejects with a typed error that carries the partial Result as
// `error.result`: TrainingFailed for failures during training, NatsUnavailable when the bus stayed
// away past its deadline, PlacementInfeasible when the group could not be placed in time,
// Interrupted on Ctrl-C. Only a ConfigError thrown before anything started has no result.
import * as Schema from "effect/Schema"
import type { GroupFailure } from "./failure-policy.ts"

export interface CheckpointInfo {
  readonly path: string
  readonly metrics: Record<string, unknown>
  /**
   * Where a checkpoint kept in an object store (a `nats-obj://` path) can be read back from, so
   * that loadCheckpointModel and fetchCheckpoint find it without being told: the run's NATS
   * servers, or the embedded cluster's JetStream directory. Never a secret.
   */
  readonly objectStore?: ObjectStoreLocation
}

/** Where the bucket of an object store checkpoint lives. Plain data without secrets: it is also written to the run directory. */
export interface ObjectStoreLocation {
  /** The joined cluster's NATS server URLs, without credentials. */
  readonly servers?: ReadonlyArray<string>
  /**
   * Which credentials the run connected with, in words, never their values ("user "gw" with a
   * password", "a token", "creds file /path/user.creds"): a reader passes them itself.
   */
  readonly credentials?: string
  /** The TLS files the run connected with (paths on the driver's machine). */
  readonly tls?: { readonly caFile?: string; readonly certFile?: string; readonly keyFile?: string }
  /** The embedded cluster's JetStream data (`<run directory>/jetstream`): its nats-server stopped with the run. */
  readonly jetstreamDir?: string
}

/** A change of the group's size: an elastic resize, or a fixed-size group short-handed after a failure and refilled. */
export interface Resize {
  readonly time: string
  /** The generation that starts at the new size. */
  readonly attempt: number
  readonly from: number
  readonly to: number
  readonly reason: string
}

/** A checkpoint that could not be written, after retries. */
export interface CheckpointError {
  readonly time: string
  readonly round: number
  readonly message: string
  readonly attempts: number
}

/** A lost NATS connection of the driver that came back (or did not). */
export interface BusOutage {
  readonly time: string
  readonly server: string
  readonly ms: number
  /** Whether gradwire restarted the server it supervises during the outage. */
  readonly serverRestarted: boolean
}

export interface Result {
  /** Rank 0's last reported metrics. */
  readonly metrics: Record<string, unknown> | undefined
  /**
   * Rank 0's metrics, one entry per report round (as Ray keeps them) that the final weights descend
   * from: a restart's rounds made again replace the first ones; a rerun resuming its own checkpoint
   * starts with the earlier fit()'s rounds up to it. metrics.jsonl keeps every row.
   */
  readonly metricsHistory: ReadonlyArray<Record<string, unknown>>
  /** Every rank's metrics per round: metricsPerRank[round][rank]. */
  readonly metricsPerRank: ReadonlyArray<ReadonlyArray<Record<string, unknown>>>
  /** The latest checkpoint. */
  readonly checkpoint: CheckpointInfo | undefined
  /** Kept checkpoints, best first by checkpointConfig.scoreAttribute (newest first without one). */
  readonly bestCheckpoints: ReadonlyArray<CheckpointInfo>
  /** The run directory: metrics, config, logs, checkpoints. */
  readonly path: string
  /** Worker-group restarts after failures (of the job and of the infrastructure). */
  readonly restarts: number
  /** Restarts that used failureConfig.maxFailures. */
  readonly countedFailures: number
  /** Size changes of an elastic group. */
  readonly resizes: ReadonlyArray<Resize>
  /** Checkpoints that could not be written; training went on. */
  readonly checkpointErrors: ReadonlyArray<CheckpointError>
  /** Outages of the driver's NATS connection. */
  readonly busOutages: ReadonlyArray<BusOutage>
  /** Restarts of a nats-server gradwire supervises (the embedded cluster's). */
  readonly natsServerRestarts: number
}

/** Why fit() rejected after training started: a failure of the job that the policy did not retry. */
export class TrainingFailed extends Error {
  readonly _tag = "TrainingFailed"
  readonly rank: number
  readonly kind: GroupFailure["kind"]
  readonly remoteTag: string
  readonly remoteStack: string
  readonly attempts: number
  /** What the run achieved before it failed. */
  result!: Result
  /** @internal The trainer makes it when its failure policy gives up. */
  constructor(failure: GroupFailure, attempts: number, decision: string) {
    super(
      `training failed${failure.rank >= 0 ? ` on rank ${failure.rank}` : ""} (${failure.kind === "loop-error" ? `${failure.tag} in the training loop` : failure.kind}): ` +
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

/** fit() was interrupted (SIGINT/SIGTERM); every worker was stopped. */
export class Interrupted extends Schema.TaggedError<Interrupted>()("Interrupted", { signal: Schema.String }) {
  override get message(): string {
    return `training was interrupted by ${this.signal}; every worker was stopped, checkpoints written so far are kept`
  }
}

/** A rejection of fit() with the partial Result attached. */
export type FitError = Error & { readonly result: Result }

/** Attaches the partial Result to an error fit() rejects with. */
export const withResult = <E extends object>(e: E, result: Result): E & { readonly result: Result } => {
  Object.defineProperty(e, "result", { value: result, enumerable: false, configurable: true, writable: true })
  return e as E & { readonly result: Result }
}

/** The partial Result of a fit() rejection, if it carries one. */
export const resultOf = (e: unknown): Result | undefined =>
  typeof e === "object" && e !== null && "result" in e ? ((e as { result?: Result }).result ?? undefined) : undefined
