// The collectives' public surface: the communicator and its operations, the all-reduce algorithm
// registry, bucketing, the tfjs adapter, the Effect entry point, deadlines from measurements
// (CommunicatorOptions.deadlines) and the typed errors. Everything else in collectives/ is internal.
export {
  Communicator,
  describeOp,
  type AllGatherOptions,
  type AllReduceAlgorithm,
  type AllReduceOptions,
  type BroadcastOptions,
  type CommunicatorOptions,
  type PeerInfo,
  type PeerLiveness,
  type WaitOn,
  type ReduceOp,
  type ReduceScatterOptions,
  type WireFormat
} from "./communicator.ts"
export {
  AlgorithmRegistrationError,
  allReduceAlgorithmNames,
  allReduceAlgorithms,
  defineAllReduceAlgorithm,
  describeAlgorithms,
  findAllReduceAlgorithm,
  registerAllReduceAlgorithm,
  type AllReduceAlgorithmEntry,
  type AllReduceCall
} from "./algorithms/index.ts"
export { MeasuredDeadlines, type Deadline, type DeadlineSettings } from "./deadlines.ts"
export { GradientBucketer, allReduceBuckets, planBuckets, DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES, type Bucket, type BucketOptions } from "./bucketing.ts"
export { allReduceTensor, allReduceTensors, broadcastTensors } from "./tensors.ts"
export { createCommunicatorEffect } from "./effect.ts"
export { segmentBounds } from "./segments.ts"
export type { HalfSource } from "./algorithms/ring.ts"
export * from "./errors.ts"
