// Learns of actor deaths within a job: listens to the job's heartbeats and events and tells each
// waiter when the actor it watches is down: an exit or stop notice (immediate), a node-lost notice
// from a cluster view, or no heartbeat for `deadAfterMs` (checked every 50 ms while anyone
// watches). An actor that beats from a thread (heartbeat.ts startThreadBeating) is judged on two
// clocks instead: silence (its process stopped, killed without notice, cut off) after
// `silentAfterMs`, and its main thread's event loop held (a hang, or a computation longer than
// any expected) after `heldAfterMs`; both default to `deadAfterMs`. One watcher per actor system;
// created on first use.
import type { NatsConnection, Subscription } from "@nats-io/nats-core"
import { HeldClock } from "../../core/held-clock.ts"
import type { JobSubjects } from "../../core/subjects.ts"
import { LinkState } from "../../scheduler/link-state.ts"
import type { WireFailure } from "./envelope.ts"
import { readJobEvent, type JobEvent } from "./events.ts"
import { DEFAULT_DEAD_AFTER_MS, describeStack, mainThreadStack, readBeat } from "./heartbeat.ts"

export type DownReason = "missed-heartbeats" | "exited" | "stopped" | "failed" | "node-lost"

/** Why an actor is considered gone. */
export interface ActorDown {
  readonly name: string
  /** The incarnation that went down ("" when unknown, e.g. never heard from). */
  readonly instance: string
  readonly reason: DownReason
  /** Process exit code / signal, when a node agent reported the exit. */
  readonly code?: number | null
  readonly signal?: string | null
  /** The error the actor failed with, when it did. */
  readonly failure?: WireFailure
  readonly node?: string
  /** One line for humans: what happened, with the stderr tail for crashed processes. */
  readonly detail: string
  /** Taken for hung with its event loop held: where its main thread was then (innermost first), as its beat thread took it. */
  readonly stack?: ReadonlyArray<string>
  readonly at: number
}

export interface WatchOptions {
  /** Only this incarnation (spawn instance); others' beats and events are ignored. */
  readonly instance?: string
  /** Silence after which the actor is declared dead, or where to read it at every check (a deadline from measurements). Default 2000 ms. */
  readonly deadAfterMs?: number | (() => number)
  /** For an actor beating from a thread: silence after which it is dead. Default deadAfterMs. */
  readonly silentAfterMs?: number | (() => number)
  /** For an actor beating from a thread: how long its event loop may be held before it is taken for hung. Default deadAfterMs. */
  readonly heldAfterMs?: number | (() => number)
  /** For an actor beating from a thread: called once a stretch when its event loop has been held past `afterMs` (and not yet taken for hung). */
  readonly onHeld?: { readonly afterMs: number | (() => number); readonly call: (heldMs: number) => void }
}

type Limit = number | (() => number)

interface Waiter {
  readonly name: string
  readonly instance: string | undefined
  since: number
  readonly deadAfterMs: Limit
  readonly silentAfterMs: Limit | undefined
  readonly heldAfterMs: Limit | undefined
  readonly onHeld: WatchOptions["onHeld"]
  /** onHeld was called for the stretch in progress. */
  heldTold: boolean
  /** Taken for hung: its stack is being fetched before it is declared. */
  declaring: boolean
  readonly resolve: (down: ActorDown) => void
}

interface Seen {
  readonly instance: string
  readonly at: number
  /** From a beat thread's beat: how long the event loop had been held when it was sent. */
  readonly heldMs?: number
  /** From beat threads' beats of this incarnation: [when heard, the process's CPU ms], the latest CPU_SAMPLES, oldest first. */
  readonly cpu?: ReadonlyArray<readonly [number, number]>
}

/** How long a hung actor's stack is waited for before it is declared without one. */
const STACK_WAIT_MS = 3_000

/** Beats kept to tell how busy a process is: 8 at 500 ms apart, the latest 3.5 s. */
const CPU_SAMPLES = 8

const limit = (l: Limit): number => (typeof l === "function" ? l() : l)

const MAX_REMEMBERED_DOWNS = 10_000

/** How often the silences are checked while anyone watches. */
const SWEEP_MS = 50

/** The stop reason of an actor process that exits because its node agent is gone (actors/node/host.ts). */
export const AGENT_GONE = "agent gone"

/** An event turned into the ActorDown it announces, or undefined for events that are not deaths. */
export const downFromEvent = (event: JobEvent): ActorDown | undefined => {
  switch (event.type) {
    case "exit": {
      const how = event.signal ? `killed by ${event.signal}` : `exited with code ${event.code}`
      const tail = event.stderrTail.trim() ? `; last stderr:\n${event.stderrTail.trimEnd()}` : ""
      return {
        name: event.name,
        instance: event.instance,
        reason: "exited",
        code: event.code,
        signal: event.signal,
        node: event.node,
        detail: `process ${event.pid} on node ${event.node} ${how}${event.killedBy ? ` (${event.killedBy})` : ""}${tail}`,
        at: event.at
      }
    }
    case "stopped":
      // An actor process whose agent is gone (killed, crashed) says so as it exits: its node is lost.
      if (event.reason === AGENT_GONE && !event.failure) {
        return {
          name: event.name,
          instance: event.instance,
          reason: "node-lost",
          detail: "its node agent is gone (killed or crashed) and the process exited with it",
          at: event.at
        }
      }
      return {
        name: event.name,
        instance: event.instance,
        reason: event.failure ? "failed" : "stopped",
        ...(event.failure ? { failure: event.failure } : {}),
        detail: event.failure ? `failed: ${event.failure.tag}: ${event.failure.message}` : `stopped: ${event.reason}`,
        at: event.at
      }
    case "node-lost":
      return {
        name: event.name,
        instance: event.instance,
        reason: "node-lost",
        node: event.node,
        detail: `node ${event.node} stopped heartbeating (machine or agent down, or network partition)`,
        at: event.at
      }
    default:
      return undefined
  }
}

export class Watcher {
  readonly #waiters = new Set<Waiter>()
  readonly #seen = new Map<string, Seen>()
  /** Latest death per name, so a watch that starts after the fact still learns of it. */
  readonly #downs = new Map<string, ActorDown>()
  readonly #listeners = new Set<(down: ActorDown) => void>()
  readonly #eventListeners = new Set<(event: JobEvent) => void>()
  readonly #subs: Subscription[]
  readonly #link: LinkState
  #timer: ReturnType<typeof setInterval> | undefined
  /** This process's own holds (core/held-clock.ts), so they do not count as the actors' silence. */
  readonly #clock = new HeldClock(SWEEP_MS)
  #closed = false

  readonly #nc: NatsConnection
  readonly #subjects: JobSubjects

  constructor(nc: NatsConnection, subjects: JobSubjects) {
    this.#nc = nc
    this.#subjects = subjects
    this.#link = new LinkState(nc)
    // Our own outage is not their death: restart every silence clock after a reconnect.
    this.#link.onResume(() => {
      const now = Date.now()
      for (const w of this.#waiters) w.since = now
    })
    const hbPrefix = subjects.heartbeat("")
    this.#subs = [
      nc.subscribe(subjects.heartbeats, {
        callback: (_err, msg) => {
          const beat = readBeat(msg.data)
          const name = msg.subject.slice(hbPrefix.length)
          if (beat && beat.name === name) this.#saw(name, beat.instance, beat.heldMs, beat.cpuMs)
        }
      }),
      nc.subscribe(subjects.events, {
        callback: (_err, msg) => {
          const event = readJobEvent(msg.data)
          if (event) this.#onEvent(event)
        }
      })
    ]
  }

  /** Called for every death this watcher learns of, watched or not. Returns an unsubscribe. */
  onDown(listener: (down: ActorDown) => void): () => void {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }

  /** Called for every job event (ready, exit, stopped, node-lost, job-end). */
  onEvent(listener: (event: JobEvent) => void): () => void {
    this.#eventListeners.add(listener)
    return () => this.#eventListeners.delete(listener)
  }

  /** When the actor was last heard from (ms since epoch), if ever. */
  lastSeen(name: string): number | undefined {
    return this.#seen.get(name)?.at
  }

  /**
   * An actor beating from a thread, as its latest beat says and as of now: how long ago it was
   * heard, and how long its event loop has been held (assuming it still is). Undefined when it was
   * never heard from, its latest beat came from its event loop, or it was of another incarnation.
   */
  heldState(name: string, instance?: string): { readonly heardAgoMs: number; readonly heldMs: number; readonly cpu?: number } | undefined {
    const seen = this.#seen.get(name)
    if (seen === undefined || seen.heldMs === undefined || (instance !== undefined && seen.instance !== instance)) return undefined
    const now = Date.now()
    // the cores its process used over its latest beats (every thread's CPU time over the wall time)
    const first = seen.cpu?.[0]
    const last = seen.cpu?.at(-1)
    const cpu = first && last && last[0] - first[0] >= 400 ? Math.max(0, (last[1] - first[1]) / (last[0] - first[0])) : undefined
    return { heardAgoMs: now - seen.at, heldMs: now - seen.at + seen.heldMs, ...(cpu !== undefined ? { cpu } : {}) }
  }

  /**
   * Calls `resolve` once when the actor is down; returns a cancel function. The silence clock
   * starts now, so an actor never heard from is declared dead after `deadAfterMs` too.
   */
  watch(name: string, options: WatchOptions, resolve: (down: ActorDown) => void): () => void {
    const known = this.#downs.get(name)
    if (known && (options.instance === undefined || options.instance === known.instance)) {
      resolve(known)
      return () => {}
    }
    let done = false
    const waiter: Waiter = {
      name,
      instance: options.instance,
      since: Date.now(),
      deadAfterMs: options.deadAfterMs ?? DEFAULT_DEAD_AFTER_MS,
      silentAfterMs: options.silentAfterMs,
      heldAfterMs: options.heldAfterMs,
      onHeld: options.onHeld,
      heldTold: false,
      declaring: false,
      resolve: (down) => {
        if (done) return
        done = true
        this.#waiters.delete(waiter)
        resolve(down)
      }
    }
    this.#waiters.add(waiter)
    this.#ensureTimer()
    return () => {
      done = true
      this.#waiters.delete(waiter)
    }
  }

  /** Forgets a recorded death (before restarting an actor under the same name). */
  forget(name: string): void {
    this.#downs.delete(name)
  }

  close(): void {
    if (this.#closed) return
    this.#closed = true
    if (this.#timer) clearInterval(this.#timer)
    this.#timer = undefined
    this.#link.close()
    for (const sub of this.#subs) {
      try {
        sub.unsubscribe()
      } catch {
        // connection already closed
      }
    }
    this.#waiters.clear()
  }

  /** When the actor a waiter watches was last heard from (0 if never, or only a previous instance). */
  #heardFrom(w: Waiter): number {
    const seen = this.#seen.get(w.name)
    return seen && (w.instance === undefined || seen.instance === w.instance) ? seen.at : 0
  }

  #saw(name: string, instance: string, heldMs?: number, cpuMs?: number): void {
    const now = Date.now()
    const before = this.#seen.get(name)
    const kept = before?.instance === instance ? before.cpu : undefined
    const cpu = cpuMs === undefined ? kept : [...(kept ?? []).slice(1 - CPU_SAMPLES), [now, cpuMs] as const]
    this.#seen.set(name, { instance, at: now, ...(heldMs !== undefined ? { heldMs } : {}), ...(cpu !== undefined ? { cpu } : {}) })
    const down = this.#downs.get(name)
    // A beat from a newer incarnation means the recorded death is history.
    if (down && down.instance !== instance) this.#downs.delete(name)
  }

  #onEvent(event: JobEvent): void {
    for (const l of this.#eventListeners) l(event)
    if (event.type === "ready") {
      this.#saw(event.name, event.instance)
      return
    }
    const down = downFromEvent(event)
    if (down) this.#declare(down)
  }

  #declare(down: ActorDown): void {
    const seen = this.#seen.get(down.name)
    // An old incarnation's death must not shadow a newer one that is alive.
    if (!(seen && seen.instance !== down.instance && down.instance !== "" && seen.at > down.at)) {
      this.#downs.set(down.name, down)
      if (this.#downs.size > MAX_REMEMBERED_DOWNS) this.#downs.delete(this.#downs.keys().next().value!)
    }
    for (const l of this.#listeners) l(down)
    for (const w of [...this.#waiters]) {
      if (w.name === down.name && (w.instance === undefined || w.instance === down.instance)) w.resolve(down)
    }
  }

  #ensureTimer(): void {
    if (this.#timer || this.#closed) return
    this.#clock.reset()
    this.#timer = setInterval(() => this.#sweep(), SWEEP_MS)
    this.#timer.unref()
  }

  #sweep(): void {
    if (this.#waiters.size === 0) {
      clearInterval(this.#timer)
      this.#timer = undefined
      return
    }
    const now = Date.now()
    const held = this.#clock.held(now)
    if (!this.#link.up) return
    if (held > 0) {
      // Our own process was held: each silence goes on from where it stood before.
      for (const w of this.#waiters) w.since = now - Math.max(0, now - held - Math.max(w.since, this.#heardFrom(w)))
      return
    }
    for (const w of [...this.#waiters]) {
      if (w.declaring) continue
      const seen = this.#seen.get(w.name)
      const ours = seen && (w.instance === undefined || seen.instance === w.instance)
      const heard = this.#heardFrom(w)
      const last = Math.max(w.since, heard)
      // The latest beat came from a beat thread: the process runs; its event loop is judged apart.
      const threaded = ours && seen.heldMs !== undefined
      const deadAfterMs = limit(threaded ? (w.silentAfterMs ?? w.deadAfterMs) : w.deadAfterMs)
      const down = (detail: string): ActorDown => ({ name: w.name, instance: w.instance ?? seen?.instance ?? "", reason: "missed-heartbeats", detail, at: now })
      if (now - last > deadAfterMs) {
        this.#declare(
          down(heard ? `no heartbeat for ${now - heard} ms (dead after ${deadAfterMs} ms of silence)` : `never heard from within ${deadAfterMs} ms`)
        )
        continue
      }
      if (!threaded) continue
      // When its event loop last ran, by the latest beat (and not before this watch began).
      const held = now - Math.max(w.since, heard - seen.heldMs!)
      const heldAfterMs = limit(w.heldAfterMs ?? w.deadAfterMs)
      if (held > heldAfterMs) {
        // where it is held, from its beat thread (a moment's pause of its main thread), then declared
        w.declaring = true
        const hung = down(
          `its event loop has been held for ${held} ms (taken for hung after ${heldAfterMs} ms): one synchronous computation ` +
            `that never returns, or runs longer than any expected; its process still beats`
        )
        void mainThreadStack(this.#nc, this.#subjects.stack(w.name), STACK_WAIT_MS).then((stack) => {
          const frames = stack?.frames ?? []
          // meanwhile closed, or its end came another way (an exit notice): told already
          if (this.#closed || !this.#waiters.has(w)) return
          this.#declare(frames.length > 0 ? { ...hung, detail: `${hung.detail}; its main thread is ${describeStack(frames)}`, stack: frames } : hung)
        })
        continue
      }
      if (w.onHeld) {
        // once a stretch: told past afterMs, told again only after the loop ran (held under half of it)
        const afterMs = limit(w.onHeld.afterMs)
        if (held > afterMs && !w.heldTold) {
          w.heldTold = true
          w.onHeld.call(held)
        } else if (held < afterMs / 2) w.heldTold = false
      }
    }
  }
}
