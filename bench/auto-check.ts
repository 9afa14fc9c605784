// Strategy auto checked against the measured best (bench hetero): in one skew and split, auto's
// samples/s beside the fastest of the fixed strategies the same bench run measured among those auto
// could have run (the all-reduce and the servers' modes; local SGD only where it was offered), and
// whether it ended on that strategy. Pure: the bench hands it the rates it measured.

/** One of the bench's runs: the strategy as the bench names it, its split, its samples/s, and for auto what it ended on. */
export interface StrategyRun {
  readonly strategy: string
  readonly adaptive: boolean
  readonly samplesPerS: number
  /** Strategy auto: the strategy it ran last (its metrics' `strategy`). */
  readonly endedOn?: string
}

export interface AutoCheck {
  /** "auto" or "auto-local" (local SGD offered). */
  readonly auto: string
  readonly adaptive: boolean
  readonly endedOn?: string
  readonly samplesPerS: number
  /** The fastest fixed strategy measured with the same split among auto's candidates. */
  readonly best: { readonly strategy: string; readonly samplesPerS: number }
  /** auto's samples/s over the best's. */
  readonly ofBest: number
  /** Within `within` of the best (auto's rate at least best / within). */
  readonly atBest: boolean
  /** auto ended on the best's strategy. */
  readonly endedOnBest: boolean
}

/** The fixed strategies a bench entry of auto could move to. */
const CANDIDATES: Readonly<Record<string, ReadonlyArray<string>>> = {
  auto: ["allreduce", "backup", "ssp", "async"],
  "auto-local": ["allreduce", "backup", "ssp", "async", "local-sgd"]
}

/**
 * Each auto run in `runs` (one skew's) against the best fixed strategy measured with its split;
 * an auto run with no candidate measured beside it is left out. `within`: the ratio counted as at
 * the best (1.1: the "within 1.1x of the fastest").
 */
export const autoAgainstBest = (runs: ReadonlyArray<StrategyRun>, within = 1.1): AutoCheck[] => {
  const out: AutoCheck[] = []
  for (const a of runs) {
    const candidates = CANDIDATES[a.strategy]
    if (!candidates) continue
    let best: StrategyRun | undefined
    for (const x of runs) {
      if (x.adaptive !== a.adaptive || !candidates.includes(x.strategy)) continue
      if (!best || x.samplesPerS > best.samplesPerS) best = x
    }
    if (!best) continue
    const ofBest = a.samplesPerS / best.samplesPerS
    out.push({
      auto: a.strategy,
      adaptive: a.adaptive,
      ...(a.endedOn !== undefined ? { endedOn: a.endedOn } : {}),
      samplesPerS: a.samplesPerS,
      best: { strategy: best.strategy, samplesPerS: best.samplesPerS },
      ofBest,
      atBest: ofBest * within >= 1,
      endedOnBest: a.endedOn === best.strategy
    })
  }
  return out
}

/** One line per check, as the bench prints them. */
export const formatAutoCheck = (c: AutoCheck): string =>
  `${c.auto}, ${c.adaptive ? "adaptive" : "equal"} split: ${c.samplesPerS.toFixed(0)} samples/s, ended on ${c.endedOn ?? "?"}; ` +
  `the fastest strategy it could run, measured here: ${c.best.strategy} at ${c.best.samplesPerS.toFixed(0)} samples/s; ` +
  `auto at ${c.ofBest.toFixed(2)}x of it (${c.atBest ? "within" : "not within"} 1.1x), ${c.endedOnBest ? "ending on it" : "ending elsewhere"}`
