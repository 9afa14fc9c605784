// gradwire's public entry point: everything a user touches is exported from here; the rest is
// internal and may change.
export * from "./core/errors.ts"
export type { Tf, BackendKind } from "./core/engine.ts"
export { loadEngine } from "./core/engine.ts"
export { loadDigits, makeDataset, trainTestSplit, shardIndices, type ArrayDataset } from "./core/datasets.ts"
export * from "./core/config.ts"
export { launchNatsServer, launchNatsCluster, startNatsServer } from "./core/nats-server.ts"
export { openNats, connectNats, Nats, NatsLayer } from "./core/connection.ts"
export { encodeMessage, decodeMessage, wireTensor, WireTensor } from "./core/wire.ts"
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
} from "./actors/train/trainer.ts"
export type { Resize, CheckpointError, BusOutage } from "./actors/train/result.ts"
export { TrainContext, DatasetShard, type Checkpoint, type ReportOptions } from "./actors/train/train-context.ts"
export { DataParallelModel } from "./actors/train/data-parallel.ts"
export { Communicator } from "./collectives/communicator.ts"
export type { ReducerStats } from "./collectives/gradient-reducer.ts"
export * from "./actors/index.ts"
export { PlacementInfeasible } from "./scheduler/placement.ts"
