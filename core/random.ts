// Small seeded PRNG (mulberry32) and a Fisher-Yates shuffle: data sharding and stochastic
// quantisation must be reproducible from a seed on every rank.

export type Rng = () => number

/** A uniform [0, 1) generator from a 32-bit seed. */
export const seededRng = (seed: number): Rng => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** Mixes several integers into one seed, so (seed, epoch) pairs give unrelated streams. */
export const mixSeed = (...parts: ReadonlyArray<number>): number => {
  let h = 0x811c9dc5
  for (const p of parts) {
    h = Math.imul(h ^ (p >>> 0), 0x01000193)
    h ^= h >>> 13
    h = Math.imul(h, 0x5bd1e995)
    h ^= h >>> 15
  }
  return h >>> 0
}

/** A seeded permutation of 0..n-1. */
export const permutation = (n: number, seed: number): Int32Array => {
  const out = new Int32Array(n)
  for (let i = 0; i < n; i++) out[i] = i
  const rng = seededRng(seed)
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1))
    const t = out[i]
    out[i] = out[j]
    out[j] = t
  }
  return out
}
