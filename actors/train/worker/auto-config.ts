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
import { GradientReducer, type GradientReducerOptions, type GradientSlotInfo } from "../../../collectives/gradient-reducer.ts"
import { planBuckets, DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES } from "../../../collectives/bucketing.ts"
import { autoCandidates, compressionType, type ResolvedCompressionConfig } from "../../../collectives/compression/index.ts"
import { chooseAlgorithm, explain, planCommunication, type CompressorProfile, type Explanation } from "../../../scheduler/algorithm-choice.ts"
import type { CostModel, Topology } from "../../../scheduler/cost-model.ts"
import { defaultCostModel, median } from "../../../scheduler/cost-model.ts"
import { describeObservation, type ObservedTopology } from "../../../scheduler/topology.ts"
import { probeGroupTopology } from "./topology-probe.ts"

export const DEFAULT_AUTO_WARMUP_STEPS = 3

/**
 * The compressors 'auto' may pick (the codec registry's entries that declare an `auto` candidate),
 * in escalation order, with ratios computed from the model's shapes, and the config each is
 * switched to when picked.
 */
export const compressorProfiles = (layout: ReadonlyArray<GradientSlotInfo>): { profiles: CompressorProfile[]; configs: Record<string, ResolvedCompressionConfig> } => {
  const { profiles, configs } = autoCandidates(layout)
  return { profiles, configs: configs as Record<string, ResolvedCompressionConfig> }
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
}

/** A GradientReducer whose algorithm and compression the cost model picks. */
export class AutoGradientReducer extends GradientReducer {
  readonly #auto: AutoReducerOptions
  readonly #computeMs: number[] = []
  #explained = false
  #decided: boolean
  #chosen: string

  constructor(comm: Communicator, opts: AutoReducerOptions) {
    const cache = new Map<number, AllReduceAlgorithm>()
    const algorithm =
      opts.algorithm === "auto"
        ? (bytes: number): AllReduceAlgorithm => {
            let a = cache.get(bytes)
            if (a === undefined) {
              a = chooseAlgorithm(bytes, opts.topology, opts.model, allReduceAlgorithms()).algorithm
              cache.set(bytes, a)
            }
            return a
          }
        : (opts.algorithm as AllReduceAlgorithm)
    super(comm, { ...opts, algorithm, compression: opts.compression === "auto" ? "none" : opts.compression })
    this.#auto = opts
    this.#decided = opts.compression !== "auto"
    this.#chosen = opts.compression === "auto" ? "none" : compressionType(opts.compression)
  }

  /** The forward + backward time of a step (the worker's observer feeds it). */
  noteCompute(ms: number): void {
    if (this.#computeMs.length < 64) this.#computeMs.push(ms)
  }

  get compressionChoice(): string {
    return this.#chosen
  }

  override async reduceGradients(flat: Float32Array, layout: ReadonlyArray<GradientSlotInfo>, weight: number, step: number, scope?: string): Promise<void> {
    const warmup = this.#auto.warmupSteps ?? DEFAULT_AUTO_WARMUP_STEPS
    if (!this.#explained) {
      this.#explained = true
      this.#emit(layout, undefined)
    }
    if (!this.#decided && step >= warmup && this.comm.worldSize > 1) {
      this.#decided = true
      // Same step on every rank: agree on one compute time (the slowest rank's median).
      const c = Float32Array.of(median(this.#computeMs.length > 0 ? this.#computeMs : [0]))
      await this.comm.allReduce(c, { op: "max", algorithm: "tree" })
      const chosen = this.#emit(layout, c[0]!)
      const { configs } = compressorProfiles(layout)
      const cfg = configs[chosen]
      if (cfg !== undefined) {
        this.setCompression(cfg)
        this.#chosen = chosen
      }
    }
    return super.reduceGradients(flat, layout, weight, step, scope)
  }

  #emit(layout: ReadonlyArray<GradientSlotInfo>, computeMs: number | undefined): string {
    const o = this.#auto
    const buckets = planBuckets(layout.map((l) => l.size), o.bucketBytes ?? DEFAULT_BUCKET_BYTES, o.firstBucketBytes ?? DEFAULT_FIRST_BUCKET_BYTES)
    const { profiles } = compressorProfiles(layout)
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
    const e = explain(plan)
    const algos = [...new Set(plan.schedule.map((s) => s.algorithm))].join("/")
    const summary =
      `gradwire: all-reduce ${o.algorithm === "auto" ? "auto" : "fixed"}: ${algos} for ${plan.buckets.length} bucket(s), ` +
      `compression ${plan.compression.chosen}${o.compression === "auto" ? (computeMs === undefined ? " (auto: deciding after warm-up)" : " (auto)") : ""}; ` +
      `predicted ${plan.predictedCommMs.toFixed(2)} ms/step comm` +
      (computeMs !== undefined ? ` vs ${computeMs.toFixed(2)} ms compute` : "")
    o.onExplain?.(e, summary)
    return plan.compression.chosen
  }
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
    const observed = input.observed ?? (await probeGroupTopology({ nc: input.nc, comm, cluster: input.cluster, job: input.job }))
    input.onObserved?.(observed)
    model = observed.model
    observation = `${describeObservation(observed)}${input.observed ? "\n(measured by an earlier group of the same nodes, reused at this regroup)" : ""}`
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
