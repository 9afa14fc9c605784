// Typed errors of the compression layer. Wire and config problems reuse core's WireDecodeError and
// ConfigError; these cover what only compression can get wrong: state that no longer fits the
// tensors it is applied to, a config that still says 'auto' when a concrete codec is needed, and a
// codec entry or codec that does not fit the registry's contract.
import * as Schema from "effect/Schema"

/**
 * A residual (or PowerSGD warm-start factor) exists under `key` with a length other than the
 * tensor's: the model or the bucket layout changed since it was saved. Clear the compression state
 * (or restore a checkpoint of the same model) instead of silently mixing two layouts.
 */
export class ResidualMismatch extends Schema.TaggedError<ResidualMismatch>()("ResidualMismatch", {
  key: Schema.String,
  expected: Schema.Number,
  got: Schema.Number
}) {
  override get message(): string {
    return (
      `compression state "${this.key}" holds ${this.expected} elements but the tensor has ${this.got}: ` +
      `the model or the bucket layout changed; drop the compression state or restore a matching checkpoint`
    )
  }
}

/** A gradient's shape does not match its data, or a codec needs a shape it was not given. */
export class CompressionShapeError extends Schema.TaggedError<CompressionShapeError>()("CompressionShapeError", {
  key: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot compress "${this.key}": ${this.reason}`
  }
}

/** `compression: 'auto'` reached a place that needs a concrete codec before the scheduler chose one. */
export class CompressionAutoUnresolved extends Schema.TaggedError<CompressionAutoUnresolved>()(
  "CompressionAutoUnresolved",
  {}
) {
  override get message(): string {
    return `compression "auto" must be resolved by the scheduler (from measured bandwidth and codec cost) before a compressor is created`
  }
}

/** A codec entry the registry cannot accept (a bad or taken name or wire id, a missing part). */
export class CodecRegistrationError extends Schema.TaggedError<CodecRegistrationError>()("CodecRegistrationError", {
  name: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot register codec "${this.name}": ${this.reason}`
  }
}

/**
 * A codec does not implement what its registry entry declares (codec.ts): it is refused when
 * created, rather than run down another aggregation's path.
 */
export class CodecContractError extends Schema.TaggedError<CodecContractError>()("CodecContractError", {
  codec: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `codec "${this.codec}" does not fit its registry entry: ${this.reason}; fix the codec or its entry (see collectives/compression/codec.ts)`
  }
}
