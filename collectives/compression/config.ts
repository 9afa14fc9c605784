// The `compression` option: its schema, its validation (a bad value is a ConfigError naming the
// field and what is allowed) and createCompressor, which turns a validated config into codecs.
//
//   'none' | 'fp16' | 'auto'
//   { type: 'none' } | { type: 'fp16', errorFeedback? }
//   { type: 'int8', chunkSize?, seed?, errorFeedback? }
//   { type: 'topk', ratio, errorFeedback? }                       ratio in (0, 1]
//   { type: 'powersgd', rank, warmupSteps?, minCompressionRate?, seed?, errorFeedback? }
//   { type: 'sign', chunkSize?, errorFeedback? }                   chunkSize a multiple of 8
//
// errorFeedback defaults to true. 'auto' is accepted here and resolved by the scheduler (compress
// only when measured communication dominates the step); createCompressor refuses it.
import { Effect, Schema } from "effect"
import { ConfigError } from "../../core/errors.ts"
import { decodeConfig } from "../../core/validate.ts"
import { CompressionAutoUnresolved } from "./errors.ts"
import { Fp16Compressor } from "./fp16.ts"
import { INT8_DEFAULT_CHUNK, Int8Compressor } from "./int8.ts"
import { NoneCompressor } from "./none.ts"
import { PowerSgdCompressor } from "./powersgd.ts"
import { SIGN_DEFAULT_CHUNK, SignCompressor } from "./sign.ts"
import { TopKCompressor } from "./topk.ts"
import type { AnyCompressor } from "./simulate.ts"

const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const Seed = Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 0xffffffff }))
const ErrorFeedbackFlag = Schema.optionalKey(Schema.Boolean)

export const NoneConfig = Schema.Struct({ type: Schema.Literal("none") })
export const Fp16Config = Schema.Struct({ type: Schema.Literal("fp16"), errorFeedback: ErrorFeedbackFlag })
export const Int8Config = Schema.Struct({
  type: Schema.Literal("int8"),
  chunkSize: Schema.optionalKey(PositiveInt),
  seed: Schema.optionalKey(Seed),
  errorFeedback: ErrorFeedbackFlag
})
export const TopKConfig = Schema.Struct({
  type: Schema.Literal("topk"),
  ratio: Schema.Finite.check(Schema.isGreaterThan(0), Schema.isLessThanOrEqualTo(1)),
  errorFeedback: ErrorFeedbackFlag
})
export const PowerSgdConfig = Schema.Struct({
  type: Schema.Literal("powersgd"),
  rank: PositiveInt.check(Schema.isLessThanOrEqualTo(30)),
  warmupSteps: Schema.optionalKey(NonNegativeInt),
  minCompressionRate: Schema.optionalKey(Schema.Finite.check(Schema.isGreaterThanOrEqualTo(1))),
  seed: Schema.optionalKey(Seed),
  errorFeedback: ErrorFeedbackFlag
})
export const SignConfig = Schema.Struct({
  type: Schema.Literal("sign"),
  chunkSize: Schema.optionalKey(PositiveInt.check(Schema.makeFilter((n: number) => n % 8 === 0, { expected: "a multiple of 8" }))),
  errorFeedback: ErrorFeedbackFlag
})

const STRINGS = ["none", "fp16", "auto"] as const
const TYPES = { none: NoneConfig, fp16: Fp16Config, int8: Int8Config, topk: TopKConfig, powersgd: PowerSgdConfig, sign: SignConfig } as const

/** The whole option, for embedding in a larger config schema. */
export const CompressionConfigSchema = Schema.Union([
  Schema.Literals(STRINGS),
  NoneConfig,
  Fp16Config,
  Int8Config,
  TopKConfig,
  PowerSgdConfig,
  SignConfig
])

export type CompressionConfig = typeof CompressionConfigSchema.Type
/** A config the scheduler has resolved: no 'auto'. */
export type ResolvedCompressionConfig = Exclude<CompressionConfig, "auto">

const ALLOWED =
  `"none", "fp16", "auto", or { type: "int8" }, { type: "topk", ratio }, ` +
  `{ type: "powersgd", rank, warmupSteps }, { type: "sign" } (also { type: "none" | "fp16" })`

const show = (v: unknown): string => {
  try {
    return JSON.stringify(v) ?? String(v)
  } catch {
    return String(v)
  }
}

/**
 * Validates the `compression` option. Absent means 'none'. Throws ConfigError naming the field
 * (`field`, or `field.ratio` and so on) and the allowed values.
 */
export const parseCompressionConfig = (input: unknown, field = "compression"): CompressionConfig => {
  if (input === undefined) return "none"
  if (typeof input === "string") {
    if ((STRINGS as ReadonlyArray<string>).includes(input)) return input as CompressionConfig
    const hint = input in TYPES ? ` (write { type: "${input}"${input === "topk" ? ", ratio: 0.01" : input === "powersgd" ? ", rank: 4, warmupSteps: 10" : ""} })` : ""
    throw new ConfigError({ field, reason: `unknown compression "${input}"${hint}; allowed: ${ALLOWED}` })
  }
  if (typeof input === "object" && input !== null && !Array.isArray(input)) {
    const type = (input as { type?: unknown }).type
    if (typeof type === "string" && type in TYPES) return decodeConfig(TYPES[type as keyof typeof TYPES], input, field)
    throw new ConfigError({
      field: `${field}.type`,
      reason: `${type === undefined ? "missing" : `unknown compression type ${show(type)}`}; allowed types: "none", "fp16", "int8", "topk", "powersgd", "sign"`
    })
  }
  throw new ConfigError({ field, reason: `expected ${ALLOWED}, got ${show(input)}` })
}

/** Effect-native validation: fails with ConfigError instead of throwing. */
export const decodeCompressionConfig = (input: unknown, field = "compression"): Effect.Effect<CompressionConfig, ConfigError> =>
  Effect.try({
    try: () => parseCompressionConfig(input, field),
    catch: (e) => (e instanceof ConfigError ? e : new ConfigError({ field, reason: String(e) }))
  })

/**
 * Codecs from a config (validated here too, for callers from plain JS). 'none' gives the identity
 * codec. PowerSGD instances hold per-rank state (warm-start factors), so every rank creates its
 * own; element-wise codecs are cheap to create and keep only scratch buffers.
 */
export const createCompressor = (config: ResolvedCompressionConfig | CompressionConfig): AnyCompressor => {
  const c = parseCompressionConfig(config)
  if (c === "auto") throw new CompressionAutoUnresolved()
  const obj = typeof c === "string" ? ({ type: c } as const) : c
  switch (obj.type) {
    case "none":
      return new NoneCompressor()
    case "fp16":
      return new Fp16Compressor({ errorFeedback: "errorFeedback" in obj ? obj.errorFeedback : undefined })
    case "int8":
      return new Int8Compressor({ chunkSize: obj.chunkSize ?? INT8_DEFAULT_CHUNK, seed: obj.seed, errorFeedback: obj.errorFeedback })
    case "topk":
      return new TopKCompressor({ ratio: obj.ratio, errorFeedback: obj.errorFeedback })
    case "powersgd":
      return new PowerSgdCompressor({
        rank: obj.rank,
        warmupSteps: obj.warmupSteps,
        minCompressionRate: obj.minCompressionRate,
        seed: obj.seed,
        errorFeedback: obj.errorFeedback
      })
    case "sign":
      return new SignCompressor({ chunkSize: obj.chunkSize ?? SIGN_DEFAULT_CHUNK, errorFeedback: obj.errorFeedback })
  }
}
