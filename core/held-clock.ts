// A periodic check's own lateness. A liveness clock (the cluster view's node silence, the death
// watcher's heartbeat silence, an agent's owner check, a collective's deadline) must not count the
// time its own process was held: the event loop blocked by a long synchronous computation or a
// garbage collection, the process stopped or starved of CPU on a loaded machine. Over such a hold
// the others' heartbeats wait unread in the socket, and a process that beats itself (the embedded
// cluster's agent runs in the driver's process) could not beat at all; after it, Node runs the
// due timers before it reads the socket, so a check run then sees a silence nobody kept.
// Each check asks `held()`: on time it is 0; late, it is how long the process was not looking, and
// the caller moves its silence clocks on by that much (or skips the round) instead of judging.

/** A check late by more than this many of its intervals (and at least `HELD_MIN_MS`) was held. */
export const HELD_INTERVALS = 4
export const HELD_MIN_MS = 1_000

export class HeldClock {
  #last: number
  #everyMs: number

  constructor(everyMs: number, now: number = Date.now()) {
    this.#everyMs = everyMs
    this.#last = now
  }

  /** Starts counting from `now` (a timer started again), at a new interval if given. */
  reset(now: number = Date.now(), everyMs: number = this.#everyMs): void {
    this.#last = now
    this.#everyMs = everyMs
  }

  /**
   * Called once at every check: 0 when it ran about on time, else how long this process was held
   * since the previous check (the gap less one interval, the part a timer on time would have run in).
   */
  held(now: number = Date.now()): number {
    const gap = now - this.#last
    this.#last = now
    return gap > Math.max(HELD_MIN_MS, HELD_INTERVALS * this.#everyMs) ? gap - this.#everyMs : 0
  }
}
