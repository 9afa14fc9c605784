// gradwire's public entry point ("gradwire"), for Promise code: what a user of the Trainer, of
// custom collectives and of the actor runtime touches. Functions here return Promises and have
// plain names; their Effect versions, named <name>Effect, and the Effect Layers and services are
// in effect.ts ("gradwire/effect"). Everything not exported from one of the two is internal and
// may change (the wire format, the embedded nats-server launchers, the node agent's internals).
// The Node version check comes first, before any other module runs.
import "./core/node-version.ts"

// Training
export {
  Trainer,
  TrainingFailed,
  Interrupted,
  resultOf,
  type Result,
  type FitError,
  type TrainerOptions,
  type CheckpointInfo,
  type TrainerCallbacks
} from "./actors/train/driver/trainer.ts"
export type { Resize, CheckpointError, BusOutage } from "./actors/train/driver/result.ts"
export { loadResult } from "./actors/train/driver/result-files.ts"
export { TrainContext, DatasetShard, type Checkpoint, type ReportOptions } from "./actors/train/worker/train-context.ts"
export {
  DataParallelModel,
  type PrepareOptions,
  type EvaluateOptions,
  type FitOptions,
  type TrainStepOptions,
  type StepResult,
  type EpochResult,
  type FitCommonOptions,
  type GradientSlot,
  type LossName,
  type LossFn,
  type ModelInput
} from "./actors/train/worker/data-parallel.ts"
export type { ShardSource, FitSource } from "./actors/train/worker/batches.ts"
export type { RecoverableModel, LoopPosition, ReplayLog } from "./actors/train/worker/group-session.ts"
export type { FailureKind, TrainerState, GroupFailure } from "./actors/train/driver/failure-policy.ts"
export type { AnyTrainLoop, DatasetInput } from "./actors/train/driver/options.ts"
export type { TrainLoop } from "./actors/train/worker/train-context.ts"
export type { LrScaling, LrRuleOptions } from "./actors/train/common/optim/lr-rules.ts"
export type { ZeroStage } from "./actors/train/common/optim/zero.ts"
// Model parallelism: pipeline stages (GPipe, 1F1B) and tensor-parallel dense pairs (ctx.preparePipeline)
export {
  PipelineModel,
  type PipelineStepResult,
  type PipelineEpochResult,
  type PipelineFitOptions,
  type PipelineStepTiming,
  type PipelineMemoryStats
} from "./actors/train/worker/model-parallel/pipeline-model.ts"
export type { PipelineOptions, PipelineSpec, LayerStack } from "./actors/train/worker/model-parallel/prepare.ts"
export type { ScheduleName } from "./actors/train/worker/model-parallel/schedule.ts"
export type { BalanceBy } from "./actors/train/worker/model-parallel/partition.ts"
export { mergePipelineCheckpoint, type PipelineLayout, type CheckpointArg } from "./actors/train/worker/model-parallel/checkpoint.ts"
// The trained model back in the driver, from a directory, its files or an object store: the model
// code is the workers', the fetch the driver's (their folders do not import each other).
import { loadCheckpointModel as modelOfCheckpoint, loadPipelineCheckpoint as modelOfPipelineCheckpoint } from "./actors/train/worker/model-parallel/checkpoint.ts"
import { checkpointLoader } from "./actors/train/driver/checkpoint-fetch.ts"
export { fetchCheckpoint, type FetchCheckpointOptions, type CheckpointSource, type CheckpointLoader } from "./actors/train/driver/checkpoint-fetch.ts"
export type { ObjectStoreLocation } from "./actors/train/driver/result.ts"
/**
 * A run's checkpoint as the tfjs model it holds, with its trained weights, for inference or export
 * (model.save), as Ray's result.checkpoint: result.checkpoint (or one of result.bestCheckpoints, or
 * loadResult(dir)'s), a checkpoint directory, its files, or a nats-obj:// path; a checkpoint kept in
 * an object store is fetched first (see fetchCheckpoint for `options`). `tf` may be left out: the
 * model is then made on gradwire's engine (loadEngine()).
 */
export const loadCheckpointModel = checkpointLoader("loadCheckpointModel", modelOfCheckpoint)
/** A pipelined run's checkpoint as one tfjs model with the trained weights; the arguments are loadCheckpointModel's. */
export const loadPipelineCheckpoint = checkpointLoader("loadPipelineCheckpoint", modelOfPipelineCheckpoint)
export type { GridPlace } from "./actors/train/worker/model-parallel/grid.ts"
export type { PipelineSource } from "./actors/train/worker/model-parallel/pipeline-model.ts"
export { ModelParallelLinkError } from "./actors/train/worker/model-parallel/transport.ts"
export { loadDigits, makeDataset, trainTestSplit, shardIndices, type ArrayDataset } from "./core/datasets.ts"
// File-backed datasets: each worker streams its own rows from files or an object store bucket
export { fromFiles, datasetFactory, type FromFilesOptions, type FileFormat, type FileDatasetSpec, type DatasetFactorySpec } from "./core/data/file-spec.ts"
export { writeShards, writeShardFile, type WriteShardsOptions, type ShardRows, type ShardHeader, type Block, type LabelDtype } from "./core/data/shard-format.ts"
export { putFiles, listUploaded, type PutOptions, type DataManifest } from "./core/data/object-data.ts"
export { FileStream, oneHot, normalize, scale, type Batch, type BatchTransform, type StreamStats, type StreamingSource } from "./core/data/stream.ts"
export { IterableStream, type RowSource, type StreamedRow, type TfDataset, type IterablePosition } from "./core/data/iterable-stream.ts"
export type { WireTensor, DType, DataFor } from "./core/wire.ts"
export type { DataPosition } from "./core/data/plan.ts"
export { DataSourceError, DataFormatError, DataPositionMismatch } from "./core/data/errors.ts"
export type { Shard } from "./actors/train/worker/train-context.ts"
export type { Tf, BackendKind } from "./core/engine.ts"
export { loadEngine } from "./core/engine.ts"
export { crossEntropy } from "./core/kernels/cross-entropy.ts"

// The configs (Schemas and their types: ScalingConfig, RunConfig, CheckpointConfig, FailureConfig,
// CollectiveConfig, ClusterConfig, TrainLoopRef, ...)
export * from "./core/config.ts"

// Typed errors a user catches (configs, NATS, placement, training, collectives, actors)
export * from "./core/errors.ts"
export { PlacementInfeasible } from "./scheduler/placement.ts"
export {
  CollectiveAborted,
  CollectiveArgumentError,
  CollectiveOverflow,
  CollectiveProtocolError,
  CollectiveTimeout,
  CommunicatorClosed,
  ConnectionLost,
  GroupMismatch,
  LengthMismatch,
  OpMismatch,
  PeerLinkLost,
  type CollectiveError
} from "./collectives/errors.ts"

// Custom collectives (ctx.communicator in a training loop)
export {
  Communicator,
  type CommunicatorOptions,
  type CallOptions,
  type AllReduceOptions,
  type AllGatherOptions,
  type BroadcastOptions,
  type ReduceScatterOptions,
  type PeerInfo,
  type PeerLiveness,
  type WaitOn,
  type TransportInfo,
  type TransportMeasurement,
  type PairTiming
} from "./collectives/communicator.ts"
export type { WireFormat, DirectOptions } from "./collectives/communicator.ts"
export type { ReduceOp } from "./collectives/kernels.ts"
export type { DirectAddress, TransportChoice } from "./collectives/direct.ts"
export { MeasuredDeadlines, type Deadline, type DeadlineSettings } from "./collectives/deadlines.ts"
export type { NodeGroup } from "./collectives/algorithms/hierarchical.ts"
export type { AllReduceAlgorithm, BuiltinAlgorithmName } from "./collectives/algorithms/index.ts"
export type { ReducerStats } from "./collectives/gradient-reducer.ts"

// The NATS connection, for code that opens its own (an actor system, for example)
export { openNats, type NatsConnectOptions, type NatsHandle, type NatsTlsOptions } from "./core/connection.ts"

// The actor runtime, for users who write their own actors
export * from "./actors/index.ts"
