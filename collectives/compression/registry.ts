// The codec registry: every gradient codec is declared once, as one entry that carries its name,
// its config's schema (and an example for messages), the aggregation it implements (codec.ts),
// its factory, its id in message headers, and what compression 'auto' needs to weigh it. Config
// parsing, error messages, createCompressor, 'auto' candidates, benchmarks and tests read their
// lists from here; the gradient reducer runs the aggregation the created codec declares.
//
// The built-in codecs are registered by ./codecs.ts; another one is one module that defines an
// entry (defineCodec) and one registerCodec call, made in every process that creates it.
import * as Schema from "effect/Schema"
import type { Aggregation, Codec } from "./codec.ts"
import { CodecContractError, CodecRegistrationError } from "./errors.ts"

/** A model's variables, as 'auto' sees them when it weighs a codec. */
export type LayoutShapes = ReadonlyArray<{ readonly shape: ReadonlyArray<number>; readonly size: number }>

/** What compression 'auto' needs to weigh a codec against sending uncompressed. */
export interface AutoCandidate<C> {
  /** Escalation order: 'auto' tries the lowest (the mild one) first. */
  readonly order: number
  /** The config 'auto' switches to when it picks this codec (weighed by the entry's wireRatio). */
  readonly config: C
  /** All-reduces per bucket (PowerSGD: P, then Q). Default 1. */
  readonly rounds?: number
}

/** One codec: what it is called and configured with, how it aggregates, how it is made. */
export interface CodecEntry<N extends string = string, S extends Schema.ConstraintDecoder<unknown> = Schema.ConstraintDecoder<unknown>> {
  /** The config's `type` (and the bare-string form with `shorthand`): lower case, digits and "-". */
  readonly name: N
  /** What it implements; the created codec must declare the same (codec.ts). */
  readonly aggregation: Aggregation
  /** One line: what it does and when it pays (docs, explain). */
  readonly hint: string
  /** The object form, { type: name, ...options }; unknown options are refused. */
  readonly schema: S
  /**
   * A typical config (the bare name for a shorthand codec): shown in messages as a user writes it
   * (`{ type: "topk", ratio: 0.01 }`), and the config tests and benchmarks run the codec with.
   */
  readonly example: S["Type"] | N
  /** May be written as the bare string `name` (every option has a default). */
  readonly shorthand?: boolean
  /** Byte 1 of its messages' header (compressor.ts), for codecs with byte messages: 0-255, unique. */
  readonly wireId?: number
  /** Makes a codec from a validated config (one per rank: some keep state). */
  create(config: S["Type"]): Codec
  /** Present when compression 'auto' may pick it. */
  readonly auto?: AutoCandidate<S["Type"]>
  /**
   * Uncompressed bytes / bytes on the wire with `config`, for a model of these variables: how the
   * cost model prices this codec, at 'auto''s config or where a run asks for it (explain.txt).
   * Needed with `auto`; without it, a codec asked for runs unpriced.
   */
  wireRatio?(config: S["Type"], layout: LayoutShapes): number
}

type AnyEntry = CodecEntry<string, Schema.ConstraintDecoder<unknown>>

const NAME = /^[a-z][a-z0-9-]{0,31}$/
const AGGREGATIONS: ReadonlyArray<Aggregation> = ["none", "linear", "allgather", "custom"]

const byName = new Map<string, AnyEntry>()
const byWireId: Array<AnyEntry | undefined> = new Array(256).fill(undefined)
let list: ReadonlyArray<AnyEntry> = []

/** Types an entry (keeping its literal name and config type) without registering it. */
export const defineCodec = <const N extends string, S extends Schema.ConstraintDecoder<unknown>>(entry: CodecEntry<N, S>): CodecEntry<N, S> => entry

/**
 * Adds a codec. Refuses a bad or taken name or wire id, or an entry without a schema, factory or
 * known aggregation. Registering the same entry object again is a no-op.
 */
export const registerCodec = (entry: CodecEntry): void => {
  const e = entry as AnyEntry
  const name = String(e?.name)
  const fail = (reason: string): never => {
    throw new CodecRegistrationError({ name, reason })
  }
  if (byName.get(name) === e) return
  if (!NAME.test(name) || name === "auto") fail('a name is 1-32 lower-case letters, digits or "-", starting with a letter, and not "auto"')
  if (byName.has(name)) fail("the name is taken; pick another")
  if (!AGGREGATIONS.includes(e.aggregation)) fail(`aggregation must be one of ${AGGREGATIONS.join(", ")}, got ${String(e.aggregation)}`)
  if (typeof e.create !== "function" || e.schema === undefined) fail("an entry needs a schema and create(config)")
  if (typeof e.hint !== "string" || e.hint.length === 0) fail("an entry needs a one-line hint")
  const example = typeof e.example === "string" ? { type: e.example } : e.example
  if (!Schema.is(e.schema)(example) || (typeof e.example === "string" && !e.shorthand)) {
    fail(`its example ${formatConfig(e.example)} is not a config its schema accepts${typeof e.example === "string" ? " (a bare name needs shorthand: true)" : ""}`)
  }
  if (e.wireId !== undefined) {
    if (!Number.isInteger(e.wireId) || e.wireId < 0 || e.wireId > 255) fail(`wireId ${e.wireId} is not an integer in 0..255`)
    const holder = byWireId[e.wireId]
    if (holder) fail(`wireId ${e.wireId} belongs to "${holder.name}"`)
  }
  if (e.auto !== undefined && (typeof e.wireRatio !== "function" || !Number.isFinite(e.auto.order) || !Schema.is(e.schema)(e.auto.config))) {
    fail("auto needs an order, a config its schema accepts and the entry's wireRatio(config, layout)")
  }
  byName.set(name, e)
  if (e.wireId !== undefined) byWireId[e.wireId] = e
  list = Object.freeze([...list, e])
}

/** The config an example or a shorthand name stands for, in its object form. */
export const exampleConfig = (entry: AnyEntry): { readonly type: string } =>
  (typeof entry.example === "string" ? { type: entry.example } : entry.example) as { readonly type: string }

/** Every registered codec, in registration order. */
export const codecs = (): ReadonlyArray<AnyEntry> => list

export const codecNames = (): string[] => list.map((c) => c.name)

export const findCodec = (name: string): AnyEntry | undefined => byName.get(name)

/** The codec whose messages carry this id in their header. */
export const codecByWireId = (id: number): AnyEntry | undefined => byWireId[id]

/**
 * Checks that a codec made by `entry` implements what the entry declares (the hooks of its
 * aggregation), so a codec that would run down the wrong path fails here, by name.
 */
export const checkCodec = (entry: AnyEntry, codec: Codec): Codec => {
  const fail = (reason: string): never => {
    throw new CodecContractError({ codec: entry.name, reason })
  }
  if (typeof codec !== "object" || codec === null) return fail("create() returned no codec")
  if (codec.name !== entry.name) fail(`the codec calls itself "${String(codec.name)}"`)
  if (codec.aggregation !== entry.aggregation) fail(`the entry declares aggregation "${entry.aggregation}", the codec "${String(codec.aggregation)}"`)
  if (typeof codec.errorFeedback !== "boolean") fail("errorFeedback must be a boolean")
  const needs = (hooks: ReadonlyArray<string>): void => {
    const missing = hooks.filter((h) => typeof (codec as unknown as Record<string, unknown>)[h] !== "function")
    if (missing.length > 0) fail(`aggregation "${entry.aggregation}" needs ${missing.join(", ")}`)
  }
  switch (codec.aggregation) {
    case "none":
      break
    case "linear":
      needs(["domainLength", "toDomain", "fromDomain"])
      if (codec.wire !== "f32" && codec.wire !== "f16") fail(`a linear codec's wire is "f32" or "f16", got ${String(codec.wire)}`)
      if (typeof codec.castsToWire !== "boolean") fail("a linear codec says whether it castsToWire")
      if (codec.castsToWire && codec.wire !== "f16") fail('castsToWire means C is the binary16 cast: it needs wire "f16"')
      break
    case "allgather":
      needs(["wireBytes", "encode", "decode", "accumulate"])
      break
    case "custom":
      needs(["reduce"])
      break
  }
  return codec
}

/** How a codec's bytes move, in the cost model's words (scheduler/algorithm-choice.ts CompressorProfile). */
export interface AutoProfile {
  readonly name: string
  readonly ratio: number
  readonly collective: "allreduce" | "allgather"
  readonly rounds?: number
}

/**
 * The codecs compression 'auto' may pick, in escalation order, with ratios computed from the
 * model's shapes, and the config each is switched to when picked.
 */
export const autoCandidates = (layout: LayoutShapes): { profiles: AutoProfile[]; configs: Record<string, unknown> } => {
  const auto = list.filter((c) => c.auto !== undefined).sort((a, b) => a.auto!.order - b.auto!.order)
  return {
    profiles: auto.flatMap((c) => profileOf(c, c.auto!.config, layout) ?? []),
    configs: Object.fromEntries(auto.map((c) => [c.name, c.auto!.config]))
  }
}

/** A codec's profile at `config` for a model of these variables; undefined without a wireRatio, or with one that is not a positive number. */
const profileOf = (entry: AnyEntry, config: unknown, layout: LayoutShapes): AutoProfile | undefined => {
  const ratio = entry.wireRatio?.(config, layout)
  if (ratio === undefined || !(ratio > 0) || !Number.isFinite(ratio)) return undefined
  return {
    name: entry.name,
    ratio: Number(ratio.toFixed(2)),
    collective: entry.aggregation === "allgather" ? "allgather" : "allreduce",
    ...(entry.auto?.rounds !== undefined ? { rounds: entry.auto.rounds } : {})
  }
}

/**
 * The profile of the codec a run asked for, priced with its own config (a top-k of another
 * density than 'auto' weighs, sign and int8, which 'auto' never picks); undefined for "none", an
 * unknown type, or a codec without wireRatio.
 */
export const askedProfile = (config: unknown, layout: LayoutShapes): AutoProfile | undefined => {
  const type = typeof config === "string" ? config : typeof config === "object" && config !== null ? String((config as { type?: unknown }).type) : undefined
  const entry = type === undefined || type === "none" ? undefined : byName.get(type)
  return entry === undefined ? undefined : profileOf(entry, typeof config === "string" ? { type: config } : config, layout)
}

/** A config as a user writes it: `"fp16"`, `{ type: "topk", ratio: 0.01 }`. */
export const formatConfig = (config: unknown): string =>
  typeof config === "object" && config !== null
    ? `{ ${Object.entries(config).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join(", ")} }`
    : JSON.stringify(config) ?? String(config)

/** `"none", "fp16", "auto", or { type: "int8" }, { type: "topk", ratio: 0.01 }, ...`: every accepted form. */
export const allowedCompression = (): string => {
  const short = list.filter((c) => c.shorthand).map((c) => `"${c.name}"`)
  const objects = list.filter((c) => !c.shorthand).map((c) => formatConfig(c.example))
  const also = list.filter((c) => c.shorthand).map((c) => `"${c.name}"`)
  return `${[...short, '"auto"'].join(", ")}, or ${objects.join(", ")}${also.length > 0 ? ` (also { type: ${also.join(" | ")} })` : ""}`
}

/** `"none", "fp16", "int8", ...`: the registered types. */
export const allowedCodecTypes = (): string => list.map((c) => `"${c.name}"`).join(", ")

/** The registered codecs, one per line with its hint (docs, `--help`). */
export const describeCodecs = (): string => list.map((c) => `${c.name} (${c.aggregation}): ${c.hint}`).join("\n")

// Option schemas several codecs share.
export const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
export const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
export const SeedOption = Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 0xffffffff })))
export const ErrorFeedbackOption = Schema.optionalKey(Schema.Boolean)
