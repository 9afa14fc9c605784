// Liveness beats. Every actor (and every driver identity) publishes a small constant message on
// its heartbeat subject at a fixed interval; a watcher that hears nothing for `deadAfterMs`
// declares it dead. Timings (defaults): beat every 500 ms, dead after 2000 ms of silence, checked
// every 250 ms, so a silent death is noticed within ~2.25 s (exit notices are immediate).
//
// A beat from a timer on the event loop is late by the longest synchronous stretch of the main
// thread (a training step, an evaluation). Actor processes a node agent spawns beat instead from a
// thread with a connection of its own (startThreadBeating, beat-thread.ts): beats that say how long
// the main thread's event loop has been held (`heldMs`), so a watcher can give a busy process the
// time its computation takes and still find a stopped or cut-off one within its silence deadline.
import type { NatsConnection } from "@nats-io/nats-core"
import { fileURLToPath } from "node:url"
import { Worker } from "node:worker_threads"
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import { SPAWNED_CONNECT_TIMEOUT_MS, type ConnectionSpec } from "../../core/connection-spec.ts"
import { ACTOR_DEAD_AFTER_MS } from "../../core/defaults.ts"
import { decodeMessage, encodeMessage } from "../../core/wire.ts"
import { CPU_FROM_END } from "./beat-bytes.ts"

export const DEFAULT_HEARTBEAT_MS = 500
export const DEFAULT_DEAD_AFTER_MS = ACTOR_DEAD_AFTER_MS

export const BeatSchema = Schema.Struct({
  name: Schema.String,
  instance: Schema.String,
  pid: Schema.Number,
  node: Schema.String,
  intervalMs: Schema.Number,
  /** Beats from a beat thread: the process's CPU time so far, user and system, every thread (ms). */
  cpuMs: Schema.optionalKey(Schema.Number),
  /** Beats from a beat thread: how long the main thread's event loop has gone without a tick (ms). */
  heldMs: Schema.optionalKey(Schema.Number)
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

/** What a beat thread gets (beat-thread.ts). */
export interface BeatThreadData {
  readonly connection: ConnectionSpec
  readonly connectionName: string
  readonly connectTimeoutMs: number
  readonly subject: string
  readonly intervalMs: number
  /** The beat, encoded, `cpuMs` and `heldMs` last: the thread writes the CPU and held times into their 8 bytes. */
  readonly template: Uint8Array
  /** One BigInt64: when the main thread's event loop last ticked (ms since epoch). */
  readonly ticks: SharedArrayBuffer
  /** Where the thread answers requests for the main thread's stack (mainThreadStack), if anywhere. */
  readonly stackSubject?: string
}

/** A beat thread's answer to a stack request: the main thread's frames, innermost first, that it is idle, or why there are none. */
export interface StackReply {
  readonly frames?: ReadonlyArray<string>
  /** Its event loop is free (it ticked within 0.3 s): waiting on I/O, a timer or a promise, not computing. */
  readonly idle?: boolean
  /** With `idle`: where the process says it is (setIdlePlace: a train worker's loop, in its user's terms). */
  readonly where?: string
  readonly error?: string
}

let idlePlace: (() => string | undefined) | undefined

/**
 * What this process says of itself when its stack is asked for while its event loop is free (an
 * idle main thread has no stack to show: it waits on a promise): a train worker names where its
 * loop is ("outside any training step, after 0 training steps since report() call 2"), so a rank
 * whose loop awaits something that never settles is found as a held one is by its stack.
 */
export const setIdlePlace = (place: (() => string | undefined) | undefined): void => {
  idlePlace = place
}

/** The idle place, never throwing. */
const idlePlaceNow = (): string | undefined => {
  try {
    return idlePlace?.()
  } catch {
    return undefined
  }
}

/** gradwire's own source and Node's, and what is installed: frames that are not the user's code. */
const NOT_USER_CODE = /(^|\()(node:|wasm:\/\/|(core|actors|collectives|scheduler)\/)|node_modules\//

/**
 * A stack in one phrase: where it runs and, further down, the first frame of the user's own code
 * (outside node_modules, gradwire and Node): "in rank0EvalLoop (train.ts:37:25), at $conv2d (wasm...)".
 */
export const describeStack = (frames: ReadonlyArray<string>): string => {
  if (frames.length === 0) return ""
  const user = frames.find((f) => !NOT_USER_CODE.test(f.slice(f.indexOf(" (") + 1)))
  return user === undefined || user === frames[0] ? `at ${frames.slice(0, 3).join(" < ")}` : `in ${user}, at ${frames[0]}`
}

/**
 * The JavaScript stack of an actor process's main thread, as its beat thread takes it (the
 * inspector, pausing the main thread for a moment, even inside a long synchronous computation),
 * on `subject` (JobSubjects.stack). Undefined when nothing answered within `timeoutMs`.
 */
export const mainThreadStack = async (nc: NatsConnection, subject: string, timeoutMs = 3_000): Promise<StackReply | undefined> => {
  try {
    const msg = await nc.request(subject, new Uint8Array(0), { timeout: timeoutMs })
    const reply = JSON.parse(new TextDecoder().decode(msg.data)) as StackReply
    if (reply.idle === true) return { idle: true, ...(typeof reply.where === "string" ? { where: reply.where } : {}) }
    return Array.isArray(reply.frames) ? { frames: reply.frames.map(String) } : { error: String(reply.error ?? "no frames") }
  } catch {
    return undefined
  }
}

const BEAT_THREAD = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "./beat-thread.ts" : "./beat-thread.js", import.meta.url))

/** How often the main thread stores its tick: the resolution of `heldMs`. */
export const TICK_MS = 100

/** Not a float32: msgpack keeps it as a float64 (0xcb and 8 big-endian bytes), which a thread can overwrite. */
const HELD_PLACEHOLDER = 0.1
const CPU_PLACEHOLDER = 0.2

/**
 * `beat` encoded with `cpuMs` and then `heldMs` as its last fields, each a msgpack float64: a beat
 * thread writes the process's CPU time and the held time into their 8 bytes (big-endian: withHeld,
 * beat-bytes.ts) and sends it without an encoder of its own. Undefined if the encoding does not
 * end so (then the main thread beats).
 */
export const beatTemplate = (beat: Beat): Uint8Array | undefined => {
  const { heldMs: _h, cpuMs: _c, ...rest } = beat
  const bytes = encodeMessage({ ...rest, cpuMs: CPU_PLACEHOLDER, heldMs: HELD_PLACEHOLDER })
  const n = bytes.byteLength
  if (n < CPU_FROM_END + 1 || bytes[n - 9] !== 0xcb || bytes[n - CPU_FROM_END - 1] !== 0xcb) return undefined
  const view = new DataView(bytes.buffer, bytes.byteOffset, n)
  if (view.getFloat64(n - 8) !== HELD_PLACEHOLDER || view.getFloat64(n - CPU_FROM_END) !== CPU_PLACEHOLDER) return undefined
  return Uint8Array.from(bytes)
}

/** A beat template with `heldMs` written in, as the thread writes it. */
export { withHeld } from "./beat-bytes.ts"

/**
 * Beats `beat` on `subject` from a worker thread with its own connection (`connection`, as this
 * process's), each beat saying how long the main thread's event loop has been held. Until the
 * thread's first beat is out (loading nats.js, connecting: about 0.1-0.5 s), and again should it
 * fail (`onFallback` says why), the main thread beats as startBeating does, with no `heldMs`.
 * With `stackSubject` the thread also answers requests there for the main thread's stack
 * (mainThreadStack). Nothing here keeps the process alive.
 */
export const startThreadBeating = (
  nc: NatsConnection,
  subject: string,
  beat: Beat,
  connection: ConnectionSpec,
  connectionName: string,
  connectTimeoutMs = SPAWNED_CONNECT_TIMEOUT_MS,
  onFallback: (reason: string) => void = () => {},
  stackSubject?: string
): Beating => {
  let fallback: Beating | undefined = startBeating(nc, subject, beat)
  const template = beatTemplate(beat)
  if (!template) return fallback
  let stopped = false
  const ticks = new BigInt64Array(new SharedArrayBuffer(8))
  const tick = (): void => {
    Atomics.store(ticks, 0, BigInt(Date.now()))
  }
  tick()
  const ticker = setInterval(tick, TICK_MS)
  ticker.unref()
  const data: BeatThreadData = {
    connection,
    connectionName,
    connectTimeoutMs,
    subject,
    intervalMs: beat.intervalMs,
    template,
    ticks: ticks.buffer as SharedArrayBuffer,
    ...(stackSubject !== undefined ? { stackSubject } : {})
  }
  let thread: Worker | undefined
  let told = false
  const beatHere = (reason: string): void => {
    if (stopped) return
    if (!told) onFallback(reason)
    told = true
    if (!fallback) fallback = startBeating(nc, subject, beat)
  }
  try {
    thread = new Worker(BEAT_THREAD, { workerData: data, stdout: false, stderr: false })
    thread.unref()
    thread.on("message", (m: unknown) => {
      if (m === "up") {
        fallback?.stop()
        fallback = undefined
      } else if (typeof m === "object" && m !== null && "place" in m) {
        // the thread asks where this idle main thread is (its event loop is free to answer)
        const where = idlePlaceNow()
        thread?.postMessage({ place: (m as { place: unknown }).place, ...(where !== undefined ? { where } : {}) })
      } else beatHere(`it failed: ${String((m as { failed?: unknown }).failed)}`)
    })
    thread.on("error", (e) => beatHere(`it failed: ${e.message}`))
    thread.on("exit", (code) => beatHere(`it exited (code ${code})`))
  } catch (e) {
    // no thread (none allowed, or out of memory): the main thread goes on beating
    onFallback(`no thread: ${e instanceof Error ? e.message : String(e)}`)
  }
  return {
    stop: () => {
      if (stopped) return
      stopped = true
      clearInterval(ticker)
      fallback?.stop()
      fallback = undefined
      if (thread) {
        const t = thread
        t.postMessage("stop")
        setTimeout(() => void t.terminate(), 1_000).unref()
      }
    }
  }
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
