// Gradient compression with error feedback: the codecs, the residual store, the config and the
// in-process simulation. The collectives layer wires these into its all-reduce / all-gather.
export type { Aggregation, CodecName, CompressedMessage, Compressor, EncodeContext } from "./compressor.ts"
export { HEADER_BYTES, codecOf } from "./compressor.ts"
export { Fp16Compressor, decodeFp16, encodeFp16, fp16BitsToFp32, fp32ToFp16Bits } from "./fp16.ts"
export { INT8_DEFAULT_CHUNK, Int8Compressor, type Int8Options } from "./int8.ts"
export { TopKCompressor, type TopKOptions, topkCount } from "./topk.ts"
export { SIGN_DEFAULT_CHUNK, SignCompressor } from "./sign.ts"
export { NoneCompressor } from "./none.ts"
export {
  type AllReduceSum,
  type MatrixGrad,
  type MatrixPlan,
  PowerSgdCompressor,
  type PowerSgdOptions,
  PowerSgdRound,
  type PowerSgdState
} from "./powersgd.ts"
export { ErrorFeedback, type ResidualState } from "./error-feedback.ts"
export {
  type CompressionConfig,
  CompressionConfigSchema,
  type ResolvedCompressionConfig,
  createCompressor,
  decodeCompressionConfig,
  parseCompressionConfig
} from "./config.ts"
export {
  type AnyCompressor,
  type SimulateOptions,
  inProcessAllReduce,
  ringSegment,
  ringSegmentKey,
  simulateCompressedAllReduce
} from "./simulate.ts"
export { CompressionAutoUnresolved, CompressionShapeError, ResidualMismatch } from "./errors.ts"
