// Local SGD / DiLoCo's outer loop on the flat parameter vector, as pure arithmetic: the settings
// (collectiveConfig.localSgd, validated), the fragments of the vector that are synchronised at
// staggered steps (streaming DiLoCo), and the outer state every rank holds identically: the
// parameters at the last synchronisation of each fragment (the "anchor") and the outer optimizer.
//
// A round of fragment f: every rank's outer gradient is delta = anchor_f - params_f (how far its
// inner steps moved it); the group averages the deltas (weighted by the samples behind them); the
// outer optimizer steps the anchor with the mean delta as its gradient, and the result is the new
// anchor and every rank's new parameters:
//   average   anchor -= outerLr * mean            (outerLr 1: plain parameter averaging)
//   nesterov  m = mu m + mean; anchor -= outerLr * (mean + mu m)   (DiLoCo: outerLr 0.7, mu 0.9)
// These are the flat optimizers' "sgd" and Nesterov "momentum" (flat-optimizers.ts), one per
// fragment, so their state saves and loads like ZeRO's.
import { ConfigError } from "../../../../core/errors.ts"
import { decodeMessage, encodeMessage } from "../../../../core/wire.ts"
import { createFlatOptimizer, type FlatOptimizer, type FlatOptimizerSpec, type FlatOptimizerState } from "./flat-optimizers.ts"

export type OuterOptimizerName = "average" | "nesterov"

/** collectiveConfig.localSgd as the workers run it (compression travels as collectiveConfig.compression). */
export interface LocalSgdSettings {
  /** Inner steps between two synchronisations of a fragment (H). */
  readonly syncEvery: number
  readonly outerOptimizer: OuterOptimizerName
  readonly outerLr: number
  /** nesterov only. */
  readonly outerMomentum: number
  /** Parts of the parameter vector synchronised at staggered steps (streaming DiLoCo). 1: the whole vector at once. */
  readonly fragments: number
  /** A fragment's all-reduce runs while the next inner steps compute; its result is merged when the next fragment is due. */
  readonly overlap: boolean
}

export const LOCAL_SGD_DEFAULTS = { syncEvery: 32, outerOptimizer: "nesterov", nesterovLr: 0.7, averageLr: 1, outerMomentum: 0.9, fragments: 1 } as const

const KEYS = ["syncEvery", "outerOptimizer", "outerLr", "outerMomentum", "compression", "fragments", "overlap"] as const

/**
 * Validates collectiveConfig.localSgd (every key optional) and fills the defaults: H = 32,
 * DiLoCo's Nesterov outer optimizer (outerLr 0.7, momentum 0.9), or "average" (outerLr 1), one
 * fragment, overlap when there are several. `compression` is checked by the caller (the codec registry).
 */
export const resolveLocalSgd = (input: unknown, field = "collectiveConfig.localSgd"): LocalSgdSettings => {
  const o = (input ?? {}) as Record<string, unknown>
  if (typeof o !== "object" || Array.isArray(o)) throw new ConfigError({ field, reason: `an object { syncEvery, outerOptimizer, outerLr, outerMomentum, compression, fragments, overlap }, got ${JSON.stringify(input)}` })
  for (const k of Object.keys(o)) {
    if (!(KEYS as readonly string[]).includes(k)) throw new ConfigError({ field: `${field}.${k}`, reason: `unknown option; allowed: ${KEYS.join(", ")}` })
  }
  const int = (k: string, dflt: number, min: number): number => {
    const v = o[k] ?? dflt
    if (typeof v !== "number" || !Number.isInteger(v) || v < min) throw new ConfigError({ field: `${field}.${k}`, reason: `must be an integer >= ${min}, got ${JSON.stringify(o[k])}` })
    return v
  }
  const syncEvery = int("syncEvery", LOCAL_SGD_DEFAULTS.syncEvery, 1)
  const fragments = int("fragments", LOCAL_SGD_DEFAULTS.fragments, 1)
  if (fragments > syncEvery) {
    throw new ConfigError({ field: `${field}.fragments`, reason: `fragments are synchronised at staggered steps within syncEvery (${syncEvery}) steps, so at most ${syncEvery}; got ${fragments}` })
  }
  const outer = o["outerOptimizer"] ?? LOCAL_SGD_DEFAULTS.outerOptimizer
  if (outer !== "average" && outer !== "nesterov") throw new ConfigError({ field: `${field}.outerOptimizer`, reason: `"average" or "nesterov", got ${JSON.stringify(outer)}` })
  const lr = o["outerLr"] ?? (outer === "nesterov" ? LOCAL_SGD_DEFAULTS.nesterovLr : LOCAL_SGD_DEFAULTS.averageLr)
  if (typeof lr !== "number" || !Number.isFinite(lr) || lr <= 0) throw new ConfigError({ field: `${field}.outerLr`, reason: `a number > 0 (1 with "average" is plain averaging), got ${JSON.stringify(o["outerLr"])}` })
  if (outer === "average" && o["outerMomentum"] !== undefined) {
    throw new ConfigError({ field: `${field}.outerMomentum`, reason: `only the "nesterov" outer optimizer has momentum: set outerOptimizer: "nesterov" or leave outerMomentum out` })
  }
  const mu = o["outerMomentum"] ?? LOCAL_SGD_DEFAULTS.outerMomentum
  if (typeof mu !== "number" || !(mu >= 0 && mu < 1)) throw new ConfigError({ field: `${field}.outerMomentum`, reason: `a number in [0, 1), got ${JSON.stringify(o["outerMomentum"])}` })
  const overlap = o["overlap"] ?? fragments > 1
  if (typeof overlap !== "boolean") throw new ConfigError({ field: `${field}.overlap`, reason: `true or false, got ${JSON.stringify(o["overlap"])}` })
  return { syncEvery, outerOptimizer: outer, outerLr: lr, outerMomentum: outer === "nesterov" ? mu : 0, fragments, overlap }
}

/** One variable's place in the flat vector (GradientSlot). */
export interface FlatSlot {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly offset: number
  readonly size: number
}

/** A contiguous range of whole variables, synchronised together. */
export interface Fragment {
  readonly index: number
  readonly start: number
  readonly end: number
  /** Its variables, with offsets from `start` (the layout a reduction of the fragment's own buffer takes). */
  readonly slots: ReadonlyArray<FlatSlot>
  /** Inner steps after a synchronisation of the whole vector at which this fragment is first due (staggered: f * H / F). */
  readonly phase: number
}

/**
 * Cuts the layout into at most `count` fragments of whole variables, in order, each closing once it
 * holds its share of the elements; a model with fewer variables gets fewer fragments. Fragment f
 * is due after inner steps t with (t - phase_f) a multiple of H (phase_f = round(f H / F), and
 * H for the first, so a fragment's rounds are H steps apart and fragments are evenly staggered).
 */
export const planFragments = (layout: ReadonlyArray<FlatSlot>, count: number, syncEvery: number): Fragment[] => {
  const total = layout.reduce((n, s) => n + s.size, 0)
  const groups: FlatSlot[][] = []
  let cur: FlatSlot[] = []
  let filled = 0
  const n = Math.max(1, Math.min(count, layout.length))
  for (let i = 0; i < layout.length; i++) {
    const s = layout[i]!
    cur.push(s)
    filled += s.size
    const left = layout.length - i - 1
    const wanted = n - groups.length - 1
    // Close where the cut lands nearest its share of the elements, or when every remaining
    // variable is needed for the fragments still to come.
    const target = (total * (groups.length + 1)) / n
    const next = layout[i + 1]?.size ?? 0
    if (wanted > 0 && (Math.abs(filled - target) <= Math.abs(filled + next - target) || left === wanted)) {
      groups.push(cur)
      cur = []
    }
  }
  if (cur.length > 0) groups.push(cur)
  const F = groups.length
  return groups.map((g, index) => {
    const start = g[0]!.offset
    const last = g[g.length - 1]!
    return {
      index,
      start,
      end: last.offset + last.size,
      slots: g.map((s) => ({ name: s.name, shape: s.shape, offset: s.offset - start, size: s.size })),
      phase: index === 0 ? syncEvery : Math.round((index * syncEvery) / F)
    }
  })
}

/** Whether fragment `f` is synchronised after inner step number `steps` (1-based count of inner steps taken). */
export const fragmentDue = (f: Fragment, steps: number, syncEvery: number): boolean => steps >= f.phase && (steps - f.phase) % syncEvery === 0

/** The outer optimizer of one fragment, as a flat optimizer spec. */
export const outerSpec = (s: LocalSgdSettings): FlatOptimizerSpec =>
  s.outerOptimizer === "nesterov" ? { kind: "momentum", learningRate: s.outerLr, momentum: s.outerMomentum, useNesterov: true } : { kind: "sgd", learningRate: s.outerLr }

/** What a checkpoint (or a peer's snapshot) carries of the outer loop. */
export interface SavedOuterState {
  readonly version: 1
  readonly outerOptimizer: OuterOptimizerName
  readonly fragments: number
  readonly total: number
  readonly anchor: Float32Array
  readonly optimizers: ReadonlyArray<FlatOptimizerState>
  /** Inner steps taken (the fragment schedule's clock). */
  readonly steps: number
  /** Completed rounds (one per fragment synchronisation). */
  readonly rounds: number
  /** Samples behind each fragment's pending delta on the rank that saved it. */
  readonly samples: ReadonlyArray<number>
  /**
   * A survivor's state for a regroup only: the fragment whose overlapped round it was making again
   * in the foreground when it parked, which the ranks taking its state make with it first.
   */
  readonly redo?: number
}

/**
 * The outer state every rank holds the same copy of: the anchor (parameters at each fragment's last
 * synchronisation), one outer optimizer per fragment, the inner step clock and the samples each
 * fragment's next delta stands for on this rank.
 */
export class OuterState {
  readonly settings: LocalSgdSettings
  readonly fragments: ReadonlyArray<Fragment>
  readonly anchor: Float32Array
  readonly #opts: FlatOptimizer[]
  /** Inner steps taken since training started (or since the state it was loaded from). */
  steps = 0
  /** Rounds completed (fragment synchronisations), the same on every rank. */
  rounds = 0
  /** Samples this rank trained on since each fragment's last synchronisation. */
  readonly samples: number[]

  constructor(settings: LocalSgdSettings, layout: ReadonlyArray<FlatSlot>, params: Float32Array) {
    this.settings = settings
    this.fragments = planFragments(layout, settings.fragments, settings.syncEvery)
    this.anchor = Float32Array.from(params)
    this.#opts = this.fragments.map((f) => createFlatOptimizer(outerSpec(settings), f.end - f.start))
    this.samples = this.fragments.map(() => 0)
  }

  /** Counts an inner step over `samples` rows; returns the fragments due now. */
  tick(samples: number): Fragment[] {
    this.steps++
    for (let f = 0; f < this.samples.length; f++) this.samples[f]! += samples
    return this.fragments.filter((f) => fragmentDue(f, this.steps, this.settings.syncEvery))
  }

  /** This rank's outer gradient of fragment f: anchor - params over its range, into `out` (the fragment's length). */
  delta(f: Fragment, params: Float32Array, out: Float32Array): Float32Array {
    const a = this.anchor
    const s = f.start
    for (let i = 0; i < out.length; i++) out[i] = a[s + i]! - params[s + i]!
    return out
  }

  /**
   * Applies the group's mean delta of fragment f: the outer optimizer steps the anchor, which is
   * then the fragment's synchronised parameters (a view of the anchor is returned). Resets the
   * fragment's sample count and counts the round.
   */
  apply(f: Fragment, meanDelta: Float32Array): Float32Array {
    const view = this.anchor.subarray(f.start, f.end)
    this.#opts[f.index]!.step(view, meanDelta)
    this.samples[f.index] = 0
    this.rounds++
    return view
  }

  /** The state to save (the anchor is this state's own array, not a copy). */
  save(): SavedOuterState {
    return {
      version: 1,
      outerOptimizer: this.settings.outerOptimizer,
      fragments: this.fragments.length,
      total: this.anchor.length,
      anchor: this.anchor,
      optimizers: this.#opts.map((o) => o.state()),
      steps: this.steps,
      rounds: this.rounds,
      samples: [...this.samples]
    }
  }

  toBytes(): Uint8Array {
    return encodeMessage(this.save())
  }

  /**
   * Loads a saved state. The anchor must be of this model's size (ConfigError otherwise); an outer
   * optimizer of another kind or fragment count starts from zero momentum (the anchor and clock
   * still load), as a changed configuration would on resume.
   */
  load(saved: SavedOuterState): void {
    if (saved.total !== this.anchor.length || saved.anchor.length !== this.anchor.length) {
      throw new ConfigError({ field: "checkpoint", reason: `its local SGD state is of ${saved.total} parameters, this model has ${this.anchor.length}: resume with the model it was saved from` })
    }
    this.anchor.set(saved.anchor)
    this.steps = saved.steps
    this.rounds = saved.rounds
    const sameOuter = saved.outerOptimizer === this.settings.outerOptimizer && saved.fragments === this.fragments.length
    this.#opts.forEach((o, i) => {
      if (sameOuter && saved.optimizers[i]) o.load(saved.optimizers[i]!)
    })
    this.samples.fill(0)
    if (saved.samples.length === this.samples.length) saved.samples.forEach((n, i) => (this.samples[i] = n))
  }

  static fromBytes(bytes: Uint8Array): SavedOuterState {
    let s: SavedOuterState
    try {
      s = decodeMessage(bytes) as SavedOuterState
    } catch (e) {
      throw new ConfigError({ field: "checkpoint", reason: `its local SGD state file cannot be read (${String(e)}): resume from another checkpoint` })
    }
    if (s === null || typeof s !== "object" || s.version !== 1 || !(s.anchor instanceof Float32Array)) {
      throw new ConfigError({ field: "checkpoint", reason: "its local SGD state file is not one this version of gradwire wrote" })
    }
    return s
  }

  /** Outer optimizer state in bytes (the anchor and the momentum). */
  stateBytes(): number {
    return this.anchor.byteLength + this.#opts.reduce((n, o) => n + o.stateBytes(), 0)
  }
}
