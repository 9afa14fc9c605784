// What the user's training loop gets on each worker: its place in the group (ranks), report()
// for metrics and checkpoints, the checkpoint to resume from, its dataset shard, prepareModel()
// for data-parallel training, the communicator for custom collectives, and tfjs with this
// worker's backend.
import type { Tf } from "../../core/engine.ts"
import { shardIndices, type ArrayDataset } from "../../core/datasets.ts"
import { ConfigError } from "../../core/errors.ts"
import { loadWeightsInto, modelToFiles } from "../../core/model-io.ts"
import type { Communicator } from "../../collectives/communicator.ts"
import type { ReducerStats } from "../../collectives/gradient-reducer.ts"
import { DataParallelModel, type GradientSync, type ParameterServers, type PrepareOptions, type ShardSource, type StepObserver } from "./data-parallel.ts"
import type { GroupSession } from "./group-session.ts"

type LayersModel = import("@tensorflow/tfjs").LayersModel

/** A checkpoint as the loop sees it: named files (bytes or text) and metadata. */
export interface Checkpoint {
  readonly files: Readonly<Record<string, Uint8Array | string>>
  readonly metadata?: Readonly<Record<string, unknown>>
  /** Where the trainer stored it (set on checkpoints handed back by getCheckpoint()). */
  readonly path?: string
  /** The metrics reported with it. */
  readonly metrics?: Readonly<Record<string, unknown>>
}

export interface ReportOptions {
  readonly checkpoint?: Checkpoint
}

/** This rank's shard of a dataset: disjoint from every other rank's, reshuffled per epoch. */
export class DatasetShard implements ShardSource {
  readonly dataset: ArrayDataset
  readonly seed: number
  readonly #place: () => { readonly rank: number; readonly worldSize: number }

  /**
   * `rank`/`worldSize` fixed, or `place` giving the group's current ones: after a regroup (recovery
   * from surviving peers, an elastic resize in place) a shard follows this rank's new place.
   */
  constructor(dataset: ArrayDataset, rank: number, worldSize: number, seed: number, place?: () => { readonly rank: number; readonly worldSize: number }) {
    this.dataset = dataset
    this.seed = seed
    this.#place = place ?? (() => ({ rank, worldSize }))
  }

  get rank(): number {
    return this.#place().rank
  }

  get worldSize(): number {
    return this.#place().worldSize
  }

  /** Rows of this rank for `epoch` (same count on every rank). */
  rows(epoch: number): Int32Array {
    return shardIndices(this.dataset.size, this.rank, this.worldSize, this.seed, epoch)
  }

  get size(): number {
    return Math.floor(this.dataset.size / this.worldSize)
  }
}

export interface TrainContextDeps {
  readonly tf: Tf
  readonly backend: string
  /** This rank's group across regroups: placement, communicator, reducer, loop position. */
  readonly session: GroupSession
  readonly seed: number
  /** collectiveConfig.adaptiveBatching: fit({ globalBatchSize }) splits by measured throughput. */
  readonly adaptiveBatching?: boolean
  /** collectiveConfig.zeroStage. */
  readonly zeroStage?: 0 | 1 | 2
  /** collectiveConfig.wireDtype "float16": ZeRO stage 2's reduce-scatter sends binary16. */
  readonly halfWire?: boolean
  /** The parameter-server strategy's servers. */
  readonly ps?: ParameterServers
  /** collectiveConfig.strategy "auto": what the model needs to decide and explain (GradientSync.auto). */
  readonly auto?: GradientSync["auto"]
  /** Elastic groups: the largest world size and what stays fixed when the size changes. */
  readonly elastic?: { readonly maxWorkers: number; readonly batch: "keep-global" | "keep-per-worker" }
  readonly observer?: StepObserver
  readonly sendReport: (index: number, metrics: Record<string, unknown>, checkpoint: Checkpoint | undefined) => Promise<void>
  readonly fetchCheckpoint: () => Promise<Checkpoint | undefined>
  readonly fetchDataset: (name: string) => Promise<ArrayDataset>
  readonly onStep?: (info: { epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number }) => void
}

export class TrainContext {
  /** tfjs, with this worker's backend active. */
  readonly tf: Tf
  readonly backend: string
  readonly #deps: TrainContextDeps
  #checkpoint: Promise<Checkpoint | undefined> | undefined
  readonly #datasets = new Map<string, Promise<ArrayDataset>>()
  #prepared: DataParallelModel | undefined

  constructor(deps: TrainContextDeps) {
    this.#deps = deps
    this.tf = deps.tf
    this.backend = deps.backend
  }

  // The group this rank is in now: after a regroup (a failed rank replaced by surviving peers, or
  // an elastic group re-formed in place) these change under a running loop.
  get worldRank(): number {
    return this.#deps.session.placement.rank
  }

  get worldSize(): number {
    return this.#deps.session.placement.worldSize
  }

  get localRank(): number {
    return this.#deps.session.placement.localRank
  }

  get localWorldSize(): number {
    return this.#deps.session.placement.localWorldSize
  }

  get nodeRank(): number {
    return this.#deps.session.placement.nodeRank
  }

  /** 0 for the first generation of the group, then 1, 2... after restarts and regroups. */
  get attempt(): number {
    return this.#deps.session.placement.attempt
  }

  /** The group's communicator, for custom collectives (all-reduce, broadcast...). */
  get communicator(): Communicator {
    return this.#deps.session.group.comm
  }

  /** How often this rank has called report(). */
  get reportCount(): number {
    return this.#deps.session.reports
  }

  /**
   * Reports metrics (every rank calls it the same number of times; rank 0's metrics make the
   * history, every rank's are kept per rank) and optionally a checkpoint. Resolves once the
   * trainer holds the checkpoint's bytes: writing it to storage happens in the background.
   */
  async report(metrics: Record<string, unknown>, options: ReportOptions = {}): Promise<void> {
    if (typeof metrics !== "object" || metrics === null || Array.isArray(metrics)) {
      throw new ConfigError({ field: "report(metrics)", reason: "metrics must be a plain object such as { loss: 0.1, epoch: 2 }" })
    }
    const session = this.#deps.session
    const index = session.reports++
    // A rank joining a regrouped generation replays the loop: the survivors made these already.
    if (session.skipReport(index)) return
    await this.#deps.sendReport(index, metrics, options.checkpoint)
  }

  /** The checkpoint this run resumes from (the latest one), or undefined on a fresh start. */
  getCheckpoint(): Promise<Checkpoint | undefined> {
    this.#checkpoint ??= this.#deps.fetchCheckpoint().then((c) => {
      if (c) this.#deps.session.resumedFromCheckpoint()
      return c
    })
    return this.#checkpoint
  }

  /** This rank's shard of the dataset passed to the Trainer as `datasets[name]`. */
  async getDatasetShard(name: string): Promise<DatasetShard> {
    let ds = this.#datasets.get(name)
    if (!ds) {
      ds = this.#deps.fetchDataset(name)
      this.#datasets.set(name, ds)
    }
    const session = this.#deps.session
    return new DatasetShard(await ds, this.worldRank, this.worldSize, this.#deps.seed, () => session.placement)
  }

  /** The full dataset (for evaluation on held-out data, for example). */
  async getDataset(name: string): Promise<ArrayDataset> {
    return (await this.getDatasetShard(name)).dataset
  }

  /**
   * Wraps a compiled model for data-parallel training: every rank starts from rank 0's weights,
   * and trainStep()/fit() all-reduce gradients (bucketed, with the configured algorithm and
   * compression) so every rank keeps identical weights.
   */
  async prepareModel(model: LayersModel, options: PrepareOptions = {}): Promise<DataParallelModel> {
    const d = this.#deps
    const session = d.session
    const onStep = d.onStep
    // Every group operation of the model runs through the session: when the group breaks under
    // it, the rank parks, is regrouped with the survivors and goes on (group-session.ts).
    const sync: GradientSync = {
      get rank() {
        return session.placement.rank
      },
      get worldSize() {
        return session.placement.worldSize
      },
      reduceGradients: (flat, layout, weight, step) =>
        session.operation<void | "adopted" | "recompute">(
          (g) => g.reducer.reduceGradients(flat, layout, weight, step),
          () => "adopted",
          () => "recompute"
        ),
      // The start-up broadcast of rank 0's weights: a joining rank takes the survivors' state instead.
      broadcast: (buf) => (session.joinTarget ? Promise.resolve() : session.group.reducer.broadcast(buf)),
      // In place too: each attempt starts from this rank's own values (three numbers, copied).
      sum: (buf) => {
        const own = buf.slice()
        return session.operation(
          (g) => {
            buf.set(own)
            return g.reducer.sum(buf)
          },
          () => buf.set(own)
        )
      },
      gradientBuffer: (n) => session.group.reducer.gradientBuffer(n),
      allGather: (buf) =>
        session.operation(
          (g) => g.comm.allGather(buf),
          () => {
            const out = new Float32Array(buf.length * session.placement.worldSize)
            for (let r = 0; r < session.placement.worldSize; r++) out.set(buf, r * buf.length)
            return out
          }
        ),
      // ZeRO (optim/zero.ts): with it the group restarts from the checkpoint after a failure, so
      // these never see a regroup; they run through the session all the same.
      zeroStage: d.zeroStage ?? 0,
      reduceScatter: (buf, weight) =>
        session.operation((g) => g.comm.reduceScatter(buf, { op: "weightedMean", weight, wire: d.halfWire ? "f16" : "f32" }), () => buf, () => buf),
      allGatherInto: (segment, out) =>
        session.operation(
          async (g) => void (await g.comm.allGather(segment, { out })),
          () => undefined,
          () => undefined
        ),
      adaptiveBatching: d.adaptiveBatching === true,
      ...(d.elastic ? { elastic: d.elastic } : {}),
      ...(d.ps ? { ps: d.ps } : {}),
      ...(d.auto ? { auto: d.auto } : {}),
      recovery: session
    }
    const dp = await DataParallelModel.prepare(this.tf, model, sync, options, d.observer)
    session.attach(dp)
    this.#prepared = dp
    if (onStep) dp.onStep = onStep
    return dp
  }

  /** A checkpoint of a model (topology and weights) plus extra files and metadata. */
  async checkpointFromModel(
    model: LayersModel | DataParallelModel,
    extra: { files?: Record<string, Uint8Array | string>; metadata?: Record<string, unknown> } = {}
  ): Promise<Checkpoint> {
    const m = model instanceof DataParallelModel ? model.model : model
    // With ZeRO the optimizer's shards come from every rank's report (DataParallelModel.shardFiles).
    const optimizer: Record<string, Uint8Array> = model instanceof DataParallelModel ? await model.optimizerFiles() : {}
    return { files: { ...(await modelToFiles(this.tf, m)), ...optimizer, ...extra.files }, metadata: { ...extra.metadata } }
  }

  /**
   * Loads a checkpoint's model weights into `model` (built in code with the same layers), and,
   * for a prepared model whose checkpoint came from checkpointFromModel(dp), its optimizer state.
   */
  async restoreModel(model: LayersModel | DataParallelModel, checkpoint: Checkpoint): Promise<void> {
    const m = model instanceof DataParallelModel ? model.model : model
    const files: Record<string, Uint8Array> = {}
    for (const [k, v] of Object.entries(checkpoint.files)) files[k] = typeof v === "string" ? new TextEncoder().encode(v) : v
    loadWeightsInto(this.tf, m, files)
    if (model instanceof DataParallelModel) await model.restoreOptimizer(files)
  }

  /**
   * Bytes this rank put on the wire for gradients (its own messages) against what the same
   * reductions would have sent as dense fp32: last step and totals since the loop started.
   * With compression, totalDenseBytes - totalWireBytes is what it saved. With parameter servers
   * its pushes count too (every server's message of a step); the last step is that of the path
   * the model trains on now (strategy "auto" moves between them).
   */
  communicationStats(): ReducerStats {
    const reduced = this.#deps.session.group.reducer.stats
    const pushed = this.#deps.ps?.pushStats
    if (!pushed || pushed.steps === 0) return reduced
    const last = this.#prepared?.viaServers === false ? reduced : pushed
    return {
      wireBytes: last.wireBytes,
      denseBytes: last.denseBytes,
      steps: reduced.steps + pushed.steps,
      totalWireBytes: reduced.totalWireBytes + pushed.totalWireBytes,
      totalDenseBytes: reduced.totalDenseBytes + pushed.totalDenseBytes
    }
  }

  /** @internal the prepared model, if any */
  get prepared(): DataParallelModel | undefined {
    return this.#prepared
  }
}
