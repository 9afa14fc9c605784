// What each fault cost a chaos run, apart from the machine's drift (bench/chaos.ts). Goodput
// compares two whole runs, and on a shared machine two fault-free runs of the same job differ by
// 10-30%: a chaos run is often slower than its fault-free partner before its first fault. Here the
// chaos run's lag behind the fault-free one is followed epoch by epoch (lag(e) = the chaos run's
// time at epoch e minus the fault-free run's); away from any fault it grows at a steady rate (the
// drift: the two runs' speed apart), and across a fault it jumps. A fault's cost is the lag gained
// from just before it to `windowMs` after it (resume, the replacement's start and join, its first
// slower steps), less the drift over that time. faultPhases splits that cost at the moments the
// group stepped again and was back at its size.

import { median } from "../scheduler/cost-model.ts"

export interface FaultCosts {
  /** Seconds each fault cost, in the order given (undefined: the run had no epoch around it). */
  readonly costs: ReadonlyArray<number | undefined>
  /** The lag's growth away from faults, seconds per second of the chaos run (0: as fast as the fault-free run). */
  readonly drift: number
  /** Fault-free time over fault-free time plus the faults' costs: goodput with the drift taken out. */
  readonly netGoodput: number
}

/** How long before a fault its window opens, ms (the lag just before it is the cost's baseline). */
const BEFORE_MS = 500

interface LagPoint {
  /** ms from the chaos run's first step to its report of an epoch. */
  readonly t: number
  /** The chaos run's time minus the fault-free run's at that epoch, ms. */
  readonly lag: number
}

/** The chaos run's lag behind the fault-free one at every epoch both reported. */
const lagSeries = (free: ReadonlyArray<number>, chaos: ReadonlyArray<number>): LagPoint[] => {
  const pts: LagPoint[] = []
  for (let e = 0; e < Math.min(free.length, chaos.length); e++) if (Number.isFinite(free[e]) && Number.isFinite(chaos[e])) pts.push({ t: chaos[e]!, lag: chaos[e]! - free[e]! })
  return pts
}

/** The lag at chaos time t: the first epoch reported at or after t (the last one past the end). */
const lagAt = (pts: ReadonlyArray<LagPoint>, t: number): LagPoint | undefined => pts.find((p) => p.t >= t) ?? pts.at(-1)

/** The lag just before chaos time t: the last epoch reported at or before it. */
const lagBefore = (pts: ReadonlyArray<LagPoint>, t: number): LagPoint | undefined => pts.findLast((p) => p.t <= t)

/**
 * The faults' windows in time order (`all`), the window of a fault by its time (`of`), and whether
 * a span of the run touches none of them (`clear`). A window runs from BEFORE_MS before its fault
 * to `windowMs` after it, ending at the next fault at the latest.
 */
const faultWindows = (
  faultsAt: ReadonlyArray<number>,
  windowMs: number
): { all: Array<readonly [number, number]>; of: (f: number) => readonly [number, number]; clear: (from: number, to: number) => boolean } => {
  const sorted = [...faultsAt].sort((a, b) => a - b)
  const all = sorted.map((f, i) => [f - BEFORE_MS, Math.min(f + windowMs, sorted[i + 1] ?? Number.POSITIVE_INFINITY)] as const)
  return { all, of: (f) => all[sorted.indexOf(f)]!, clear: (from, to) => all.every(([a, b]) => to < a || from > b) }
}

/**
 * `free[e]`, `chaos[e]`: ms from each run's first step to its report of epoch e; `faultsAt`: ms
 * from the chaos run's first step to each fault. A fault's window ends at the next fault at the
 * latest. Epochs within 0.5 s before a fault or inside its window do not count toward the drift.
 */
export const faultCosts = (free: ReadonlyArray<number>, chaos: ReadonlyArray<number>, faultsAt: ReadonlyArray<number>, windowMs = 5_000): FaultCosts => {
  const pts = lagSeries(free, chaos)
  const windows = faultWindows(faultsAt, windowMs)
  // Between two consecutive epochs with no fault's window in reach.
  let rise = 0
  let span = 0
  for (let i = 1; i < pts.length; i++) {
    const [p, q] = [pts[i - 1]!, pts[i]!]
    if (windows.clear(p.t, q.t)) {
      rise += q.lag - p.lag
      span += q.t - p.t
    }
  }
  const drift = span > 0 ? rise / span : 0
  const costs = faultsAt.map((f) => {
    const w = windows.of(f)
    const a = lagBefore(pts, w[0])
    const b = lagAt(pts, w[1])
    if (!a || !b || b.t <= a.t) return undefined
    return (b.lag - a.lag - drift * (b.t - a.t)) / 1000
  })
  const freeMs = free[Math.min(free.length, chaos.length) - 1] ?? 0
  const total = costs.reduce<number>((s, c) => s + Math.max(0, c ?? 0), 0) * 1000
  return { costs, drift, netGoodput: freeMs > 0 ? freeMs / (freeMs + total) : Number.NaN }
}

/** What each fault cost against the chaos run's own pace away from faults (ownPaceCosts). */
export interface OwnPaceCosts {
  /** Seconds each fault cost, in the order given (undefined: no epoch around it, or no clear epochs to pace it by). */
  readonly costs: ReadonlyArray<number | undefined>
  /** The run's time over itself less the faults' costs (each at least 0): goodput against its own pace. */
  readonly goodput: number
}

/** The chaos run's first seconds (a fresh process's slowest) pace no fault. */
const OWN_PACE_SKIP_MS = 2_000

/**
 * Each fault's cost from the chaos run alone: the time its window took (from the last epoch reported
 * at or before the fault to the first at or past `windowMs` after it, or the next fault) less as many
 * epochs at the run's own pace, the mean epoch over the clear stretches (no fault's window in reach)
 * within `aroundMs` of the window. The fault-free partner's noise (two runs differ by 10-30% on a
 * shared machine) and a drift that is not steady do not enter; a fault that slows the group for good
 * (beyond its window) is not seen, as faultCosts counts it as drift. `chaos[e]`: ms from the run's
 * first step to its report of epoch e; `faultsAt`: ms from there to each fault.
 */
export const ownPaceCosts = (chaos: ReadonlyArray<number>, faultsAt: ReadonlyArray<number>, windowMs = 5_000, aroundMs = 20_000): OwnPaceCosts => {
  const ends = chaos.filter((t) => Number.isFinite(t))
  const windows = faultWindows(faultsAt, windowMs)
  const costs = faultsAt.map((f) => {
    const [, end] = windows.of(f)
    const a = ends.findLastIndex((t) => t <= f)
    const b = ends.findIndex((t) => t >= end)
    if (a < 0 || b < 0 || b <= a) return undefined
    let sum = 0
    let n = 0
    for (let e = 1; e < ends.length; e++) {
      const [p, q] = [ends[e - 1]!, ends[e]!]
      if (p < OWN_PACE_SKIP_MS || q < f - aroundMs || p > end + aroundMs || !windows.clear(p, q)) continue
      sum += q - p
      n++
    }
    if (n === 0) return undefined
    return (ends[b]! - ends[a]! - (b - a) * (sum / n)) / 1000
  })
  const total = ends.at(-1) ?? 0
  const lost = costs.reduce<number>((s, c) => s + Math.max(0, c ?? 0), 0) * 1000
  return { costs, goodput: total > 0 ? (total - lost) / total : Number.NaN }
}

/** Where a fault's cost went (seconds of the group's time, each less the drift over its span). */
export interface FaultPhases {
  /** From just before the fault to the first step of the next generation: detection, regroup, resume. */
  readonly stall: number
  /** From there to the group being back at its size (0 when it never ran short-handed). */
  readonly shortHanded: number
  /** The half second after the replacement joined (its loop's start, the group's first steps with it). */
  readonly join: number
  /** The rest of the fault's window (the replacement's first, slower steps). */
  readonly after: number
}

/** When a fault's group stepped again and when it was whole again, ms from the chaos run's first step. */
export interface FaultTimes {
  readonly at: number
  readonly resumeAt?: number
  /** Absent: the group was never short of workers (as after a nats-server restart), or did not grow back in the window. */
  readonly wholeAt?: number
}

/**
 * The cost of each fault (faultCosts) split at the moments the group resumed and was whole again:
 * the lag gained in each span less the drift over it, so the four add up to the fault's cost.
 * `drift` is faultCosts's. undefined where the run has no epoch around the fault or no resume.
 */
export const faultPhases = (
  free: ReadonlyArray<number>,
  chaos: ReadonlyArray<number>,
  faults: ReadonlyArray<FaultTimes>,
  drift: number,
  windowMs = 5_000
): Array<FaultPhases | undefined> => {
  const pts = lagSeries(free, chaos)
  const windows = faultWindows(faults.map((f) => f.at), windowMs)
  return faults.map((f) => {
    const [from, end] = windows.of(f.at)
    const start = lagBefore(pts, from)
    if (start === undefined || f.resumeAt === undefined || f.resumeAt > end) return undefined
    const whole = f.wholeAt !== undefined && f.wholeAt >= f.resumeAt && f.wholeAt <= end ? f.wholeAt : f.resumeAt
    const marks = [f.resumeAt, whole, Math.min(whole + 500, end), end].map((t) => lagAt(pts, t))
    if (marks.some((m) => m === undefined)) return undefined
    const at = [start, ...(marks as LagPoint[])]
    // Each span's lag gained less the drift over it; a mark that snapped past the next (epochs are
    // discrete) leaves that span empty.
    const span = (k: number): number => {
      const [p, q] = [at[k]!, at[k + 1]!]
      return q.t <= p.t ? 0 : (q.lag - p.lag - drift * (q.t - p.t)) / 1000
    }
    return { stall: span(0), shortHanded: span(1), join: span(2), after: span(3) }
  })
}

/**
 * What each grow back to the group's size stalled the group (a replacement's admission: the
 * survivors pause, the group forms again with it, it replays the loop to their step): the epoch in
 * which it came took this many seconds longer than the run's median epoch. `chaos[e]`: ms from the
 * run's first step to its report of epoch e; `growsAt`: ms from there to each grow. undefined where
 * no epoch was reported after the grow or before it.
 */
export const growStalls = (chaos: ReadonlyArray<number>, growsAt: ReadonlyArray<number>): Array<number | undefined> => {
  const epochs = chaos.map((t, e) => [t, e > 0 ? t - chaos[e - 1]! : Number.NaN] as const).filter(([t, d]) => Number.isFinite(t) && Number.isFinite(d))
  if (epochs.length === 0) return growsAt.map(() => undefined)
  const typical = median(epochs.map(([, d]) => d))
  return growsAt.map((g) => {
    const next = epochs.find(([t, d]) => t >= g && t - d <= g)
    return next === undefined ? undefined : (next[1] - typical) / 1000
  })
}

/** A joined worker's CPU over its first seconds in the group, beside the survivors' (joinCpu). */
export interface JoinCpu {
  /** The attempt (group generation) it joined. */
  readonly attempt: number
  /** Cores the joined worker used (its process, compiler threads included). */
  readonly joiner: number
  /** Cores each survivor used over the same time, their mean. */
  readonly survivors: number
  /** Seconds measured: `windowMs`, or less where the next attempt began sooner. */
  readonly seconds: number
  /**
   * Of those cores, the main threads' (the loop, tfjs's kernels, the collectives), where `mainCpu`
   * was given: the rest is the other threads' (V8's optimizing compiler and garbage collector).
   */
  readonly joinerMain?: number
  readonly survivorsMain?: number
}

/** Cores used by a process between t1 and t2 from its cumulative CPU samples ([ms since epoch, CPU ms]); undefined unless the samples span [t1, t2]. */
const coresBetween = (samples: ReadonlyArray<readonly [number, number]>, t1: number, t2: number): number | undefined => {
  if (samples.length < 2 || samples[0]![0] > t1 || samples.at(-1)![0] < t2) return undefined
  const at = (t: number): number => {
    let i = 1
    while (i < samples.length - 1 && samples[i]![0] < t) i++
    const [ta, ca] = samples[i - 1]!
    const [tb, cb] = samples[i]!
    return tb === ta ? cb : ca + ((cb - ca) * (t - ta)) / (tb - ta)
  }
  return (at(t2) - at(t1)) / (t2 - t1)
}

/**
 * Whether a worker that joins a running group comes in slower than the survivors: in a data-parallel
 * group every rank runs the same steps, so their CPU over the same seconds compares their CPU per
 * step (a capped rank that needs more shows as its cap, and the group waits for it). `cpu`: per
 * process, its cumulative CPU samples; `firstAttempt`: per process, the attempt it started the
 * loop at (a joiner: the attempt it joined); `startAt`: per attempt, when its first step was seen.
 * For each attempt a worker joined, over `windowMs` from that first step (or to the next attempt).
 * `mainCpu`: per process, its main thread's cumulative CPU samples, split out where they span the window.
 */
export const joinCpu = (
  cpu: ReadonlyMap<number, ReadonlyArray<readonly [number, number]>>,
  firstAttempt: ReadonlyMap<number, number>,
  startAt: ReadonlyMap<number, number>,
  windowMs = 5_000,
  mainCpu?: ReadonlyMap<number, ReadonlyArray<readonly [number, number]>>
): JoinCpu[] => {
  const attempts = [...startAt.keys()].sort((a, b) => a - b)
  const pids = [...firstAttempt.entries()]
  const out: JoinCpu[] = []
  for (const [i, a] of attempts.entries()) {
    if (a === 0) continue
    const t1 = startAt.get(a)!
    const next = attempts[i + 1] !== undefined ? startAt.get(attempts[i + 1]!)! : Number.POSITIVE_INFINITY
    const t2 = Math.min(t1 + windowMs, next)
    if (t2 - t1 < 1_000) continue
    const used = (of: number[], series = cpu): number[] => of.flatMap((p) => { const c = coresBetween(series.get(p) ?? [], t1, t2); return c === undefined ? [] : [c] })
    const mean = (xs: number[]): number => xs.reduce((s, x) => s + x, 0) / xs.length
    const joinerPids = pids.filter(([, f]) => f === a).map(([p]) => p)
    const survivorPids = pids.filter(([, f]) => f < a).map(([p]) => p)
    const joiners = used(joinerPids)
    const survivors = used(survivorPids)
    if (joiners.length === 0 || survivors.length === 0) continue
    // (Split only where every process counted above has main-thread samples over the window.)
    const joinersMain = mainCpu ? used(joinerPids, mainCpu) : []
    const survivorsMain = mainCpu ? used(survivorPids, mainCpu) : []
    const split = joinersMain.length === joiners.length && survivorsMain.length === survivors.length
    out.push({
      attempt: a,
      joiner: mean(joiners),
      survivors: mean(survivors),
      seconds: (t2 - t1) / 1000,
      ...(split ? { joinerMain: mean(joinersMain), survivorsMain: mean(survivorsMain) } : {})
    })
  }
  return out
}
