// An actor's typed protocol: the message kinds it understands, each with a Schema for the request
// body and (for kinds one can `ask`) for the reply. The same object is used on both ends: the actor
// validates what arrives, the asker validates what comes back, and TypeScript infers body and reply
// types from it.
import * as Cause from "effect/Cause"
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"

/** Any schema without services; its encoded form must be msgpack-able (tensors included). */
// biome-ignore lint: the protocol is generic over every schema
export type AnySchema = Schema.Codec<any, any, never, never>

export interface KindSpec {
  readonly request: AnySchema
  /** Absent for tell-only kinds. */
  readonly reply?: AnySchema
  /**
   * Handled as it arrives, outside the mailbox, even while another message's handler is running:
   * for a message that a waiting handler depends on (an answer it awaits). The handler should be
   * synchronous; it runs in no particular order with the mailbox's messages.
   */
  readonly immediate?: boolean
}

export type ProtocolSpec = { readonly [kind: string]: KindSpec }

export type KindOf<Spec extends ProtocolSpec> = keyof Spec & string

export type RequestOf<Spec extends ProtocolSpec, K extends KindOf<Spec>> = Spec[K]["request"]["Type"]

export type ReplyOf<Spec extends ProtocolSpec, K extends KindOf<Spec>> = Spec[K] extends { readonly reply: infer R extends AnySchema }
  ? R["Type"]
  : void

/** Kinds that have a reply schema and so can be asked. */
export type AskKindOf<Spec extends ProtocolSpec> = {
  [K in KindOf<Spec>]: Spec[K] extends { readonly reply: AnySchema } ? K : never
}[KindOf<Spec>]

/** Pre-built validators of one kind; built once so the hot path only calls them. */
export interface KindCodec {
  readonly kind: string
  readonly hasReply: boolean
  /** KindSpec.immediate: handled outside the mailbox. */
  readonly immediate: boolean
  readonly encodeRequest: (value: unknown) => Exit.Exit<unknown, Schema.SchemaError>
  readonly decodeRequest: (value: unknown) => Exit.Exit<unknown, Schema.SchemaError>
  readonly encodeReply: (value: unknown) => Exit.Exit<unknown, Schema.SchemaError>
  readonly decodeReply: (value: unknown) => Exit.Exit<unknown, Schema.SchemaError>
}

export interface Protocol<Spec extends ProtocolSpec = ProtocolSpec> {
  readonly name: string
  readonly kinds: Spec
  /** @internal validators per kind */
  readonly codecs: ReadonlyMap<string, KindCodec>
}

const KIND = /^[A-Za-z][A-Za-z0-9_.-]{0,63}$/

const passThrough = (value: unknown): Exit.Exit<unknown, Schema.SchemaError> => Exit.succeed(value)

/**
 * Declares a protocol. Kind names start with a letter (names starting with "$" are the runtime's
 * own system messages).
 *
 * ```ts
 * const Counter = defineProtocol("counter", {
 *   add: { request: Schema.Struct({ n: Schema.Number }), reply: Schema.Number },
 *   reset: { request: Schema.Null }
 * })
 * ```
 */
export const defineProtocol = <const Spec extends ProtocolSpec>(name: string, kinds: Spec): Protocol<Spec> => {
  for (const kind of Object.keys(kinds)) {
    if (!KIND.test(kind)) throw new Error(`protocol "${name}": kind "${kind}" must start with a letter and use letters, digits, "_", "-", "."`)
  }
  return buildProtocol(name, kinds)
}

/** @internal defineProtocol without the kind-name rule, for the runtime's own "$" messages. */
export const buildProtocol = <const Spec extends ProtocolSpec>(name: string, kinds: Spec): Protocol<Spec> => {
  const codecs = new Map<string, KindCodec>()
  for (const [kind, spec] of Object.entries(kinds)) {
    const reply = spec.reply
    codecs.set(kind, {
      kind,
      hasReply: reply !== undefined,
      immediate: spec.immediate === true,
      encodeRequest: Schema.encodeUnknownExit(spec.request),
      decodeRequest: Schema.decodeUnknownExit(spec.request),
      encodeReply: reply ? Schema.encodeUnknownExit(reply) : passThrough,
      decodeReply: reply ? Schema.decodeUnknownExit(reply) : passThrough
    })
  }
  return { name, kinds, codecs }
}

/** The first line of a schema error, short enough for a log line or an error message. */
export const schemaIssue = (exit: Exit.Exit<unknown, Schema.SchemaError>): string => {
  if (Exit.isSuccess(exit)) return ""
  const error = Cause.squash(exit.cause)
  const text = (error instanceof Error ? error.message : String(error)).replace(/\s*\n\s*/g, " ")
  return text.length > 500 ? `${text.slice(0, 500)}…` : text
}
