// One training strategy behind one interface: what a worker does with its gradients, the state it
// keeps, its checkpoint files, the recoveries it supports, its configuration's checks and what
// "auto" prices it by. An entry (StrategyEntry) is registered once (registry.ts); the data-parallel
// model (data-parallel.ts) makes one StrategyWorker per prepared model from it and calls its hooks
// around the plain step: forward/backward, the flat gradient out of the engine, the exchange, the
// apply.
import type { CollectiveConfig } from "../../../../core/config.ts"
import type { FlatOptimizerSpec, FlatOptimizerState } from "../../common/optim/flat-optimizers.ts"
import type { LocalSgdSettings } from "../../common/optim/outer-optimizer.ts"
import type { ZeroStage } from "../../common/optim/zero.ts"
import type { GradientSlot, GradientSync, StepObserver } from "../gradient-sync.ts"
import type { StrategyName } from "../../../../scheduler/strategy-choice.ts"

type Optimizer = import("@tensorflow/tfjs").Optimizer

/** collectiveConfig as options.ts resolves it, for an entry's checks (a ConfigError naming the field). */
export interface StrategyConfigInput {
  readonly strategy: string
  readonly collective: CollectiveConfig
  /** collectiveConfig.compression, parsed (collectives/compression). */
  readonly compression: unknown
  readonly zeroStage: number
  /** collectiveConfig.localSgd as resolved (strategy "local-sgd", or a candidate of "auto"). */
  readonly localSgd: LocalSgdSettings | undefined
  /** The fewest workers the group runs with. */
  readonly minWorkers: number
}

/** One configuration a strategy is benchmarked in. */
export interface BenchVariant {
  /** Its row's label. */
  readonly name: string
  /** collectiveConfig for it, given how many parameter servers the bench runs. */
  readonly collective: (servers: number) => Record<string, unknown>
  /** Held to the bench's accuracy target (within 2 points of the baseline). */
  readonly accuracyTarget?: boolean
  /** Run only when the bench is given this flag (a slow or exploratory variant). */
  readonly optIn?: string
}

/** A training strategy, as registered: its name, what it needs, its checks and its worker side. */
export interface StrategyEntry<N extends string = string> {
  /** collectiveConfig.strategy's value: lower case, digits and "-". */
  readonly name: N
  /** One line: what it does (error messages, the docs). */
  readonly hint: string
  /** Parameter-server processes start with the job (collectiveConfig.parameterServer configures them). */
  readonly servers: boolean
  /**
   * False for a strategy chosen otherwise than by collectiveConfig.strategy (pipeline and tensor
   * parallelism: ctx.preparePipeline); it is listed, and refused as a config value. Default true.
   */
  readonly selectable?: boolean
  /** Checks the rest of collectiveConfig against this strategy; throws a ConfigError naming the field. */
  validate?(input: StrategyConfigInput): void
  /**
   * Why recovery from surviving peers cannot work under this configuration (then a failure restarts
   * from the checkpoint, and recoverFrom "peers" is refused with this reason); undefined: it can.
   */
  peersCannot(input: StrategyConfigInput): string | undefined
  /**
   * Strategy "auto"'s cost-model entries (scheduler/strategy-choice.ts's predictions) this strategy
   * is priced by when auto may move to it; none: auto never picks it.
   */
  readonly autoCandidates?: ReadonlyArray<StrategyName>
  /**
   * The configurations `npm run bench -- strategy` compares this strategy in (on the same digits job,
   * under a straggler); none: it is not in that bench. The first variant of the first entry is the
   * baseline the others are measured against.
   */
  readonly benchVariants?: ReadonlyArray<BenchVariant>
  /** The worker side, one per prepared model; absent: not run by the data-parallel model. */
  create?(host: StrategyHost): StrategyWorker
}

/** What a strategy's worker side may use of the data-parallel model it runs in. */
export interface StrategyHost {
  readonly sync: GradientSync
  readonly layout: ReadonlyArray<GradientSlot>
  readonly parameterCount: number
  readonly optimizer: Optimizer
  readonly weightDecay: number
  readonly observer: StepObserver | undefined
  /** The optimizer's learning rate now (undefined without a numeric one). */
  readonly learningRate: number | undefined
  /** Inside dp.fit() (every rank takes the same steps). */
  readonly inFit: boolean
  /** The loop trains with dp.fit() (has called it). */
  readonly fitUsed: boolean
  /** The report() calls this rank's loop has made; undefined outside a Trainer's worker (no group session). */
  readonly reports: number | undefined
  /** Every report() call is a group operation now (a hand-written loop's group below its size): PeerRecovery.reportsExchange. */
  readonly reportsExchange: boolean
  /** The ranks dp.fit()'s heterogeneity-aware batcher gives no rows now (the same on every rank at a step; none outside dp.fit()). */
  readonly ranksWithoutRows: readonly number[]
  /** The one rank dp.fit()'s batcher gives every row of the step, where it gives the others none (the same on every rank at a step); else undefined. */
  readonly soleHolder: number | undefined
  /** Take the exchange path even with one worker (benchmarks). */
  readonly exchangeAlone: boolean
  /** The update counter (the step numbers the group's exchanges are keyed by). */
  step: number
  /** The group's progress in synchronous steps' worth of gradients (globalStep). */
  global: number
  /** The trainable weights as one flat vector, read asynchronously. */
  readFlatParams(): Promise<Float32Array>
  /** Loads a flat vector into the trainable weights. */
  assignFlat(flat: Float32Array): void
  /** The plain update from a reduced flat gradient: weight decay, then the optimizer. */
  applyFlat(flat: Float32Array): void
  /**
   * prepareModel's clipping (clipValue, then clipNorm) on a reduced gradient, in place, before a
   * strategy's own update: `whole` the whole gradient (every element), else a segment of it, which
   * only clipValue applies to (a norm needs the whole).
   */
  clip(flat: Float32Array, whole: boolean): void
  /** prepareModel's clipNorm and clipValue (a strategy that holds a segment clips by the group's norm: ZeRO stage 2). */
  readonly clipNorm: number | undefined
  readonly clipValue: number | undefined
  /** Hands a whole flat optimizer state (shards, the servers) to tfjs's optimizer. */
  loadTfjsOptimizer(spec: FlatOptimizerSpec, state: FlatOptimizerState): Promise<void>
}

/** What a step hands its strategy's exchange. */
export interface StepExchange {
  readonly step: number
  /** Sample weight of this rank's gradient (accumulated micro-batches included). */
  readonly samples: number
  /**
   * The step's samples over every rank, where the loop knows them (dp.fit()'s global batch, which
   * adaptive batching splits unequally): this rank's share of the step is samples / globalSamples.
   */
  readonly globalSamples?: number
  /** The group was re-formed under the reduction: this rank's gradient again, for the new group. */
  recompute(): Promise<Float32Array>
}

/** An exchanged gradient: how to apply it, or "adopted" (a survivor's state holds this step). */
export interface Exchanged {
  readonly adopted?: boolean
  /** When the exchange (re)started, when a recompute moved it (performance.now()). */
  readonly sentAt?: number
  /** Milliseconds on the wire, and whether through the servers (strategy "auto" measures them). */
  readonly commMs?: number
  readonly onServers?: boolean
  apply?(): Promise<void> | void
}

/** A strategy's worker side: its state and the hooks the data-parallel model calls. */
export interface StrategyWorker {
  /** What runs now (strategy "auto": the strategy it moved to). */
  readonly name: string
  /** Steps go through the parameter servers now. */
  readonly viaServers: boolean
  /**
   * The ranks hold the same state between steps (state parity checks it). Asked by each rank at
   * each report() call: it must answer the same on every rank at the same call (strategy auto).
   */
  readonly replicated: boolean
  /** ZeRO: each rank holds only its shard of the optimizer state. */
  readonly zeroStage?: ZeroStage
  /** After the start-up weight broadcast: the strategy's own state. */
  init?(): Promise<void>
  /** Before each step (strategy "auto" decides there). */
  beforeStep?(): Promise<void>
  /** This step applies its gradients in the engine, without leaving it (no exchange). */
  inPlace(): boolean
  /** After an in-place step's update (local SGD's outer rounds). */
  afterInPlace?(samples: number): Promise<void>
  /** This rank's compute ms of a step (strategy "auto"). */
  computed?(ms: number, step: number, inPlace: boolean): void
  /** The buffer the flat gradient is read into (ZeRO stage 2's padded one). */
  gradientBuffer?(): Float32Array | undefined
  /** Exchanges this step's flat gradient; the model applies what it returns. */
  exchange(flat: Float32Array, step: StepExchange): Promise<Exchanged>
  /** A round in flight is merged (before any other group operation, a checkpoint, the end). */
  settle?(): Promise<void>
  /** This rank's loop ended. */
  finish?(): Promise<void>
  /**
   * At report() call `index` (0-based), before its parity check, on every rank at the same call:
   * strategy auto makes a move there that needs the ranks at the same place in their loops.
   */
  atReport?(index: number): Promise<void>
  /** Checkpoint files besides the update counter (`optimizerFile`: tfjs's optimizer's whole state); absent: that file alone. */
  checkpointFiles?(optimizerFile: () => Promise<Uint8Array>): Promise<Record<string, Uint8Array>>
  /** This rank's own files for its reports (ZeRO's shard). */
  shardFiles?(): Record<string, Uint8Array>
  /** Loads a checkpoint's strategy state; true when done, false when the optimizer's whole state is still to load. */
  restore?(files: Readonly<Record<string, Uint8Array>>): Promise<boolean>
  /**
   * Files a survivor's snapshot adds (throws PeerRecoveryMisaligned where no survivor holds the
   * whole state); `inStep`: the snapshot is taken in a numbered step (past beforeStep).
   */
  snapshotFiles?(inStep: boolean): Record<string, Uint8Array>
  /** This rank's update of the step in flight is made (ZeRO stage 1, in its all-gather): a regroup completes that step. */
  readonly stepApplied?: boolean
  /** A regroup's state of this survivor besides its snapshot (ZeRO stage 1: its shard and replica), merged with every other survivor's. */
  peerFiles?(): Record<string, Uint8Array>
  /**
   * After a survivor's files (with the merged peerFiles) are loaded: the strategy's own state of
   * them (ZeRO re-shards). `inStep`: this rank is in a numbered step (past beforeStep);
   * `redoingStep`: it redoes that step in the new group.
   */
  adopted?(files: Readonly<Record<string, Uint8Array>>, at: { readonly inStep: boolean; readonly redoingStep: boolean }): Promise<void>
  /**
   * Why a regroup cannot take this rank's state now (strategy auto on the parameter servers, or in
   * the middle of a move), or undefined: the group then restarts from the checkpoint, saying why.
   */
  peersCannotNow?(): string | undefined
  /** Before a survivor's files are loaded: returns what to do after (local SGD keeps its own parameters). */
  beforeAdopt?(files: Readonly<Record<string, Uint8Array>>): Promise<(() => void) | undefined>
  /** Metrics for report(). */
  metrics?(): Record<string, number | string>
  /** Bytes held across steps, where the strategy holds its own buffers (ZeRO). */
  memoryStats?(): { readonly optimizerState: number; readonly reducedGradient: number; readonly gradientBuffers: number; readonly parameterBuffers: number }
}

/** Types an entry (keeping its literal name) without registering it. */
export const defineStrategy = <const N extends string>(entry: StrategyEntry<N>): StrategyEntry<N> => entry

/**
 * The group's weighted mean of `flat` (GradientSync.reduceGradients), redone while the group broke
 * under it and was re-formed: the buffer holds partial sums of the old group, so this rank's
 * gradients are computed again (the weights are unchanged) and reduced in the new group.
 */
export const reduceWithRecompute = async (host: StrategyHost, flat: Float32Array, x: StepExchange, holder?: number): Promise<{ flat: Float32Array; adopted: boolean; sentAt: number | undefined }> => {
  let sentAt: number | undefined
  let reduced = await host.sync.reduceGradients(flat, host.layout, x.samples, x.step, undefined, undefined, holder)
  // (Redone in a re-formed group: a joiner's split there is not the one that named the holder.)
  while (reduced === "recompute") {
    flat = await x.recompute()
    sentAt = performance.now()
    reduced = await host.sync.reduceGradients(flat, host.layout, x.samples, x.step)
  }
  return { flat, adopted: reduced === "adopted", sentAt }
}
