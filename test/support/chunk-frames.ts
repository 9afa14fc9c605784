// Helpers shared by the chunking suites (test/chunking.test.ts, test/chunking-pool.test.ts).
import { expect } from "vitest"
import type { Reassembler } from "../../core/chunking.ts"

/** n deterministic pseudo-random bytes (an LCG's high byte) for seed. */
export const payloadOf = (n: number, seed = 1): Uint8Array => {
  const p = new Uint8Array(n)
  let x = seed
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) >>> 0
    p[i] = x >>> 24
  }
  return p
}

/** Pushes all frames; returns what the last push returned (earlier pushes must return undefined). */
export const feed = (r: Reassembler, frames: ReadonlyArray<Uint8Array>): Uint8Array | undefined => {
  let out: Uint8Array | undefined
  frames.forEach((f, i) => {
    out = r.push(f)
    if (i < frames.length - 1) expect(out).toBeUndefined()
  })
  return out
}
