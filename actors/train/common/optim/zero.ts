// ZeRO stage 1 and 2 (Rajbhandari et al. 2020) on the flat parameter vector: rank r of p owns the
// r-th of p equal segments of it (the vector padded with zeros to a multiple of p, so every
// rank's segment has the same length S = ceil(N / p) and the all-gather needs no sizes), keeps
// the optimizer state of that segment only (Adam's two moments: 2N/p floats instead of 2N),
// updates it from the reduced gradient of the segment, and the updated segments are all-gathered
// into the full parameters every rank loads into its model.
//   stage 1: the gradients are all-reduced (any compression), each rank reads its segment of the result;
//   stage 2: the gradients are reduce-scattered, so each rank receives only its segment's reduced
//            gradient: the same bytes on the wire as one all-reduce (reduce-scatter + all-gather).
// The state is saved per shard, one checkpoint file per rank (shardFileName), and a restore at
// another world size re-shards it: each new rank copies the ranges of the old shards it now owns.
import { ConfigError } from "../../../../core/errors.ts"
import { decodeMessage, encodeMessage } from "../../../../core/wire.ts"
import { createFlatOptimizer, flatOptimizerSlots, type FlatOptimizer, type FlatOptimizerSpec, type FlatOptimizerState } from "./flat-optimizers.ts"

export type ZeroStage = 0 | 1 | 2

/** Where rank `rank`'s segment of an N-element vector over p ranks lies. */
export interface ShardLayout {
  readonly total: number
  readonly worldSize: number
  readonly rank: number
  /** Every rank's segment length (the padded vector is shardSize * worldSize long). */
  readonly shardSize: number
  readonly start: number
  /** End of the real elements (the last ranks' segments may run into the padding). */
  readonly end: number
}

export const shardLayout = (total: number, worldSize: number, rank: number): ShardLayout => {
  const shardSize = Math.ceil(total / worldSize)
  const start = Math.min(total, rank * shardSize)
  return { total, worldSize, rank, shardSize, start, end: Math.min(total, start + shardSize) }
}

export const shardFileName = (rank: number, worldSize: number): string => `optimizer.shard-${rank}-of-${worldSize}.msgpack`
const SHARD_FILE = /^optimizer\.shard-(\d+)-of-(\d+)\.msgpack$/

/** One rank's saved shard: its range of the flat vector and the optimizer state of that range. */
export interface SavedShard {
  readonly format: 1
  readonly stage: ZeroStage
  readonly kind: string
  readonly total: number
  readonly worldSize: number
  readonly rank: number
  readonly start: number
  readonly end: number
  readonly slots: Readonly<Record<string, Float32Array>>
  readonly scalars: Readonly<Record<string, number>>
}

/** Whether a checkpoint holds sharded optimizer state. */
export const hasShards = (files: Readonly<Record<string, unknown>>): boolean => Object.keys(files).some((f) => SHARD_FILE.test(f))

/**
 * The shards of a checkpoint, checked to be one complete set (every rank of one world size, same
 * optimizer, same parameter count): a ConfigError saying what is missing or differs otherwise.
 */
export const readShards = (files: Readonly<Record<string, Uint8Array>>, expect: { readonly kind: string; readonly total: number }): SavedShard[] => {
  const names = Object.keys(files).filter((f) => SHARD_FILE.test(f))
  const sizes = new Set(names.map((f) => Number(SHARD_FILE.exec(f)![2])))
  const fail = (reason: string): never => {
    throw new ConfigError({ field: "checkpoint", reason: `its sharded optimizer state (ZeRO) ${reason}` })
  }
  if (sizes.size !== 1) fail(`must come from one world size, found shards of ${[...sizes].join(", ")} ranks`)
  const p = [...sizes][0]!
  const shards: SavedShard[] = []
  for (let r = 0; r < p; r++) {
    const bytes = files[shardFileName(r, p)]
    if (!bytes) fail(`is incomplete: ${shardFileName(r, p)} is missing (of ${p} shards); every rank adds its shard to the reports, so keep the checkpoint's files together`)
    const s = decodeMessage(bytes!) as SavedShard
    if (s.kind !== expect.kind) fail(`was saved by a "${s.kind}" optimizer; this model's optimizer is "${expect.kind}": compile the model with the same optimizer to resume`)
    if (s.total !== expect.total) fail(`covers ${s.total} parameters; this model has ${expect.total}: build the same model to resume`)
    const want = shardLayout(s.total, p, r)
    if (s.start !== want.start || s.end !== want.end) fail(`shard ${r} covers [${s.start}, ${s.end}), expected [${want.start}, ${want.end})`)
    shards.push(s)
  }
  return shards
}

/**
 * Elements [start, end) of a vector saved in parts, each covering [part.start, part.end): the
 * overlapping ranges copied into a new array (what re-sharding and re-cutting server state do).
 */
export const gatherRange = (parts: ReadonlyArray<{ readonly start: number; readonly end: number; readonly data: Float32Array }>, start: number, end: number): Float32Array => {
  const out = new Float32Array(end - start)
  for (const p of parts) {
    const lo = Math.max(p.start, start)
    const hi = Math.min(p.end, end)
    if (hi > lo) out.set(p.data.subarray(lo - p.start, hi - p.start), lo - start)
  }
  return out
}

/**
 * The optimizer state of `layout`'s range assembled from saved shards of any world size (the
 * same world size: this rank's own shard, copied). Slots are `layout.end - layout.start` long.
 */
export const reshard = (shards: ReadonlyArray<SavedShard>, layout: ShardLayout): FlatOptimizerState => {
  const first = shards[0]!
  const slots: Record<string, Float32Array> = {}
  for (const name of Object.keys(first.slots)) {
    slots[name] = gatherRange(shards.map((s) => ({ start: s.start, end: s.end, data: s.slots[name]! })), layout.start, layout.end)
  }
  return { kind: first.kind as FlatOptimizerState["kind"], slots, scalars: { ...first.scalars } }
}

/**
 * This rank's part of ZeRO: the master copy of its parameter segment, the optimizer state of that
 * segment, and the buffers the segment's reduce-scatter and the parameters' all-gather use.
 */
export class ZeroShard {
  readonly stage: 1 | 2
  readonly layout: ShardLayout
  readonly optimizer: FlatOptimizer
  /** This rank's segment of the parameters, padded to shardSize (what the all-gather sends). */
  readonly segment: Float32Array
  /** The real elements of the segment (a view). */
  readonly params: Float32Array
  #gathered: Float32Array | undefined
  #gradients: Float32Array | undefined

  constructor(stage: 1 | 2, spec: FlatOptimizerSpec, total: number, rank: number, worldSize: number) {
    this.stage = stage
    this.layout = shardLayout(total, worldSize, rank)
    this.segment = new Float32Array(this.layout.shardSize)
    this.params = this.segment.subarray(0, this.layout.end - this.layout.start)
    this.optimizer = createFlatOptimizer(spec, this.params.length)
  }

  /** Takes this rank's segment of the full flat parameters (after the start-up broadcast, or a restore). */
  loadParams(flat: Float32Array): void {
    this.params.set(flat.subarray(this.layout.start, this.layout.end))
  }

  /**
   * The full padded parameter vector the all-gather fills. Stage 2 gathers into its gradient
   * buffer: by then the segment's reduced gradient has been applied and the rest holds nothing
   * needed. Stage 1 has a buffer of its own (allocated once).
   */
  get gathered(): Float32Array {
    if (this.stage === 2) return this.gradients
    return (this.#gathered ??= new Float32Array(this.layout.shardSize * this.layout.worldSize))
  }

  /** Stage 2: the padded local gradient the reduce-scatter works on (allocated once). */
  get gradients(): Float32Array {
    return (this.#gradients ??= new Float32Array(this.layout.shardSize * this.layout.worldSize))
  }

  /** Applies the optimizer to the segment from its reduced gradient (`end - start` elements). */
  update(grad: Float32Array, learningRate: number | undefined, weightDecay: number): void {
    if (learningRate !== undefined) this.optimizer.learningRate = learningRate
    this.optimizer.step(this.params, grad.subarray(0, this.params.length), weightDecay)
  }

  /** This rank's checkpoint file: its range and the optimizer state of it. */
  shardFile(): { readonly name: string; readonly bytes: Uint8Array } {
    const st = this.optimizer.state()
    const saved: SavedShard = {
      format: 1,
      stage: this.stage,
      kind: st.kind,
      total: this.layout.total,
      worldSize: this.layout.worldSize,
      rank: this.layout.rank,
      start: this.layout.start,
      end: this.layout.end,
      slots: st.slots,
      scalars: st.scalars
    }
    return { name: shardFileName(this.layout.rank, this.layout.worldSize), bytes: encodeMessage(saved) }
  }

  /** Loads the state of this rank's range from a checkpoint's shards (re-sharded when their world size differs). */
  loadShards(files: Readonly<Record<string, Uint8Array>>): void {
    const shards = readShards(files, { kind: this.optimizer.spec.kind, total: this.layout.total })
    this.optimizer.load(reshard(shards, this.layout))
  }

  /** Loads this rank's range of a whole flat optimizer state (converted from a stage-0 checkpoint). */
  loadWhole(state: FlatOptimizerState): void {
    const whole: SavedShard = { format: 1, stage: this.stage, kind: state.kind, total: this.layout.total, worldSize: 1, rank: 0, start: 0, end: this.layout.total, slots: state.slots, scalars: state.scalars }
    this.optimizer.load(reshard([whole], this.layout))
  }

  /** Bytes held across steps: optimizer state, and the buffers of the segment, the gather and (stage 2) the gradients. */
  memory(): { readonly optimizerState: number; readonly parameterBuffers: number; readonly gradientBuffers: number } {
    return {
      optimizerState: this.optimizer.stateBytes(),
      parameterBuffers: this.segment.byteLength + (this.#gathered?.byteLength ?? 0),
      gradientBuffers: this.#gradients?.byteLength ?? 0
    }
  }
}

export { flatOptimizerSlots }
