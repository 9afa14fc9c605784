// collectiveConfig.strategy "local-sgd" (Local SGD / DiLoCo, and streaming DiLoCo with fragments):
// the data-parallel model applies each step's gradients locally with its own (inner) optimizer, no
// exchange; every H inner steps a fragment of the parameters is synchronised: the ranks' outer
// gradients (anchor - params) are averaged, weighted by the samples behind them, through the
// group's gradient reducer (so with the configured codec and its error feedback, each fragment
// with residuals of its own), and the outer optimizer (optim/outer-optimizer.ts) steps the anchor,
// which every rank loads. With `overlap` a fragment's all-reduce runs in the background while the
// next inner steps compute; its result is merged when the next fragment is due (or before any other
// group operation): the new synchronised values plus the local progress made meanwhile.
//
// The outer state (anchor, outer momentum, the step clock) goes with checkpoints (LOCAL_SGD_FILE)
// and with a survivor's state when a group is regrouped: a member still in the survivor's round
// keeps its own parameters (its local progress); one that missed a round (a replacement, a rank
// that was behind) starts from the latest synchronised parameters, the anchor, as hivemind's
// load_state_from_peers does. An overlapped round that the group breaks under (or that a regroup
// interrupts) does not park the rank, whose inner steps go on: it is made again in the foreground at
// the next round or group operation, where the rank parks, and the ranks that take this rank's state
// make that round with it first.
import { encodeMessage } from "../../../core/wire.ts"
import { OuterState, type Fragment, type LocalSgdSettings, type FlatSlot, type SavedOuterState } from "../common/optim/outer-optimizer.ts"

/** A prepared model's checkpoint file of the outer loop (anchor, outer momentum, step clock). */
export const LOCAL_SGD_FILE = "local-sgd.msgpack"

export interface LocalSgdHost {
  readonly layout: ReadonlyArray<FlatSlot>
  /** The model's trainable weights as one flat vector (a copy), read asynchronously (GPU backends read no other way). */
  readParams(): Promise<Float32Array>
  /** Loads a flat vector into the trainable weights. */
  writeParams(flat: Float32Array): void
  /**
   * The group's weighted mean of `buf` in place (GradientSync.reduceGradients), with residuals
   * keyed by `scope`; "adopted": the group was re-formed and this rank took a survivor's state that
   * contains this round; "recompute": redo it in the new group (the buffer holds partial sums).
   * `background` (an overlapped round): "recompute" also when a regroup is asked for, without
   * parking the rank (GradientSync.reduceGradients).
   */
  reduce(buf: Float32Array, layout: ReadonlyArray<FlatSlot>, weight: number, round: number, scope: string, background?: boolean): Promise<void | "adopted" | "recompute">
  /** Time spent on a synchronisation (the timeline's "wait" rows). */
  observe?(name: string, startMs: number, endMs: number): void
  /** The reducer's byte counts (this rank's messages so far, and the same as dense fp32). */
  wireStats?(): { readonly totalWireBytes: number; readonly totalDenseBytes: number }
}

interface Pending {
  readonly fragment: Fragment
  readonly done: Promise<void | "adopted" | "recompute">
  /** The parameters of the fragment when its delta was taken (local progress is measured from them). */
  readonly sentFrom: Float32Array
  readonly startMs: number
}

export class LocalSgd {
  readonly settings: LocalSgdSettings
  readonly #host: LocalSgdHost
  #outer: OuterState
  /** One delta buffer per fragment (reduced in place). */
  readonly #deltas: Float32Array[]
  #pending: Pending | undefined
  /** Bumped by adopt(): a round in flight across it is not applied on top of the adopted state. */
  #epoch = 0
  /** The fragment whose overlapped round settle() is making again in the foreground (a regroup broke it). */
  #redoing: number | undefined
  /**
   * A fragment round to make before anything else: the survivor this rank took its state from was
   * making it again (#redoing) when it parked, and makes it first in the new group.
   */
  #redoFirst: number | undefined
  #syncMs = 0
  #lastSyncMs = 0

  /** `params`: the model's parameters now (host.readParams()), the outer loop's first anchor. */
  constructor(settings: LocalSgdSettings, host: LocalSgdHost, params: Float32Array) {
    this.settings = settings
    this.#host = host
    this.#outer = new OuterState(settings, host.layout, params)
    this.#deltas = this.#outer.fragments.map((f) => new Float32Array(f.end - f.start))
  }

  get outer(): OuterState {
    return this.#outer
  }

  /** The anchor is the model's parameters now (after the start-up broadcast or a restore of weights alone). */
  async resetAnchor(): Promise<void> {
    this.#outer.anchor.set(await this.#host.readParams())
  }

  /** Whether a fragment's reduction runs in the background. */
  get pending(): boolean {
    return this.#pending !== undefined
  }

  /**
   * After an inner step over `samples` rows: synchronises the fragments due now (waiting first for
   * one still in flight). Without overlap it returns once every due fragment is synchronised.
   */
  async afterStep(samples: number): Promise<void> {
    const due = this.#outer.tick(samples)
    if (due.length === 0) return
    await this.settle()
    const t0 = performance.now()
    if (this.settings.overlap && due.length === 1) {
      const f = due[0]!
      const params = await this.#host.readParams()
      const buf = this.#outer.delta(f, params, this.#deltas[f.index]!)
      const weight = this.#outer.samples[f.index]!
      const round = this.#outer.rounds
      this.#pending = {
        fragment: f,
        sentFrom: params.slice(f.start, f.end),
        startMs: t0,
        done: this.#host.reduce(buf, f.slots, weight, round, `frag${f.index}`, true)
      }
      // Settled by the next fragment, or before any other group operation (settle()).
      this.#pending.done.catch(() => {})
      return
    }
    const params = await this.#host.readParams()
    for (const f of due) {
      const r = await this.#reduceNow(f, params)
      if (r === "adopted") return this.#observe(t0)
    }
    this.#host.writeParams(params)
    this.#observe(t0)
  }

  /**
   * One fragment's round, redone in a re-formed group as needed; writes the synchronised values
   * into `params`. "recompute" (the group broke under the round: the buffer holds partial sums)
   * is the only reason to redo it. A round that returns normally was completed by the whole group
   * that ran it, also when this rank was regrouped before it started (a pause for a grow or a
   * failure elsewhere parks the rank at the round's start, and the round then runs in the new
   * group: every member, a joiner too, makes it once, and a rank that made it again would call a
   * round the others do not).
   */
  async #reduceNow(f: Fragment, params: Float32Array): Promise<void | "adopted"> {
    const buf = this.#deltas[f.index]!
    for (;;) {
      this.#outer.delta(f, params, buf)
      const epoch = this.#epoch
      const r = await this.#host.reduce(buf, f.slots, this.#outer.samples[f.index]!, this.#outer.rounds, `frag${f.index}`)
      if (r === "adopted") return "adopted"
      // The group was re-formed meanwhile: this rank's parameters are its own again, or the
      // survivors' anchor when it was behind them (adopt()).
      if (epoch !== this.#epoch) params.set(await this.#host.readParams())
      if (r === "recompute") continue
      params.set(this.#outer.apply(f, buf), f.start)
      return
    }
  }

  /** One fragment's round now, in the foreground, on the model's parameters (left as they are when this rank adopted a survivor's state). */
  async #roundNow(f: Fragment): Promise<void> {
    const params = await this.#host.readParams()
    if ((await this.#reduceNow(f, params)) !== "adopted") this.#host.writeParams(params)
  }

  /** One round of every fragment now (leaving local SGD: every rank ends with the same weights). */
  async flush(): Promise<void> {
    await this.settle()
    const t0 = performance.now()
    const params = await this.#host.readParams()
    for (const f of this.#outer.fragments) if ((await this.#reduceNow(f, params)) === "adopted") return this.#observe(t0)
    this.#host.writeParams(params)
    this.#observe(t0)
  }

  /**
   * Merges a fragment whose reduction ran in the background: the fragment's new synchronised
   * values plus the local progress since its delta was taken. A reduction the group broke under is
   * done again, in the re-formed group, without overlap.
   */
  async settle(): Promise<void> {
    const first = this.#redoFirst
    if (first !== undefined) {
      // A joiner (or a rank that took a redoing survivor's state): that round, as the survivors make it.
      this.#redoFirst = undefined
      await this.#roundNow(this.#outer.fragments[first]!)
    }
    const p = this.#pending
    if (!p) return
    this.#pending = undefined
    const epoch = this.#epoch
    const r = await p.done
    if (r === "adopted") return
    if (r === "recompute" || epoch !== this.#epoch) {
      // The round broke in the background (or a regroup was asked for): made again here, in the
      // foreground, where this rank parks for the regroup with the loop at a known step.
      this.#redoing = p.fragment.index
      try {
        await this.#roundNow(p.fragment)
      } finally {
        this.#redoing = undefined
      }
      return
    }
    const params = await this.#host.readParams()
    const f = p.fragment
    const synced = this.#outer.apply(f, this.#deltas[f.index]!)
    for (let i = 0; i < synced.length; i++) params[f.start + i] = synced[i]! + (params[f.start + i]! - p.sentFrom[i]!)
    this.#host.writeParams(params)
    this.#observe(p.startMs)
  }

  #observe(t0: number): void {
    const t1 = performance.now()
    this.#lastSyncMs = t1 - t0
    this.#syncMs += this.#lastSyncMs
    this.#host.observe?.("local SGD outer all-reduce", t0, t1)
  }

  /**
   * The outer state, for a checkpoint or a peer (call settle() first: a round in flight is not in
   * it). `inStep`: taken while parked in a step's round, so the step clock leaves that step out (the
   * state's parameters are from before it was synchronised, and a joiner computes that step again).
   */
  stateFile(inStep = false): Uint8Array {
    const o = this.#outer
    const redo = this.#redoing !== undefined ? { redo: this.#redoing } : {}
    if (!inStep && this.#redoing === undefined) return o.toBytes()
    return encodeMessage({ ...o.save(), ...redo, ...(inStep ? { steps: o.steps - 1 } : {}) })
  }

  /** Loads a checkpoint's outer state; the model's weights are already loaded. */
  restore(bytes: Uint8Array): void {
    this.#pending = undefined
    this.#redoFirst = undefined
    this.#outer.load(OuterState.fromBytes(bytes))
  }

  /**
   * Takes a survivor's outer state after a regroup. A rank in the same round as the survivor keeps
   * its own parameters (returns "keep"); one behind it loads the survivor's anchor, the latest
   * synchronised parameters, as its own ("anchor").
   */
  adopt(bytes: Uint8Array): "keep" | "anchor" {
    const saved: SavedOuterState = OuterState.fromBytes(bytes)
    this.#epoch++
    // The survivor was making an overlapped round again when it parked: so does this rank, unless
    // it is making that round again itself.
    const redo = saved.redo
    this.#redoFirst = redo !== undefined && this.#redoing === undefined ? redo : undefined
    const o = this.#outer
    // In the survivor's round at its step (or in that step's round, which it left out of its clock).
    const same = saved.rounds === o.rounds && o.steps - saved.steps >= 0 && o.steps - saved.steps <= 1
    const samples = [...o.samples]
    const steps = o.steps
    o.load(saved)
    if (same) {
      samples.forEach((n, i) => (o.samples[i] = n))
      o.steps = steps
      return "keep"
    }
    // This rank's own inner progress since the survivor's last round is not known to it: none.
    this.#outer.samples.fill(0)
    this.#host.writeParams(this.#outer.anchor)
    return "anchor"
  }

  metrics(): Record<string, number> {
    const w = this.#host.wireStats?.()
    return {
      ...(w ? { "localsgd/wire_bytes": w.totalWireBytes, "localsgd/dense_bytes": w.totalDenseBytes } : {}),
      "localsgd/rounds": this.#outer.rounds,
      "localsgd/inner_steps": this.#outer.steps,
      "localsgd/sync_ms": this.#lastSyncMs,
      "localsgd/sync_ms_total": this.#syncMs
    }
  }
}

/** The group operations of GradientSync other than the outer rounds' own reduction. */
const SETTLED_OPS = new Set<PropertyKey>(["broadcast", "sum", "allGather", "reduceScatter", "allGatherInto"])

/**
 * The group as the model sees it with local SGD: every other group operation (the epoch's metric
 * sum, a batch-size exchange) first merges a fragment's round still in flight, so no two
 * operations of the model overlap except that round and the inner steps.
 */
export const settlingSync = <S extends object>(sync: S, settle: () => Promise<void>): S =>
  new Proxy(sync, {
    get(target, key, receiver) {
      const v = Reflect.get(target, key, receiver) as unknown
      if (typeof v !== "function" || !SETTLED_OPS.has(key)) return v
      return async (...args: unknown[]) => {
        await settle()
        return (v as (...a: unknown[]) => unknown).apply(target, args)
      }
    }
  })
