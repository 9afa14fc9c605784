// The `compression` option: its validation (a bad value is a ConfigError naming the field and what
// is allowed) and createCompressor, which turns a validated config into a codec. The forms come
// from the codec registry (registry.ts; the built-ins in codecs.ts):
//
//   'auto' | a shorthand name ('none', 'fp16')
//   { type: <codec>, ...its options }                e.g. { type: 'topk', ratio: 0.01 }
//
// errorFeedback defaults to true. 'auto' is accepted here and resolved by the scheduler (compress
// only when measured communication dominates the step); createCompressor refuses it.
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import { ConfigError } from "../../core/errors.ts"
import { decodeConfig } from "../../core/validate.ts"
import type { Codec } from "./codec.ts"
import "./codecs.ts" // registers the built-in codecs
import type { BuiltinCodecConfig, BuiltinShorthand } from "./codecs.ts"
import { CompressionAutoUnresolved } from "./errors.ts"
import { allowedCodecTypes, allowedCompression, checkCodec, codecs, findCodec, formatConfig } from "./registry.ts"

/**
 * A config with 'auto' resolved: a registered codec's object form, or the bare name of one that
 * allows it. Codecs registered at run time type as `{ type: string }` and bare strings.
 */
export type ResolvedCompressionConfig = BuiltinCodecConfig | BuiltinShorthand | { readonly type: string } | (string & {})
export type CompressionConfig = ResolvedCompressionConfig | "auto"

/** The whole option as one schema, for embedding in a larger config schema: the registered codecs now. */
export const compressionConfigSchema = () =>
  Schema.Union([
    Schema.Literals(["auto", ...codecs().filter((c) => c.shorthand).map((c) => c.name)]),
    ...codecs().map((c) => c.schema)
  ])

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
    if (input === "auto") return input
    const entry = findCodec(input)
    if (entry?.shorthand) return input
    const hint = entry ? ` (write ${formatConfig(entry.example)})` : ""
    throw new ConfigError({ field, reason: `unknown compression "${input}"${hint}; allowed: ${allowedCompression()}` })
  }
  if (typeof input === "object" && input !== null && !Array.isArray(input)) {
    const type = (input as { type?: unknown }).type
    const entry = typeof type === "string" ? findCodec(type) : undefined
    if (entry) return decodeConfig(entry.schema, input, field) as CompressionConfig
    throw new ConfigError({
      field: `${field}.type`,
      reason: `${type === undefined ? "missing" : `unknown compression type ${show(type)}`}; allowed types: ${allowedCodecTypes()}`
    })
  }
  throw new ConfigError({ field, reason: `expected ${allowedCompression()}, got ${show(input)}` })
}

/** Effect-native validation: fails with ConfigError instead of throwing. */
export const decodeCompressionConfig = (input: unknown, field = "compression"): Effect.Effect<CompressionConfig, ConfigError> =>
  Effect.try({
    try: () => parseCompressionConfig(input, field),
    catch: (e) => (e instanceof ConfigError ? e : new ConfigError({ field, reason: String(e) }))
  })

/** The codec type a config names ('none' for absent), without validating it. */
export const compressionType = (config: CompressionConfig | undefined): string =>
  config === undefined ? "none" : typeof config === "string" ? config : config.type

/**
 * A codec from a config (validated here too, for callers from plain JS), made by its registry
 * entry and checked against what the entry declares. 'none' gives the identity codec. Codecs may
 * hold per-rank state (PowerSGD's warm-start factors), so every rank creates its own.
 */
export const createCompressor = (config: CompressionConfig): Codec => {
  const c = parseCompressionConfig(config)
  if (c === "auto") throw new CompressionAutoUnresolved()
  const type = compressionType(c)
  const entry = findCodec(type)
  if (!entry) throw new ConfigError({ field: "compression.type", reason: `unknown compression type "${type}"; allowed types: ${allowedCodecTypes()}` })
  const obj = typeof c === "string" ? decodeConfig(entry.schema, { type: c }, "compression") : c
  return checkCodec(entry, entry.create(obj))
}
