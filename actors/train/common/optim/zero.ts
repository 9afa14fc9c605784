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
// Recovery from peers: each rank also keeps a replica of the shard of rank r - d mod p (its
// "predecessor" at distance d, replicaOffset: 1 on one node; on several, a distance that puts every
// replica on another node than its shard where the layout allows, so a lost node loses no shard),
// updated from the same reduced gradient with the same code, so bit for bit the same as the
// owner's: at stage 1 from the all-reduced gradient every rank has (no cost on the wire), at stage
// 2 from the predecessor's segment of it, which each rank sends to rank r + d after the
// reduce-scatter (Communicator.shift: N/p elements a rank, a step). A regroup collects every survivor's shard and
// replica (mergePeerShards): one lost rank, or several that are not d apart (a whole node's ranks,
// where d spans nodes), leave a complete set, which the new group re-shards as a restore does, its
// parameters included. A group that
// broke in a step's all-gather has survivors a step apart: those behind are brought level with the
// step's reduced gradient a survivor that made it hands over (STEP_GRADIENT_FILE).
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

/**
 * A regroup's file from a survivor that had updated its shards for a step the group broke in (in
 * the step's all-gather): that step's whole reduced gradient and rate, with which the shards of
 * survivors that had not (still in the step's all-reduce) are brought to the same step.
 */
export const STEP_GRADIENT_FILE = "optimizer.step-gradient.msgpack"
/** Stage 2: one segment's reduced gradient of the step in flight, from a rank that had not applied it (its range's start in the name). */
const segmentGradientFile = (start: number): string => `optimizer.step-gradient-${start}.msgpack`
const STEP_GRADIENT = /^optimizer\.step-gradient(-\d+)?\.msgpack$/
interface StepGradient {
  /** The optimizer step the gradient makes (the updated shards' step scalar). */
  readonly step: number
  /** Where `gradient` starts in the flat vector (absent: 0, the whole vector). */
  readonly start?: number
  readonly gradient: Float32Array
  readonly learningRate: number
  readonly weightDecay: number
}

/** The step gradient among `gradients` that covers a shard's range, if any. */
const covering = (gradients: ReadonlyArray<StepGradient>, s: { readonly start: number; readonly end: number }): StepGradient | undefined =>
  gradients.find((g) => (g.start ?? 0) <= s.start && (g.start ?? 0) + g.gradient.length >= s.end)
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
  /** The parameters of the range (a survivor's shard in a regroup; checkpoints keep them in the model's weights). */
  readonly params?: Float32Array
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
  /** With `replica`: the predecessor's range, its parameters and optimizer state. */
  readonly #replica: { readonly layout: ShardLayout; readonly params: Float32Array; readonly optimizer: FlatOptimizer } | undefined
  #predecessorGradient: Float32Array | undefined

  constructor(stage: 1 | 2, spec: FlatOptimizerSpec, total: number, rank: number, worldSize: number, options: { readonly replica?: boolean; readonly replicaOffset?: number } = {}) {
    this.stage = stage
    this.layout = shardLayout(total, worldSize, rank)
    this.segment = new Float32Array(this.layout.shardSize)
    this.params = this.segment.subarray(0, this.layout.end - this.layout.start)
    this.optimizer = createFlatOptimizer(spec, this.params.length)
    if (options.replica && worldSize > 1) {
      const d = options.replicaOffset ?? 1
      if (!Number.isInteger(d) || d < 1 || d >= worldSize) {
        throw new ConfigError({ field: "zero.replicaOffset", reason: `must be an integer in [1, ${worldSize - 1}] (the distance to the rank whose shard this one keeps), got ${String(d)}` })
      }
      this.replicaOffset = d
      const layout = shardLayout(total, worldSize, (rank + worldSize - d) % worldSize)
      const n = layout.end - layout.start
      this.#replica = { layout, params: new Float32Array(n), optimizer: createFlatOptimizer(spec, n) }
    }
  }

  /** With a replica: the distance d to the rank whose shard this one keeps (r - d), and to the one that keeps this rank's (r + d). */
  readonly replicaOffset: number = 1

  /** Whether this rank keeps its predecessor's shard too. */
  get replicated(): boolean {
    return this.#replica !== undefined
  }

  /** Takes this rank's segment (and its replica's) of the full flat parameters (after the start-up broadcast, or a restore). */
  loadParams(flat: Float32Array): void {
    this.params.set(flat.subarray(this.layout.start, this.layout.end))
    const r = this.#replica
    if (r) r.params.set(flat.subarray(r.layout.start, r.layout.end))
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

  /** Stage 2 with a replica: where the predecessor's padded segment of the reduced gradient arrives (allocated once). */
  get predecessorGradient(): Float32Array {
    return (this.#predecessorGradient ??= new Float32Array(this.layout.shardSize))
  }

  /** Stage 2: the replica's update, from the predecessor's segment of the reduced gradient, as its owner makes it. */
  updateReplicaSegment(segment: Float32Array, learningRate: number | undefined, weightDecay: number): void {
    const r = this.#replica
    if (!r) return
    if (learningRate !== undefined) r.optimizer.learningRate = learningRate
    r.optimizer.step(r.params, segment.subarray(0, r.params.length), weightDecay)
  }

  /** Stage 1: the replica's update, from the whole reduced gradient, as its owner makes it. */
  updateReplica(full: Float32Array, learningRate: number | undefined, weightDecay: number): void {
    const r = this.#replica
    if (!r) return
    if (learningRate !== undefined) r.optimizer.learningRate = learningRate
    r.optimizer.step(r.params, full.subarray(r.layout.start, r.layout.end), weightDecay)
  }

  /** This rank's checkpoint file: its range and the optimizer state of it. */
  shardFile(): { readonly name: string; readonly bytes: Uint8Array } {
    return { name: shardFileName(this.layout.rank, this.layout.worldSize), bytes: encodeMessage(this.#saved(this.layout, this.optimizer)) }
  }

  /**
   * A regroup's files of this survivor: its shard and its replica, each with its parameters, and,
   * when it has updated them for a step in flight (`applied`: that step's whole reduced gradient
   * and weight decay), the gradient that brings survivors still behind it to the same step.
   */
  peerFiles(
    applied?: { readonly gradient?: Float32Array; readonly weightDecay: number },
    reduced?: { readonly segment: Float32Array; readonly predecessor?: Float32Array; readonly learningRate: number | undefined; readonly weightDecay: number }
  ): Record<string, Uint8Array> {
    const own = { [shardFileName(this.layout.rank, this.layout.worldSize)]: encodeMessage(this.#saved(this.layout, this.optimizer, this.params)) }
    const r = this.#replica
    const files = r ? { ...own, [shardFileName(r.layout.rank, r.layout.worldSize)]: encodeMessage(this.#saved(r.layout, r.optimizer, r.params)) } : own
    if (reduced && !applied) {
      // Stage 2, between the reduction and this rank's update: its segment's and its predecessor's
      // reduced gradient bring its shard and replica level where the others made the step.
      const step = this.optimizer.state().scalars.step! + 1
      const learningRate = reduced.learningRate ?? this.optimizer.learningRate
      const segments: Array<[ShardLayout, Float32Array]> = [[this.layout, reduced.segment], ...(r && reduced.predecessor ? [[r.layout, reduced.predecessor] as [ShardLayout, Float32Array]] : [])]
      const out: Record<string, Uint8Array> = { ...files }
      for (const [l, seg] of segments) {
        const g: StepGradient = { step, start: l.start, gradient: seg.subarray(0, l.end - l.start), learningRate, weightDecay: reduced.weightDecay }
        out[segmentGradientFile(l.start)] = encodeMessage(g)
      }
      return out
    }
    if (!applied?.gradient) return files
    const g: StepGradient = { step: this.optimizer.state().scalars.step!, gradient: applied.gradient, learningRate: this.optimizer.learningRate, weightDecay: applied.weightDecay }
    return { ...files, [STEP_GRADIENT_FILE]: encodeMessage(g) }
  }

  #saved(layout: ShardLayout, optimizer: FlatOptimizer, params?: Float32Array): SavedShard {
    const st = optimizer.state()
    return {
      format: 1,
      stage: this.stage,
      kind: st.kind,
      total: layout.total,
      worldSize: layout.worldSize,
      rank: layout.rank,
      start: layout.start,
      end: layout.end,
      slots: st.slots,
      scalars: st.scalars,
      ...(params ? { params } : {})
    }
  }

  /** Loads the state of this rank's range (and its replica's) from a checkpoint's shards (re-sharded when their world size differs). */
  loadShards(files: Readonly<Record<string, Uint8Array>>): void {
    this.#loadFrom(readShards(files, { kind: this.optimizer.spec.kind, total: this.layout.total }))
  }

  /**
   * A regroup's merged shards (mergePeerShards): the optimizer state and the parameters of this
   * rank's range and its replica's, re-sharded; returns the whole parameter vector they hold.
   */
  loadPeerShards(files: Readonly<Record<string, Uint8Array>>): Float32Array {
    const saved = readShards(files, { kind: this.optimizer.spec.kind, total: this.layout.total })
    const gradients = Object.entries(files)
      .filter(([name]) => STEP_GRADIENT.test(name))
      .map(([, bytes]) => decodeMessage(bytes) as StepGradient)
    // Shards one step behind: the step their owners had yet to make, made here as they would have.
    const shards = saved.map((s) => {
      const g = covering(gradients, s)
      return g && s.scalars.step === g.step - 1 && s.params ? this.#stepped(s, g) : s
    })
    const missing = shards.find((s) => !s.params)
    if (missing) throw new ConfigError({ field: "peer state", reason: `shard ${missing.rank} of ${missing.worldSize} came without its parameters` })
    const full = gatherRange(shards.map((s) => ({ start: s.start, end: s.end, data: s.params! })), 0, this.layout.total)
    this.#loadFrom(shards)
    this.loadParams(full)
    return full
  }

  #stepped(s: SavedShard, g: StepGradient): SavedShard {
    const opt = createFlatOptimizer(this.optimizer.spec, s.end - s.start)
    opt.load({ kind: s.kind as FlatOptimizerState["kind"], slots: s.slots, scalars: s.scalars })
    opt.learningRate = g.learningRate
    const params = s.params!.slice()
    const at = g.start ?? 0
    opt.step(params, g.gradient.subarray(s.start - at, s.end - at), g.weightDecay)
    const st = opt.state()
    return { ...s, slots: st.slots, scalars: st.scalars, params }
  }

  #loadFrom(shards: ReadonlyArray<SavedShard>): void {
    this.optimizer.load(reshard(shards, this.layout))
    const r = this.#replica
    if (r) r.optimizer.load(reshard(shards, r.layout))
  }

  /** Loads this rank's range of a whole flat optimizer state (converted from a stage-0 checkpoint). */
  loadWhole(state: FlatOptimizerState): void {
    const whole: SavedShard = { format: 1, stage: this.stage, kind: state.kind, total: this.layout.total, worldSize: 1, rank: 0, start: 0, end: this.layout.total, slots: state.slots, scalars: state.scalars }
    this.#loadFrom([whole])
  }

  /** Bytes held across steps: optimizer state, and the buffers of the segment, the gather and (stage 2) the gradients. */
  memory(): { readonly optimizerState: number; readonly parameterBuffers: number; readonly gradientBuffers: number } {
    const r = this.#replica
    return {
      optimizerState: this.optimizer.stateBytes() + (r?.optimizer.stateBytes() ?? 0),
      parameterBuffers: this.segment.byteLength + (this.#gathered?.byteLength ?? 0) + (r?.params.byteLength ?? 0),
      gradientBuffers: (this.#gradients?.byteLength ?? 0) + (this.#predecessorGradient?.byteLength ?? 0)
    }
  }
}

/**
 * The distance d at which each rank keeps a replica of rank r - d's shard, from the group's node of
 * each rank: the d in [1, p - 1] that puts the most replicas on another node than their shards
 * (every one, for ranks laid out in equal blocks per node: d = a node's ranks), the smallest such;
 * 1 on one node (or p < 2).
 */
export const replicaOffset = (nodes: ReadonlyArray<string>): number => {
  const p = nodes.length
  let best = 1
  let bestApart = -1
  for (let d = 1; d < p; d++) {
    let apart = 0
    for (let r = 0; r < p; r++) if (nodes[r] !== nodes[(r + d) % p]) apart++
    if (apart > bestApart) {
      best = d
      bestApart = apart
    }
  }
  return best
}

/**
 * A regroup's shards: every survivor's own shard and replica (ZeroShard.peerFiles; undefined for a
 * survivor without), checked to make one complete set of one world size at one optimizer step.
 * Returns the set's files, or why the survivors cannot make one (the run then restarts from the
 * checkpoint, with that reason).
 */
export const mergePeerShards = (
  perSurvivor: ReadonlyArray<Readonly<Record<string, Uint8Array>> | undefined>
): { readonly files: Record<string, Uint8Array> } | { readonly reason: string } => {
  const byName = new Map<string, { bytes: Uint8Array; shard: SavedShard }>()
  const gradients = new Map<string, { bytes: Uint8Array; gradient: StepGradient }>()
  for (const files of perSurvivor) {
    if (!files) return { reason: "a survivor holds no ZeRO shard to hand over" }
    for (const [name, bytes] of Object.entries(files)) {
      if (STEP_GRADIENT.test(name)) {
        if (!gradients.has(name)) gradients.set(name, { bytes, gradient: decodeMessage(bytes) as StepGradient })
        continue
      }
      if (!SHARD_FILE.test(name)) continue
      // A shard and its replica: the newer copy (its holder made the step in flight, the other not).
      const shard = decodeMessage(bytes) as SavedShard
      const held = byName.get(name)
      if (!held || shard.scalars.step! > held.shard.scalars.step!) byName.set(name, { bytes, shard })
    }
  }
  const all = [...byName.values()]
  const sizes = new Set(all.map((s) => s.shard.worldSize))
  if (sizes.size !== 1) return { reason: `the survivors' ZeRO shards come from ${sizes.size === 0 ? "no" : "different"} world sizes` }
  const p = [...sizes][0]!
  const lost = Array.from({ length: p }, (_, r) => r).filter((r) => !byName.has(shardFileName(r, p)))
  if (lost.length) {
    return { reason: `the optimizer shard of rank(s) ${lost.join(", ")} of ${p} was lost with ${lost.length > 1 ? "them and the ranks that kept their replicas" : "it and the rank that kept its replica"} (ranks that keep each other's shards failed together)` }
  }
  // A group that broke in a step's all-gather: survivors that had not finished its reduction are
  // a step behind, and the step's gradient brings them level: the whole of it from a rank that
  // made the step (stage 1), or each lagging shard's segment of it from its owner, which had it
  // reduced but not applied (stage 2).
  const steps = [...new Set(all.map((s) => s.shard.scalars.step!))].sort((a, b) => a - b)
  const files: Record<string, Uint8Array> = Object.fromEntries([...byName].map(([name, s]) => [name, s.bytes]))
  if (steps.length === 1) return { files }
  const next = [...gradients].filter(([, g]) => g.gradient.step === steps[1])
  const behind = all.filter((s) => s.shard.scalars.step === steps[0])
  if (steps.length === 2 && steps[1] === steps[0]! + 1 && behind.every((s) => covering(next.map(([, g]) => g.gradient), s.shard))) {
    return { files: { ...files, ...Object.fromEntries(next.map(([name, g]) => [name, g.bytes])) } }
  }
  return { reason: `the survivors' ZeRO shards are at different optimizer steps (${steps.join(", ")}) and none holds the gradient to bring them level` }
}

export { flatOptimizerSlots }
