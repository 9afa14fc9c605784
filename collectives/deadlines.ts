// Collective deadlines from measurements: how long a collective wait may go without a frame before
// the rank probes its peers and names the one holding the group up. A fixed 30 s is far too long
// for a job whose steps take 100 ms (a hung rank stalls everyone for 300 steps) and the only
// choice for a job that has measured nothing yet. So: once enough training steps are measured,
// the deadline is DEADLINE_FACTOR x the median step time (or the median collective time, if
// larger) + the floor, capped at the fixed default; before that, the fixed default applies.
//
// An explicit timeoutMs (collectiveConfig.timeoutMs, CommunicatorOptions.timeoutMs) is respected
// as given, never shortened: users raise it for ranks that legitimately fall behind for longer
// (a long checkpoint write between collectives), and lower it for fast detection, as with Ray's
// and Horovod's timeouts. Pure bookkeeping: the communicator asks, the training loop tells.
import {
  BUSY_PEER_WAIT_MS,
  COLLECTIVE_DEADLINE_FLOOR_MS,
  COLLECTIVE_TIMEOUT_MS,
  DEADLINE_FACTOR,
  DEADLINE_WARMUP_STEPS,
  DEADLINE_WINDOW,
  WORKER_DEAD_AFTER_MS,
  WORKER_HELD_DEAD_AFTER_MS,
  WORKER_START_DEAD_AFTER_MS
} from "../core/defaults.ts"

export interface DeadlineSettings {
  /** An explicit deadline (ms): used as given, nothing is derived. */
  readonly fixedMs?: number
  /** The most a derived deadline may be, and the deadline until one is derived. Default COLLECTIVE_TIMEOUT_MS. */
  readonly capMs?: number
  readonly factor?: number
  readonly floorMs?: number
  readonly warmupSteps?: number
  readonly window?: number
}

/** The deadline of the next collective wait and how it came about. */
export interface Deadline {
  readonly ms: number
  /** True once derived from measurements (false: fixed, or still warming up). */
  readonly measured: boolean
  /** How it was derived, for messages: "2 x median step 0.11 s + floor 10 s", "collectiveConfig.timeoutMs 3 s, set explicitly". */
  readonly why: string
}

/** Seconds, short: 0.0042 s, 0.11 s, 1.1 s, 5 s, 12 s. */
export const seconds = (ms: number): string => {
  const s = ms / 1000
  return `${s >= 10 ? Math.round(s) : s >= 1 ? Number(s.toFixed(1)) : Number(s.toPrecision(2))} s`
}

/** A limit, short: in seconds (as `seconds`) below 10 min, whole minutes from there: 120 s, 30 min. */
export const limitText = (ms: number): string => (ms >= 600_000 ? `${Math.round(ms / 60_000)} min` : seconds(ms))

/** The median of the latest `n` values (their lower middle when even, so one spike never moves it up). */
const median = (xs: ReadonlyArray<number>): number => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[(sorted.length - 1) >> 1]
}

/** One rank's measured step and collective times and the collective deadline they give. */
export class MeasuredDeadlines {
  readonly fixedMs: number | undefined
  readonly capMs: number
  readonly factor: number
  readonly floorMs: number
  readonly warmupSteps: number
  readonly window: number
  readonly #steps: number[] = []
  readonly #collectives: number[] = []
  #stepsSeen = 0
  /** Steps measured since the group was last formed (newGroup). */
  #stepsInGroup = 0

  constructor(settings: DeadlineSettings = {}) {
    this.fixedMs = settings.fixedMs
    this.capMs = settings.capMs ?? COLLECTIVE_TIMEOUT_MS
    this.factor = settings.factor ?? DEADLINE_FACTOR
    this.floorMs = settings.floorMs ?? COLLECTIVE_DEADLINE_FLOOR_MS
    this.warmupSteps = settings.warmupSteps ?? DEADLINE_WARMUP_STEPS
    this.window = settings.window ?? DEADLINE_WINDOW
  }

  /** One training step's time on this rank (forward/backward, its collectives, the update). */
  noteStep(ms: number): void {
    if (!(ms >= 0) || !Number.isFinite(ms)) return
    this.#stepsSeen++
    this.#stepsInGroup++
    push(this.#steps, ms, this.window)
  }

  /** One completed collective call's time on this rank. */
  noteCollective(ms: number): void {
    if (!(ms >= 0) || !Number.isFinite(ms)) return
    push(this.#collectives, ms, this.window)
  }

  /**
   * A group was formed (start-up, a regroup, a grow): until it has run the warm-up steps again the
   * default applies, since a joiner still loads tfjs, heals its state and compiles its kernels while
   * the others wait for it in a collective. The measured times are kept.
   */
  newGroup(): void {
    this.#stepsInGroup = 0
  }

  /** Steps measured so far (all of them, not only the window's). */
  get stepsMeasured(): number {
    return this.#stepsSeen
  }

  /** The median step time over the window, once warmed up. */
  get medianStepMs(): number | undefined {
    return this.#stepsInGroup >= this.warmupSteps ? median(this.#steps) : undefined
  }

  /** The median collective time over the window, if any was measured. */
  get medianCollectiveMs(): number | undefined {
    return this.#collectives.length > 0 ? median(this.#collectives) : undefined
  }

  /** The deadline of a collective wait that starts now. */
  current(): Deadline {
    if (this.fixedMs !== undefined) return { ms: this.fixedMs, measured: false, why: `timeoutMs ${seconds(this.fixedMs)}, set explicitly` }
    const step = this.medianStepMs
    if (step === undefined) {
      return { ms: this.capMs, measured: false, why: `the default ${seconds(this.capMs)} until ${this.warmupSteps} steps of this group are measured (${this.#stepsInGroup} so far)` }
    }
    const coll = this.medianCollectiveMs ?? 0
    const [basis, what] = coll > step ? [coll, "median collective"] : [step, "median step"]
    const derived = Math.ceil(this.factor * basis + this.floorMs)
    const formula = `${this.factor} x ${what} ${seconds(basis)} + floor ${seconds(this.floorMs)}`
    if (derived >= this.capMs) return { ms: this.capMs, measured: true, why: `the cap ${seconds(this.capMs)}, below ${formula}` }
    return { ms: derived, measured: true, why: formula }
  }

  /** For explain.txt and the start-up line: the deadline and the figures behind it. */
  describe(): { readonly text: string; readonly json: Record<string, unknown>; readonly summary: string } {
    const d = this.current()
    const step = this.medianStepMs
    const coll = this.medianCollectiveMs
    const figures = [
      step !== undefined ? `median step ${seconds(step)} over the latest ${Math.min(this.#stepsSeen, this.window)} steps` : undefined,
      coll !== undefined ? `median collective ${seconds(coll)}` : undefined
    ].filter((x) => x !== undefined)
    const text =
      `collective deadline: ${seconds(d.ms)} (${d.why})` +
      (figures.length ? `; measured ${figures.join(", ")}` : "") +
      `. A collective wait with no frame for this long probes the peers and names the rank holding the group up` +
      (this.fixedMs === undefined
        ? `, unless its owner (a training run's driver) knows it is still working: its event loop held by one computation ` +
          `(waited for up to ${seconds(WORKER_HELD_DEAD_AFTER_MS)}) or its process busy outside the collectives (up to ${limitText(BUSY_PEER_WAIT_MS)}).`
        : ".")
    return {
      text,
      json: {
        collectiveDeadlineMs: d.ms,
        measured: d.measured,
        why: d.why,
        ...(step !== undefined ? { medianStepMs: step } : {}),
        ...(coll !== undefined ? { medianCollectiveMs: coll } : {}),
        factor: this.factor,
        floorMs: this.floorMs,
        capMs: this.fixedMs ?? this.capMs,
        ...(this.fixedMs === undefined ? { heldPeerWaitMs: WORKER_HELD_DEAD_AFTER_MS, busyPeerWaitMs: BUSY_PEER_WAIT_MS } : {})
      },
      summary: `gradwire: collective deadline ${seconds(d.ms)} (${d.why})`
    }
  }
}

/**
 * A worker process's heartbeat deadline, as the driver keeps it from the step times the workers
 * report. A beat from a timer on the worker's event loop is late by the longest computation that
 * holds the loop (tfjs runs kernels synchronously), not the typical one. So the deadline is
 * DEADLINE_FACTOR x the longest computation of the latest steps, never less than
 * WORKER_DEAD_AFTER_MS: it only grows for steps too long for the fixed 10 s, and a hung worker is
 * named sooner by the collective deadline (MeasuredDeadlines) than by its heartbeats anyway.
 * Before any step is measured it is WORKER_START_DEAD_AFTER_MS (or the floor, if longer).
 *
 * Worker processes beat from a thread (actors/runtime/heartbeat.ts startThreadBeating), so this
 * deadline applies as such only to beats from the main thread (while the thread starts, or where
 * none could); a beating thread's silence counts after the floor (`silentMs`), and its event loop
 * held counts after `heldMs`: this deadline or WORKER_HELD_DEAD_AFTER_MS, whichever is longer.
 */
export class HeartbeatDeadline {
  readonly floorMs: number
  readonly startMs: number
  readonly factor: number
  readonly window: number
  readonly #computeMs: number[] = []
  /** The workers (their instances) that have reported a step: until one has, it gets startMs. */
  readonly #measured = new Set<string>()

  constructor(settings: { readonly floorMs?: number; readonly startMs?: number; readonly factor?: number; readonly window?: number } = {}) {
    this.floorMs = settings.floorMs ?? WORKER_DEAD_AFTER_MS
    this.startMs = Math.max(this.floorMs, settings.startMs ?? WORKER_START_DEAD_AFTER_MS)
    this.factor = settings.factor ?? DEADLINE_FACTOR
    this.window = settings.window ?? DEADLINE_WINDOW
  }

  /** One step's computation on some worker (forward/backward and the update: what holds its event loop), `who` its instance. */
  noteCompute(ms: number, who?: string): void {
    if (!(ms >= 0) || !Number.isFinite(ms)) return
    push(this.#computeMs, ms, this.window)
    if (who !== undefined) this.#measured.add(who)
  }

  /** Steps noted (within the window). */
  get measured(): number {
    return this.#computeMs.length
  }

  /**
   * The deadline; for worker `who`, startMs until it has reported a step itself (a worker that
   * started later, or a replacement, is still in its first computations when the others' steps
   * bring the deadline down: in CI one was counted dead in its dry step that way).
   */
  current(who?: string): Deadline {
    if (who !== undefined && !this.#measured.has(who) && this.#computeMs.length > 0)
      return { ms: this.startMs, measured: false, why: `${seconds(this.startMs)} until this worker's first step is measured` }
    if (this.#computeMs.length === 0) return { ms: this.startMs, measured: false, why: `${seconds(this.startMs)} until a step is measured, then at least the floor ${seconds(this.floorMs)}` }
    const longest = Math.max(...this.#computeMs)
    const derived = Math.ceil(this.factor * longest)
    const formula = `${this.factor} x longest step computation ${seconds(longest)}`
    if (derived <= this.floorMs) return { ms: this.floorMs, measured: true, why: `the floor ${seconds(this.floorMs)}, above ${formula}` }
    return { ms: derived, measured: true, why: formula }
  }

  /** Silence after which a worker beating from its thread is dead (its process stopped or cut off). */
  get silentMs(): number {
    return this.floorMs
  }

  /** How long a worker's event loop may be held (its thread still beating) before it is taken for hung. */
  heldMs(who?: string): number {
    return Math.max(WORKER_HELD_DEAD_AFTER_MS, this.current(who).ms)
  }

  /** For explain.txt and the start-up line. */
  describe(): { readonly text: string; readonly json: Record<string, unknown>; readonly summary: string } {
    const d = this.current()
    return {
      text:
        `heartbeat deadline: ${seconds(d.ms)} (${d.why}). Workers beat from a thread of their own: one not heard from for ` +
        `${seconds(this.silentMs)} is counted as dead (its process stopped or cut off), one whose event loop is held for ` +
        `${seconds(this.heldMs())} by one computation is taken for hung; beats from a worker's event loop (while its thread starts) ` +
        `count as silent after the deadline.`,
      json: { heartbeatDeadlineMs: d.ms, measured: d.measured, why: d.why, factor: this.factor, floorMs: this.floorMs, silentMs: this.silentMs, heldMs: this.heldMs() },
      summary: `gradwire: heartbeat deadline ${seconds(d.ms)} (${d.why})`
    }
  }
}

const push = (xs: number[], x: number, window: number): void => {
  xs.push(x)
  if (xs.length > window) xs.shift()
}
