// collectiveConfig.algorithm / compression 'auto' on a worker: after the communicator has formed,
// the group's topology is observed (actors/train/worker/topology-probe.ts; rank 0 measures, everyone gets the
// same cost model), every bucket's all-reduce algorithm is the cheapest predicted one, and
// compression 'auto' is decided once, after `warmupSteps` uncompressed steps have measured the
// compute time of a step: every rank all-reduces (max) its median compute time at the same step,
// so all ranks feed the same numbers into the same pure planCommunication and pick the same
// compressor. The candidates are the registries' (collectives/algorithms/, and the codecs that
// declare an 'auto' candidate in collectives/compression/), handed to the scheduler, which does
// not import them. The plan is explained (scheduler/algorithm-choice.ts explain()) and handed to
// `onExplain` (rank 0 sends it to the trainer, which writes explain.txt / explain.json).
import type { NatsConnection } from "@nats-io/nats-core"
import type { Communicator } from "../../../collectives/communicator.ts"
import { allReduceAlgorithms, type AllReduceAlgorithm } from "../../../collectives/algorithms/index.ts"
import { GradientReducer, routeName, type GradientReducerOptions, type GradientSlotInfo, type Route } from "../../../collectives/gradient-reducer.ts"
import { planBuckets, DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES } from "../../../collectives/bucketing.ts"
import { askedProfile, autoCandidates, compressionType, type ResolvedCompressionConfig } from "../../../collectives/compression/index.ts"
import { chooseAlgorithm, explain, planCommunication, type CompressorProfile, type Explanation } from "../../../scheduler/algorithm-choice.ts"
import type { CostModel, Topology } from "../../../scheduler/cost-model.ts"
import { defaultCostModel, median } from "../../../scheduler/cost-model.ts"
import { AlgorithmTuner, DriftMonitor, roundsSlower, roundsToOverride, type TunedSize } from "../../../scheduler/algorithm-tuner.ts"
import { describeObservation, type ObservedTopology, type ProbeOptions } from "../../../scheduler/topology.ts"
import { probeGroupTopology } from "./topology-probe.ts"
import { observedNodes, type LinkMeasurements, type TunedShape } from "../common/train-protocol.ts"

export const DEFAULT_AUTO_WARMUP_STEPS = 3

/**
 * The compressors 'auto' may pick (the codec registry's entries that declare an `auto` candidate),
 * in escalation order, with ratios computed from the model's shapes, and the config each is
 * switched to when picked.
 */
export const compressorProfiles = (
  layout: ReadonlyArray<GradientSlotInfo>,
  asked?: ResolvedCompressionConfig
): { profiles: CompressorProfile[]; configs: Record<string, ResolvedCompressionConfig> } => {
  const { profiles, configs } = autoCandidates(layout)
  // The codec a run asked for is priced with its own config, in place of 'auto''s of that name.
  const own = asked === undefined ? undefined : askedProfile(asked, layout)
  const priced = own === undefined ? profiles : [...profiles.filter((p) => p.name !== own.name), own]
  return { profiles: priced, configs: configs as Record<string, ResolvedCompressionConfig> }
}

export interface AutoReducerOptions extends Omit<GradientReducerOptions, "algorithm" | "compression"> {
  /** 'auto' or a fixed algorithm. */
  readonly algorithm: string
  /** 'auto' or a resolved config. */
  readonly compression: ResolvedCompressionConfig | "auto"
  readonly topology: Topology
  readonly model: CostModel
  readonly warmupSteps?: number
  /** Called with every (re)explanation: at the first step, and when 'auto' compression is decided. */
  readonly onExplain?: (e: Explanation, summary: string) => void
  /**
   * What an earlier group of the same shape measured (a regroup hands the same to every member):
   * taken instead of timing the candidates again, when its candidates are this tuner's.
   */
  readonly known?: KnownPicks
  /** Called with what the tuner decided, each time it decides. */
  readonly onTuned?: (k: KnownPicks) => void
}

/** A tuner's decision, to hand to a later group of the same shape: its candidates and per-size results. */
export interface KnownPicks {
  readonly candidates: readonly string[]
  readonly sizes: readonly TunedSize[]
  /** Measured from CONFIRM_AT_CALL on (warm processes); otherwise the group that takes it measures once more there. */
  readonly confirmed: boolean
}

/** Group shapes whose measured picks a worker keeps (the most recent first). */
const TUNED_SHAPES_KEPT = 4

/** Each rank's node as the first rank on that node ([a, a, b] and [c, c, d] both [0, 0, 2]): the layout, whatever the nodes are called. */
const layoutKey = (nodes: ReadonlyArray<string>): string[] => nodes.map((n) => String(nodes.indexOf(n)))

/**
 * The picks measured for a group of this shape (the node of each rank), if kept. Failing that, those
 * of a group on the same nodes with its ranks in another order (a replacement joins after the
 * survivors, so a group that lost a rank and grew back has the ranks it had, renumbered), and failing
 * that, those of a group laid out alike on other nodes (as many ranks, the same ranks sharing a node:
 * a spare or a replacement on a node no group of this job ran on yet). Both are taken as not
 * confirmed, so that the group times every candidate again at CONFIRM_AT_CALL, on warm processes
 * and in its own order, instead of on its first calls while the joiner is cold (each candidate
 * five times, over both paths: 30 calls after a barrier each, while the survivors wait).
 */
export const picksFor = (kept: LinkMeasurements["tuned"], nodes: ReadonlyArray<string>): TunedShape | undefined => {
  const exact = kept?.find((x) => sameNames(x.nodes, nodes))
  if (exact !== undefined) return exact
  const sorted = [...nodes].sort()
  const layout = layoutKey(nodes)
  const similar = kept?.find((x) => sameNames([...x.nodes].sort(), sorted)) ?? kept?.find((x) => sameNames(layoutKey(x.nodes), layout))
  return similar === undefined ? undefined : { ...similar, nodes: [...nodes], confirmed: false }
}

/** `shape` first, then the other shapes kept before (one per node layout), at most TUNED_SHAPES_KEPT. */
export const rememberShape = (kept: LinkMeasurements["tuned"], shape: TunedShape): TunedShape[] =>
  [shape, ...(kept ?? []).filter((x) => !sameNames(x.nodes, shape.nodes))].slice(0, TUNED_SHAPES_KEPT)

/** Calls per candidate algorithm and size that the tuner times (AlgorithmTuner's rounds). */
export const TUNE_ROUNDS = 5
/** The model's pick stands unless it measured more than this factor slower than the fastest, in most rounds (AlgorithmTuner's keepWithin). */
export const TUNE_KEEP_WITHIN = 1.1
/**
 * After tuning, each size's calls are timed in windows of this many (DriftMonitor); a window whose
 * median is DRIFT_FACTOR x off the first window's, DRIFT_CONFIRM windows in a row, times every
 * candidate again. The ranks agree every DRIFT_CHECK_EVERY calls (one one-float all-reduce),
 * twice as far apart after each time they measured again (at most 32x): a group whose calls keep
 * moving (a noisy machine) is not measured over and over.
 */
export const DRIFT_WINDOW = 50
export const DRIFT_FACTOR = 2
export const DRIFT_CONFIRM = 2
export const DRIFT_CHECK_EVERY = 100
/**
 * A group's first measurement runs on its first calls, while its processes warm up (on a busy
 * 2-core machine it picked a route 2-5x slower than the warm fastest in 3 of 7 runs); at this call
 * every candidate is timed once more, and that decision stands (and is what a later group of the
 * same shape takes).
 */
export const CONFIRM_AT_CALL = 200
/** With picks taken from an earlier group, the calls of each size left out before the drift baseline. */
export const REUSED_DRIFT_SKIP = 2 * DRIFT_WINDOW
/**
 * With transport 'auto', sizes below this are timed over both paths (each algorithm over the
 * direct links and over NATS); larger ones over the direct links only, where bandwidth decides
 * and a call over NATS would cost tens of milliseconds more for every round of the measurement.
 */
export const PATH_TUNE_MAX_BYTES = 4 * 1024 * 1024
const PATHS = ["direct", "nats"] as const

/**
 * Whether a group's calls can take either path: transport 'auto' (the user left the choice to
 * gradwire) and the group formed with a direct link between every two ranks. Both are the same on
 * every rank, so every rank times the same candidates and lays out the same table.
 */
export const tunesPaths = (comm: Communicator): boolean => comm.worldSize > 1 && comm.transport.choice === "auto" && comm.wholeDirect

const sameNames = (a: ReadonlyArray<string>, b: ReadonlyArray<string>): boolean => a.length === b.length && a.every((x, i) => x === b[i])

/** A tuner candidate's name back into a route ("tree/nats" -> tree over NATS; "tree" -> the communicator's path). */
const parseRoute = (name: string): Route => {
  const at = name.indexOf("/")
  if (at < 0) return { algorithm: name as AllReduceAlgorithm }
  return { algorithm: name.slice(0, at) as AllReduceAlgorithm, transport: name.slice(at + 1) as "nats" | "direct" }
}

/**
 * A GradientReducer whose algorithm and compression the cost model picks. With algorithm 'auto'
 * the model's pick holds until the tuner has timed every candidate on this group's own calls
 * (TUNE_ROUNDS calls each, from the call after the first that finds compression decided: the
 * group's second, or the one after compression 'auto' decides); from then on each size runs the
 * measured fastest (the model's pick kept unless it measured clearly slower: AlgorithmTuner).
 * When the calls then move well away from what they took after tuning (a link slowed or sped up,
 * the cores got busier, a peer fell back to NATS: DriftMonitor), every candidate is timed again.
 * With transport 'auto' and a direct link between every two ranks (tunesPaths), a candidate is an
 * algorithm over a path ("tree/direct", "tree/nats"), sizes below PATH_TUNE_MAX_BYTES timed over
 * both; with a fixed algorithm, the tuner times only its two paths.
 */
export class AutoGradientReducer extends GradientReducer {
  readonly #auto: AutoReducerOptions
  readonly #computeMs: number[] = []
  #explained = false
  #decided: boolean
  #chosen: string
  #agreedComputeMs: number | undefined = undefined
  /** A codec the run asked for (not 'auto', not "none"): priced against the compute once it is measured. */
  readonly #asked: boolean
  readonly #tune: {
    tuner: AlgorithmTuner | undefined
    calls: number
    from: number | undefined
    active: boolean
    result: TunedSize[] | undefined
    /** The call at which the last tuning decided. */
    decidedAt: number
    /** Tunings after the first (for moved calls), and why the last one was made. */
    retunes: number
    why: string | undefined
    /** The picks were measured from CONFIRM_AT_CALL on (on warm processes), here or by the group they came from. */
    confirmed: boolean
  }
  readonly #drift = new DriftMonitor(DRIFT_WINDOW, DRIFT_FACTOR, DRIFT_CONFIRM)
  readonly #modelPick: (bytes: number) => string
  readonly #paths: boolean
  /** The picks came from an earlier group of the same shape (until measured again here). */
  #reused = false

  constructor(comm: Communicator, opts: AutoReducerOptions) {
    const cache = new Map<number, AllReduceAlgorithm>()
    const modelPick = (bytes: number): AllReduceAlgorithm => {
      let a = cache.get(bytes)
      if (a === undefined) {
        a = chooseAlgorithm(bytes, opts.topology, opts.model, allReduceAlgorithms()).algorithm
        cache.set(bytes, a)
      }
      return a
    }
    const algorithmFor = (bytes: number): AllReduceAlgorithm => (opts.algorithm === "auto" ? modelPick(bytes) : (opts.algorithm as AllReduceAlgorithm))
    const algorithms = opts.algorithm === "auto" ? allReduceAlgorithms().map((a) => a.name) : [opts.algorithm]
    const paths = tunesPaths(comm)
    const candidates = paths ? algorithms.flatMap((a) => PATHS.map((t) => routeName({ algorithm: a, transport: t }))) : algorithms
    // With both paths timed, the incumbent is the direct one (faster in steady state wherever it was
    // measured; the start-up measurement that set the communicator's threshold ran on cold
    // processes), and from PATH_TUNE_MAX_BYTES on only the direct path is timed.
    const modelRoute = (bytes: number): string => (paths ? routeName({ algorithm: algorithmFor(bytes), transport: "direct" }) : algorithmFor(bytes))
    const timedOn = paths ? (bytes: number): readonly string[] => (bytes < PATH_TUNE_MAX_BYTES ? candidates : candidates.filter((c) => c.endsWith("/direct"))) : undefined
    const tune = {
      tuner: comm.worldSize > 1 && candidates.length > 1 ? new AlgorithmTuner(candidates, TUNE_ROUNDS, TUNE_KEEP_WITHIN, timedOn) : undefined,
      calls: 0,
      from: undefined as number | undefined,
      active: false,
      result: undefined as TunedSize[] | undefined,
      decidedAt: 0,
      retunes: 0,
      why: undefined as string | undefined,
      confirmed: false
    }
    const route = (bytes: number): Route => {
      if (tune.active) return parseRoute(tune.tuner!.next(bytes))
      const picked = tune.tuner?.pick(bytes)
      return picked !== undefined ? parseRoute(picked) : { algorithm: algorithmFor(bytes) }
    }
    super(comm, { ...opts, algorithm: algorithmFor, route, compression: opts.compression === "auto" ? "none" : opts.compression })
    this.#auto = opts
    this.#decided = opts.compression !== "auto"
    this.#asked = opts.compression !== "auto" && compressionType(opts.compression) !== "none"
    this.#chosen = opts.compression === "auto" ? "none" : compressionType(opts.compression)
    this.#tune = tune
    this.#modelPick = modelRoute
    this.#paths = paths
    const known = opts.known
    if (tune.tuner !== undefined && known !== undefined && known.sizes.length > 0 && sameNames(known.candidates, tune.tuner.candidates)) {
      tune.tuner.adopt(known.sizes)
      tune.result = [...known.sizes]
      tune.confirmed = known.confirmed
      this.#reused = true
      // The first calls of a regrouped group run while a replacement is cold (its first seconds
      // of steps are up to 2-3x slower): not a baseline the later calls should be held to.
      this.#drift.reset(REUSED_DRIFT_SKIP)
    }
  }

  /** Whether the tuner times each algorithm over both paths (transport 'auto' with every peer's direct link up). */
  get tunesPaths(): boolean {
    return this.#paths
  }

  protected override noteCall(bytes: number, algorithm: string, ms: number): void {
    if (this.#tune.active) this.#tune.tuner!.record(bytes, algorithm, ms)
    else if (this.#tune.result !== undefined) this.#drift.record(bytes, ms)
  }

  /** Times every candidate was timed again after the first tuning, and why the last time. */
  get retuned(): { readonly times: number; readonly why: string | undefined } {
    return { times: this.#tune.retunes, why: this.#tune.why }
  }

  /** The forward + backward time of a step (the worker's observer feeds it). */
  noteCompute(ms: number): void {
    if (this.#computeMs.length < 64) this.#computeMs.push(ms)
  }

  get compressionChoice(): string {
    return this.#chosen
  }

  override async reduceGradients(flat: Float32Array, layout: ReadonlyArray<GradientSlotInfo>, weight: number, step: number, scope?: string, holder?: number): Promise<void> {
    const warmup = this.#auto.warmupSteps ?? DEFAULT_AUTO_WARMUP_STEPS
    if (!this.#explained) {
      this.#explained = true
      this.#emit(layout, undefined)
    }
    const t = this.#tune
    // Counted in this reducer's calls (every rank makes the same ones, also where a loop does
    // not reduce every step).
    const call = t.tuner !== undefined ? t.calls++ : 0
    if (t.tuner !== undefined && t.result === undefined) {
      // Tuning runs from the call after the first one that finds compression decided (the
      // group's first call warms up), for tuner.steps calls.
      if (t.from === undefined && this.#decided) t.from = call + 1
      if (t.from !== undefined && call >= t.from + t.tuner.steps) {
        t.active = false
        const table = t.tuner.table()
        if (table.length > 0) await this.comm.allReduce(table, { op: "max", algorithm: "tree" })
        t.result = t.tuner.decide(table, this.#modelPick)
        t.decidedAt = call
        if (t.from > CONFIRM_AT_CALL) t.confirmed = true
        this.#reused = false
        this.#auto.onTuned?.({ candidates: t.tuner.candidates, sizes: t.result, confirmed: t.confirmed })
        this.#emit(layout, this.#agreedComputeMs)
      } else t.active = t.from !== undefined && call >= t.from
      // A tuning call starts together on every rank, so a rank's time is the call's and not its
      // wait for a slower rank's backward pass (a barrier costs about one small message).
      if (t.active) await this.comm.barrier()
    } else if (t.tuner !== undefined && !t.confirmed && call >= CONFIRM_AT_CALL) {
      // The first measurement ran on the group's first calls, while its processes were still
      // warming up (and, after a fault, a replacement was cold): every rank, at the same call,
      // times the candidates once more, and that decision stands.
      this.#timeAgain(call)
    } else if (t.tuner !== undefined && call > t.decidedAt && (call - t.decidedAt) % (DRIFT_CHECK_EVERY * 2 ** Math.min(t.retunes, 5)) === 0) {
      // Every rank at the same call: has any rank's calls moved away from what they took after
      // tuning? Then every candidate is timed again, from the next call.
      const drifted = this.#drift.drifted()
      const flag = Float32Array.of(drifted.length > 0 ? 1 : 0)
      await this.comm.allReduce(flag, { op: "max", algorithm: "tree" })
      if (flag[0]! > 0) {
        this.#timeAgain(call)
        t.retunes++
        t.why = drifted.length > 0 ? `rank ${this.comm.rank}'s calls moved: ${drifted.join(", ")}` : "another rank's calls moved"
      }
    }
    if (this.#asked && this.#agreedComputeMs === undefined && step >= warmup && this.comm.worldSize > 1) {
      // A codec the run asked for, priced once against the measured compute (the slowest rank's
      // median, agreed at the same step on every rank): explain.txt and the printed line say when
      // it saves little of a step.
      const c = Float32Array.of(median(this.#computeMs.length > 0 ? this.#computeMs : [0]))
      await this.comm.allReduce(c, { op: "max", algorithm: "tree" })
      this.#agreedComputeMs = c[0]!
      this.#emit(layout, c[0]!)
    }
    if (!this.#decided && step >= warmup && this.comm.worldSize > 1) {
      this.#decided = true
      // Same step on every rank: agree on one compute time (the slowest rank's median).
      const c = Float32Array.of(median(this.#computeMs.length > 0 ? this.#computeMs : [0]))
      await this.comm.allReduce(c, { op: "max", algorithm: "tree" })
      this.#agreedComputeMs = c[0]!
      const chosen = this.#emit(layout, c[0]!)
      const { configs } = compressorProfiles(layout)
      const cfg = configs[chosen]
      if (cfg !== undefined) {
        this.setCompression(cfg)
        this.#chosen = chosen
      }
    }
    // (A tuning call times the all-reduce's candidates: it all-reduces, holder or not.)
    return super.reduceGradients(flat, layout, weight, step, scope, t.active ? undefined : holder)
  }

  /** Every candidate timed again from the call after `call`; the current picks run until the new ones are decided. */
  #timeAgain(call: number): void {
    const t = this.#tune
    const again = new AlgorithmTuner(t.tuner!.candidates, TUNE_ROUNDS, TUNE_KEEP_WITHIN, t.tuner!.timedOn)
    if (t.result !== undefined) again.adopt(t.result)
    t.tuner = again
    t.result = undefined
    t.from = call + 1
    this.#drift.reset()
  }

  #emit(layout: ReadonlyArray<GradientSlotInfo>, computeMs: number | undefined): string {
    const o = this.#auto
    const buckets = planBuckets(layout.map((l) => l.size), o.bucketBytes ?? DEFAULT_BUCKET_BYTES, o.firstBucketBytes ?? DEFAULT_FIRST_BUCKET_BYTES)
    const { profiles } = compressorProfiles(layout, o.compression === "auto" ? undefined : o.compression)
    const fixed = o.algorithm === "auto" ? undefined : [o.algorithm]
    const plan = planCommunication({
      bucketBytes: buckets.map((b) => b.length * 4),
      topology: o.topology,
      model: o.model,
      ...(computeMs !== undefined ? { computeMs } : {}),
      compression: o.compression === "auto" ? "auto" : this.#chosen,
      compressors: profiles,
      algorithms: allReduceAlgorithms(),
      ...(fixed ? { candidates: fixed } : {})
    })
    const e = withTuned(explain(plan), this.#tune.result, { ...(this.#tune.retunes > 0 ? { again: this.#tune } : {}), paths: this.#paths, reused: this.#reused, confirmed: this.#tune.confirmed, fixed: o.algorithm !== "auto" })
    const tuned = this.#tune.result
    const algos = [...new Set(tuned !== undefined && tuned.length > 0 ? tuned.map((x) => x.picked) : plan.schedule.map((s) => s.algorithm))].join(", ") + (tuned !== undefined && tuned.length > 0 ? (this.#reused ? " (measured by an earlier group of this shape)" : " (measured)") : "")
    const summary =
      `gradwire: all-reduce ${o.algorithm === "auto" ? "auto" : "fixed"}: ${algos} for ${plan.buckets.length} bucket(s), ` +
      `compression ${plan.compression.chosen}${o.compression === "auto" ? (computeMs === undefined ? " (auto: deciding after warm-up)" : " (auto)") : ""}` +
      `${plan.compression.note !== undefined ? ` (${plan.compression.note})` : ""}; ` +
      `predicted ${plan.predictedCommMs.toFixed(2)} ms/step comm` +
      (computeMs !== undefined ? ` vs ${computeMs.toFixed(2)} ms compute` : "")
    o.onExplain?.(e, summary)
    return plan.compression.chosen
  }
}

const fmtTunedBytes = (b: number): string => (b >= 1024 * 1024 ? `${(b / (1024 * 1024)).toFixed(1)} MiB` : `${(b / 1024).toFixed(1)} KiB`)

/** The explanation with what the tuner measured and picked, when it has decided (`paths`: each algorithm was timed over both paths). */
/**
 * Why a kept pick slower than the fastest was not overridden: within TUNE_KEEP_WITHIN x of it, or
 * slower than it in too few of the rounds (AlgorithmTuner's rule: in at least 3 of every 4).
 */
const keptBy = (t: TunedSize, fastest: number): string => {
  const mine = t.rounds?.[t.candidates.indexOf(t.picked)]
  const best = t.rounds?.[t.ms.indexOf(fastest)]
  const ratio = t.ms[t.candidates.indexOf(t.picked)]! / fastest
  if (ratio <= TUNE_KEEP_WITHIN || mine === undefined || best === undefined) return `within ${TUNE_KEEP_WITHIN}x or slower in too few rounds`
  return `${ratio.toFixed(2)}x, but slower in ${roundsSlower(mine, best)} of ${mine.length} rounds (${roundsToOverride(mine.length)} needed): ${mine.map((v) => v.toFixed(2)).join(", ")} against ${best.map((v) => v.toFixed(2)).join(", ")} ms`
}

export const withTuned = (
  e: Explanation,
  tuned: readonly TunedSize[] | undefined,
  how: {
    /** Measured again after the first time, and why. */
    readonly again?: { readonly retunes: number; readonly why: string | undefined }
    /** Each algorithm was timed over both paths. */
    readonly paths?: boolean
    /** The picks are an earlier group's of the same shape. */
    readonly reused?: boolean
    /** Measured from CONFIRM_AT_CALL on, once the processes were warm. */
    readonly confirmed?: boolean
    /** A configured algorithm (only its paths were timed), not the cost model's pick. */
    readonly fixed?: boolean
  } = {}
): Explanation => {
  if (tuned === undefined) return e
  const { again, paths = false, reused = false, confirmed = false, fixed = false } = how
  // What stands unless measured clearly slower: the cost model's pick, or the configured algorithm (over the direct links).
  const who = fixed ? "the start-up pick was" : "the cost model picked"
  const lines = tuned.map((t) => {
    const of = (name: string): number => t.ms[t.candidates.indexOf(name)]!
    const fastest = Math.min(...t.ms)
    return (
      `  ${fmtTunedBytes(t.bytes)}: ${t.ms.map((ms, j) => `${t.candidates[j]} ${ms.toFixed(2)}`).join(", ")} ms -> ${t.picked}` +
      (t.picked !== t.modelPick
        ? ` (${who} ${t.modelPick}: ${t.candidates.includes(t.modelPick) ? `${(of(t.modelPick) / fastest).toFixed(2)}x the fastest` : "not timed"})`
        : of(t.picked) > fastest
          ? ` (${who} ${t.picked}, kept: not clearly slower than the fastest, ${keptBy(t, fastest)})`
          : ` (${who} ${t.picked} too)`)
    )
  })
  const timed = paths
    ? `each algorithm timed ${TUNE_ROUNDS} times per bucket size, over the direct links and, below ${fmtTunedBytes(PATH_TUNE_MAX_BYTES)}, over NATS (transport 'auto'; ${fixed ? "the configured algorithm" : "the cost model's pick"} taken over the direct links), on training's own calls`
    : `each algorithm timed ${TUNE_ROUNDS} times per bucket size on training's own calls`
  const text =
    tuned.length === 0
      ? "measured pick: no bucket size was timed with every algorithm; the cost model's picks stand"
      : `measured pick (${timed}, each call's slowest rank, the median of each algorithm's calls):\n${lines.join("\n")}` +
        (reused
          ? `\n  (measured by an earlier group of the same shape, each rank on the same node, ${confirmed ? `from its call ${CONFIRM_AT_CALL} on, once its processes were warm` : `on its first calls (measured once more from this group's call ${CONFIRM_AT_CALL} on)`}, and reused at this regroup: measured again if its calls move)`
          : confirmed
            ? `\n  (measured from the group's call ${CONFIRM_AT_CALL} on, once its processes were warm; a first measurement on its first calls decided until then)`
            : `\n  (measured on the group's first calls; measured once more from call ${CONFIRM_AT_CALL} on, once its processes are warm)`)
  const retold = again ? `\n  timed again (${again.retunes} time${again.retunes === 1 ? "" : "s"} since the first; the last because ${again.why ?? "the calls moved"}: a window of ${DRIFT_WINDOW} calls ${DRIFT_FACTOR}x off the first after tuning, ${DRIFT_CONFIRM} windows in a row)` : ""
  return { ...e, text: `${e.text}\n${text}${retold}`, json: { ...e.json, tuned, confirmed, ...(again ? { retuned: { times: again.retunes, why: again.why } } : {}) } }
}

export interface AutoCollectivesInput {
  readonly nc: NatsConnection
  readonly comm: Communicator
  readonly cluster: string
  readonly job: string
  /** collectiveConfig.algorithm as resolved by the trainer ('auto' or a fixed one). */
  readonly algorithm: string
  /** collectiveConfig.compression, parsed ('auto' or resolved). */
  readonly compression: unknown
  readonly log?: { debug(line: string): void; info(line: string): void; warn(line: string): void }
  readonly onExplain?: AutoReducerOptions["onExplain"]
  /**
   * The links as an earlier group of the same nodes observed them (a regroup hands every member the
   * same one): used instead of probing again. Every rank of the group gets it, or none does.
   */
  readonly observed?: ObservedTopology
  /** Called with what the probe observed (or the reused observation), for a later regroup. */
  readonly onObserved?: (o: ObservedTopology) => void
  /** Timed calls over the direct links (rank 0's fit the model's direct links); see ProbeOptions.direct. */
  readonly direct?: ProbeOptions["direct"]
}

/**
 * What AutoGradientReducer needs besides the bucket settings: the observed topology and the
 * fitted model (probed only when something is 'auto'; otherwise the placeholder model, which only
 * feeds the explanation).
 */
export const prepareAutoCollectives = async (
  input: AutoCollectivesInput
): Promise<Pick<AutoReducerOptions, "algorithm" | "compression" | "topology" | "model" | "onExplain">> => {
  const { comm } = input
  const compression = input.compression as ResolvedCompressionConfig | "auto"
  const wantsAuto = input.algorithm === "auto" || compression === "auto"
  const topology = comm.peers.map((p) => ({ nodeId: p.node, server: p.server }))
  let model: CostModel
  let observation: string | undefined
  if (wantsAuto && comm.worldSize > 1) {
    const observed = input.observed ?? (await probeGroupTopology({ nc: input.nc, comm, cluster: input.cluster, job: input.job, ...(input.direct ? { direct: input.direct } : {}) }))
    input.onObserved?.(observed)
    model = observed.model
    // Reused at a regroup: nodes the observation was not taken on (a replacement's or spare's) are priced by their link class.
    const seen = observedNodes(observed)
    const unseen = [...new Set(topology.map((r) => r.nodeId))].filter((n) => !seen.has(n))
    const reusedNote = unseen.length > 0
      ? `\n(measured by an earlier group, reused at this regroup; not measured: the links of node${unseen.length === 1 ? "" : "s"} ${unseen.join(", ")}, priced by their link class)`
      : "\n(measured by an earlier group of the same nodes, reused at this regroup)"
    observation = `${describeObservation(observed)}${input.observed ? reusedNote : ""}`
    // The measured links go into explain.txt with the plan; to the console only with verbose (GRADWIRE_LOG=debug).
    if (comm.rank === 0) input.log?.debug(observation)
  } else {
    model = defaultCostModel()
  }
  const tell = input.onExplain
  return {
    algorithm: input.algorithm,
    compression,
    topology,
    model,
    ...(tell ? { onExplain: (e: Explanation, summary: string) => tell(observation ? { ...e, text: `${e.text}\n${observation}` } : e, summary) } : {})
  }
}
