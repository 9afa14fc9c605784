// Gradient compression with error feedback: the codec registry and the built-in codecs, the
// residual store, the config and the in-process simulation. The collectives layer wires these into
// its all-reduce / all-gather (gradient-reducer.ts), by the aggregation each codec declares.
export type { CompressedMessage, Compressor, EncodeContext, WireCodec } from "./compressor.ts"
export { HEADER_BYTES, codecOf } from "./compressor.ts"
export type { Aggregation, Codec, CustomCodec, CustomTensor, GatherCodec, LinearCodec, SumAllReduce, UncompressedCodec } from "./codec.ts"
export {
  ErrorFeedbackOption,
  NonNegativeInt,
  PositiveInt,
  SeedOption,
  allowedCodecTypes,
  allowedCompression,
  askedProfile,
  autoCandidates,
  checkCodec,
  codecByWireId,
  codecNames,
  codecs,
  defineCodec,
  describeCodecs,
  exampleConfig,
  findCodec,
  formatConfig,
  registerCodec,
  type AutoCandidate,
  type AutoProfile,
  type CodecEntry,
  type LayoutShapes
} from "./registry.ts"
export { builtinCodecs, type BuiltinCodecConfig, type BuiltinShorthand } from "./codecs.ts"
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
  type ResolvedCompressionConfig,
  compressionConfigSchema,
  compressionType,
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
  simulateCompressedAllReduce,
  simulateRequantizingRing
} from "./simulate.ts"
export { CodecContractError, CodecRegistrationError, CompressionAutoUnresolved, CompressionShapeError, ResidualMismatch } from "./errors.ts"
