// The model-parallel model a rank trains: its pipeline stage (a chain of blocks: layer runs and
// tensor-parallel dense pairs), run over a batch's micro-batches in the order of the schedule
// (GPipe or 1F1B), its gradients accumulated over the micro-batches, all-reduced among the stage's
// data-parallel replicas, and applied with one optimizer step per batch.
//
// Exactness. Micro-batch i of n_i rows out of B contributes the gradient of (n_i / B) x its mean
// loss, so the sum over micro-batches is the gradient of the batch's mean loss whatever the
// micro-batch sizes (they need not divide the batch), and the replicas' weighted mean (weights B_d)
// is the gradient of the global batch's mean loss: the update a single worker makes on the whole
// batch, up to float rounding. The last stage computes the loss; the loss sum and correct count of
// the batch go back up the pipeline in one small message after the gradients, so every stage
// returns the batch's loss.
//
// Activations and gradients travel as raw float32 buffers in the order the schedule makes them;
// sends do not wait (a stage goes on computing while its message is on the wire), receives
// happen when the op needs them. A rank holds the stashed inputs of its blocks for the micro-batches
// in flight (all m with GPipe, at most S - s with 1F1B): memoryStats() reports the peak.
//
// Recovery from surviving peers (with `recovery`, which a Trainer's worker gives it): each step,
// epoch sum and evaluation is one group operation of the worker's group session. When a rank of
// the grid is lost, the survivors park in theirs and say what they hold of their stages (stageHandover); the
// regroup keeps each survivor at its rank, places a replacement at the lost one, and every rank
// takes its stage's state from the replica furthest on (its stageFiles through the driver; adoptStage), its links made again for the
// new group before its next operation. A stage none of whose replicas applied the step in flight
// skips that step; the rest retry it. A replacement builds its stage at the survivors' cut,
// replays the loop from the checkpoint without computing, and takes its stage's state where the
// survivors are.
import type { Tf } from "../../../../core/engine.ts"
import { gatherRows, shardIndices, type ArrayDataset } from "../../../../core/datasets.ts"
import { ConfigError } from "../../../../core/errors.ts"
import type { Batch, BatchTransform } from "../../../../core/data/stream.ts"
import type { Block } from "./blocks.ts"
import type { GridPlace } from "./grid.ts"
import type { StageLinks } from "./links.ts"
import { LAYOUT_FILE, shardFileName, stageFilesOf } from "./checkpoint.ts"
import { countCorrect, type ResolvedLoss } from "./loss.ts"
import { microBatchSizes, stageOps, type ScheduleName } from "./schedule.ts"
import type { WeightPart } from "./tensor-parallel.ts"
import { loadStageShard, stageShardFiles, type FrozenWeight, type PipelineLayout } from "./checkpoint.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar
type Variable = import("@tensorflow/tfjs").Variable
type Optimizer = import("@tensorflow/tfjs").Optimizer

/** One stage as this rank runs it. */
export interface StageSpec {
  readonly blocks: ReadonlyArray<Block>
  /** One per variable of the blocks, in order: which model weight (or slice of one) it is. */
  readonly parts: ReadonlyArray<WeightPart>
  /** Per-sample shape of the stage's input and output. */
  readonly inputShape: ReadonlyArray<number>
  readonly outputShape: ReadonlyArray<number>
  /** Weights of the stage's layers that are not trained (batch-norm statistics): checkpointed whole. */
  readonly frozen?: ReadonlyArray<FrozenWeight>
}

export interface PipelineStepResult {
  /** The batch's mean loss (this replica's batch). */
  readonly loss: number
  readonly samples: number
  /** Correct predictions (classification losses). */
  readonly correct?: number
}

export interface PipelineEpochResult {
  readonly epoch: number
  /** Mean loss over every replica's samples. */
  readonly loss: number
  readonly accuracy?: number
  readonly samples: number
  readonly steps: number
  readonly seconds: number
}

/** Where the time of the last step went, on this rank. */
export interface PipelineStepTiming {
  /** From the first op of the schedule to the last (sends settled). */
  readonly pipelineMs: number
  /** Of which waiting for a neighbour's message. */
  readonly waitMs: number
  /** waitMs / pipelineMs: this stage's measured bubble. */
  readonly bubble: number
  /** Computing its forward ops (all micro-batches), and its backward ops (with the recomputed forward). */
  readonly forwardMs: number
  readonly backwardMs: number
  /** All-reduce of the stage's gradients among its replicas. */
  readonly reduceMs: number
  readonly applyMs: number
}

export interface PipelineMemoryStats {
  /** Bytes of stashed block inputs at the peak of the last step (activation memory). */
  readonly activationPeakBytes: number
  /** Most micro-batches in flight at once in the last step. */
  readonly peakInFlight: number
  /** Bytes of this rank's trainable weights. */
  readonly parameterBytes: number
  /** The tfjs engine's bytes at the peak of the last step (sampled after every op). */
  readonly enginePeakBytes: number
}

export interface PipelineFitOptions {
  readonly epochs: number
  /** Rows per batch of each data-parallel replica. */
  readonly batchSize: number
  readonly initialEpoch?: number
  /** Seed of the per-epoch shuffles; default the shard's (Trainer seed). */
  readonly seed?: number
  /** After each step: its result, the epoch, the step's index and the epoch's steps (samples 0: a step this rank did not train, replaying to its group or made by it meanwhile). */
  readonly onStep?: (r: PipelineStepResult & { epoch: number; index: number; steps: number }) => void | Promise<void>
  readonly onEpochEnd?: (r: PipelineEpochResult) => void | Promise<void>
}

/** What pp.fit() trains from: an in-memory dataset (ctx.getDatasetShard of arrays, with its map transforms, or the dataset itself). */
export type PipelineSource = { readonly dataset: ArrayDataset; readonly seed?: number; readonly transforms?: ReadonlyArray<BatchTransform> } | ArrayDataset

/** What the worker's group session does for a pipelined model (actors/train/worker/group-session.ts). */
export interface PipelineSession {
  /** Set while this rank is a replacement replaying the loop to where the survivors are. */
  readonly joinTarget: unknown
  replayOperation(step: boolean): Promise<"skip" | "run">
  /** Runs a group operation; parks for a regroup when the group breaks under it (see the module comment). */
  operation<T>(run: () => Promise<T>, adopted: () => T): Promise<T>
  countStep(): void
}

/** Recovery from surviving peers: the session, and this rank's links made again in a regrouped group. */
export interface PipelineRecovery {
  readonly session: PipelineSession
  relink(): Promise<StageLinks>
  /** Puts new links in place of the model's; returns the old ones. */
  swap(next: StageLinks): StageLinks
}

/** A stage handed over at a regroup (actors/train/common/train-protocol.ts StageHandover): the files it holds, not their bytes. */
export interface StageHandoverSummary {
  readonly step: number
  readonly holds: ReadonlyArray<string>
  readonly needs: ReadonlyArray<{ readonly name: string; readonly what: string }>
}

export interface PipelineModelOptions {
  readonly schedule: ScheduleName
  readonly microBatches: number
  readonly loss: ResolvedLoss
  readonly optimizer: Optimizer
  readonly layout: PipelineLayout
  /** Default seed of fit()'s shuffles. */
  readonly seed?: number
  readonly recovery?: PipelineRecovery
  /** After each step this rank trained: where it is (a Trainer's worker sends it on as a progress message). */
  readonly progress?: (info: { epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number }) => void
}

const size = (shape: ReadonlyArray<number>): number => shape.reduce((a, b) => a * b, 1)

/** A micro-batch's forward kept for its backward: each block's input, the last stage's output, their bytes. */
interface StashEntry {
  inputs: Tensor[]
  out?: Tensor
  bytes: number
}

/** One trainStep's state as its ops run: the batch's cut, the stash, the gradients, the sends, the figures. */
interface StepState {
  readonly x: Tensor | undefined
  readonly y: Tensor | undefined
  readonly batch: number
  readonly sizes: ReadonlyArray<number>
  readonly offsets: ReadonlyArray<number>
  readonly stash: Map<number, StashEntry>
  readonly acc: Array<Tensor | undefined>
  readonly sends: Array<Promise<void>>
  /** The last stage's per-micro-batch losses (each weighted by its share of the batch) and correct counts, read once the schedule has run. */
  readonly losses: Tensor[]
  readonly corrects: Tensor[]
  lossSum: number
  correct: number
  waitMs: number
  forwardMs: number
  backwardMs: number
  stashBytes: number
  peakBytes: number
  peakMicro: number
  enginePeak: number
}

export class PipelineModel {
  readonly place: GridPlace
  /** @internal This rank's blocks of the model, its frozen weights and tensor-parallel parts. */
  readonly stage: StageSpec
  readonly optimizer: Optimizer
  readonly layout: PipelineLayout
  schedule: ScheduleName
  microBatches: number
  readonly #tf: Tf
  readonly #links: StageLinks
  readonly #loss: ResolvedLoss
  readonly #vars: Variable[]
  readonly #blockVarStart: number[]
  readonly #seed: number
  #timing: PipelineStepTiming = { pipelineMs: 0, waitMs: 0, bubble: 0, forwardMs: 0, backwardMs: 0, reduceMs: 0, applyMs: 0 }
  #memory: PipelineMemoryStats
  #steps = 0
  #closed = false
  /** A step failed mid-conversation: its links are given up (made again by a regroup, with recovery). */
  #broken = false
  readonly #recovery: PipelineRecovery | undefined
  readonly #progress: PipelineModelOptions["progress"]
  /** Regrouped: the links are made again before the next group operation. */
  #stale = false

  /** @internal ctx.preparePipeline makes it, with the stage's links. */
  constructor(tf: Tf, place: GridPlace, stage: StageSpec, links: StageLinks, opts: PipelineModelOptions) {
    this.#tf = tf
    this.place = place
    this.stage = stage
    this.#links = links
    this.#loss = opts.loss
    this.optimizer = opts.optimizer
    this.layout = opts.layout
    this.schedule = opts.schedule
    this.microBatches = opts.microBatches
    this.#seed = opts.seed ?? 0
    this.#recovery = opts.recovery
    this.#progress = opts.progress
    this.#vars = []
    this.#blockVarStart = []
    for (const b of stage.blocks) {
      this.#blockVarStart.push(this.#vars.length)
      this.#vars.push(...b.variables)
    }
    if (stage.parts.length !== this.#vars.length) throw new Error(`stage has ${this.#vars.length} variables but ${stage.parts.length} weight parts`)
    this.#memory = { activationPeakBytes: 0, peakInFlight: 0, parameterBytes: this.#vars.reduce((n, v) => n + v.size * 4, 0), enginePeakBytes: 0 }
  }

  get isFirstStage(): boolean {
    return this.place.stage === 0
  }

  get isLastStage(): boolean {
    return this.place.stage === this.place.stages - 1
  }

  /** This rank's trainable variables (its stage's, tensor-parallel ones as slices). */
  get variables(): ReadonlyArray<Variable> {
    return this.#vars
  }

  get parameterCount(): number {
    return this.#vars.reduce((n, v) => n + v.size, 0)
  }

  /** Optimizer steps taken. */
  get steps(): number {
    return this.#steps
  }

  get lastStepTiming(): PipelineStepTiming {
    return this.#timing
  }

  memoryStats(): PipelineMemoryStats {
    return this.#memory
  }

  /** The loss's targets from class ids (one-hot for a categorical loss), as dp.lossTargets. */
  lossTargets(y: Tensor, numClasses: number): Tensor {
    if (this.#loss.classification && !this.#loss.sparse) return this.#tf.oneHot(y.toInt(), numClasses)
    return y.clone()
  }

  #check(): void {
    if (this.#closed || (this.#broken && !this.#recovery)) throw new ConfigError({ field: "pipeline", reason: "this pipelined model was closed (its loop ended or its links failed)" })
  }

  /**
   * One optimizer step on a batch. The first stage uses `x`, the last stage `y` (the loss's
   * targets, as from lossTargets); pass the same batch on every rank of a pipeline, or null where a
   * stage does not need it with `{ batchSize }`. Every rank of the group calls it the same number of times.
   */
  async trainStep(x: Tensor | null | undefined, y: Tensor | null | undefined, opts: { readonly batchSize?: number } = {}): Promise<PipelineStepResult> {
    const r = await this.#step(x, y, opts)
    // (a loop of its own steps has no epochs)
    if (r.samples > 0) this.#progress?.({ epoch: 0, step: this.#steps - 1, stepsPerEpoch: 0, samples: r.samples, loss: r.loss })
    return r
  }

  /** One step, under the group session with recovery (trainStep's, and fit()'s for each batch). */
  async #step(x: Tensor | null | undefined, y: Tensor | null | undefined, opts: { readonly batchSize?: number }): Promise<PipelineStepResult> {
    this.#check()
    const rec = this.#recovery
    if (!rec) return this.#trainStep(x, y, opts)
    this.#batchOf(x, y, opts)
    // A replacement replaying the loop: the steps the survivors made already are skipped (no samples).
    if (rec.session.joinTarget !== undefined && (await rec.session.replayOperation(true)) === "skip") return { loss: Number.NaN, samples: 0 }
    const r = await rec.session.operation(
      async () => {
        await this.#fresh()
        return this.#trainStep(x, y, opts)
      },
      // The step was made by the survivor furthest on; this rank took its stage's state from it.
      () => ({ loss: Number.NaN, samples: 0 })
    )
    rec.session.countStep()
    return r
  }

  /** A group operation other than a step (an epoch's sums, an evaluation), under the session with recovery. */
  async #operation<T>(run: () => Promise<T>, skipped: () => T): Promise<T> {
    const rec = this.#recovery
    if (!rec) return run()
    if (rec.session.joinTarget !== undefined && (await rec.session.replayOperation(false)) === "skip") return skipped()
    return rec.session.operation(async () => {
      await this.#fresh()
      return run()
    }, skipped)
  }

  /** After a regroup: this rank's links made again for the new group (every rank does it at its next operation). */
  async #fresh(): Promise<void> {
    if (!this.#stale) return
    const rec = this.#recovery!
    const next = await rec.relink()
    const old = rec.swap(next)
    await old.close().catch(() => {})
    this.#stale = false
    this.#broken = false
  }

  /** @internal A regroup is coming: whatever this rank waits for on its links fails now (they are made again after it). */
  interrupt(): void {
    this.#broken = true
    void this.#links.close().catch(() => {})
  }

  /** @internal The group regrouped around this rank (its place in the grid is the same). */
  regrouped(): void {
    this.#stale = true
  }

  /** @internal This rank's stage for a regroup: the files it holds (stageFiles), its steps, and every shard the grid needs. */
  stageHandover(): StageHandoverSummary {
    const needs: Array<{ name: string; what: string }> = []
    for (let s = 0; s < this.place.stages; s++) {
      for (let t = 0; t < this.place.tp; t++) needs.push({ name: shardFileName(s, this.place.stages, t, this.place.tp), what: `stage ${s}${this.place.tp > 1 ? ` (tensor rank ${t})` : ""}` })
    }
    return { step: this.#steps, holds: stageFilesOf(this.place), needs }
  }

  /** @internal This rank's stage as files: its shard (weights, optimizer state, steps) and the layout. */
  async stageFiles(): Promise<Record<string, Uint8Array>> {
    const files = await stageShardFiles(this.layout, this.place, this.#vars, this.stage.parts, this.optimizer, this.stage.frozen, this.#steps)
    files[LAYOUT_FILE] = new TextEncoder().encode(JSON.stringify(this.layout))
    return files
  }

  /** @internal Takes this rank's stage from a regroup's merged state (the replica furthest on). */
  async adoptStage(files: Readonly<Record<string, Uint8Array>>): Promise<void> {
    const step = await loadStageShard(this.#tf, files, this.layout, this.place, this.#vars, this.stage.parts, this.optimizer, this.stage.frozen)
    if (step !== undefined) this.#steps = step
  }

  async #trainStep(x: Tensor | null | undefined, y: Tensor | null | undefined, opts: { readonly batchSize?: number }): Promise<PipelineStepResult> {
    const tf = this.#tf
    const batch = this.#batchOf(x, y, opts)
    const sizes = microBatchSizes(batch, this.microBatches)
    const st: StepState = {
      x: x ?? undefined,
      y: y ?? undefined,
      batch,
      sizes,
      offsets: sizes.map((_, i) => sizes.slice(0, i).reduce((a, b) => a + b, 0)),
      stash: new Map(),
      acc: new Array(this.#vars.length).fill(undefined),
      sends: [],
      losses: [],
      corrects: [],
      lossSum: 0,
      correct: 0,
      waitMs: 0,
      forwardMs: 0,
      backwardMs: 0,
      stashBytes: 0,
      peakBytes: 0,
      peakMicro: 0,
      enginePeak: 0
    }
    const t0 = performance.now()
    try {
      await this.#runSchedule(st)
    } catch (e) {
      for (const entry of st.stash.values()) {
        for (const t of entry.inputs) t.dispose()
        entry.out?.dispose()
      }
      tf.dispose(st.acc.filter((t): t is Tensor => t !== undefined))
      tf.dispose([...st.losses, ...st.corrects])
      // A step cut short leaves the links mid-conversation: give them up, which fails the peers'
      // transfers in flight at once instead of at their deadline, and refuse further steps (with
      // recovery, until the regroup has made them again).
      this.#broken = true
      void this.#links.close().catch(() => {})
      throw e
    }
    const pipelineMs = performance.now() - t0
    const grads = st.acc.map((g, j) => g ?? tf.zerosLike(this.#vars[j]))
    const r0 = performance.now()
    let reduced: Tensor[]
    try {
      reduced = await this.#reduce(grads, batch)
    } catch (e) {
      this.#broken = true
      void this.#links.close().catch(() => {})
      throw e
    }
    const reduceMs = performance.now() - r0
    const a0 = performance.now()
    if (this.#vars.length > 0) this.optimizer.applyGradients(this.#vars.map((v, j) => ({ name: v.name, tensor: reduced[j] })))
    tf.dispose(reduced)
    const applyMs = performance.now() - a0
    this.#steps++
    const { waitMs, forwardMs, backwardMs } = st
    this.#timing = { pipelineMs, waitMs, bubble: pipelineMs > 0 ? waitMs / pipelineMs : 0, forwardMs, backwardMs, reduceMs, applyMs }
    this.#memory = { ...this.#memory, activationPeakBytes: st.peakBytes, peakInFlight: st.peakMicro, enginePeakBytes: st.enginePeak }
    return { loss: st.lossSum / batch, samples: batch, ...(this.#loss.classification ? { correct: st.correct } : {}) }
  }

  /** The batch's size, from x, y or opts.batchSize, and a ConfigError for what this stage lacks. */
  #batchOf(x: Tensor | null | undefined, y: Tensor | null | undefined, opts: { readonly batchSize?: number }): number {
    const B = x?.shape[0] ?? y?.shape[0] ?? opts.batchSize
    if (!(Number.isInteger(B) && (B as number) >= 1)) {
      throw new ConfigError({ field: "pipeline.trainStep", reason: `needs a batch: pass x (first stage), y (last stage), or { batchSize } (stages in between); got ${String(B)}` })
    }
    const batch = B as number
    if (this.isFirstStage && !x) throw new ConfigError({ field: "pipeline.trainStep", reason: "the first stage needs the batch's features x" })
    if (this.isLastStage && !y) throw new ConfigError({ field: "pipeline.trainStep", reason: "the last stage needs the batch's targets y" })
    for (const [name, t] of [["x", x], ["y", y]] as const) {
      if (t && t.shape[0] !== batch) throw new ConfigError({ field: "pipeline.trainStep", reason: `${name} has ${t.shape[0]} rows, the batch ${batch}` })
    }
    return batch
  }

  /** This stage's forward and backward ops of the schedule, then the batch's loss and correct count up the pipeline. */
  async #runSchedule(st: StepState): Promise<void> {
    const tf = this.#tf
    const links = this.#links
    for (const op of stageOps(this.schedule, this.place.stage, this.place.stages, st.sizes.length)) {
      const opStart = performance.now()
      const waitedBefore = st.waitMs
      if (op.kind === "F") await this.#forwardOp(st, op.micro)
      else await this.#backwardOp(st, op.micro)
      st.enginePeak = Math.max(st.enginePeak, tf.memory().numBytes)
      const busy = performance.now() - opStart - (st.waitMs - waitedBefore)
      if (op.kind === "F") st.forwardMs += busy
      else st.backwardMs += busy
    }
    // The batch's loss and correct count go back up the pipeline, behind the last gradients.
    if (this.isLastStage) await this.#readLoss(st)
    else {
      const meta = new Float32Array(2)
      await this.#recv(st, links.fromNext, meta)
      st.lossSum = meta[0]
      st.correct = meta[1]
    }
    if (!this.isFirstStage) this.#send(st, links.toPrev, Float32Array.of(st.lossSum, st.correct))
    await Promise.all(st.sends)
  }

  /** Micro-batch i's forward through this stage's blocks: its inputs stashed for the backward, its output sent on. */
  async #forwardOp(st: StepState, i: number): Promise<void> {
    const tf = this.#tf
    const n = st.sizes[i]
    const blocks = this.stage.blocks
    const last = this.isLastStage
    const fused = last && blocks.at(-1)?.backwardLoss !== undefined
    let h: Tensor
    if (this.isFirstStage) h = tf.slice(st.x as Tensor, st.offsets[i], n)
    else {
      const buf = new Float32Array(n * size(this.stage.inputShape))
      await this.#recv(st, this.#links.fromPrev, buf)
      h = tf.tensor(buf, [n, ...this.stage.inputShape])
    }
    const inputs: Tensor[] = []
    const upTo = fused ? blocks.length - 1 : blocks.length
    for (let k = 0; k < upTo; k++) {
      inputs.push(h)
      h = await blocks[k].forward(h)
    }
    const entry: StashEntry = { inputs, bytes: 0 }
    if (fused) inputs.push(h)
    else if (last) entry.out = h
    else {
      const data = (await h.data()) as Float32Array
      h.dispose()
      this.#send(st, this.#links.toNext, data)
    }
    entry.bytes = inputs.reduce((s, t) => s + t.size * 4, 0) + (entry.out ? entry.out.size * 4 : 0)
    st.stash.set(i, entry)
    st.stashBytes += entry.bytes
    st.peakBytes = Math.max(st.peakBytes, st.stashBytes)
    st.peakMicro = Math.max(st.peakMicro, st.stash.size)
  }

  /** Micro-batch i's backward: the loss on the last stage (or the gradient from the next), then back through the blocks. */
  async #backwardOp(st: StepState, i: number): Promise<void> {
    const tf = this.#tf
    const n = st.sizes[i]
    const blocks = this.stage.blocks
    const first = this.isFirstStage
    const entry = st.stash.get(i)
    if (!entry) throw new Error(`schedule ran the backward of micro-batch ${i} before its forward`)
    let dy: Tensor | undefined
    let k = blocks.length - 1
    if (this.isLastStage) {
      const r = this.#lossBackward(st, i, entry)
      dy = r.dy
      k = r.k
    } else {
      const buf = new Float32Array(n * size(this.stage.outputShape))
      await this.#recv(st, this.#links.fromNext, buf)
      dy = tf.tensor(buf, [n, ...this.stage.outputShape])
    }
    for (; k >= 0; k--) {
      const r = await blocks[k].backward(entry.inputs[k], dy!, k > 0 || !first)
      dy!.dispose()
      this.#addGrads(st, k, r.grads)
      dy = r.dx
    }
    if (!first) {
      const data = (await dy!.data()) as Float32Array
      this.#send(st, this.#links.toPrev, data)
    }
    dy?.dispose()
    for (const t of entry.inputs) t.dispose()
    entry.out?.dispose()
    st.stashBytes -= entry.bytes
    st.stash.delete(i)
  }

  /**
   * The last stage's loss on micro-batch i and its gradient: through the last block's fused
   * backwardLoss when it has one (then the blocks left start one lower), else through the output.
   */
  #lossBackward(st: StepState, i: number, entry: StashEntry): { dy: Tensor | undefined; k: number } {
    const tf = this.#tf
    const blocks = this.stage.blocks
    const lastBlock = blocks.at(-1)
    let k = blocks.length - 1
    const yi = tf.slice(st.y as Tensor, st.offsets[i], st.sizes[i])
    const lossOf = (out: Tensor): Scalar => tf.mul(this.#loss.fn(yi, out), st.sizes[i] / st.batch) as Scalar
    try {
      if (lastBlock?.backwardLoss !== undefined) {
        const r = lastBlock.backwardLoss(entry.inputs[k], lossOf, k > 0 || !this.isFirstStage, this.#loss.classification)
        st.losses.push(r.value)
        if (r.out) {
          st.corrects.push(this.#countCorrect(r.out, yi))
          r.out.dispose()
        }
        this.#addGrads(st, k, r.grads)
        k--
        return { dy: r.dx, k }
      }
      const out = entry.out!
      const { value, grads } = tf.engine().gradients(() => lossOf(out), [out])
      st.losses.push(value)
      if (this.#loss.classification) st.corrects.push(this.#countCorrect(out, yi))
      return { dy: grads[0], k }
    } finally {
      yi.dispose()
    }
  }

  /** A block's gradients added to the step's (the first ones kept as they are). */
  #addGrads(st: StepState, k: number, grads: ReadonlyArray<Tensor>): void {
    const base = this.#blockVarStart[k]
    for (const [j, g] of grads.entries()) {
      const prev = st.acc[base + j]
      if (prev) {
        st.acc[base + j] = this.#tf.add(prev, g)
        prev.dispose()
        g.dispose()
      } else st.acc[base + j] = g
    }
  }

  /** The rows of `out` whose arg max is the label's (a scalar, read with the losses). */
  #countCorrect(out: Tensor, yi: Tensor): Tensor {
    return countCorrect(this.#tf, out, yi)
  }

  /**
   * The last stage's batch loss and correct count, read back once per step (asynchronously: a GPU
   * backend has no synchronous read in Node, and one read of two sums waits less than one per micro-batch).
   */
  async #readLoss(st: StepState): Promise<void> {
    const tf = this.#tf
    const [loss, correct] = tf.tidy(() => [
      st.losses.length > 0 ? tf.addN(st.losses) : tf.scalar(0),
      st.corrects.length > 0 ? tf.addN(st.corrects.map((c) => c.toFloat())) : tf.scalar(0)
    ])
    tf.dispose([...st.losses, ...st.corrects])
    st.losses.length = 0
    st.corrects.length = 0
    try {
      const [l, c] = await Promise.all([loss!.data(), correct!.data()])
      st.lossSum = l[0]! * st.batch
      st.correct = c[0]!
    } finally {
      tf.dispose([loss!, correct!])
    }
  }

  /** Sends on a link without waiting (the step awaits them all at its end). */
  #send(st: StepState, ch: { send(b: Float32Array): Promise<void> } | undefined, buf: Float32Array): void {
    const p = ch!.send(buf)
    p.catch(() => {})
    st.sends.push(p)
  }

  /** Receives from a link, the wait counted as the pipeline's bubble. */
  async #recv(st: StepState, ch: { recv(b: Float32Array): Promise<void> } | undefined, buf: Float32Array): Promise<void> {
    const w = performance.now()
    await ch!.recv(buf)
    st.waitMs += performance.now() - w
  }

  /** The stage's gradients averaged over its replicas (weighted by their batches): one flat all-reduce. */
  async #reduce(grads: Tensor[], batch: number): Promise<Tensor[]> {
    const tf = this.#tf
    const group = this.#links.replicas
    if (group.size === 1 || grads.length === 0) return grads
    // Concatenated on the device, read once; the reduced values go back as views of the same buffer.
    const flatT = tf.tidy(() => tf.concat(grads.map((g) => g.reshape([-1]))))
    tf.dispose(grads)
    const flat = (await flatT.data()) as Float32Array
    flatT.dispose()
    await group.weightedMean(flat, batch)
    const out: Tensor[] = []
    let o = 0
    for (const v of this.#vars) {
      out.push(tf.tensor(flat.subarray(o, o + v.size), v.shape))
      o += v.size
    }
    return out
  }

  /**
   * Loss (and accuracy) of the model on `x`/`y`, every stage taking part (a forward-only pass in
   * batches of `batchSize`); replica 0 computes, every rank gets the result.
   */
  async evaluate(x: Tensor | null | undefined, y: Tensor | null | undefined, opts: { readonly batchSize?: number; readonly rows?: number } = {}): Promise<{ loss: number; accuracy?: number }> {
    this.#check()
    const rows = x?.shape[0] ?? y?.shape[0] ?? opts.rows
    if (!(Number.isInteger(rows) && (rows as number) >= 1)) throw new ConfigError({ field: "pipeline.evaluate", reason: "needs x (first stage), y (last stage) or { rows } (stages in between)" })
    if (this.isFirstStage && !x) throw new ConfigError({ field: "pipeline.evaluate", reason: "the first stage needs x" })
    if (this.isLastStage && !y) throw new ConfigError({ field: "pipeline.evaluate", reason: "the last stage needs y" })
    // Skipped by a replacement replaying the loop, or made by the survivors without this rank: no figures.
    const none = () => ({ loss: Number.NaN, ...(this.#loss.classification ? { accuracy: Number.NaN } : {}) })
    return this.#operation(() => this.#evaluate(x, y, rows as number, opts.batchSize ?? 256), none)
  }

  async #evaluate(x: Tensor | null | undefined, y: Tensor | null | undefined, rows: number, bs: number): Promise<{ loss: number; accuracy?: number }> {
    const tf = this.#tf
    let lossSum = 0
    let correct = 0
    const mine = this.place.replica === 0
    if (mine) {
      for (let off = 0; off < rows; off += bs) {
        const n = Math.min(bs, rows - off)
        let h: Tensor
        if (this.isFirstStage) h = tf.slice(x as Tensor, off, n)
        else {
          const buf = new Float32Array(n * size(this.stage.inputShape))
          await this.#links.fromPrev!.recv(buf)
          h = tf.tensor(buf, [n, ...this.stage.inputShape])
        }
        for (const b of this.stage.blocks) {
          const next = await b.forward(h)
          h.dispose()
          h = next
        }
        if (this.isLastStage) {
          const yi = tf.slice(y as Tensor, off, n)
          const l = tf.tidy(() => this.#loss.fn(yi, h))
          lossSum += (await l.data())[0]! * n
          l.dispose()
          if (this.#loss.classification) {
            const c = this.#countCorrect(h, yi)
            correct += (await c.data())[0]!
            c.dispose()
          }
          yi.dispose()
          h.dispose()
        } else {
          const data = (await h.data()) as Float32Array
          h.dispose()
          await this.#links.toNext!.send(data)
        }
      }
    }
    // Only one rank holds the answer: replica 0's last stage, tensor rank 0.
    const sums = new Float32Array(2)
    if (mine && this.isLastStage && this.place.tpRank === 0) sums.set([lossSum, correct])
    await this.#links.world.sum(sums)
    return { loss: sums[0] / (rows as number), ...(this.#loss.classification ? { accuracy: sums[1] / (rows as number) } : {}) }
  }

  /**
   * Trains `epochs - initialEpoch` epochs on an in-memory dataset: each replica takes its shard
   * (reshuffled per epoch, as ctx.getDatasetShard), every stage of a replica the same rows (the
   * first stage their features, the last their targets), batches of `batchSize`. Metrics are
   * over every replica's samples.
   */
  async fit(source: PipelineSource, opts: PipelineFitOptions): Promise<PipelineEpochResult[]> {
    this.#check()
    const tf = this.#tf
    const ds: ArrayDataset = "dataset" in source ? source.dataset : source
    const seed = opts.seed ?? ("dataset" in source ? source.seed : undefined) ?? this.#seed
    if (!ds || !(ds.x instanceof Float32Array)) {
      throw new ConfigError({ field: "pipeline.fit", reason: "takes an in-memory dataset (ctx.getDatasetShard of arrays, or makeDataset(...)); with streamed data call pp.trainStep() per batch" })
    }
    if (!(Number.isInteger(opts.batchSize) && opts.batchSize >= 1)) throw new ConfigError({ field: "pipeline.fit.batchSize", reason: `must be an integer >= 1, got ${opts.batchSize}` })
    // dp.fit's options a pipeline does not take: refused, not ignored
    for (const k of ["classWeight", "accumulationSteps", "globalBatchSize"]) {
      if ((opts as unknown as Record<string, unknown>)[k] !== undefined) {
        throw new ConfigError({ field: `pipeline.fit.${k}`, reason: `is dp.fit's; a pipelined model's fit takes epochs, batchSize (each replica's), initialEpoch, seed, onStep and onEpochEnd` })
      }
    }
    const numClasses = ds.numClasses || (this.stage.outputShape.at(-1) ?? 1)
    const transforms = "dataset" in source ? (source.transforms ?? []) : []
    const out: PipelineEpochResult[] = []
    for (let epoch = opts.initialEpoch ?? 0; epoch < opts.epochs; epoch++) {
      const started = performance.now()
      const rows = shardIndices(ds.size, this.place.replica, this.place.replicas, seed, epoch)
      const steps = Math.ceil(rows.length / opts.batchSize)
      let lossSum = 0
      let correct = 0
      let samples = 0
      for (let s = 0; s < steps; s++) {
        const idx = rows.subarray(s * opts.batchSize, Math.min(rows.length, (s + 1) * opts.batchSize))
        // Only what this stage needs is gathered: features on the first stage, targets on the last.
        // (the shard's map transforms run on every stage that gathers, in order, as dp.fit runs them)
        let g: Batch | undefined
        if (this.isFirstStage || this.isLastStage) {
          const rowsOf = gatherRows(ds, idx)
          g = { x: rowsOf.x, y: rowsOf.y, n: idx.length, featureShape: ds.featureShape, labelShape: ds.labelShape ?? [] }
          for (const t of transforms) g = t(g)
        }
        const x = this.isFirstStage ? tf.tensor(g!.x, [idx.length, ...g!.featureShape]) : undefined
        let y: Tensor | undefined
        if (this.isLastStage) {
          const b = g!
          y = tf.tidy(() => {
            if (b.y instanceof Int32Array && b.labelShape.length === 0) return this.lossTargets(tf.tensor1d(b.y, "int32"), numClasses)
            return tf.tensor(b.y, [idx.length, ...(b.labelShape.length > 0 ? b.labelShape : [1])], "float32")
          })
        }
        try {
          const r = await this.#step(x, y, { batchSize: idx.length })
          // (a step a replacement skips, or one made by the survivors without this rank, has no samples)
          if (r.samples > 0) {
            lossSum += r.loss * r.samples
            correct += r.correct ?? 0
            samples += r.samples
            this.#progress?.({ epoch, step: s, stepsPerEpoch: steps, samples: r.samples, loss: r.loss })
          }
          await opts.onStep?.({ ...r, epoch, index: s, steps })
        } finally {
          x?.dispose()
          y?.dispose()
        }
      }
      // Every replica's sums; one rank per replica contributes (its stages know the same sums).
      const sums = new Float32Array(3)
      if (this.place.stage === 0 && this.place.tpRank === 0) sums.set([lossSum, correct, samples])
      await this.#operation(() => this.#links.world.sum(sums), () => sums.fill(0))
      const r: PipelineEpochResult = {
        epoch,
        loss: sums[2] > 0 ? sums[0] / sums[2] : Number.NaN,
        ...(this.#loss.classification ? { accuracy: sums[2] > 0 ? sums[1] / sums[2] : 0 } : {}),
        samples: sums[2],
        steps,
        seconds: (performance.now() - started) / 1000
      }
      out.push(r)
      await opts.onEpochEnd?.(r)
    }
    return out
  }

  /** This rank's checkpoint files: its stage's weights and optimizer state (replica 0 only; the others hold copies). */
  async shardFiles(): Promise<Record<string, Uint8Array>> {
    if (this.place.replica !== 0) return {}
    return stageShardFiles(this.layout, this.place, this.#vars, this.stage.parts, this.optimizer, this.stage.frozen, this.#steps)
  }

  /** Loads this rank's stage from a checkpoint of the same layout (any replica loads replica 0's shard). */
  async restore(files: Readonly<Record<string, Uint8Array>>): Promise<void> {
    const step = await loadStageShard(this.#tf, files, this.layout, this.place, this.#vars, this.stage.parts, this.optimizer, this.stage.frozen)
    if (step !== undefined) this.#steps = step
  }

  /** Gives up this rank's links (the loop ended). */
  async close(): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    await this.#links.close()
  }
}
