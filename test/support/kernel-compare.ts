// Helpers for the tests that check gradwire's fused layer kernels against tfjs-layers' own code
// (lstm-cell, layer-norm, batch-norm-train): seeded values, the worst relative difference between
// two lists of tensors, and the kernels a computation went through.
import { expect } from "vitest"
import type { Tf } from "../../core/engine.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** n values in [-scale, scale) + shift, from a seed (a linear congruential generator). */
export const seeded = (n: number, seed: number, scale = 1, shift = 0): Float32Array => {
  let s = seed >>> 0 || 1
  return Float32Array.from({ length: n }, () => (((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32) * 2 - 1) * scale + shift)
}

/** The worst of |a − b| / (1 + |b|) over two arrays of one length (a NaN in a counts as infinitely far). */
export const farthest = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  expect(a.length).toBe(b.length)
  let w = 0
  for (let i = 0; i < a.length; i++) w = Math.max(w, Number.isNaN(a[i]!) ? Infinity : Math.abs(a[i]! - b[i]!) / (1 + Math.abs(b[i]!)))
  return w
}

/** farthest over every value of every tensor; the shapes must match. */
export const worst = async (a: Tensor[], b: Tensor[]): Promise<number> => {
  expect(a.map((t) => t.shape)).toEqual(b.map((t) => t.shape))
  let w = 0
  for (let i = 0; i < a.length; i++) w = Math.max(w, farthest((await a[i]!.data()) as Float32Array, (await b[i]!.data()) as Float32Array))
  return w
}

/** The names of the kernels a run of `f` went through (its outputs disposed). */
export const kernelsOf = async (tf: Tf, f: () => Tensor[]): Promise<string[]> => {
  const p = await tf.profile(async () => {
    const out = f()
    await out[0]!.data()
    tf.dispose(out)
  })
  return p.kernels.map((k) => (k as unknown as { name: string }).name)
}
