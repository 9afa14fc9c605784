// Measured algorithm choice: the cost model picks each bucket's all-reduce algorithm before a step
// has run; the tuner then times every candidate on the calls training makes anyway and keeps the
// fastest per message size, so the pick rests on the path, sizes and load the job really has (a
// model of links cannot see, for instance, that four ranks on two cores run a ring's six lockstep
// stages slower than a hierarchical reduce's three). Pure bookkeeping, no I/O: the caller times
// the calls and agrees on the table across ranks (one small all-reduce), as below.
//
// Schedule. For `rounds` x candidates calls from its start, call i of a size runs candidate
// i mod candidates, so every candidate runs `rounds` times on every size, interleaved (a burst
// of load falls on all of them). The caller counts calls per step: every rank runs the same steps
// with the same buckets, so the schedule is the same everywhere.
//
// Agreement. Each rank notes its time of every tuning call; `table()` lays them out in a fixed
// order (sizes ascending, then candidates in order, then the calls in the order they ran), and
// an all-reduce with "max" gives every rank each call's slowest rank (a step goes on when its last
// rank has its result, so that is what the call cost the group). `decide(agreed)` takes, per size
// and candidate, the median of its calls (what a step pays on average; the fastest call would
// favour an algorithm that is sometimes fast and often stalls), and picks the fastest candidate,
// unless the cost model's pick is not clearly slower (its median within `keepWithin`, 1.1x, of
// the fastest's, or slower in fewer than 3 of 4 rounds): then the model's stands, so noise
// between near-equal algorithms does not decide. Every rank decides from the same numbers
// and picks the same algorithm.

import { median } from "./cost-model.ts"

/** In how many rounds `a` took longer than `b` (round k of both ran back to back). */
export const roundsSlower = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let slower = 0
  for (let k = 0; k < a.length; k++) if (a[k]! > b[k]!) slower++
  return slower
}

/** Of `rounds`, in how many the model's pick must be slower for the tuner to override it (3 of every 4). */
export const roundsToOverride = (rounds: number): number => Math.ceil(0.75 * rounds)

/**
 * The tuner's rule: whether the model's pick (calls `a`, median `ma`) is clearly slower than the
 * fastest (`b`, `mb`): its median more than `keepWithin` x the fastest's, and slower in most of the
 * rounds (round k of both ran back to back; with 5 rounds, in at least 4), so one burst of load on
 * the machine does not decide.
 */
export const clearlySlower = (a: ArrayLike<number>, b: ArrayLike<number>, ma: number, mb: number, keepWithin: number): boolean =>
  ma > keepWithin * mb && roundsSlower(a, b) >= roundsToOverride(a.length)

export interface TunedSize {
  readonly bytes: number
  /** The candidates timed on this size (all of them, or those `timedOn` allowed it), in order. */
  readonly candidates: readonly string[]
  /** Agreed time per candidate, ms, in `candidates`' order. */
  readonly ms: readonly number[]
  readonly picked: string
  /** What the cost model had picked for this size. */
  readonly modelPick: string
  /** Each candidate's agreed time in each round, ms, in `candidates`' order (round k of all ran back to back): what `picked` was decided on. */
  readonly rounds?: readonly (readonly number[])[]
}

export class AlgorithmTuner {
  readonly candidates: readonly string[]
  readonly rounds: number
  readonly keepWithin: number
  /** Which candidates a size is timed with (default: all); the same function on every rank. */
  readonly timedOn: ((bytes: number) => readonly string[]) | undefined
  /** Per size, per candidate, this rank's times of its calls in the order they ran. */
  readonly #times = new Map<number, number[][]>()
  readonly #calls = new Map<number, number>()
  #decided: ReadonlyMap<number, string> | undefined

  /**
   * `keepWithin`: the model's pick stands while its measured time is within this factor of the
   * fastest candidate's (default 1.1). `timedOn`: the candidates a size is timed with, a subset of
   * `candidates` decided from the size alone (so every rank lays out the same table); default all.
   */
  constructor(candidates: readonly string[], rounds = 5, keepWithin = 1.1, timedOn?: (bytes: number) => readonly string[]) {
    if (candidates.length === 0) throw new Error("AlgorithmTuner needs at least one candidate")
    this.keepWithin = keepWithin
    this.candidates = [...candidates]
    this.rounds = Math.max(1, Math.floor(rounds))
    this.timedOn = timedOn
  }

  /** Indices of the candidates `bytes` is timed with, in the candidates' order. */
  #on(bytes: number): number[] {
    const all = this.candidates.map((_, j) => j)
    if (this.timedOn === undefined) return all
    const some = new Set(this.timedOn(bytes))
    const on = all.filter((j) => some.has(this.candidates[j]!))
    return on.length > 0 ? on : all
  }

  /** Calls of tuning: every candidate `rounds` times (on every size, which every step carries). */
  get steps(): number {
    return this.candidates.length * this.rounds
  }

  /** The candidate the next call of `bytes` runs while tuning (a size with fewer candidates cycles through them again). */
  next(bytes: number): string {
    const i = this.#calls.get(bytes) ?? 0
    this.#calls.set(bytes, i + 1)
    const on = this.#on(bytes)
    return this.candidates[on[i % on.length]!]!
  }

  /** Notes how long a call of `bytes` by `algorithm` took on this rank. */
  record(bytes: number, algorithm: string, ms: number): void {
    const j = this.candidates.indexOf(algorithm)
    if (j < 0 || !(ms >= 0) || !Number.isFinite(ms)) return
    let row = this.#times.get(bytes)
    if (row === undefined) {
      row = this.candidates.map(() => [])
      this.#times.set(bytes, row)
    }
    row[j]!.push(ms)
  }

  /** Sizes timed `rounds` times with every candidate they are timed with, ascending: the blocks of `table()`. */
  get sizes(): number[] {
    return [...this.#times.entries()]
      .filter(([b, row]) => this.#on(b).every((j) => row[j]!.length >= this.rounds))
      .map(([b]) => b)
      .sort((a, b) => a - b)
  }

  /** This rank's times of the first `rounds` calls per (size, candidate it is timed with); all-reduce with "max". */
  table(): Float32Array {
    const r = this.rounds
    const blocks = this.sizes.map((b) => ({ row: this.#times.get(b)!, on: this.#on(b) }))
    const out = new Float32Array(blocks.reduce((n, x) => n + x.on.length * r, 0))
    let at = 0
    for (const { row, on } of blocks) {
      for (const j of on) {
        out.set(row[j]!.slice(0, r), at)
        at += r
      }
    }
    return out
  }

  /** Picks per size from the agreed table (what `table()` gave, all-reduced with "max"). */
  decide(agreed: Float32Array, modelPick: (bytes: number) => string): TunedSize[] {
    const sizes = this.sizes
    const r = this.rounds
    const expected = sizes.reduce((n, b) => n + this.#on(b).length * r, 0)
    if (agreed.length !== expected) throw new Error(`tuner table has ${agreed.length} entries, expected ${expected}`)
    const picks = new Map<number, string>()
    let at = 0
    const out = sizes.map((bytes) => {
      const names = this.#on(bytes).map((j) => this.candidates[j]!)
      const calls = names.map((_, k) => agreed.subarray(at + k * r, at + (k + 1) * r))
      at += names.length * r
      const ms = calls.map((c) => median(Array.from(c)))
      let best = 0
      for (let k = 1; k < names.length; k++) if (ms[k]! < ms[best]!) best = k
      // The model's pick stands unless it measured clearly slower: a few calls on a busy machine
      // differ by this much from run to run, and switching on noise gains nothing.
      const model = modelPick(bytes)
      const m = names.indexOf(model)
      const picked = m >= 0 && !clearlySlower(calls[m]!, calls[best]!, ms[m]!, ms[best]!, this.keepWithin) ? model : names[best]!
      picks.set(bytes, picked)
      return { bytes, candidates: names, ms, picked, modelPick: model, rounds: calls.map((c) => Array.from(c, (v) => Math.round(v * 1000) / 1000)) }
    })
    this.#decided = picks
    return out
  }

  /**
   * Takes picks decided before (an earlier group of the same shape, same candidates) as this
   * tuner's decision, without timing anything; a name that is not a candidate is left out.
   */
  adopt(picks: ReadonlyArray<{ readonly bytes: number; readonly picked: string }>): void {
    this.#decided = new Map(picks.filter((p) => this.candidates.includes(p.picked)).map((p) => [p.bytes, p.picked]))
  }

  /** The decided pick for `bytes`, if it was timed. */
  pick(bytes: number): string | undefined {
    return this.#decided?.get(bytes)
  }
}

/**
 * Whether the calls a tuned pick was measured on have changed since (a link slowed, another job
 * took the cores, a peer fell back to NATS): after tuning, each size's calls are timed on this
 * rank in windows of `window` calls; the first window's median is the size's baseline, and a
 * window whose median is more than `factor` times the baseline, or less than 1 / factor of it,
 * `confirm` windows in a row, says the candidates should be timed again. Pure bookkeeping: the
 * caller agrees across ranks (the max of every rank's flag, at the same call everywhere) and
 * starts a new tuning round, then reset()s this.
 */
export class DriftMonitor {
  readonly window: number
  readonly factor: number
  readonly confirm: number
  /** Calls of each size left out before its first window (the group's first, cold calls). */
  #skip = 0
  readonly #sizes = new Map<number, { base: number | undefined; current: number[]; strikes: number; last: number; skipped: number }>()

  constructor(window = 50, factor = 2, confirm = 2) {
    if (!(Number.isInteger(window) && window >= 1)) throw new RangeError(`DriftMonitor window must be an integer >= 1, got ${window}`)
    if (!(factor > 1)) throw new RangeError(`DriftMonitor factor must be > 1, got ${factor}`)
    if (!(Number.isInteger(confirm) && confirm >= 1)) throw new RangeError(`DriftMonitor confirm must be an integer >= 1, got ${confirm}`)
    this.window = window
    this.factor = factor
    this.confirm = confirm
  }

  /** Notes one call of `bytes` that took `ms` on this rank. */
  record(bytes: number, ms: number): void {
    if (!(ms >= 0) || !Number.isFinite(ms)) return
    let s = this.#sizes.get(bytes)
    if (s === undefined) {
      s = { base: undefined, current: [], strikes: 0, last: 0, skipped: 0 }
      this.#sizes.set(bytes, s)
    }
    if (s.skipped < this.#skip) {
      s.skipped++
      return
    }
    s.current.push(ms)
    if (s.current.length < this.window) return
    const m = median(s.current)
    s.current = []
    s.last = m
    if (s.base === undefined) s.base = m
    else if (m > this.factor * s.base || m * this.factor < s.base) s.strikes++
    else s.strikes = 0
  }

  /** The sizes whose calls moved away from their baseline for `confirm` windows in a row: "4.0 KiB 0.31 -> 1.20 ms". */
  drifted(): string[] {
    const out: string[] = []
    for (const [bytes, s] of [...this.#sizes.entries()].sort((a, b) => a[0] - b[0])) {
      if (s.strikes >= this.confirm && s.base !== undefined) out.push(`${bytes >= 1024 * 1024 ? `${(bytes / (1024 * 1024)).toFixed(1)} MiB` : `${(bytes / 1024).toFixed(1)} KiB`} ${s.base.toFixed(2)} -> ${s.last.toFixed(2)} ms`)
    }
    return out
  }

  /**
   * Forgets every baseline (after the candidates were timed again); with `skip`, each size's next
   * `skip` calls are left out before its first window (a group whose picks were taken from an
   * earlier one starts timing at its first call, while a replacement that just joined is still cold).
   */
  reset(skip = 0): void {
    this.#sizes.clear()
    this.#skip = skip
  }
}
