// collectiveConfig.strategy "auto": which way of training the measured group runs fastest.
// Inputs are what the workers measured over recent steps: every rank's forward/backward time of
// each step (a p x k matrix, the same steps on every rank), the gradient all-reduce's pure
// communication time (per step, the least any rank spent in it: the last rank to arrive waits for
// nobody), the flat gradient's bytes and the number of parameter servers. Candidates, in gradient
// steps applied per second over the group (p per synchronous step):
//   allreduce   p / (E[max_i c_i] + a)           every step waits for that step's slowest rank
//   backup      (p-1) / (E[c_(p-1)] + t_ps)      PS sync taking the first p-1 gradients (p >= 3)
//   ssp         min(p / (max_i mean c_i + t_w), server bound)
//                                                ranks run at their own pace within the staleness
//                                                bound: a persistent straggler still sets the
//                                                pace, a jittery one no longer does
//   async       min(sum_i 1 / (mean c_i + t_w), server bound)
//                                                every rank at its own pace, no bound
// where a push-pull costs a worker t_w = a * max(1, p / (2(p-1))) (its gradient out, parameters
// back, at the bandwidth the all-reduce showed, and a round trip no cheaper than the all-reduce),
// a push occupies a server t_s = t_w / p (a guess until measured: a ring rank's share of the
// all-reduce), so the servers take at most servers / t_s pushes per second (the server bound), and
// a sync step waits for the servers to take the others' pushes too: t_ps = t_w + (p-1) t_s / servers.
// Once the group has run on the servers, the push-pull time measured there replaces t_w, and the
// CPU time per push the servers report replaces t_s. The fastest wins; a change from the current strategy needs a
// predicted gain of `hysteresis` (default 1.2x), so noise does not flip it back and forth; within
// 5% of the fastest the all-reduce is preferred (it is exactly synchronous training), and after it
// the one whose gradients are least stale: backup workers (fresh, some dropped), SSP (bounded), async.
// With `equalSteps` (dp.fit(): every rank takes the same steps, an epoch ends with a barrier) no
// rank can take over a slower one's share, so backup workers and async are held to the slowest
// rank's pace too: they then only help against jitter, as SSP does. Async's predicted staleness
// (its slowest rank's gradients: the updates the others apply meanwhile) is shown. A rate the group
// measured under a strategy (`measured`) replaces its prediction: the model proposes, running decides;
// and where the current strategy ran slower than predicted, the others' predictions are scaled down
// by the same factor, so a measurement is never compared with a model's optimism. Off the
// all-reduce, backup workers, if they have not run and are predicted within the hysteresis of what
// the current strategy measured, are explored once (after async ran well).
//
// Local SGD (when collectiveConfig.localSgd offers it, `localSgd`): every rank steps on its own and
// the group averages the parameters once every H steps, one all-reduce of the whole vector (r ms,
// the gradient all-reduce's time scaled by the outer codec's bytes):
//   local-sgd   p / (E[max_i c_i] + r / H)
// It trades statistical efficiency (H local steps drift apart) for bytes, so it is a candidate only
// where the link bounds training (the all-reduce takes longer than the slowest rank's compute);
// where compute bounds it, synchronous training is kept, and the explanation says so. Near a tie it
// comes last in the preference order.
//
// The cores: every prediction is held to what the machines' cores can run (cpuCaps): a machine
// whose ranks took R steps/s with B of its C cores busy (every process on it counted, but other
// tenants' no more than half again the ranks' own CPU) has room for R * C / B. No strategy beats an oversubscribed machine's CPU, so the jitter of ranks
// time-sharing it does not move training off the all-reduce; a machine left idle by a throttled
// straggler shows its headroom.

export type StrategyName = "allreduce" | "backup" | "ssp" | "async" | "local-sgd"

/** Which of the modes strategy "auto" moves between run on the parameter servers (each named once). */
const ON_SERVERS: Readonly<Record<StrategyName, boolean>> = { allreduce: false, backup: true, ssp: true, async: true, "local-sgd": false }

/** Whether a mode of strategy "auto" trains through the parameter servers. */
export const onServers = (s: StrategyName): boolean => ON_SERVERS[s]

export interface StrategyMeasure {
  /** computeMs[rank][step]: forward/backward ms, the same steps on every rank. */
  readonly computeMs: ReadonlyArray<ReadonlyArray<number>>
  /** The gradient all-reduce's communication ms per step without waiting (see above). */
  readonly allReduceMs: number
  readonly numServers: number
  /**
   * A push-pull's ms as measured on the servers (per step the least any rank spent): replaces the
   * price derived from the all-reduce once the group has run on them.
   */
  readonly pushPullMs?: number
  /** The busiest server's CPU ms per push, as the servers reported it: replaces the guessed t_s. */
  readonly serverMs?: number
  /**
   * Gradient steps/s the group really applied under a strategy in a recent window (the current
   * one's last window; others' from when they last ran): they replace the predictions, so what the
   * model misses (CPU contention on an oversubscribed machine, a server's queue) is corrected by
   * trying, and a strategy that ran slower than predicted is not tried again while its measurement
   * is remembered.
   */
  readonly measured?: Readonly<Partial<Record<StrategyName, number>>>
  /** Every rank takes the same number of steps (dp.fit()): nobody can run ahead for long. */
  readonly equalSteps?: boolean
  /** The strategies that may be picked (the training-strategy registry's auto candidates); absent: every one predicted. */
  readonly candidates?: ReadonlySet<StrategyName>
  /**
   * Local SGD as a candidate: its H, and the ms of one round (the whole vector's all-reduce with the
   * outer codec; default: allReduceMs times bytesRatio, 1 when not given).
   */
  readonly localSgd?: { readonly syncEvery: number; readonly roundMs?: number; readonly bytesRatio?: number }
  /**
   * The machines' cores, per rank over the last window: the busy cores of its machine (every
   * process on it: the workers, servers, nats-server and whatever else runs there), the steps/s it
   * took, its machine's cores, and which machine it is on (ranks of one machine share its cores).
   * Every strategy's prediction is held to what the cores can run (see cpuCaps).
   */
  readonly cpu?: {
    readonly busyCores: ReadonlyArray<number>
    /** The cores the rank's own process kept busy over the window (its process CPU time). */
    readonly ownCores?: ReadonlyArray<number>
    readonly stepsPerSec: ReadonlyArray<number>
    readonly cores: ReadonlyArray<number>
    readonly host: ReadonlyArray<number>
  }
}

/**
 * What the machines' cores allow, in gradient steps/s over the group. A machine whose ranks took
 * R steps/s with B of its C cores busy spends B / R core-seconds a step (everything on it counted),
 * so its ranks can take at most R * C / B: ranks at their own pace add that up over the machines
 * (`own`); at one pace (a synchronous step) the most loaded machine sets it for every rank
 * (`even`). On an oversubscribed machine no strategy beats its CPU, whatever the jitter of
 * time-shared ranks suggests; on a machine left idle by a throttled straggler the headroom shows.
 */
/** The job's processes besides the ranks (servers, nats-server, driver) as a share of the ranks' own CPU: at most half again. */
const JOB_OVERHEAD = 1.5

export const cpuCaps = (cpu: NonNullable<StrategyMeasure["cpu"]>): { own: number; even: number; why: string } | undefined => {
  const p = cpu.busyCores.length
  if (p === 0 || cpu.busyCores.some((c) => !(c > 0)) || cpu.stepsPerSec.some((c) => !(c > 0)) || cpu.cores.some((c) => !(c > 0))) return undefined
  if (cpu.ownCores !== undefined && cpu.ownCores.some((c) => !(c > 0))) return undefined
  const hosts = new Map<number, { n: number; rate: number; busy: number; cores: number; own: number }>()
  for (let r = 0; r < p; r++) {
    const h = hosts.get(cpu.host[r]!) ?? { n: 0, rate: 0, busy: 0, cores: Number.POSITIVE_INFINITY, own: 0 }
    h.n++
    h.rate += cpu.stepsPerSec[r]!
    h.own += cpu.ownCores?.[r] ?? Number.POSITIVE_INFINITY
    h.busy = Math.max(h.busy, cpu.busyCores[r]!)
    h.cores = Math.min(h.cores, cpu.cores[r]!)
    hosts.set(cpu.host[r]!, h)
  }
  let own = 0
  let even = Number.POSITIVE_INFINITY
  for (const h of hosts.values()) {
    // Other tenants' CPU is not the job's to count: what they use they would share with ranks
    // that stop idling. So the busy cores counted are at most JOB_OVERHEAD times the ranks' own
    // (their servers', nats-server's and driver's share on top).
    h.busy = Math.min(h.busy, h.own * JOB_OVERHEAD)
    const room = (h.rate * h.cores) / Math.min(h.busy, h.cores)
    own += room
    even = Math.min(even, (p * room) / h.n)
  }
  const busiest = [...hosts.values()].reduce((a, b) => (b.busy / b.cores > a.busy / a.cores ? b : a))
  const why = `${hosts.size} machine(s); the busiest ran ${busiest.rate.toFixed(0)} steps/s of ${busiest.n} rank(s) on ${busiest.busy.toFixed(2)} of ${busiest.cores} cores`
  return { own, even, why }
}

export interface StrategyPrediction {
  readonly name: StrategyName
  /** Gradient steps applied per second over the group. */
  readonly stepsPerSec: number
  /** How it was priced, for explain.txt. */
  readonly why: string
}

export interface StrategyChoice {
  readonly pick: StrategyName
  readonly predictions: ReadonlyArray<StrategyPrediction>
  readonly changed: boolean
  readonly text: string
  readonly json: Record<string, unknown>
}

/** Within this factor of the fastest, the all-reduce is preferred, then the others in this order. */
const TIE = 1.05
const PREFERENCE: ReadonlyArray<StrategyName> = ["allreduce", "backup", "ssp", "async", "local-sgd"]

const mean = (xs: ReadonlyArray<number>): number => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0)

/** The k-th smallest (1-based) of xs. */
const orderStat = (xs: ReadonlyArray<number>, k: number): number => [...xs].sort((a, b) => a - b)[Math.min(xs.length, Math.max(1, k)) - 1]!

export const predictStrategies = (m: StrategyMeasure): StrategyPrediction[] => {
  const p = m.computeMs.length
  const steps = Math.min(...m.computeMs.map((r) => r.length))
  if (p === 0 || steps === 0) return []
  const perStep = Array.from({ length: steps }, (_, t) => m.computeMs.map((r) => r[t]!))
  const a = Math.max(0, m.allReduceMs)
  const out: StrategyPrediction[] = []
  const maxC = mean(perStep.map((s) => Math.max(...s)))
  out.push({ name: "allreduce", stepsPerSec: (p * 1000) / (maxC + a), why: `${p} / (E[max compute] ${maxC.toFixed(1)} ms + all-reduce ${a.toFixed(1)} ms)` })
  const local = m.localSgd !== undefined && p >= 2 ? predictLocalSgd(p, maxC, a, m.localSgd) : undefined
  if (local) out.push(local)
  if (p < 2) return out
  // A push-pull is a round trip through an actor: never priced below the all-reduce's own time.
  const tw = m.pushPullMs ?? Math.max(a, (a * p) / (2 * (p - 1)))
  const servers = Math.max(1, m.numServers)
  const ts = Math.max(1e-3, m.serverMs ?? tw / p)
  const tps = tw + ((p - 1) * ts) / servers
  if (p >= 3) {
    const c = mean(perStep.map((s) => orderStat(s, p - 1)))
    out.push({ name: "backup", stepsPerSec: ((p - 1) * 1000) / (c + tps), why: `${p - 1} / (E[${p - 1}th fastest compute] ${c.toFixed(1)} ms + push-pull ${tps.toFixed(1)} ms)` })
  }
  const means = m.computeMs.map((r) => mean(r.slice(0, steps)))
  const slowest = Math.max(...means)
  const pace = (p * 1000) / (slowest + tw)
  const serverBound = (servers * 1000) / ts
  const bound = `servers ${serverBound.toFixed(0)}/s at ${ts.toFixed(2)} ms a push${m.serverMs === undefined ? " (guessed)" : ""}`
  const held = `, held to the slowest rank's pace ${pace.toFixed(1)}/s (equal steps)`
  if (m.equalSteps && p >= 3) {
    const b = out.find((x) => x.name === "backup")!
    const cap = ((p - 1) * 1000) / (slowest + tps)
    if (b.stepsPerSec > cap) out[out.length - 1] = { ...b, stepsPerSec: cap, why: `${b.why}, held to ${p - 1} / (slowest mean compute + push-pull) ${cap.toFixed(1)}/s (equal steps)` }
  }
  out.push({
    name: "ssp",
    stepsPerSec: Math.min(pace, serverBound),
    why: `min(${p} / (slowest mean compute ${slowest.toFixed(1)} ms + push-pull ${tw.toFixed(1)} ms), ${bound})`
  })
  const rates = means.map((c) => 1000 / (c + tw))
  const own = rates.reduce((a, b) => a + b, 0)
  const minRate = Math.min(...rates)
  const asyncRate = Math.min(own, serverBound, m.equalSteps ? pace : Number.POSITIVE_INFINITY)
  out.push({
    name: "async",
    stepsPerSec: asyncRate,
    why:
      `min(sum of every rank's 1 / (mean compute + push-pull ${tw.toFixed(1)} ms) ${own.toFixed(1)}/s, ${bound})${m.equalSteps && pace < Math.min(own, serverBound) ? held : ""}; ` +
      `slowest rank's staleness ~${((own - minRate) / minRate).toFixed(1)}`
  })
  const caps = m.cpu ? cpuCaps(m.cpu) : undefined
  if (!caps) return out
  return out.map((x) => {
    if (x.stepsPerSec <= 0) return x
    const cap = x.name === "async" && !m.equalSteps ? caps.own : x.name === "backup" ? (caps.even * (p - 1)) / p : caps.even
    return x.stepsPerSec <= cap ? x : { ...x, stepsPerSec: cap, why: `${x.why}; held to what the cores run, ${cap.toFixed(1)}/s (${caps.why})` }
  })
}

/**
 * Local SGD's rate: p / (E[max compute] + round / H), offered only where the link bounds the
 * all-reduce's step (its communication exceeds the slowest rank's compute); elsewhere priced at 0
 * with the reason, so explain.txt says why synchronous training stays.
 */
export const predictLocalSgd = (p: number, maxComputeMs: number, allReduceMs: number, l: NonNullable<StrategyMeasure["localSgd"]>): StrategyPrediction => {
  const H = Math.max(1, l.syncEvery)
  const round = l.roundMs ?? allReduceMs * (l.bytesRatio ?? 1)
  const rate = (p * 1000) / (maxComputeMs + round / H)
  const why = `${p} / (E[max compute] ${maxComputeMs.toFixed(1)} ms + round ${round.toFixed(1)} ms / H ${H})`
  if (allReduceMs <= maxComputeMs) {
    return { name: "local-sgd", stepsPerSec: 0, why: `not a candidate: compute (${maxComputeMs.toFixed(1)} ms) bounds the step, not the link (all-reduce ${allReduceMs.toFixed(1)} ms); would be ${rate.toFixed(1)}/s: ${why}` }
  }
  return { name: "local-sgd", stepsPerSec: rate, why: `${why}; the link bounds the all-reduce's step` }
}

/**
 * The predictions, with a measured rate in place of the prediction wherever the group has one.
 * Where the current strategy ran slower than its prediction, what the model missed (CPU contention,
 * the event loop, the bus's queueing) is likely to slow the others as much, so their unmeasured
 * predictions are scaled by the same factor (never up): measured rates are then compared with
 * predictions on the same footing, and a quiet group does not leave the all-reduce for a model's
 * optimism.
 */
const withMeasured = (predicted: StrategyPrediction[], measured: StrategyMeasure["measured"], current: StrategyName): StrategyPrediction[] => {
  const cur = predicted.find((x) => x.name === current)
  const ran = measured?.[current]
  const k = cur && ran !== undefined && ran > 0 && cur.stepsPerSec > 0 ? Math.min(1, ran / cur.stepsPerSec) : 1
  return predicted.map((x) => {
    const r = measured?.[x.name]
    if (r !== undefined && r > 0) return { name: x.name, stepsPerSec: r, why: `measured ${r.toFixed(1)}/s when it ran (predicted ${x.stepsPerSec.toFixed(1)}/s: ${x.why})` }
    if (k >= 1 || x.stepsPerSec <= 0) return x
    return { name: x.name, stepsPerSec: x.stepsPerSec * k, why: `predicted ${x.stepsPerSec.toFixed(1)}/s x ${k.toFixed(2)} (${current} ran at ${k.toFixed(2)} of its prediction): ${x.why}` }
  })
}

export const chooseStrategy = (m: StrategyMeasure, current: StrategyName, hysteresis = 1.2): StrategyChoice => {
  const offered = predictStrategies(m).filter((x) => !m.candidates || x.name === current || m.candidates.has(x.name))
  const predictions = withMeasured(offered, m.measured, current)
  const now = predictions.find((x) => x.name === current)
  const fastest = predictions.reduce((b, x) => (x.stepsPerSec > b.stepsPerSec ? x : b), predictions[0] ?? { name: current, stepsPerSec: 0, why: "" })
  // Near a tie the all-reduce wins: it is exactly synchronous training, the others trade some of
  // it, the fresher their gradients the less (PREFERENCE's order).
  const best = PREFERENCE.map((n) => predictions.find((x) => x.name === n)).find((x) => x !== undefined && x.stepsPerSec * TIE >= fastest.stepsPerSec) ?? fastest
  let changed = best.name !== current && (!now || best.stepsPerSec > now.stepsPerSec * hysteresis)
  // Exploration: once training has left the all-reduce for SSP or async (the staleness is paid
  // for already), backup workers (fresh gradients, the straggler's dropped), if they have not run
  // yet and are predicted within the hysteresis of what the current strategy measured, are tried
  // once: their measurement then decides, where a prediction inside the hysteresis never would,
  // and within the hysteresis the fresher gradients are kept. SSP is not explored from async: its
  // pace is the slowest rank's whole step, which its compute time alone underprices (a throttled
  // straggler is slow at everything), so its prediction is least trustworthy where it matters.
  let explored: StrategyPrediction | undefined
  if (!changed && current !== "allreduce" && now !== undefined && m.measured?.[current] !== undefined) {
    const rank = (n: StrategyName): number => PREFERENCE.indexOf(n)
    explored = PREFERENCE.map((n) => predictions.find((x) => x.name === n))
      .filter((x): x is StrategyPrediction => x !== undefined && x.name === "backup" && rank(x.name) < rank(current) && m.measured?.[x.name] === undefined)
      .find((x) => x.stepsPerSec * hysteresis >= now.stepsPerSec)
    if (explored) changed = true
  }
  const pick = explored ? explored.name : changed ? best.name : current
  const lines = [
    `strategy: ${pick}${changed ? ` (was ${current})` : ""}; gradient steps/s over the group, predicted or measured:`,
    ...predictions.map((x) => `  ${x.name.padEnd(9)} ${x.stepsPerSec.toFixed(1).padStart(8)}/s  ${x.why}${x.name === pick ? "  <- picked" : ""}`),
    `  a change needs ${hysteresis}x the current strategy's prediction`,
    ...(explored ? [`  exploring ${explored.name}: fresher gradients than ${current}, not run yet, predicted within ${hysteresis}x of what ${current} measured; its own measurement decides next`] : [])
  ]
  return {
    pick,
    predictions,
    changed,
    text: lines.join("\n"),
    json: { pick, previous: current, changed, ...(explored ? { explored: explored.name } : {}), hysteresis, allReduceMs: m.allReduceMs, pushPullMs: m.pushPullMs, serverMs: m.serverMs, measured: m.measured ?? {}, numServers: m.numServers, equalSteps: m.equalSteps === true, predictions }
  }
}
