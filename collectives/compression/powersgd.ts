// PowerSGD (Vogels et al. 2019) of rank r: a gradient M (n×m) is sent as two thin factors,
// P = M·Q (n×r) and Q = Mᵀ·P̂ (m×r), r(n+m) numbers instead of n·m. Both factors are linear in M,
// so they are summed with two ordinary fp32 all-reduces, rounds the codec drives itself
// (aggregation 'custom', see codec.ts):
//   P_w = M_w Q;  P = Σ P_w (round 1);  P̂ = orthonormalize(P);
//   Q_w = M_wᵀ P̂;  Q = Σ Q_w (round 2);  aggregate = P̂ Qᵀ = Σ_w P̂ Q_wᵀ.
// - Warm start: the Q of a tensor is kept across steps (one power iteration per step refines it).
//   Every rank starts from the same seeded random Q (seed + key, never the rank) and then keeps
//   the all-reduced one, so Q is identical everywhere -- required, since Σ M_w Q only equals
//   (Σ M_w) Q for a shared Q.
// - Tensors of rank < 2 and matrices too small to gain (n·m < minCompressionRate · r(n+m)) go
//   uncompressed, as fp32, in round 1. They get no residual.
// - The first `warmupSteps` steps are uncompressed altogether (DDP's start_powerSGD_iter).
// - Error feedback: M_w = G_w + e_w, e_w = M_w - P̂ Q_wᵀ: this rank's own share of the aggregate,
//   as in the authors' code (DDP's hook subtracts the averaged approximation instead, which makes
//   ranks' residuals absorb each other's errors). Σ_w P̂ Q_wᵀ is exactly the aggregate, so the
//   error-feedback invariant holds per rank. For r <= 4 the subtraction is owed to the residual
//   (ErrorFeedback.owe) and paid in the next step's first pass, which reads the residual anyway:
//   one pass over it fewer per step, the same values (any other read of the residual pays first).
// - Tensors of rank > 2 (conv kernels [h, w, in, out]) are viewed as [h·w·in, out].
//
// No byte format of its own: the two rounds carry plain Float32Arrays (round 1: the P factors of
// the compressed tensors then the uncompressed tensors, in the order given; round 2: the Q
// factors), so the collective's normal fp32 all-reduce moves them.
//
// Two ways to drive it: `reduce(tensors, allReduce)` with an async sum all-reduce callback, or the
// step-by-step `begin` -> `round.second(sum1)` -> `round.finish(sum2)` for callers that run the
// collective themselves (and for lock-step simulation in tests).
import * as Schema from "effect/Schema"
import type { CustomCodec } from "./codec.ts"
import { CompressionShapeError, ResidualMismatch } from "./errors.ts"
import { ErrorFeedbackOption, NonNegativeInt, PositiveInt, SeedOption, defineCodec, type LayoutShapes } from "./registry.ts"
import type { ErrorFeedback } from "./error-feedback.ts"
import { decodeOuter, feedbackMatMul, matMul, matMulT, orthonormalize, outer, subtractOwn, type OwedProduct } from "./matrix.ts"
import { Mulberry32, hashKey, mixSeed } from "./rng.ts"

export interface PowerSgdOptions {
  readonly rank: number
  /** Uncompressed steps before compression starts. Default 0. */
  readonly warmupSteps?: number
  /** Compress a matrix only if n·m >= this · r(n+m). Default 2 (DDP's min_compression_rate). */
  readonly minCompressionRate?: number
  /** Seed of the initial Q factors; must be the same on every rank. */
  readonly seed?: number
  readonly errorFeedback?: boolean
}

/**
 * One gradient tensor and its identity. `grad` is read, never modified, except when a step is
 * given a scale and runs without error feedback (then it is scaled in place).
 */
export interface MatrixGrad {
  readonly key: string
  readonly shape: ReadonlyArray<number>
  readonly grad: Float32Array
  /** Where the aggregate goes (it may be `grad` itself); by default a new array. */
  readonly out?: Float32Array
}

export interface MatrixPlan {
  readonly compress: boolean
  /** Rows and columns of the matrix view. */
  readonly n: number
  readonly m: number
  /** Effective rank, min(rank, n, m). */
  readonly r: number
}

export interface PowerSgdState {
  readonly step: number
  readonly q: Record<string, Float32Array>
}

/** Sum all-reduce over the group, as the collective provides it. */
export type AllReduceSum = (buf: Float32Array) => Promise<Float32Array>

export class PowerSgdCompressor implements CustomCodec {
  readonly name = "powersgd" as const
  readonly aggregation = "custom" as const
  readonly rank: number
  readonly warmupSteps: number
  readonly minCompressionRate: number
  readonly seed: number
  readonly errorFeedback: boolean
  private readonly qs = new Map<string, Float32Array>()
  private steps = 0

  constructor(options: PowerSgdOptions) {
    if (!Number.isInteger(options.rank) || options.rank < 1) throw new RangeError(`PowerSGD rank must be a positive integer, got ${options.rank}`)
    if (options.rank > 30) throw new RangeError(`PowerSGD rank ${options.rank} is too large to pay off (at most 30)`)
    this.rank = options.rank
    this.warmupSteps = options.warmupSteps ?? 0
    this.minCompressionRate = options.minCompressionRate ?? 2
    this.seed = options.seed ?? 0
    this.errorFeedback = options.errorFeedback ?? true
  }

  /** Steps completed so far (warm-up ones included). */
  get step(): number {
    return this.steps
  }

  plan(shape: ReadonlyArray<number>): MatrixPlan {
    const size = shape.reduce((a, b) => a * b, 1)
    if (shape.length < 2) return { compress: false, n: size, m: 1, r: 0 }
    const m = shape[shape.length - 1]
    const n = m === 0 ? 0 : size / m
    const r = Math.min(this.rank, n, m)
    const compress = r >= 1 && n * m >= this.minCompressionRate * r * (n + m)
    return { compress, n, m, r }
  }

  /** fp32 bytes each rank contributes over both rounds for a tensor of this shape. */
  wireBytes(shape: ReadonlyArray<number>, step = this.steps): number {
    const p = this.plan(shape)
    return 4 * (p.compress && step >= this.warmupSteps ? p.r * (p.n + p.m) : p.n * p.m)
  }

  /**
   * Starts a step: returns the round whose `first` buffer must be sum-all-reduced. Each gradient
   * is multiplied by `scale` first (a weighted mean's w/W), fused with the residual update.
   */
  begin(tensors: ReadonlyArray<MatrixGrad>, ef?: ErrorFeedback, scale = 1): PowerSgdRound {
    return new PowerSgdRound(this, tensors, this.errorFeedback ? ef : undefined, this.steps < this.warmupSteps, scale)
  }

  /** One whole step: one or two sum all-reduces; returns the summed (approximate) gradients. */
  async reduce(tensors: ReadonlyArray<MatrixGrad>, allReduce: AllReduceSum, ef?: ErrorFeedback, scale = 1): Promise<Array<Float32Array>> {
    const round = this.begin(tensors, ef, scale)
    const second = round.second(await allReduce(round.first))
    return round.finish(second === null ? null : await allReduce(second))
  }

  /** @internal the warm-start factor of `key`, created on first use identically on every rank */
  q(key: string, m: number, r: number): Float32Array {
    const q = this.qs.get(key)
    if (q !== undefined) {
      if (q.length !== m * r) throw new ResidualMismatch({ key: `powersgd.q:${key}`, expected: q.length, got: m * r })
      return q
    }
    const fresh = new Float32Array(m * r)
    const rng = new Mulberry32(mixSeed(this.seed, hashKey(key)))
    for (let i = 0; i < fresh.length; i++) fresh[i] = rng.normal()
    this.qs.set(key, fresh)
    return fresh
  }

  /** @internal keeps the all-reduced Q for the next step, re-seeding columns that collapsed */
  keep(key: string, Q: Float32Array, m: number, r: number, collapsed: number): void {
    for (let c = 0; c < r; c++) {
      let s = 0
      for (let j = 0; j < m; j++) s += Q[j * r + c] * Q[j * r + c]
      // a zero column would stay zero forever (P = M·0); restart it from the same random
      // numbers on every rank: Q and the step are identical everywhere
      if (collapsed & (1 << c) || s === 0) {
        const rng = new Mulberry32(mixSeed(this.seed, hashKey(key), this.steps + 1, c))
        for (let j = 0; j < m; j++) Q[j * r + c] = rng.normal()
      }
    }
    this.qs.set(key, Q)
  }

  /** @internal */
  advance(): void {
    this.steps++
  }

  /** Warm-start factors and step count, for a checkpoint. */
  state(): PowerSgdState {
    const q: Record<string, Float32Array> = {}
    for (const [k, v] of this.qs) q[k] = v.slice()
    return { step: this.steps, q }
  }

  restore(state: { readonly step: number; readonly q: Readonly<Record<string, ArrayLike<number>>> }): void {
    this.qs.clear()
    for (const [k, v] of Object.entries(state.q)) this.qs.set(k, Float32Array.from(v))
    this.steps = state.step
  }
}

/** What a step owes a residual: E -= P̂ Q_wᵀ (r <= 4). */
interface Owed extends OwedProduct {
  readonly r: number
}

interface Slot {
  /** Position in the caller's list. */
  readonly idx: number
  readonly t: MatrixGrad
  readonly plan: MatrixPlan
  /** M = G + e (the residual buffer itself when error feedback is on), or G. */
  readonly M: Float32Array
  readonly residual: Float32Array | undefined
  /** The correction the last step owes `residual`, paid in this step's first pass. */
  readonly owed?: Owed
  /** Offset in the round-1 buffer (P or raw values) and in the round-2 buffer (Q; -1 = raw). */
  readonly at1: number
  readonly at2: number
  P?: Float32Array
  /** This rank's own Q factor, kept for the residual update fused into finish (r <= 4). */
  Qw?: Float32Array
  collapsed?: number
}

/** One PowerSGD step in flight. Call `second` then `finish`, each once, in that order. */
export class PowerSgdRound {
  /** Round-1 buffer: all-reduce (sum) it and pass the result to `second`. */
  readonly first: Float32Array
  private readonly owner: PowerSgdCompressor
  private readonly slots: Array<Slot> = []
  private readonly size2: number
  private phase: 1 | 2 | 3 = 1
  private readonly outputs: Array<Float32Array>
  private readonly ef: ErrorFeedback | undefined

  constructor(owner: PowerSgdCompressor, tensors: ReadonlyArray<MatrixGrad>, ef: ErrorFeedback | undefined, warmup: boolean, scale = 1) {
    this.owner = owner
    this.ef = ef
    this.outputs = tensors.map(() => new Float32Array(0))
    const plans = tensors.map((t) => {
      const plan = owner.plan(t.shape)
      if (plan.n * plan.m !== t.grad.length || t.shape.some((d) => !Number.isInteger(d) || d < 0)) {
        throw new CompressionShapeError({ key: t.key, reason: `shape [${t.shape.join(", ")}] does not hold ${t.grad.length} elements` })
      }
      return warmup || !plan.compress ? { ...plan, compress: false } : plan
    })
    // P factors first, then raw tensors: the layout is a pure function of the shapes, so every
    // rank builds the same buffer
    let size1 = 0
    let size2 = 0
    try {
      tensors.forEach((t, idx) => {
        const plan = plans[idx]
        if (!plan.compress) return
        let M = t.grad
        let residual: Float32Array | undefined
        let owed: Owed | undefined
        if (ef) {
          owed = ef.takeOwed<Owed>(t.key, t.grad.length)
          residual = ef.residual(t.key, t.grad.length)
          M = residual // filled below: M = G·scale + e
        } else if (scale !== 1) {
          for (let i = 0; i < M.length; i++) M[i] *= scale
        }
        this.slots.push({ idx, t, plan, M, residual, owed, at1: size1, at2: size2 })
        size1 += plan.n * plan.r
        size2 += plan.m * plan.r
      })
    } catch (err) {
      // nothing owed may be lost with the step that failed
      for (const s of this.slots) if (s.owed && s.residual) subtractOwn(s.owed, s.plan.n, s.plan.m, s.owed.r, s.residual)
      throw err
    }
    tensors.forEach((t, idx) => {
      if (plans[idx].compress) return
      this.slots.push({ idx, t, plan: plans[idx], M: t.grad, residual: undefined, at1: size1, at2: -1 })
      size1 += t.grad.length
    })
    this.size2 = size2
    this.first = new Float32Array(size1)
    for (const s of this.slots) {
      const { n, m, r } = s.plan
      if (s.at2 < 0) {
        const dst = this.first.subarray(s.at1, s.at1 + s.t.grad.length)
        if (scale === 1) dst.set(s.t.grad)
        else for (let i = 0; i < dst.length; i++) dst[i] = s.t.grad[i] * scale
        continue
      }
      const Q = owner.q(s.t.key, m, r)
      const P = this.first.subarray(s.at1, s.at1 + n * r)
      if (s.residual && r <= 4 && (!s.owed || s.owed.r === r)) feedbackMatMul(s.t.grad, scale, s.residual, n, m, Q, r, P, s.owed)
      else {
        // (owed with another r: the compressor was replaced by one of another rank)
        if (s.residual && s.owed) subtractOwn(s.owed, n, m, s.owed.r, s.residual)
        if (s.residual) for (let i = 0; i < s.residual.length; i++) s.residual[i] += Math.fround(s.t.grad[i] * scale)
        matMul(s.M, n, m, Q, r, P)
      }
    }
  }

  /**
   * Takes the summed round-1 buffer; returns the round-2 buffer (Q factors) to sum-all-reduce,
   * or null when nothing is compressed this step (warm-up, or only small tensors).
   */
  second(firstSum: Float32Array): Float32Array | null {
    if (this.phase !== 1) throw new Error("PowerSgdRound.second called twice or after finish")
    if (firstSum.length !== this.first.length) {
      throw new CompressionShapeError({ key: "powersgd", reason: `round-1 sum has ${firstSum.length} elements, expected ${this.first.length}` })
    }
    this.phase = 2
    const second = this.size2 > 0 ? new Float32Array(this.size2) : null
    for (const s of this.slots) {
      if (s.at2 < 0) {
        const sum = firstSum.subarray(s.at1, s.at1 + s.t.grad.length)
        if (s.t.out) s.t.out.set(sum)
        this.outputs[s.idx] = s.t.out ?? sum.slice()
        continue
      }
      const { n, m, r } = s.plan
      const P = firstSum.slice(s.at1, s.at1 + n * r)
      s.collapsed = orthonormalize(P, n, r)
      s.P = P
      const Qw = second!.subarray(s.at2, s.at2 + m * r)
      matMulT(s.M, n, m, P, r, Qw)
      // own message only: e = M - P̂ Q_wᵀ, from exactly the fp32 values that enter the sum (for
      // r <= 4 owed to the residual in finish and paid in the next step's first pass; the
      // all-reduce sums the round-2 buffer in place, so this rank's share is kept)
      if (s.residual && r <= 4) s.Qw = Qw.slice()
      else if (s.residual) outer(P, Qw, n, m, r, s.residual, true, -1)
    }
    if (second === null) this.done()
    return second
  }

  /** Takes the summed round-2 buffer (null if `second` returned null); returns the sums per tensor. */
  finish(secondSum: Float32Array | null): Array<Float32Array> {
    if (this.phase === 3) return this.outputs
    if (this.phase !== 2) throw new Error("PowerSgdRound.finish called before second")
    if ((secondSum?.length ?? 0) !== this.size2) {
      throw new CompressionShapeError({ key: "powersgd", reason: `round-2 sum has ${secondSum?.length ?? 0} elements, expected ${this.size2}` })
    }
    for (const s of this.slots) {
      if (s.at2 < 0) continue
      const { n, m, r } = s.plan
      const Q = secondSum!.slice(s.at2, s.at2 + m * r)
      const out = s.t.out ?? new Float32Array(n * m)
      if (r <= 4) {
        decodeOuter(s.P!, Q, n, m, r, out)
        if (s.Qw && s.residual && this.ef) {
          const owed: Owed = { P: s.P!, Qw: s.Qw, r }
          this.ef.owe(s.t.key, { product: owed, payTo: (e) => subtractOwn(owed, n, m, r, e) })
        }
      } else outer(s.P!, Q, n, m, r, out, false)
      this.outputs[s.idx] = out
      this.owner.keep(s.t.key, Q, m, r, s.collapsed ?? 0)
    }
    this.done()
    return this.outputs
  }

  private done(): void {
    this.phase = 3
    this.owner.advance()
  }
}

/** 'auto' weighs PowerSGD at this rank, without warm-up (it decides after uncompressed steps). */
const AUTO_RANK = 4

/** Uncompressed / sent for a model at rank r: r(m + n) per matrix (first dim x the rest), 1-D tensors whole. */
const ratioAt = (rank: number, layout: LayoutShapes): number => {
  const total = layout.reduce((s, l) => s + l.size, 0)
  let sent = 0
  for (const l of layout) {
    if (l.shape.length >= 2) {
      const m = l.shape[0]!
      sent += Math.min(l.size, rank * (m + l.size / m))
    } else sent += l.size
  }
  return total / Math.max(1, sent)
}

export const powerSgdCodec = defineCodec({
  name: "powersgd",
  aggregation: "custom",
  hint: "rank-r factors P and Q of every matrix, all-reduced in two fp32 rounds, warm-started; 1-D tensors go uncompressed",
  example: { type: "powersgd", rank: 4, warmupSteps: 10 },
  schema: Schema.Struct({
    type: Schema.Literal("powersgd"),
    rank: PositiveInt.check(Schema.isLessThanOrEqualTo(30)),
    warmupSteps: Schema.optionalKey(NonNegativeInt),
    minCompressionRate: Schema.optionalKey(Schema.Finite.check(Schema.isGreaterThanOrEqualTo(1))),
    seed: SeedOption,
    errorFeedback: ErrorFeedbackOption
  }),
  create: (c) =>
    new PowerSgdCompressor({ rank: c.rank, warmupSteps: c.warmupSteps, minCompressionRate: c.minCompressionRate, seed: c.seed, errorFeedback: c.errorFeedback }),
  auto: { order: 1, config: { type: "powersgd", rank: AUTO_RANK, warmupSteps: 0 }, rounds: 2 },
  wireRatio: (c, layout) => ratioAt(c.rank, layout)
})
