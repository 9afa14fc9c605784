// What the user's training loop gets on each worker: its place in the group (ranks), report()
// for metrics and checkpoints, the checkpoint to resume from, its dataset shard, prepareModel()
// for data-parallel training, the communicator for custom collectives, and tfjs with this
// worker's backend.
import type { NatsConnection } from "@nats-io/nats-core"
import type { Tf } from "../../../core/engine.ts"
import { makeDataset, shardIndices, type ArrayDataset } from "../../../core/datasets.ts"
import { ConfigError } from "../../../core/errors.ts"
import { dryStep } from "../../../core/kernels/dry-step.ts"
import { FileStream, type BatchTransform } from "../../../core/data/stream.ts"
import { IterableStream, isRowSource, type IterablePosition, type RowSource } from "../../../core/data/iterable-stream.ts"
import { isFileDatasetSpec } from "../../../core/data/file-spec.ts"
import { resolveFileDataset, type ResolvedDataset } from "../../../core/data/resolve.ts"
import type { DataPosition } from "../../../core/data/plan.ts"
import { PARITY_METRIC, UNPREPARED_METRIC, UNPREPARED_HINT, type DatasetPayload } from "../common/train-protocol.ts"
import { countUnpreparedUpdates, takeUnpreparedUpdates } from "./unprepared.ts"
import { PIPELINE_MEMBERS, PREPARED_MEMBERS, SHARD_MEMBERS, withAwaitHint } from "./await-hint.ts"
import { replicaOffset } from "../common/optim/zero.ts"
import { loadWeightsInto, modelToFiles } from "../../../core/model-io.ts"
import type { Communicator } from "../../../collectives/communicator.ts"
import { groupBroke, isCallMismatch } from "../../../collectives/errors.ts"
import { isTensor } from "./model-input.ts"
import type { ReducerStats } from "../../../collectives/gradient-reducer.ts"
import { DataParallelModel, type GradientSync, type ParameterServers, type PrepareOptions, type ShardSource, type StepObserver } from "./data-parallel.ts"
import type { GroupSession } from "./group-session.ts"
import { reduceScatterOperation } from "./gradient-sync.ts"
import { preparePipelineModel, type PipelineOptions, type PipelineSpec } from "./model-parallel/prepare.ts"
import { PipelineModel } from "./model-parallel/pipeline-model.ts"
import { PIPELINE_NO_PEERS, PIPELINE_WHOLE_GROUP } from "./strategies/model-parallel.ts"
import { natsLinks, worldGroup, type SubgroupFactory } from "./model-parallel/transport.ts"
import { PIPELINE_SHARD_PREFIX, isPipelineCheckpoint, loadPipelineCheckpointInto, otherStageFiles, readLayout, stageFilesOf } from "./model-parallel/checkpoint.ts"
import { gridShape, placeOf, type GridPlace } from "./model-parallel/grid.ts"

type LayersModel = import("@tensorflow/tfjs").LayersModel

/** A checkpoint as the loop sees it: named files (bytes or text) and metadata. */
export interface Checkpoint {
  readonly files: Readonly<Record<string, Uint8Array | string>>
  readonly metadata?: Readonly<Record<string, unknown>>
  /** Where the trainer stored it (set on checkpoints handed back by getCheckpoint()). */
  readonly path?: string
  /** The metrics reported with it. */
  readonly metrics?: Readonly<Record<string, unknown>>
  /**
   * Files of the stored checkpoint left out of `files`: asked for after ctx.preparePipeline(), a
   * rank's checkpoint holds only its own stage's shard (and every file that is not a shard), not
   * the other stages'. The stored checkpoint has them all (result.checkpoint, loadPipelineCheckpoint).
   */
  readonly omitted?: ReadonlyArray<string>
}

export interface ReportOptions {
  readonly checkpoint?: Checkpoint
}

/** A checkpoint's file with the positions of the streamed datasets (for a resume mid-epoch). */
export const DATA_POSITION_FILE = "gradwire/data-position.json"

/** What ctx.getDatasetShard() gives: in-memory rows, a file dataset's stream, or a worker-side loader's. */
export type Shard = DatasetShard | FileStream | IterableStream

/**
 * The fields metrics.jsonl writes beside a report's metrics, refused as metric names: a loop's
 * would overwrite them (a `report` breaks the history's lineage, a `time` was dropped by
 * loadResult as the row's stamp).
 */
const RESERVED_METRICS: ReadonlyArray<readonly [string, string]> = [
  ["report", `"report" is the name of metrics.jsonl's report number, which the run's history is kept by: rename the metric, e.g. "train_report"`],
  ["time", `"time" is the name of the time metrics.jsonl stamps each report with: rename the metric, e.g. "epoch_time_s"`]
]

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

  /** Rows of this rank for `epoch` (same count on every rank), shuffled by `seed` (default: the Trainer's). */
  rows(epoch: number, seed: number = this.seed): Int32Array {
    return shardIndices(this.dataset.size, this.rank, this.worldSize, seed, epoch)
  }

  get size(): number {
    return Math.floor(this.dataset.size / this.worldSize)
  }

  /** One row's feature shape, the labels' shape per row, and the class count: as a stream's, so a loop reads them the same way from any shard. */
  get featureShape(): ReadonlyArray<number> {
    return this.dataset.featureShape
  }

  get labelShape(): ReadonlyArray<number> {
    return this.dataset.labelShape ?? []
  }

  get numClasses(): number {
    return this.dataset.numClasses
  }

  /** Map transforms dp.fit() applies to every batch, in order (as FileStream.map). */
  readonly transforms: BatchTransform[] = []

  /** Adds a map transform (normalisation, one-hot...); returns this shard. */
  map(fn: BatchTransform): this {
    if (typeof fn !== "function") throw new ConfigError({ field: "shard.map", reason: "takes a function (batch) => batch" })
    this.transforms.push(fn)
    return this
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
  /** ZeRO recovering from peers: each rank keeps its predecessor's shard too. */
  readonly zeroReplica?: boolean
  /** collectiveConfig.strategy (GradientSync.strategy). */
  readonly strategy?: string
  /** collectiveConfig.wireDtype "float16": ZeRO stage 2's reduce-scatter sends binary16. */
  readonly halfWire?: boolean
  /** The parameter-server strategy's servers. */
  readonly ps?: ParameterServers
  /** collectiveConfig.strategy "auto": what the model needs to decide and explain (GradientSync.auto). */
  readonly auto?: GradientSync["auto"]
  /** collectiveConfig.strategy "local-sgd": the outer loop's settings (GradientSync.localSgd). */
  readonly localSgd?: GradientSync["localSgd"]
  /** The largest world size and what stays fixed when the size changes (GradientSync.elastic). */
  readonly elastic?: GradientSync["elastic"]
  readonly observer?: StepObserver
  /** `aux`: files of this rank that join the round's checkpoint (a pipeline stage's shard). */
  readonly sendReport: (index: number, metrics: Record<string, unknown>, checkpoint: Checkpoint | undefined, aux?: Record<string, Uint8Array>) => Promise<void>
  /** Communicators over subsets of the group (ctx.preparePipeline's links and groups). */
  readonly subgroup?: SubgroupFactory
  /** `omit`: files of the checkpoint not to fetch (the other stages' shards of a pipelined model). A joiner counts its report() calls from the checkpoint it is given (set here). */
  readonly fetchCheckpoint: (omit?: ReadonlyArray<string>) => Promise<Checkpoint | undefined>
  readonly fetchDataset: (name: string) => Promise<DatasetPayload>
  /** A NATS connection for datasets in an object store (opened on first use). */
  readonly dataNats?: () => Promise<NatsConnection>
  /** Modules this worker may import (the agent checked them); undefined: any. */
  readonly allowedImports?: ReadonlyArray<string>
  readonly onStep?: (info: { epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number }) => void
  /** failureConfig.parityEvery: report rounds between state-parity checks (0 or absent: none). */
  readonly parityEvery?: number
  /** A warning for the worker's log. */
  readonly warn?: (line: string) => void
}

export class TrainContext {
  /** tfjs, with this worker's backend active. */
  readonly tf: Tf
  readonly backend: string
  readonly #deps: TrainContextDeps
  #checkpoint: Promise<Checkpoint | undefined> | undefined
  readonly #datasets = new Map<string, Promise<ArrayDataset | FileStream | IterableStream>>()
  /** The streams made so far, as they are made (a pause asks where they are: #streamsPinned). */
  readonly #streams: Array<FileStream | IterableStream> = []
  /** The place (rank, group size) each loader's factory was called with. */
  readonly #loaderPlace = new WeakMap<IterableStream, { readonly rank: number; readonly worldSize: number }>()
  /** Saved positions of streams not made yet (restoreModel before getDatasetShard). */
  #pendingPositions: Record<string, unknown> = {}
  #prepared: DataParallelModel | undefined
  /** preparePipeline() calls so far (each gets sub-groups of its own). */
  #pipelines = 0
  /** The place of the pipelined model this loop prepared (the first one). */
  #pipelinePlace: GridPlace | undefined

  /** @internal The worker makes the context; a training loop receives it. */
  constructor(deps: TrainContextDeps) {
    this.#deps = deps
    this.tf = deps.tf
    this.backend = deps.backend
    countUnpreparedUpdates(deps.tf)
  }

  /** Whether this rank's loop has been told that it trains a model it never prepared. */
  #warnedUnprepared = false

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
   * trainer holds the checkpoint's bytes: writing it to storage happens in the background. A
   * metric that is a tensor of one element (a tf.Scalar loss) is reported as its number. A report
   * the loop does not await still comes before the loop's next training step (which waits for it)
   * and is sent before the rank's loop counts as finished.
   */
  report(metrics: Record<string, unknown>, options: ReportOptions = {}): Promise<void> {
    if (typeof metrics !== "object" || metrics === null || Array.isArray(metrics)) {
      return Promise.reject(new ConfigError({ field: "report(metrics)", reason: "metrics must be a plain object such as { loss: 0.1, epoch: 2 }" }))
    }
    const taken = RESERVED_METRICS.find(([name]) => name in metrics)
    if (taken !== undefined) return Promise.reject(new ConfigError({ field: `report(metrics).${taken[0]}`, reason: taken[1] }))
    const session = this.#deps.session
    const index = session.reports
    // Counted now, where the loop called it (its next steps count from here), awaited or not.
    session.reported()
    // A report the loop did not await still runs its collectives in the loop's order: after the
    // reports before it, and before the loop's next training step (dp.trainStep waits for it,
    // awaitReports), as on every rank; else the ranks' calls could interleave differently.
    const before = this.#inFlight.size > 0 ? Promise.allSettled([...this.#inFlight]) : undefined
    const held = heldMetrics(metrics)
    const done = before ? before.then(() => this.#report(session, index, held, options)) : this.#report(session, index, held, options)
    // It reaches the driver before the rank says it finished (reportsSent), and its failure is
    // raised there (or at the next step) rather than as an unhandled rejection.
    done.catch(() => {})
    this.#inFlight.add(done)
    const forget = () => void this.#inFlight.delete(done)
    done.then(forget, forget)
    return done
  }

  /** report() calls still on their way (the loop may not have awaited them). */
  readonly #inFlight = new Set<Promise<void>>()

  /** Waits for every report() call made so far; rejects with the first one's failure. The worker calls it when the loop returns. */
  async reportsSent(): Promise<void> {
    while (this.#inFlight.size > 0) await Promise.all([...this.#inFlight])
  }

  async #report(session: GroupSession, index: number, metrics: Record<string, unknown>, options: ReportOptions): Promise<void> {
    metrics = await metricValues(metrics)
    session.inReport = true
    try {
      // A rank joining a regrouped generation replays the loop: the survivors made these already.
      if (session.skipReport(index)) return
      // The strategy's work at a report (auto's move that waits for every rank's loop to get here),
      // then the parity check; neither where the furthest survivor of a regroup made this report
      // already (this rank took its state just before it, and the survivor is past it).
      let parity: number[] | undefined
      if (!session.reportMadeAlready(index)) {
        await this.#prepared?.atReport(index)
        parity = await this.#parity(index)
      }
      if (parity !== undefined && parity.length > 0) metrics = { ...metrics, [PARITY_METRIC]: parity.length, [`${PARITY_METRIC}_ranks`]: parity.join(" ") }
      // Weights this rank trained alone (a model it never prepared), where there are other ranks.
      const unprepared = takeUnpreparedUpdates()
      if (unprepared > 0 && this.worldSize > 1) {
        metrics = { ...metrics, [UNPREPARED_METRIC]: unprepared }
        if (!this.#warnedUnprepared) {
          this.#warnedUnprepared = true
          this.#deps.warn?.(`rank ${this.worldRank}: ${UNPREPARED_HINT(unprepared)}`)
        }
      }
      // A pipeline's checkpoint is every rank's: rank 0's carries the layout and metadata, the other
      // ranks' stage shards join it as files of their own.
      const c = options.checkpoint
      if (c && this.worldRank !== 0 && Object.keys(c.files).some((f) => f.startsWith("pipeline/"))) {
        const aux: Record<string, Uint8Array> = {}
        for (const [k, v] of Object.entries(c.files)) if (k.startsWith("pipeline/")) aux[k] = typeof v === "string" ? new TextEncoder().encode(v) : v
        await this.#deps.sendReport(index, metrics, undefined, aux)
      } else await this.#deps.sendReport(index, metrics, options.checkpoint)
      // A hand-written loop's group below its size: new ranks join at a report boundary.
      await session.reportBoundary((flag) => session.group.comm.allGather(flag))
    } finally {
      session.inReport = false
    }
  }

  /**
   * State parity at report round `index` (every failureConfig.parityEvery rounds): every rank takes
   * rank 0's non-trainable weights (batch-norm statistics, DataParallelModel.syncBuffers), the
   * ranks exchange a digest of their state (stateDigest) and, when any differs from rank 0's, every
   * rank takes rank 0's state. Returns the ranks that differed, or undefined when
   * nothing was compared. Outside the group session's count of operations: a group that breaks
   * under it skips the check (the regroup hands every member the furthest survivor's state anyway).
   */
  async #parity(index: number): Promise<number[] | undefined> {
    const every = this.#deps.parityEvery ?? 0
    const dp = this.#prepared
    const session = this.#deps.session
    const world = session.placement.worldSize
    if (every <= 0 || !dp || world < 2 || (index + 1) % every !== 0) return undefined
    const digest = await dp.stateDigest()
    if (!digest) return undefined
    const group = session.group
    try {
      await dp.syncBuffers((buf) => group.reducer.broadcast(buf))
      const all = await group.comm.allGather(digest)
      const differ: number[] = []
      for (let r = 1; r < world; r++) if (digest.some((_, i) => all[r * digest.length + i] !== all[i])) differ.push(r)
      if (differ.length === 0) return []
      this.#deps.warn?.(`rank ${session.placement.rank}: the state of rank(s) ${differ.join(", ")} differed from rank 0's at report ${index}; every rank takes rank 0's`)
      await dp.takeRankZeroState((buf) => group.reducer.broadcast(buf))
      return differ
    } catch (e) {
      // the group broke on mismatched calls here: where this rank was is here, not at its next call
      if (isCallMismatch(e)) session.noteWhere()
      // A group that broke under the check (a lost peer, the bus, a regroup closing it) regroups
      // next, which the driver reports; only another failure is worth a line of its own.
      if (groupBroke(e)) return undefined
      this.#deps.warn?.(`rank ${session.placement.rank}: state parity check of report ${index} skipped: ${e instanceof Error ? e.message.split("\n")[0] : String(e)}`)
      return undefined
    }
  }

  /**
   * The checkpoint this run resumes from (the latest one), or undefined on a fresh start. Asked
   * for after ctx.preparePipeline(), it holds this rank's stage shard of the pipelined model and
   * not the other stages' (`omitted` names them): no rank fetches the whole model.
   */
  getCheckpoint(): Promise<Checkpoint | undefined> {
    const place = this.#pipelines === 1 ? this.#pipelinePlace : undefined
    const omit = place ? otherStageFiles(place) : undefined
    this.#checkpoint ??= this.#deps.fetchCheckpoint(omit).then((c) => {
      if (c && !place) this.#hintWholePipeline(c)
      return c
    })
    return this.#checkpoint
  }

  /** A pipeline checkpoint fetched before its model was prepared came whole, every stage's shard: the log says how to fetch one. */
  #hintWholePipeline(c: Checkpoint): void {
    const shards = Object.entries(c.files).filter(([f]) => f.startsWith(PIPELINE_SHARD_PREFIX))
    if (shards.length < 2) return
    const bytes = shards.reduce((n, [, v]) => n + (typeof v === "string" ? v.length : v.byteLength), 0)
    this.#deps.warn?.(
      `rank ${this.worldRank}: fetched every stage's shard of the pipeline checkpoint (${shards.length} shards, ${(bytes / 2 ** 20).toFixed(1)} MiB); ` +
        "call ctx.getCheckpoint() after ctx.preparePipeline() and each rank fetches only its own stage's"
    )
  }

  /** Turns the driver's answer for `name` into rows or a stream (a factory runs here). */
  async #load(name: string, payload: DatasetPayload): Promise<ArrayDataset | FileStream | IterableStream> {
    const d = this.#deps
    const session = d.session
    const place = () => session.placement
    const fileStream = (resolved: ResolvedDataset): FileStream => new FileStream(name, resolved, d.seed, place, d.dataNats)
    if (payload.kind === "array") {
      return makeDataset(payload.x, payload.y, payload.featureShape, { numClasses: payload.numClasses, ...(payload.labelShape ? { labelShape: payload.labelShape } : {}) })
    }
    if (payload.kind === "files") return fileStream(payload.resolved as ResolvedDataset)
    // A factory: imported here (the agent checked the module), called with this rank's place.
    if (d.allowedImports !== undefined && !d.allowedImports.includes(payload.module)) {
      throw new ConfigError({ field: `datasets.${name}`, reason: `module ${payload.module} was not declared to the agent, so it was not checked; pass it through datasetFactory()` })
    }
    const mod = (await import(payload.module)) as Record<string, unknown>
    const fn = mod[payload.export]
    if (typeof fn !== "function") {
      throw new ConfigError({ field: `datasets.${name}`, reason: `export "${payload.export}" of ${payload.module} is not a function; it exports: ${Object.keys(mod).join(", ") || "nothing"}` })
    }
    const madeFor = { rank: this.worldRank, worldSize: this.worldSize }
    const made = (await (fn as (o: unknown, info: unknown) => unknown)(payload.options, { ...madeFor, seed: d.seed, tf: this.tf })) as unknown
    const loader = (l: IterableStream): IterableStream => (this.#loaderPlace.set(l, madeFor), l)
    if (isFileDatasetSpec(made)) return fileStream(await resolveFileDataset(name, made, d.dataNats))
    const a = made as Partial<ArrayDataset> | undefined
    if (a && a.x instanceof Float32Array && (a.y instanceof Int32Array || a.y instanceof Float32Array) && Array.isArray(a.featureShape)) {
      return makeDataset(a.x, a.y, a.featureShape, { ...(a.numClasses !== undefined ? { numClasses: a.numClasses } : {}), ...(a.labelShape ? { labelShape: a.labelShape } : {}) })
    }
    const wrapped = made as { rows?: unknown; size?: number; numClasses?: number } | undefined
    if (wrapped && typeof wrapped === "object" && "rows" in wrapped && isRowSource(wrapped.rows)) {
      return loader(new IterableStream(name, wrapped.rows as RowSource, { ...(wrapped.size !== undefined ? { size: wrapped.size } : {}), ...(wrapped.numClasses !== undefined ? { numClasses: wrapped.numClasses } : {}) }))
    }
    if (isRowSource(made)) return loader(new IterableStream(name, made))
    throw new ConfigError({
      field: `datasets.${name}`,
      reason: `the factory ${payload.module}#${payload.export} returned ${typeof made}; return makeDataset(...), fromFiles(...), a tf.data dataset of { xs, ys } rows of finite size, or { rows, size }`
    })
  }

  #dataset(name: string): Promise<ArrayDataset | FileStream | IterableStream> {
    let ds = this.#datasets.get(name)
    if (!ds) {
      ds = this.#deps.fetchDataset(name).then(async (p) => {
        const loaded = await this.#load(name, p)
        if (loaded instanceof FileStream || loaded instanceof IterableStream) this.#streams.push(loaded)
        const pending = this.#pendingPositions[name]
        if (pending !== undefined && !(loaded instanceof Object && "x" in loaded)) {
          if (loaded instanceof FileStream) loaded.restore(pending as DataPosition)
          else if (loaded instanceof IterableStream) loaded.restore(pending as IterablePosition)
          delete this.#pendingPositions[name]
        }
        return loaded
      })
      this.#datasets.set(name, ds)
    }
    return ds
  }

  /**
   * This rank's shard of the dataset passed to the Trainer as `datasets[name]`: for in-memory
   * arrays a set of rows reshuffled per epoch; for files (fromFiles) a stream that reads only this
   * rank's rows, in the background, and whose position checkpoints keep; for a factory what it made.
   * Every call for one name gives the same stream. The type parameter names what the dataset is
   * (`getDatasetShard<FileStream>("train")` for a file dataset's stream methods); dp.fit() takes any.
   */
  getDatasetShard<S extends Shard = DatasetShard>(name: string): Promise<S> {
    return withAwaitHint(this.#datasetShard<S>(name), `ctx.getDatasetShard(${JSON.stringify(name)})`, SHARD_MEMBERS)
  }

  async #datasetShard<S extends Shard>(name: string): Promise<S> {
    const ds = await this.#dataset(name)
    if (ds instanceof FileStream || ds instanceof IterableStream) return ds as S
    const session = this.#deps.session
    return new DatasetShard(ds, this.worldRank, this.worldSize, this.#deps.seed, () => session.placement) as S
  }

  /**
   * The full dataset (for evaluation on held-out data, for example). A file dataset is read whole
   * into memory: use it for data that fits.
   */
  async getDataset(name: string): Promise<ArrayDataset> {
    const ds = await this.#dataset(name)
    if (ds instanceof FileStream) {
      const all = await ds.readAll()
      return makeDataset(all.x, all.y, all.featureShape, { numClasses: all.numClasses, labelShape: all.labelShape })
    }
    if (ds instanceof IterableStream) {
      throw new ConfigError({ field: `getDataset("${name}")`, reason: "the dataset is a streamed loader, which has no whole to hand out: iterate it with getDatasetShard() and dp.fit()" })
    }
    return ds
  }

  /**
   * Why the loop's streams cannot follow a regroup now. A loader was made by its factory for this
   * rank's place (its rank and the group's size when it was made) and cannot be cut again for
   * another: any regroup, in dp.fit() or not, mid-epoch or between epochs, goes through the
   * checkpoint, where every rank makes its loader again (`dataPinned`). Outside dp.fit(), a file
   * dataset's stream in the middle of an epoch is read with the plan the loop opened (its own
   * openEpoch() and take() counts): its survivors go on reading it after a regroup
   * (FileStream.restore keeps an open plan), as an in-memory shard's finish the epoch on their rows,
   * but a rank joining now would read another cut of it: joiners wait for a report() between
   * epochs, where the next one is planned for the grown group (`joinLater`). dp.fit() plans a file
   * dataset's epoch again itself.
   */
  #streamsPinned(inFit: boolean): { dataPinned?: string; joinLater?: string } {
    const out: { dataPinned?: string; joinLater?: string } = {}
    for (const s of this.#streams) {
      if (s instanceof IterableStream) {
        const at = this.#loaderPlace.get(s)
        out.dataPinned ??= `the loop reads the loader "${s.name}", which its factory made for rank ${at?.rank ?? "?"} of ${at?.worldSize ?? "?"} (a loader cannot be cut again for another group): the group restarts from the checkpoint, where every rank makes its loader for its new place`
        continue
      }
      const epoch = inFit ? undefined : s.midEpoch()
      if (epoch === undefined) continue
      out.joinLater ??= `the loop reads the file dataset "${s.name}" itself and is in the middle of epoch ${epoch}: new ranks join at a report() between epochs`
    }
    return out
  }

  /** The positions of the streamed datasets made so far, as a checkpoint file (none: undefined). */
  async #positionsFile(): Promise<Uint8Array | undefined> {
    const out: Record<string, unknown> = {}
    for (const [name, p] of this.#datasets) {
      const ds = await p.catch(() => undefined)
      const pos = ds instanceof FileStream || ds instanceof IterableStream ? ds.position() : undefined
      if (pos) out[name] = pos
    }
    return Object.keys(out).length > 0 ? new TextEncoder().encode(JSON.stringify(out)) : undefined
  }

  /** Puts the streams (made now or later) where a checkpoint's positions file says. */
  async #restorePositions(bytes: Uint8Array | undefined): Promise<void> {
    if (!bytes) return
    const saved = JSON.parse(new TextDecoder().decode(bytes)) as Record<string, unknown>
    for (const [name, pos] of Object.entries(saved)) {
      const p = this.#datasets.get(name)
      const ds = p ? await p.catch(() => undefined) : undefined
      if (ds instanceof FileStream) ds.restore(pos as DataPosition)
      else if (ds instanceof IterableStream) ds.restore(pos as IterablePosition)
      else if (!p) this.#pendingPositions[name] = pos
    }
  }

  /**
   * Wraps a compiled model for data-parallel training: every rank starts from rank 0's weights,
   * and trainStep()/fit() all-reduce gradients (bucketed, with the configured algorithm and
   * compression) so every rank keeps identical weights.
   */
  prepareModel(model: LayersModel, options: PrepareOptions = {}): Promise<DataParallelModel> {
    return withAwaitHint(this.#prepareModel(model, options), "ctx.prepareModel(model)", PREPARED_MEMBERS)
  }

  async #prepareModel(model: LayersModel, options: PrepareOptions): Promise<DataParallelModel> {
    const d = this.#deps
    // A kernel this backend cannot run is an UnsupportedKernel error now, naming it and its layer.
    dryStep(this.tf, model, this.backend)
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
      reduceGradients: (flat, layout, weight, step, scope, background, holder) => {
        // The split that named a holder is this group's: re-formed before the operation runs, every
        // member all-reduces (a joiner's split starts equal, and the survivors' starts again).
        const splitIn = session.group
        return session.operation<void | "adopted" | "recompute">(
          (g) => g.reducer.reduceGradients(flat, layout, weight, step, scope, g === splitIn ? holder : undefined),
          () => "adopted",
          () => "recompute",
          false,
          background
        )
      },
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
      // ZeRO (optim/zero.ts): recovering from peers regroups from the survivors' shards and
      // replicas (stage 2 sends each rank's reduced segment to the rank that keeps its replica,
      // on another node where the layout allows).
      zeroStage: d.zeroStage ?? 0,
      ...(d.zeroReplica ? { zeroReplica: true } : {}),
      get zeroReplicaOffset() {
        return replicaOffset(session.placement.nodes)
      },
      reduceScatter: (buffers, weight) =>
        session.operation<Float32Array | "adopted" | "recompute">(
          (g) => reduceScatterOperation(g.comm, buffers(), weight, d.halfWire ? "f16" : "f32"),
          () => "adopted",
          () => "recompute"
        ),
      // The step's last operation: a regroup under it re-shards from the survivors' updated shards
      // and loads their parameters, which completes the step (a redo would gather segments of the
      // old layout).
      allGatherInto: (segment, out) =>
        session.operation(
          async (g) => {
            await g.comm.allGather(segment, { out })
            return true
          },
          () => false,
          () => false,
          true
        ),
      adaptiveBatching: d.adaptiveBatching === true,
      ...(d.elastic ? { elastic: d.elastic } : {}),
      ...(d.ps ? { ps: d.ps } : {}),
      serverOperation: <T>(run: () => Promise<T>, appliedOnSend: boolean) =>
        session.operation<T | "adopted" | "again">(run, () => "adopted", () => "again", appliedOnSend ? "applied" : false),
      serverRequest: <T>(run: () => Promise<T>) => session.serverRequest(run),
      ...(d.auto ? { auto: d.auto } : {}),
      ...(d.localSgd ? { localSgd: d.localSgd } : {}),
      ...(d.strategy ? { strategy: d.strategy } : {}),
      wireStats: () => session.group.reducer.stats,
      recovery: session
    }
    const dp = await DataParallelModel.prepare(this.tf, model, sync, options, d.observer)
    // Beside a pipelined model: a regroup would hand over one of the two (see preparePipeline).
    if (this.#pipelines > 0) session.noPeerRecovery(PIPELINE_NO_PEERS)
    // A regroup hands the furthest survivor's data positions to every member with its weights.
    session.attach({
      snapshot: async () => {
        const s = await dp.snapshot()
        const pos = await this.#positionsFile()
        return pos ? { ...s, files: { ...s.files, [DATA_POSITION_FILE]: pos } } : s
      },
      adopt: async (state, opts) => {
        await dp.adopt(state, opts)
        await this.#restorePositions(state.files[DATA_POSITION_FILE])
      },
      regrouped: () => dp.regrouped(),
      inStep: () => dp.inStep(),
      // Whether the loop called dp.fit(): where a grow's pause parks (at a step in dp.fit(), not at a report()).
      fitUsed: () => dp.fitUsed(),
      peerFiles: () => dp.peerFiles(),
      replayLog: () => dp.replayLog(),
      loopPosition: () => {
        const p = dp.loopPosition()
        return { ...p, ...this.#streamsPinned(p.inFit) }
      }
    })
    this.#prepared = dp
    dp.awaitReports = () => (this.#inFlight.size > 0 ? this.reportsSent() : undefined)
    if (onStep) dp.onStep = onStep
    return dp
  }

  /**
   * Cuts a compiled model into pipeline stages and tensor-parallel slices over the group (a data x
   * pipeline x tensor grid: worldSize = replicas x stages x tensorParallel) and returns this rank's
   * part of it; every rank calls it with the same model (the same code) and options. `model` is a
   * compiled model, or a stack of layer factories ({ inputShape, layers }, with optimizer and loss
   * in the options) of which each rank makes only its stage's layers. See actors/train/worker/model-parallel/.
   */
  preparePipeline(model: PipelineSpec, options: PipelineOptions = {}): Promise<PipelineModel> {
    return withAwaitHint(this.#preparePipeline(model, options), "ctx.preparePipeline(spec)", PIPELINE_MEMBERS)
  }

  async #preparePipeline(model: PipelineSpec, options: PipelineOptions): Promise<PipelineModel> {
    const subgroup = this.#deps.subgroup
    if (!subgroup) throw new ConfigError({ field: "preparePipeline", reason: "this worker cannot make sub-groups (it runs outside a Trainer's worker)" })
    if ((this.#deps.zeroStage ?? 0) > 0 || this.#deps.ps) {
      throw new ConfigError({ field: "preparePipeline", reason: "a pipelined model shards its weights by stage already: use it without collectiveConfig.zeroStage and without parameter servers" })
    }
    const k = this.#pipelines++
    const session = this.#deps.session
    // One pipelined model, and no data-parallel one beside it, is regrouped from the survivors;
    // with more, a failure restarts the run from the checkpoint, and the restart says why.
    const alone = k === 0 && this.#prepared === undefined
    if (!alone) session.noPeerRecovery(PIPELINE_NO_PEERS)
    // A replacement fetches the layout and its stage's shard of the survivors' state (not the others' stages).
    const joining = alone && session.joinTarget !== undefined ? session.joinState(stageFilesOf(placeOf(this.worldRank, gridShape(this.worldSize, options.stages ?? 1, options.tensorParallel ?? 1)))) : undefined
    const pp = await preparePipelineModel(this.tf, model, options, {
      rank: this.worldRank,
      worldSize: this.worldSize,
      seed: this.#deps.seed,
      world: worldGroup(this.communicator),
      // (made again after a regroup: the group session's communicator is then the new group's)
      links: (place) => natsLinks(place, this.communicator, (name, members) => subgroup(`m${k}${name}`, members)),
      ...(alone ? { session } : {}),
      // progress messages, as a prepared model's steps send them (the live line, the dashboard)
      ...(this.#deps.onStep ? { progress: this.#deps.onStep } : {}),
      ...(joining ? { joinLayout: async () => readLayout((await joining).files) } : {})
    })
    if (k === 0) this.#pipelinePlace = pp.place
    if (alone) {
      session.attach({
        snapshot: async () => ({ files: await pp.stageFiles(), step: pp.steps }),
        adopt: (state) => pp.adoptStage(state.files),
        regrouped: () => pp.regrouped(),
        interrupt: () => pp.interrupt(),
        stateFiles: () => stageFilesOf(pp.place),
        loopPosition: () => ({ inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0, wholeGroup: PIPELINE_WHOLE_GROUP }),
        stageHandover: () => Promise.resolve(pp.stageHandover())
      })
    }
    return pp
  }

  /** A checkpoint of a model (topology and weights) plus extra files and metadata. */
  async checkpointFromModel(
    model: LayersModel | DataParallelModel | PipelineModel,
    extra: { files?: Record<string, Uint8Array | string>; metadata?: Record<string, unknown> } = {}
  ): Promise<Checkpoint> {
    // A pipelined model: this rank's stage shard (every rank calls it and reports it; rank 0's adds the layout).
    if (model instanceof PipelineModel) return { files: { ...(await model.shardFiles()), ...extra.files }, metadata: { ...extra.metadata } }
    const m = model instanceof DataParallelModel ? model.model : model
    // With ZeRO the optimizer's shards come from every rank's report (DataParallelModel.shardFiles).
    const optimizer: Record<string, Uint8Array> = model instanceof DataParallelModel ? await model.optimizerFiles() : {}
    // Where the streamed datasets are, so a resume goes on mid-epoch without repeating or skipping rows.
    const positions = await this.#positionsFile()
    return {
      files: { ...(await modelToFiles(this.tf, m)), ...optimizer, ...(positions ? { [DATA_POSITION_FILE]: positions } : {}), ...extra.files },
      metadata: { ...extra.metadata }
    }
  }

  /**
   * Loads a checkpoint's model weights into `model` (built in code with the same layers), and,
   * for a prepared model whose checkpoint came from checkpointFromModel(dp), its optimizer state;
   * streamed datasets go on from the position the checkpoint recorded.
   */
  async restoreModel(model: LayersModel | DataParallelModel | PipelineModel, checkpoint: Checkpoint): Promise<void> {
    const files: Record<string, Uint8Array> = {}
    for (const [k, v] of Object.entries(checkpoint.files)) files[k] = typeof v === "string" ? new TextEncoder().encode(v) : v
    // A pipelined model loads its stage at the same layout; a whole model takes the merged stages.
    if (model instanceof PipelineModel) return model.restore(files)
    if (isPipelineCheckpoint(files) && !(model instanceof DataParallelModel)) {
      if (checkpoint.omitted?.length) {
        throw new ConfigError({
          field: "restoreModel",
          reason: `this checkpoint was fetched after ctx.preparePipeline(), so it holds only this rank's stage, not ${checkpoint.omitted.join(", ")}: restore the pipelined model (ctx.restoreModel(pp, checkpoint)), or load the whole model from the stored checkpoint with loadPipelineCheckpoint(tf, "${checkpoint.path ?? "<its path>"}")`
        })
      }
      return loadPipelineCheckpointInto(this.tf, model, files)
    }
    const m = model instanceof DataParallelModel ? model.model : model
    loadWeightsInto(this.tf, m, files)
    if (model instanceof DataParallelModel) await model.restoreOptimizer(files)
    await this.#restorePositions(files[DATA_POSITION_FILE])
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

/** The function each worker runs (trainLoopPerWorker): the loop's config and this worker's context. */
export type TrainLoop<C = unknown> = (config: C, ctx: TrainContext) => unknown | Promise<unknown>

/**
 * A report's metrics as the driver keeps them (metrics.jsonl, metrics.csv, TensorBoard, the
 * dashboard): each tensor of one element read as its number (a loss the loop kept as a tf.Scalar),
 * a bigint as a number (as a string past 2^53), a Date as its ISO string, an undefined value left
 * out. A tensor of more elements, a function or a symbol is a ConfigError that says how to report it.
 */
const metricValues = async (metrics: Record<string, unknown>): Promise<Record<string, unknown>> => {
  // (report() checked that metrics is a plain object)
  const tensors = Object.entries(metrics).filter((e): e is [string, import("@tensorflow/tfjs").Tensor] => isTensor(e[1]))
  const out: Record<string, unknown> = {}
  try {
    for (const [k, v] of Object.entries(metrics)) {
      if (v === undefined) continue
      if (typeof v === "function" || typeof v === "symbol") {
        throw new ConfigError({ field: `report(metrics).${k}`, reason: `is a ${typeof v}; a metric is a number, a string, or an array or object of them` })
      }
      if (typeof v === "bigint") out[k] = v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v.toString()
      else if (v instanceof Date) out[k] = v.toISOString()
      else if (isTensor(v)) {
        if (v.size !== 1) {
          throw new ConfigError({
            field: `report(metrics).${k}`,
            reason: `is a tensor of shape [${v.shape.join(", ")}]; a metric is a number (a tensor of one element is read as one): reduce it first (e.g. tf.mean(t)), or report Array.from(await t.data())`
          })
        }
        out[k] = (await v.data())[0]
      } else out[k] = v
    }
  } finally {
    for (const [, t] of tensors) t.dispose()
  }
  return out
}

/**
 * The metrics with each tensor replaced by a clone of it (sharing its data), taken when report() is
 * called: the loop may dispose its own tensor before a report it did not await reads it.
 * metricValues reads and disposes the clones.
 */
const heldMetrics = (metrics: Record<string, unknown>): Record<string, unknown> => {
  if (!Object.values(metrics).some(isTensor)) return metrics
  return Object.fromEntries(Object.entries(metrics).map(([k, v]) => [k, isTensor(v) ? v.clone() : v]))
}
