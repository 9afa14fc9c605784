// Seeded randomness for the codecs: stochastic rounding (int8) and PowerSGD's initial factors.
// Everything is derived from integers (seed, rank, step, key) so a run is reproducible, and
// different ranks / steps / tensors draw independent streams (correlated rounding across ranks
// would not cancel in the sum).

/** 32-bit FNV-1a of a string: a stable number for a tensor key. */
export const hashKey = (key: string): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i)
    h = Math.imul(h, 0x01000193)
  }
  return h >>> 0
}

/** Mixes several integers into one 32-bit seed (murmur3 finaliser after each word). */
export const mixSeed = (...words: ReadonlyArray<number>): number => {
  let h = 0x9e3779b9
  for (const w of words) {
    h ^= w >>> 0
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b)
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35)
    h ^= h >>> 16
    // fold in the high part of numbers beyond 32 bits (steps can exceed 2^32 in theory)
    h ^= Math.floor(w / 4294967296) >>> 0
  }
  return h >>> 0
}

/**
 * mulberry32: small and fast, good enough for dithering. The hot loops in int8.ts inline the same
 * recurrence; this object form serves the cold paths.
 */
export class Mulberry32 {
  private s: number
  constructor(seed: number) {
    this.s = seed | 0
  }
  /** Uniform in [0, 1). */
  next(): number {
    this.s = (this.s + 0x6d2b79f5) | 0
    let t = Math.imul(this.s ^ (this.s >>> 15), 1 | this.s)
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  /** Standard normal (Box-Muller). */
  normal(): number {
    const u = 1 - this.next()
    const v = this.next()
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v)
  }
}
