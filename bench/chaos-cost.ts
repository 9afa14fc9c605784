// What each fault cost a chaos run, apart from the machine's drift (bench/chaos.ts). Goodput
// compares two whole runs, and on a shared machine two fault-free runs of the same job differ by
// 10-30%: a chaos run is often slower than its fault-free partner before its first fault. Here the
// chaos run's lag behind the fault-free one is followed epoch by epoch (lag(e) = the chaos run's
// time at epoch e minus the fault-free run's); away from any fault it grows at a steady rate (the
// drift: the two runs' speed apart), and across a fault it jumps. A fault's cost is the lag gained
// from just before it to `windowMs` after it (resume, the replacement's start and join, its first
// slower steps), less the drift over that time.

export interface FaultCosts {
  /** Seconds each fault cost, in the order given (undefined: the run had no epoch around it). */
  readonly costs: ReadonlyArray<number | undefined>
  /** The lag's growth away from faults, seconds per second of the chaos run (0: as fast as the fault-free run). */
  readonly drift: number
  /** Fault-free time over fault-free time plus the faults' costs: goodput with the drift taken out. */
  readonly netGoodput: number
}

/**
 * `free[e]`, `chaos[e]`: ms from each run's first step to its report of epoch e; `faultsAt`: ms
 * from the chaos run's first step to each fault. A fault's window ends at the next fault at the
 * latest. Epochs within 0.5 s before a fault or inside its window do not count toward the drift.
 */
export const faultCosts = (free: ReadonlyArray<number>, chaos: ReadonlyArray<number>, faultsAt: ReadonlyArray<number>, windowMs = 5_000): FaultCosts => {
  const n = Math.min(free.length, chaos.length)
  const pts: Array<{ t: number; lag: number }> = []
  for (let e = 0; e < n; e++) if (Number.isFinite(free[e]) && Number.isFinite(chaos[e])) pts.push({ t: chaos[e]!, lag: chaos[e]! - free[e]! })
  const before = 500
  const sorted = [...faultsAt].sort((a, b) => a - b)
  const windows = sorted.map((f, i) => [f - before, Math.min(f + windowMs, sorted[i + 1] ?? Number.POSITIVE_INFINITY)] as const)
  // Between two consecutive epochs with no fault's window in reach.
  const clear = (from: number, to: number): boolean => windows.every(([a, b]) => to < a || from > b)
  let rise = 0
  let span = 0
  for (let i = 1; i < pts.length; i++) {
    const [p, q] = [pts[i - 1]!, pts[i]!]
    if (clear(p.t, q.t)) {
      rise += q.lag - p.lag
      span += q.t - p.t
    }
  }
  const drift = span > 0 ? rise / span : 0
  // The lag at chaos time t: the first epoch reported at or after t (the last one past the end).
  const lagAt = (t: number): { t: number; lag: number } | undefined => pts.find((p) => p.t >= t) ?? pts.at(-1)
  const costs = faultsAt.map((f) => {
    const w = windows[sorted.indexOf(f)]!
    const a = [...pts].reverse().find((p) => p.t <= w[0])
    const b = lagAt(w[1])
    if (!a || !b || b.t <= a.t) return undefined
    return (b.lag - a.lag - drift * (b.t - a.t)) / 1000
  })
  const freeMs = free[n - 1] ?? 0
  const total = costs.reduce<number>((s, c) => s + Math.max(0, c ?? 0), 0) * 1000
  return { costs, drift, netGoodput: freeMs > 0 ? freeMs / (freeMs + total) : Number.NaN }
}
