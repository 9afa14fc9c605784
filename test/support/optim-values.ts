// Seeded test data for the flat-optimizer tests (flat-optimizers, tfjs-state): parameter values,
// gradients, and the relative difference the comparisons with tfjs's optimizers bound.
import { expect } from "vitest"
import type { Rng } from "../../core/random.ts"

/** Values in [-1, 1). */
export const randomValues = (rng: Rng, n: number): Float32Array => {
  const a = new Float32Array(n)
  for (let i = 0; i < n; i++) a[i] = rng() * 2 - 1
  return a
}

/** Gradients with |g| in [0.05, 1.05) and random signs (keeps centered RMSProp's root away from 0). */
export const randomGrads = (rng: Rng, n: number): Float32Array => {
  const a = new Float32Array(n)
  for (let i = 0; i < n; i++) a[i] = (rng() < 0.5 ? -1 : 1) * (0.05 + rng())
  return a
}

/** Largest |a - b| / (1 + |b|); Infinity where either is NaN. */
export const maxRelDiff = (a: Float32Array, b: Float32Array): number => {
  expect(a.length).toBe(b.length)
  let worst = 0
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Number.isNaN(a[i]!) || Number.isNaN(b[i]!) ? Infinity : Math.abs(a[i]! - b[i]!) / (1 + Math.abs(b[i]!)))
  return worst
}
