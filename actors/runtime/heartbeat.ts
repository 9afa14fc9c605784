// Liveness beats. Every actor (and every driver identity) publishes a small constant message on
// its heartbeat subject at a fixed interval; a watcher that hears nothing for `deadAfterMs`
// declares it dead. Timings (defaults): beat every 500 ms, dead after 2000 ms of silence, checked
// every 250 ms, so a silent death is noticed within ~2.25 s (exit notices are immediate).
import type { NatsConnection } from "@nats-io/nats-core"
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import { ACTOR_DEAD_AFTER_MS } from "../../core/defaults.ts"
import { decodeMessage, encodeMessage } from "../../core/wire.ts"

export const DEFAULT_HEARTBEAT_MS = 500
export const DEFAULT_DEAD_AFTER_MS = ACTOR_DEAD_AFTER_MS

export const BeatSchema = Schema.Struct({
  name: Schema.String,
  instance: Schema.String,
  pid: Schema.Number,
  node: Schema.String,
  intervalMs: Schema.Number
})
export type Beat = typeof BeatSchema.Type

const decodeBeat = Schema.decodeUnknownExit(BeatSchema)

export interface Beating {
  stop(): void
}

/**
 * Publishes `beat` on `subject` now and every `intervalMs`. The bytes are encoded once. The timer
 * does not keep the process alive (the connection or the actor's work does), and publishing on a
 * closed or reconnecting connection is skipped or buffered by the client, never thrown.
 */
export const startBeating = (nc: NatsConnection, subject: string, beat: Beat): Beating => {
  const bytes = encodeMessage(beat)
  const send = (): void => {
    if (nc.isClosed() || nc.isDraining()) return
    try {
      nc.publish(subject, bytes)
    } catch {
      // closed between the check and the publish: the next tick sees it
    }
  }
  send()
  const timer = setInterval(send, beat.intervalMs)
  timer.unref()
  return { stop: () => clearInterval(timer) }
}

/** Decodes a beat; undefined for anything malformed. */
export const readBeat = (data: Uint8Array): Beat | undefined => {
  let value: unknown
  try {
    value = decodeMessage(data)
  } catch {
    return undefined
  }
  const exit = decodeBeat(value)
  return Exit.isSuccess(exit) ? exit.value : undefined
}
