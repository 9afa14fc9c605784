// How actor mail travels: the envelopes (request `[kind, body]`, reply `[0, body]` or
// `[1, tag, message, stack]`) encoded with the tensor wire format, sent whole when they fit the
// server's max_payload and as chunk frames when not. Whole messages start with the wire magic
// "GWM", chunk frames with "GWC", so a receiver tells them apart from the first bytes, without
// NATS headers on the hot path.
import type { NatsConnection } from "@nats-io/nats-core"
import { encodeFrames, Reassembler } from "../../core/chunking.ts"
import { ChunkError, WireDecodeError } from "../../core/errors.ts"
import { decodeMessage, encodeMessage } from "../../core/wire.ts"

/** A decoded request envelope. */
export interface RequestEnvelope {
  readonly kind: string
  readonly body: unknown
}

/** A failure as it crosses the wire. */
export interface WireFailure {
  readonly tag: string
  readonly message: string
  readonly stack: string
}

export type ReplyEnvelope = { readonly ok: true; readonly body: unknown } | { readonly ok: false; readonly failure: WireFailure }

const isChunkFrame = (bytes: Uint8Array): boolean => bytes.length > 3 && bytes[0] === 0x47 && bytes[1] === 0x57 && bytes[2] === 0x43

/**
 * Publishes an envelope, whole or as chunk frames. Frames of one message go out back to back
 * from one connection, so NATS keeps them in order for each subscriber.
 */
export const publishEnvelope = (nc: NatsConnection, subject: string, envelope: unknown, maxPayload: number, reply?: string): void => {
  const bytes = encodeMessage(envelope)
  const opts = reply === undefined ? undefined : { reply }
  if (bytes.length <= maxPayload) {
    nc.publish(subject, bytes, opts)
    return
  }
  // Encode again straight into frames: one copy of the tensor bytes instead of two, and large
  // messages are rare enough that the wasted skeleton encode does not matter.
  for (const frame of encodeFrames(envelope, maxPayload)) nc.publish(subject, frame, opts)
}

export const requestEnvelope = (kind: string, body: unknown): unknown => [kind, body]
export const okReply = (body: unknown): unknown => [0, body]
export const failReply = (failure: WireFailure): unknown => [1, failure.tag, failure.message, failure.stack]

/** Reads a request envelope; a string describing the problem when it is not one. */
export const readRequest = (value: unknown): RequestEnvelope | string => {
  if (!Array.isArray(value) || value.length !== 2) return "not a request envelope ([kind, body])"
  const kind = value[0]
  if (typeof kind !== "string" || kind.length === 0 || kind.length > 128) return "message kind is not a short string"
  return { kind, body: value[1] }
}

/** Reads a reply envelope; a string describing the problem when it is not one. */
export const readReply = (value: unknown): ReplyEnvelope | string => {
  if (!Array.isArray(value)) return "not a reply envelope"
  if (value[0] === 0 && value.length === 2) return { ok: true, body: value[1] }
  if (value[0] === 1 && value.length === 4 && typeof value[1] === "string" && typeof value[2] === "string") {
    return { ok: false, failure: { tag: value[1], message: value[2], stack: typeof value[3] === "string" ? value[3] : "" } }
  }
  return "not a reply envelope ([0, body] or [1, tag, message, stack])"
}

/** What receiving one NATS message gave: a decoded value, nothing yet (a chunk), or a problem. */
export type Received =
  | { readonly type: "value"; readonly value: unknown; readonly bytes: number }
  | { readonly type: "partial" }
  | { readonly type: "error"; readonly reason: string }

export interface ReceiverOptions {
  /** Largest message accepted, whole or reassembled. */
  readonly maxMessageBytes: number
  /** Incomplete chunked messages are dropped after this long without a frame. */
  readonly chunkTimeoutMs?: number
}

/**
 * Turns the NATS messages of one subscription back into values: decodes whole messages,
 * reassembles chunk frames (bounded in size and time), and reports anything else as an error
 * string instead of throwing, so one bad message never breaks the subscription.
 */
export class EnvelopeReceiver {
  readonly #maxMessageBytes: number
  readonly #reassembler: Reassembler
  #lastExpire = 0
  readonly #chunkTimeoutMs: number

  constructor(options: ReceiverOptions) {
    this.#maxMessageBytes = options.maxMessageBytes
    this.#chunkTimeoutMs = options.chunkTimeoutMs ?? 10_000
    this.#reassembler = new Reassembler({
      maxMessageBytes: options.maxMessageBytes,
      // Several large messages may be in flight to one actor, but not without bound.
      maxPendingBytes: Math.max(options.maxMessageBytes * 2, 64 * 1024 * 1024),
      timeoutMs: this.#chunkTimeoutMs
    })
  }

  /** Incomplete chunked messages held. */
  get pending(): number {
    return this.#reassembler.pending
  }

  receive(data: Uint8Array): Received {
    let bytes: Uint8Array | undefined = data
    if (isChunkFrame(data)) {
      this.#maybeExpire()
      try {
        bytes = this.#reassembler.push(data)
      } catch (e) {
        return { type: "error", reason: e instanceof ChunkError ? e.message : `chunk error: ${String(e)}` }
      }
      if (bytes === undefined) return { type: "partial" }
    } else if (data.length > this.#maxMessageBytes) {
      return { type: "error", reason: `message of ${data.length} bytes is above the limit of ${this.#maxMessageBytes} bytes` }
    }
    try {
      return { type: "value", value: decodeMessage(bytes), bytes: bytes.length }
    } catch (e) {
      return { type: "error", reason: e instanceof WireDecodeError ? e.message : `cannot decode message: ${String(e)}` }
    }
  }

  /** Drops stale incomplete messages; returns why, one line per message dropped. */
  expire(): string[] {
    this.#lastExpire = Date.now()
    return this.#reassembler.expire().map((e) => e.message)
  }

  // Called on frame arrival so that a trickle of junk frames cannot pin memory forever even
  // when nobody calls expire() from a timer.
  #maybeExpire(): void {
    const now = Date.now()
    if (now - this.#lastExpire >= this.#chunkTimeoutMs / 2) this.expire()
  }
}

/** The tag, message and stack of anything thrown or failed with, for the wire. */
export const toWireFailure = (error: unknown): WireFailure => {
  if (error instanceof Error) {
    const tagged = (error as { _tag?: unknown })._tag
    const tag = typeof tagged === "string" ? tagged : error.name || "Error"
    return { tag, message: error.message, stack: error.stack ?? "" }
  }
  if (typeof error === "object" && error !== null) {
    const tagged = (error as { _tag?: unknown })._tag
    const message = (error as { message?: unknown }).message
    return {
      tag: typeof tagged === "string" ? tagged : "Error",
      message: typeof message === "string" ? message : safeJson(error),
      stack: ""
    }
  }
  return { tag: "Error", message: String(error), stack: "" }
}

const safeJson = (value: unknown): string => {
  try {
    return JSON.stringify(value)?.slice(0, 1000) ?? String(value)
  } catch {
    return String(value)
  }
}
