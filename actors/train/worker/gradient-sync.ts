// What the data-parallel model needs of its group (the worker wires it to the communicator, the
// parameter servers and the group session): the flat gradient's layout, the gradient sync, the
// parameter servers' client, recovery from peers and the step observer's timing hooks.
import type { FlatOptimizerSpec, FlatOptimizerState } from "../common/optim/flat-optimizers.ts"
import type { ZeroStage } from "../common/optim/zero.ts"
import type { LocalSgdSettings } from "../common/optim/outer-optimizer.ts"
import type { StreamCursor } from "../common/train-protocol.ts"
import type { Communicator, WireFormat } from "../../../collectives/communicator.ts"

/** One variable's place in the flat gradient buffer. */
export interface GradientSlot {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly offset: number
  readonly size: number
}

/** What GradientSync.reduceScatter works on, as the operation runs (see there). */
export interface ReduceScatterBuffers {
  readonly buf: Float32Array
  readonly shiftInto?: Float32Array
  readonly shiftBy?: number
  readonly reduced?: (segment: Float32Array, predecessor: Float32Array) => void
  /**
   * The reduced gradient's global norm (clipNorm at stage 2, where no rank holds the whole):
   * `of` gives this rank's segment's sum of squares, `total` gets the sum over every rank's, the
   * same value on every rank, in the same group operation.
   */
  readonly squares?: { readonly of: (segment: Float32Array) => number; readonly total: (sum: number) => void }
}

/** The communicator calls a stage-2 reduce-scatter makes (reduceScatterOperation). */
export type ReduceScatterComm = Pick<Communicator, "reduceScatter" | "shift" | "barrier" | "allReduce">

/**
 * GradientSync.reduceScatter's group operation on `comm`: the segment reduced to the weighted
 * mean; with `shiftInto`, sent to the replica's keeper and the predecessor's taken, then a barrier
 * (no rank updates its shard before every rank holds the segments to make the same update: a
 * regroup brings a rank that had not made it level, optim/zero.ts); with `squares`, the segments'
 * sums of squares summed over the group, which is that barrier too (no rank has the sum before
 * every rank gave its part).
 */
export const reduceScatterOperation = async (comm: ReduceScatterComm, b: ReduceScatterBuffers, weight: number, wire: WireFormat): Promise<Float32Array> => {
  const segment = await comm.reduceScatter(b.buf, { op: "weightedMean", weight, wire })
  if (b.shiftInto) {
    await comm.shift(segment, { out: b.shiftInto, ...(b.shiftBy !== undefined ? { by: b.shiftBy } : {}) })
    b.reduced?.(segment, b.shiftInto)
  }
  if (b.squares) {
    // (a tree: reduced at one rank and sent down, so every rank scales by the same bits)
    const sum = Float32Array.of(b.squares.of(segment))
    await comm.allReduce(sum, { op: "sum", algorithm: "tree" })
    b.squares.total(sum[0]!)
  } else if (b.shiftInto) await comm.barrier()
  return segment
}

/** What the wrapper needs from the group: the worker wires it to the communicator. */
export interface GradientSync {
  readonly rank: number
  readonly worldSize: number
  /**
   * Reduces the flat gradient in place to the weighted mean over ranks (weight: this rank's sample
   * count). After the group was re-formed meanwhile (recovery from peers): "adopted" when this rank
   * took a survivor's state, which already contains this step (nothing is to be applied);
   * "recompute" when the step is to be done again in the new group (the buffer holds partial sums
   * of the old one). `background`: a reduction that runs beside the loop's steps (local SGD's
   * overlapped rounds): where the group breaks under it or a regroup is asked for, it returns
   * "recompute" without parking, and the loop redoes it in the foreground, where the rank parks at
   * a point of the loop a replacement can reach. `holder`: the one rank with a weight above 0, as
   * every rank knows from the step's split (adaptive batching left the others without rows): its
   * gradient is the mean, sent from there without waiting for the others (GradientReducer); dropped
   * where the group is re-formed before the operation runs (the new group's splits start equal).
   */
  reduceGradients(flat: Float32Array, layout: ReadonlyArray<GradientSlot>, weight: number, step: number, scope?: string, background?: boolean, holder?: number): Promise<void | "adopted" | "recompute">
  /** Copies rank 0's values into `buf` on every rank. */
  broadcast(buf: Float32Array): Promise<void>
  /** Element-wise sum over ranks, in place. */
  sum(buf: Float32Array): Promise<void>
  /**
   * A flat gradient buffer of n elements that reduceGradients works on in place (faster with
   * compression: GradientReducer.gradientBuffer), or undefined to pass any Float32Array.
   */
  gradientBuffer?(n: number): Float32Array | undefined
  /** Gathers every rank's buffer in rank order (heterogeneity-aware batching exchanges throughputs). */
  allGather?(buf: Float32Array): Promise<Float32Array>
  /** collectiveConfig.adaptiveBatching: fit({ globalBatchSize }) splits by measured throughput. */
  readonly adaptiveBatching?: boolean
  /**
   * Elastic groups (scalingConfig.numWorkers { min, max }): "keep-global" scales a per-rank
   * batchSize by maxWorkers / worldSize so the global batch stays that of the full group;
   * "keep-per-worker" keeps the rank's batch and scales the learning rate by worldSize / maxWorkers.
   */
  readonly elastic?: { readonly maxWorkers: number; readonly batch: "keep-global" | "keep-per-worker"; readonly fixed?: boolean }
  /** Recovery from surviving peers (actors/train/worker/group-session.ts); absent: a failure restarts from the checkpoint. */
  readonly recovery?: PeerRecovery
  /** collectiveConfig.zeroStage: 1 and 2 shard the optimizer state (optim/zero.ts). Default 0. */
  readonly zeroStage?: ZeroStage
  /** Each rank keeps a replica of its predecessor's shard, so a regroup recovers a lost one (failures recover from peers). */
  readonly zeroReplica?: boolean
  /** With zeroReplica: the distance to that predecessor in the current group (optim/zero.ts replicaOffset: across nodes where the layout allows). */
  readonly zeroReplicaOffset?: number
  /**
   * Stage 2: reduces `buf` (a multiple of worldSize long) to the weighted mean over ranks and
   * returns this rank's segment of it (segment r of p equal ones), a view of `buf`; with
   * `shiftInto`, then sends that segment to rank r + shiftBy (default 1) and takes rank
   * r - shiftBy's into `shiftInto` (a replica's gradient), then waits for every rank to have done as much (a barrier),
   * in the same group operation (`reduced` is told both segments before the barrier): a rank that
   * got through it knows every rank holds its segment and its predecessor's, so a regroup can bring
   * any rank that had not applied them level with those that had. `buffers` gives them when the operation runs: a regroup before it (a grow)
   * changes the world size, and so the buffers'. After
   * the group was re-formed under it: "adopted" (this rank took a survivor's state, which holds
   * this step) or "recompute" (the step is done again in the new group: `buf` holds partial sums of
   * the old one).
   */
  reduceScatter?(buffers: () => ReduceScatterBuffers, weight: number): Promise<Float32Array | "adopted" | "recompute">
  /**
   * Every rank's `segment` (equal lengths) into `out`, in rank order; true when gathered, false when
   * the group broke under it and was re-formed, with the state adopted from the survivors (nothing gathered).
   */
  allGatherInto?(segment: Float32Array, out: Float32Array): Promise<boolean>
  /** collectiveConfig.strategy "parameter-server" (or "auto"): the servers (ps-client.ts). */
  readonly ps?: ParameterServers
  /**
   * A step's push to the servers as a group operation (recovery from peers): when the group is
   * regrouped under it, "again" (the step is pushed again in the new group: sync mode, whose
   * servers dropped the step's gradients) or, with `appliedOnSend` (async and SSP servers apply a
   * gradient as it arrives), "adopted" (the step counts as done; this rank took a survivor's state).
   */
  serverOperation?<T>(run: () => Promise<T>, appliedOnSend: boolean): Promise<T | "adopted" | "again">
  /**
   * A request to the servers beside the steps (rank 0 asking their state for a checkpoint): where a
   * server is lost under it, the rank parks there for the regroup and asks the new servers again.
   * Not a group operation: the rank's operation count does not move.
   */
  serverRequest?<T>(run: () => Promise<T>): Promise<T>
  /**
   * collectiveConfig.strategy "auto": training starts on the all-reduce and, from measured compute
   * and communication times, moves to the servers (backup workers, or SSP) and back
   * (scheduler/strategy-choice.ts); rank 0 explains every decision.
   */
  readonly auto?: { readonly numServers: number; explain(text: string, json: Record<string, unknown>, summary: string): void }
  /**
   * collectiveConfig.strategy "local-sgd": steps apply their gradients locally; every syncEvery
   * steps the parameter deltas are averaged through reduceGradients (scoped per fragment) and the
   * outer optimizer applied (local-sgd.ts).
   */
  readonly localSgd?: LocalSgdSettings
  /**
   * collectiveConfig.strategy: the registry's entry (strategies/registry.ts) that runs the steps.
   * Absent: read from what the group offers (auto, ps, localSgd; else "allreduce").
   */
  readonly strategy?: string
  /** Bytes this rank's reductions put on the wire so far, and as dense fp32 (the reducer's stats). */
  wireStats?(): { readonly totalWireBytes: number; readonly totalDenseBytes: number }
}

/** What the data-parallel model needs of the parameter servers (PsClient implements it, ps-client.ts). */
export interface ParameterServers {
  readonly numServers: number
  /** The servers' version at this rank's last pull or push answer (the least over the servers). */
  readonly version: number
  init(flat: Float32Array, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number): Promise<void>
  pushPull(
    worker: number,
    step: number,
    grad: Float32Array,
    weight: number,
    learningRate: number | undefined,
    /** Sync: the step's samples over every worker, when known (the step's quota counts samples then). */
    stepWeight?: number
  ): Promise<{ readonly params: Float32Array; readonly staleness: number; readonly dropped: boolean; readonly version: number; readonly serverMs: number | undefined }>
  pull(n: number): Promise<Float32Array>
  stateFiles(): Promise<Record<string, Uint8Array>>
  /** Re-initialises the servers from a checkpoint's parameter-server files; false when it has none. */
  restore(files: Readonly<Record<string, Uint8Array>>, n: number, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number): Promise<boolean>
  finish(worker: number): Promise<void>
  /** This worker is away until its next push (in a collective outside the servers): sync steps do not wait for it meanwhile. */
  away(worker: number): Promise<void>
  /** The mode the servers were configured with, and their backup workers (sync). */
  readonly mode: "sync" | "async" | "ssp"
  readonly backupWorkers: number
  takeOver(flat: Float32Array, optimizer: FlatOptimizerState, learningRate: number, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number, as: { readonly mode: "sync" | "async" | "ssp"; readonly backupWorkers: number }): Promise<void>
  wholeState(n: number): Promise<{ readonly params: Float32Array; readonly optimizer: FlatOptimizerState }>
  /** Gradient bytes pushed (last step: every server's message; totals), as ReducerStats counts the all-reduce's. */
  readonly pushStats?: { readonly wireBytes: number; readonly denseBytes: number; readonly steps: number; readonly totalWireBytes: number; readonly totalDenseBytes: number }
}

/** Where a loop is in dp.fit(): the group operations done, the epoch and the step in it. */
export interface RecoveryCursor {
  readonly ops: number
  readonly inFit: boolean
  readonly epoch: number
  readonly stepInEpoch: number
  readonly stepsPerEpoch: number
  /** A streamed epoch's plan (common/train-protocol.ts StreamCursor). */
  readonly stream?: StreamCursor
  /** The survivors' recent distributed evaluations (Position.evaluations): a joiner's replay answers its own with them. */
  readonly evaluations?: ReadonlyArray<ReadonlyArray<number>>
  /** The survivors' recent dp.fit() epoch results (Position.epochs): a joiner's replay returns them for the epochs it skips. */
  readonly epochs?: ReadonlyArray<ReadonlyArray<number>>
}

/** What dp.fit() needs of the group session to skip, join and follow regroups. */
export interface PeerRecovery {
  /** Bumped at every regroup and join. */
  readonly generation: number
  readonly ops: number
  /** A joining rank's target: the survivors' position; undefined once joined. */
  readonly joinTarget: RecoveryCursor | undefined
  /** The joining rank reached the target: take the survivors' state. */
  join(): Promise<void>
  /** The rank each survivor had before the last regroup (its placement's; undefined before any). */
  readonly survivorRanks: ReadonlyArray<number> | undefined
  /** After a regroup, where the furthest survivor was (once). */
  takeCursor(): RecoveryCursor | undefined
  /** A trainStep() outside dp.fit(): a joining rank skips the survivors' steps, then joins them. */
  replayStep(): Promise<"skip" | "run">
  /** A training step completed. */
  countStep(): void
  /** The report() calls this rank's loop has made (a joiner counts from its checkpoint's). */
  readonly reports: number
  /**
   * Every report() call is a group operation now (a hand-written loop's group below its size, where
   * replacements join at a report() boundary: GroupSession.reportBoundary).
   */
  readonly reportsExchange: boolean
}

/**
 * Optional timing hooks (the timeline and the report's compute/communication split), all in
 * performance.now() milliseconds. "step" encloses the three others; it is reported last.
 */
export interface StepObserver {
  phase?(name: "step" | "forward_backward" | "allreduce" | "apply", startMs: number, endMs: number, step: number): void
  /** A collective outside any step (initial weight broadcast, epoch-end metric sum): time spent on the group. */
  wait?(name: string, startMs: number, endMs: number): void
}

/** The registry's strategy a group's steps run: collectiveConfig.strategy, else read from what the group offers. */
export const strategyOf = (sync: GradientSync): string => sync.strategy ?? (sync.auto ? "auto" : sync.localSgd ? "local-sgd" : sync.ps ? "parameter-server" : "allreduce")
