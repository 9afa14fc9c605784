// ZeRO stages 1 and 2 (collectiveConfig.zeroStage with strategy "allreduce"): each rank holds the
// optimizer state of its segment of the flat parameters only (optim/zero.ts). Stage 1 all-reduces
// the whole gradient and updates its segment; stage 2 reduce-scatters, so each rank receives only
// its segment's reduced gradient. The updated segments are all-gathered into every rank's model.
// Checkpoints carry each rank's shard in its reports; a restore re-shards for another world size.
// With recovery from peers (collective zeroReplica) each rank keeps its predecessor's shard too
// (stage 2: from the predecessor's reduced segment, sent after the reduce-scatter): a regroup takes every survivor's shard and replica (peerFiles, in its pause reply), and
// every member of the new group loads its range of them with the parameters they hold (adopted).
import { ConfigError } from "../../../../core/errors.ts"
import { OPTIMIZER_FILE, readOptimizerFile } from "../../../../core/model-io.ts"
import { PeerRecoveryMisaligned } from "../group-session.ts"
import { flatOptimizerSpecOf } from "../../common/optim/flat-optimizers.ts"
import { flatStateFromTfjs } from "../../common/optim/tfjs-state.ts"
import { ZeroShard, hasShards, type ZeroStage } from "../../common/optim/zero.ts"
import { scaleToNorm, sumOfSquares } from "../clipping.ts"
import { reduceWithRecompute, type Exchanged, type StepExchange, type StrategyHost, type StrategyWorker } from "./strategy.ts"

export class ZeroWorker implements StrategyWorker {
  readonly name = "allreduce"
  readonly viaServers = false
  readonly replicated = true
  readonly #host: StrategyHost
  #zero: ZeroShard
  /**
   * Between this rank's update of a step and the end of its all-gather: at stage 1 the step's
   * whole reduced gradient and weight decay, for survivors a step behind (peerFiles).
   */
  #applied: { readonly gradient?: Float32Array; readonly weightDecay: number } | undefined
  /** Stage 2 with a replica: this step's reduced segment and its predecessor's, between the reduction and the update (peerFiles). */
  #reduced: { readonly segment: Float32Array; readonly predecessor: Float32Array; readonly learningRate: number | undefined; readonly weightDecay: number } | undefined

  constructor(host: StrategyHost) {
    const { sync } = host
    const stage = sync.zeroStage as 1 | 2
    if (!sync.allGatherInto || (stage === 2 && !sync.reduceScatter)) {
      throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: `stage ${stage} needs the group's reduce-scatter and all-gather, which this group does not offer` })
    }
    this.#host = host
    this.#zero = this.#shard()
  }

  /** This rank's shard for its group as it is now (a regroup makes a new one). */
  #shard(): ZeroShard {
    const { sync } = this.#host
    const spec = flatOptimizerSpecOf(this.#host.optimizer as unknown as Parameters<typeof flatOptimizerSpecOf>[0])
    return new ZeroShard(sync.zeroStage as 1 | 2, spec, this.#host.parameterCount, sync.rank, sync.worldSize, {
      replica: sync.zeroReplica === true,
      ...(sync.zeroReplicaOffset !== undefined ? { replicaOffset: sync.zeroReplicaOffset } : {})
    })
  }

  get zeroStage(): ZeroStage {
    return this.#zero.stage
  }

  /** Takes this rank's parameter segment from the model's weights (after a broadcast or a restore). */
  async init(): Promise<void> {
    this.#zero.loadParams(await this.#host.readFlatParams())
  }

  inPlace(): boolean {
    return false
  }

  gradientBuffer(): Float32Array | undefined {
    return this.#zero.stage === 2 ? this.#zero.gradients : undefined
  }

  async exchange(flat: Float32Array, x: StepExchange): Promise<Exchanged> {
    const zero = this.#zero
    if (zero.stage === 2) {
      // Each rank receives only its segment of the reduced gradient (and, keeping a replica, its
      // predecessor's). A group that breaks under it is re-formed (the shard re-made for the new
      // layout, adopted()) and the step done again there, into the new shard's gradient buffer.
      // The buffers are the shard's as the operation runs: the gradient is moved into a new
      // shard's (padded for the new world size) when a regroup made one meanwhile.
      let gradient = flat
      let sentAt: number | undefined
      const n = this.#host.parameterCount
      const buffers = () => {
        const z = this.#zero
        if (gradient !== z.gradients) {
          z.gradients.set(gradient.subarray(0, n))
          z.gradients.fill(0, n)
          gradient = z.gradients
        }
        // Between the reduction and the update, a regroup may bring this rank's shard and replica
        // level with ranks that made the step, from the segments it holds (peerFiles).
        const reduced = (segment: Float32Array, predecessor: Float32Array) =>
          (this.#reduced = { segment, predecessor, learningRate: this.#host.learningRate, weightDecay: this.#host.weightDecay })
        return {
          buf: z.gradients,
          ...(z.replicated ? { shiftInto: z.predecessorGradient, shiftBy: z.replicaOffset, reduced } : {}),
          ...(squares ? { squares } : {})
        }
      }
      // clipNorm: the whole reduced gradient's norm (after clipValue) from every rank's segment,
      // summed in the same group operation; each rank scales its segment and its replica of the
      // predecessor's by it, as the whole gradient would be.
      const { clipNorm, clipValue } = this.#host
      let l2 = Number.NaN
      const squares = clipNorm === undefined ? undefined : { of: (segment: Float32Array) => sumOfSquares(segment, clipValue), total: (sum: number) => (l2 = Math.sqrt(sum)) }
      for (;;) {
        this.#reduced = undefined
        const got = await this.#host.sync.reduceScatter!(buffers, x.samples)
        if (got === "adopted") {
          this.#reduced = undefined
          return { adopted: true }
        }
        if (got !== "recompute") {
          // (The shard the operation ran with: only a regroup replaces it, and none came after it.)
          const z = this.#zero
          return {
            ...(sentAt !== undefined ? { sentAt } : {}),
            apply: () => {
              // clipValue on the segments, then clipNorm by the group's norm
              this.#host.clip(got, false)
              if (z.replicated) this.#host.clip(z.predecessorGradient, false)
              if (clipNorm !== undefined) {
                scaleToNorm(got, l2, clipNorm)
                if (z.replicated) scaleToNorm(z.predecessorGradient, l2, clipNorm)
              }
              return this.#applyShard(got, undefined, z.replicated ? z.predecessorGradient : undefined)
            }
          }
        }
        gradient = await x.recompute()
        sentAt = performance.now()
      }
    }
    // Stage 1: the whole gradient is all-reduced (with any compression); this rank updates its
    // segment and its replica of the predecessor's (the shard of the group it applies in: a regroup
    // during the reduction re-shards).
    const r = await reduceWithRecompute(this.#host, flat, x)
    return {
      adopted: r.adopted,
      ...(r.sentAt !== undefined ? { sentAt: r.sentAt } : {}),
      apply: () => {
        // every rank the same whole gradient, so the same clipping (and the replica's update with it)
        this.#host.clip(r.flat, true)
        return this.#applyShard(r.flat.subarray(this.#zero.layout.start, this.#zero.layout.end), r.flat)
      }
    }
  }

  /**
   * This rank's segment from its reduced gradient (and the replica's, from the whole one at stage
   * 1, from the predecessor's segment at stage 2), then
   * every segment all-gathered into the model. A group that breaks in the all-gather is re-formed
   * from the survivors' shards, whose parameters every member has loaded by then: nothing to assign.
   */
  async #applyShard(grad: Float32Array, full?: Float32Array, predecessor?: Float32Array): Promise<void> {
    const zero = this.#zero
    const h = this.#host
    this.#reduced = undefined
    zero.update(grad, h.learningRate, h.weightDecay)
    if (full) zero.updateReplica(full, h.learningRate, h.weightDecay)
    if (predecessor) zero.updateReplicaSegment(predecessor, h.learningRate, h.weightDecay)
    const gathered = zero.gathered
    this.#applied = { ...(full ? { gradient: full } : {}), weightDecay: h.weightDecay }
    try {
      if (await h.sync.allGatherInto!(zero.segment, gathered)) h.assignFlat(gathered)
    } finally {
      this.#applied = undefined
    }
  }

  /** The optimizer's state is in every rank's shard file (shardFiles), not in the model's checkpoint files. */
  async checkpointFiles(): Promise<Record<string, Uint8Array>> {
    return {}
  }

  shardFiles(): Record<string, Uint8Array> {
    const { name, bytes } = this.#zero.shardFile()
    return { [name]: bytes }
  }

  /** This rank's range of the saved shards (re-sharded for another world size), or of a stage-0 run's whole state. */
  async restore(files: Readonly<Record<string, Uint8Array>>): Promise<boolean> {
    const zero = this.#zero
    await this.init()
    if (hasShards(files)) zero.loadShards(files)
    else if (files[OPTIMIZER_FILE]) {
      // Saved whole by a stage-0 run: converted to the flat layout, this rank's range kept.
      const h = this.#host
      const saved = await readOptimizerFile(files[OPTIMIZER_FILE], h.optimizer.getClassName())
      const whole = flatStateFromTfjs(zero.optimizer.spec, h.layout, h.parameterCount, saved.map((w) => ({ name: w.name, values: w.data })))
      zero.loadWhole(whole)
    }
    return true
  }

  /** A survivor's snapshot: nothing of ZeRO's own (the regroup merges every survivor's peerFiles). */
  snapshotFiles(): Record<string, Uint8Array> {
    if (!this.#zero.replicated && this.#host.sync.worldSize > 1) {
      throw new PeerRecoveryMisaligned({ reason: `with zeroStage ${this.#zero.stage} each rank holds only its shard of the optimizer state, so no survivor holds the whole of it` })
    }
    return {}
  }

  /** This rank's update of the step in flight is made (in its all-gather): a regroup completes that step. */
  get stepApplied(): boolean {
    return this.#applied !== undefined
  }

  /** This rank's shard and its replica of its predecessor's, with their parameters, for a regroup. */
  peerFiles(): Record<string, Uint8Array> {
    return this.#zero.peerFiles(this.#applied, this.#reduced)
  }

  /** After a regroup: this rank's range of the merged shards in the new group, and the parameters they hold. */
  async adopted(files: Readonly<Record<string, Uint8Array>>): Promise<void> {
    if (!hasShards(files)) return
    const zero = this.#shard()
    const full = zero.loadPeerShards(files)
    this.#zero = zero
    this.#host.assignFlat(full)
  }

  memoryStats(): { optimizerState: number; reducedGradient: number; gradientBuffers: number; parameterBuffers: number } {
    const zero = this.#zero
    const n = this.#host.parameterCount
    const m = zero.memory()
    const reduced = zero.stage === 2 ? zero.layout.shardSize * 4 : n * 4
    return { optimizerState: m.optimizerState, reducedGradient: reduced, gradientBuffers: m.gradientBuffers || n * 4, parameterBuffers: m.parameterBuffers }
  }
}
