// What the trainer's controller (in the driver) and its workers (one process per rank) say to
// each other. Workers ask the controller for datasets and the checkpoint to resume from, and
// report metrics (with checkpoint bytes) as they go; the controller tells workers to run.
import { Schema } from "effect"
import { defineProtocol } from "../runtime/protocol.ts"

const Bytes = Schema.instanceOf(Uint8Array<ArrayBufferLike>)
const Metrics = Schema.Record(Schema.String, Schema.Unknown)

export const CheckpointPayload = Schema.Struct({
  files: Schema.Record(Schema.String, Bytes),
  metadata: Schema.Record(Schema.String, Schema.Unknown)
})
export type CheckpointPayload = typeof CheckpointPayload.Type

export const DatasetPayload = Schema.Struct({
  x: Schema.instanceOf(Float32Array<ArrayBufferLike>),
  y: Schema.instanceOf(Int32Array<ArrayBufferLike>),
  featureShape: Schema.Array(Schema.Number),
  numClasses: Schema.Number
})

export const ControllerProtocol = defineProtocol("trainer-controller", {
  /** A rank's report number `index`; answered once the controller holds it (checkpoint bytes included). */
  report: {
    request: Schema.Struct({
      attempt: Schema.Number,
      rank: Schema.Number,
      index: Schema.Number,
      metrics: Metrics,
      checkpoint: Schema.optionalKey(CheckpointPayload),
      /** This rank's own state for a checkpoint of this round (compression residuals), by file name. */
      aux: Schema.optionalKey(Schema.Record(Schema.String, Bytes))
    }),
    reply: Schema.Null
  },
  /** The rows of a named dataset given to the Trainer. */
  dataset: { request: Schema.Struct({ name: Schema.String }), reply: DatasetPayload },
  /** The checkpoint to resume from, or null. */
  checkpoint: {
    request: Schema.Null,
    reply: Schema.NullOr(Schema.Struct({ path: Schema.String, metrics: Metrics, payload: CheckpointPayload }))
  },
  /** Step progress for the live display and straggler hints. */
  progress: {
    request: Schema.Struct({
      attempt: Schema.Number,
      rank: Schema.Number,
      epoch: Schema.Number,
      step: Schema.Number,
      stepsPerEpoch: Schema.Number,
      /** Samples this rank has trained on so far in this attempt. */
      samples: Schema.Number,
      loss: Schema.Number,
      computeMs: Schema.Number,
      commMs: Schema.Number,
      /** Every step since the last progress message: [step, forward/backward ms, all-reduce ms, apply ms]. */
      stepTimes: Schema.optionalKey(Schema.Array(Schema.Array(Schema.Number)))
    })
  },
  /** Rank 0's all-reduce plan (algorithm per bucket, compression) with predicted times: explain.txt / explain.json. */
  explain: {
    request: Schema.Struct({ attempt: Schema.Number, text: Schema.String, json: Schema.Unknown, summary: Schema.String })
  },
  /** Timeline events of a rank (Chrome trace "X" events), flushed in batches. */
  trace: {
    request: Schema.Struct({ attempt: Schema.Number, rank: Schema.Number, events: Schema.Array(Schema.Unknown) })
  },
  /** The loop returned (`reports`: how often this rank called report). */
  finished: { request: Schema.Struct({ attempt: Schema.Number, rank: Schema.Number, reports: Schema.Number }) },
  /** The loop threw. */
  failed: {
    request: Schema.Struct({
      attempt: Schema.Number,
      rank: Schema.Number,
      tag: Schema.String,
      message: Schema.String,
      stack: Schema.String,
      /** Ranks a collective error blames (dead or stalled peers), when the failure is one. */
      blamed: Schema.optionalKey(Schema.Array(Schema.Number))
    })
  }
})
export type ControllerProtocol = typeof ControllerProtocol

export const WorkerArgs = Schema.Struct({
  attempt: Schema.Number,
  rank: Schema.Number,
  worldSize: Schema.Number,
  localRank: Schema.Number,
  localWorldSize: Schema.Number,
  nodeRank: Schema.Number,
  /** Node id per rank (hierarchical all-reduce groups by it). */
  nodes: Schema.Array(Schema.String),
  controller: Schema.String,
  loopModule: Schema.String,
  loopExport: Schema.String,
  loopConfig: Schema.Unknown,
  group: Schema.String,
  backend: Schema.String,
  collective: Schema.Struct({
    algorithm: Schema.String,
    compression: Schema.Unknown,
    bucketSizeMiB: Schema.Number,
    firstBucketSizeMiB: Schema.Number,
    wireDtype: Schema.String,
    timeoutMs: Schema.Number,
    /** Heterogeneity-aware per-rank batches for fit({ globalBatchSize }). */
    adaptiveBatching: Schema.optionalKey(Schema.Boolean)
  }),
  seed: Schema.Number,
  timeline: Schema.Boolean,
  /** failureConfig.natsOutageTimeoutMs: the worker exits when NATS stays away longer. */
  natsOutageTimeoutMs: Schema.optionalKey(Schema.Number),
  /** Elastic groups: the largest world size, and what stays fixed when the size changes. */
  elastic: Schema.optionalKey(Schema.Struct({ maxWorkers: Schema.Number, batch: Schema.Literals(["keep-global", "keep-per-worker"]) }))
})
export type WorkerArgs = typeof WorkerArgs.Type

export const WorkerProtocol = defineProtocol("trainer-worker", {
  /** Start the user's loop (answered at once; the loop runs in the background). */
  run: { request: Schema.Null, reply: Schema.Null }
})
export type WorkerProtocol = typeof WorkerProtocol
