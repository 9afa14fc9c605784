// Error feedback (Seide et al. 2014; Karimireddy et al. 2019): what a lossy codec drops this step
// is added back before compressing the next, so nothing is lost, only delayed. Done right:
// - one fp32 residual per compress point, keyed by a stable identity (variable name, or bucket id
//   + offset; a ring hop that re-compresses a partial sum has its own key, see ringSegmentKey);
// - p = g + e; send C(p); e = p - D(C(p)) from THIS rank's own message, never from the aggregate
//   (the aggregate mixes other ranks' errors in, and the sum of residuals would stop telescoping);
// - tensors that are not compressed get no residual at all;
// - residuals are part of a checkpoint (state / restore), or a restart silently drops a step's
//   worth of gradient mass per tensor.
// A codec built with `errorFeedback: false` bypasses the store.
import type { CompressedMessage, Compressor, EncodeContext } from "./compressor-contract.ts"
import { ResidualMismatch } from "./errors.ts"

/** Serializable residual state: compress-point key -> residual. */
export type ResidualState = Record<string, Float32Array>

/**
 * A correction a codec still owes a residual (PowerSGD subtracts its own share P̂·Q_wᵀ in the
 * next step's first pass instead of in a pass of its own). `payTo` applies it; `product` is what a
 * codec that fuses the payment into its next pass takes back (takeOwed).
 */
export interface OwedCorrection<T = unknown> {
  readonly product: T
  readonly payTo: (e: Float32Array) => void
}

export class ErrorFeedback {
  private readonly residuals = new Map<string, Float32Array>()
  private readonly owed = new Map<string, OwedCorrection>()
  #version = 0

  /**
   * Changes whenever residuals are replaced or dropped (restore, delete, clear), so a codec can
   * tell that what it knew about their contents (the fp16 reducer: where they may be nonzero) no
   * longer holds.
   */
  get version(): number {
    return this.#version
  }

  /**
   * Makes the zeroed residual of n floats for `key`, on first use and on restore. The gradient
   * reducer puts large residuals in SIMD memory (see GradientReducer), where the kernels update
   * them in place.
   */
  allocate: (key: string, n: number) => Float32Array = (_key, n) => new Float32Array(n)

  /**
   * The residual under `key`, created as zeros on first use. A length change is an error. A
   * correction owed to it is paid first.
   */
  residual(key: string, n: number): Float32Array {
    const e = this.get(key)
    if (e === undefined) {
      const fresh = this.allocate(key, n)
      this.residuals.set(key, fresh)
      return fresh
    }
    if (e.length !== n) throw new ResidualMismatch({ key, expected: e.length, got: n })
    return e
  }

  /** The residual under `key` as it stands (a correction owed to it is paid first). */
  get(key: string): Float32Array | undefined {
    const e = this.residuals.get(key)
    const c = this.owed.get(key)
    if (e !== undefined && c !== undefined) {
      this.owed.delete(key)
      c.payTo(e)
    }
    return e
  }

  /**
   * Records a correction owed to the residual of `key` (which must exist). Every read of the
   * residual (residual, get, state) pays it first, unless the codec takes it back with takeOwed.
   */
  owe<T>(key: string, correction: OwedCorrection<T>): void {
    if (!this.residuals.has(key)) throw new Error(`no residual under ${key} to owe a correction to`)
    if (this.owed.has(key)) this.get(key)
    this.owed.set(key, correction)
  }

  /**
   * Takes back the correction owed to `key`, unpaid, for a codec that pays it in its own pass.
   * A residual of another length than `n` is an error (thrown before anything is taken).
   */
  takeOwed<T>(key: string, n: number): T | undefined {
    const e = this.residuals.get(key)
    if (e !== undefined && e.length !== n) throw new ResidualMismatch({ key, expected: e.length, got: n })
    const c = this.owed.get(key)
    if (c === undefined) return undefined
    this.owed.delete(key)
    return c.product as T
  }

  has(key: string): boolean {
    return this.residuals.has(key)
  }

  delete(key: string): boolean {
    this.#version++
    this.owed.delete(key)
    return this.residuals.delete(key)
  }

  clear(): void {
    this.#version++
    this.owed.clear()
    this.residuals.clear()
  }

  keys(): ReadonlyArray<string> {
    return [...this.residuals.keys()]
  }

  get size(): number {
    return this.residuals.size
  }

  /**
   * Compresses `grad` at compress point `key` with error feedback and returns the message to send.
   * `grad` is not modified. Costs one encode and one decode-accumulate, no allocation besides the
   * message (none when `out` is given).
   */
  compress(compressor: Compressor, key: string, grad: Float32Array, ctx: EncodeContext = {}, out?: Uint8Array): CompressedMessage {
    const context = { ...ctx, key }
    if (!compressor.errorFeedback) return compressor.encode(grad, context, out)
    const e = this.residual(key, grad.length)
    for (let i = 0; i < e.length; i++) e[i] += grad[i] // e holds p = g + e
    const msg = compressor.encode(e, context, out)
    compressor.accumulate(msg, e, -1) // e = p - D(C(p)), from our own message
    return msg
  }

  /** A copy of every residual (owed corrections paid), for a checkpoint. */
  state(): ResidualState {
    const out: ResidualState = {}
    for (const k of this.residuals.keys()) out[k] = this.get(k)!.slice()
    return out
  }

  /** Replaces all residuals with copies of a saved state (arrays of numbers are accepted too). */
  restore(state: Readonly<Record<string, ArrayLike<number>>>): void {
    this.#version++
    this.owed.clear()
    this.residuals.clear()
    for (const [k, v] of Object.entries(state)) {
      const e = this.allocate(k, v.length)
      e.set(v)
      this.residuals.set(k, e)
    }
  }
}
