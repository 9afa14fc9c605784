// Shared between the compression rank processes and the tests that check them: gradient layouts
// (named, shaped slots laid back to back) and the deterministic per-rank gradient of a step, so
// the parent can recompute every rank's input for the in-process simulation.
import type { GradientSlotInfo } from "../../collectives/gradient-reducer.ts"

export interface SlotSpec {
  readonly name: string
  readonly shape: ReadonlyArray<number>
}

export const layoutOf = (slots: ReadonlyArray<SlotSpec>): GradientSlotInfo[] => {
  let offset = 0
  return slots.map((s) => {
    const size = s.shape.reduce((a, b) => a * b, 1)
    const info = { name: s.name, shape: s.shape, offset, size }
    offset += size
    return info
  })
}

/**
 * Fills `out` with rank `rank`'s gradient for `seed`: heavy-tailed values (a cube of a uniform)
 * so top-k has something to pick, a different scale per 4096-element block, and a shared
 * component across ranks so the sum is not pure noise. Cheap enough for 64 MiB per step.
 */
export const fillGradient = (out: Float32Array, seed: number, rank: number): void => {
  let s = (Math.imul(seed, 0x9e3779b1) ^ Math.imul(rank + 1, 0x85ebca6b)) >>> 0
  let c = (Math.imul(seed, 0x27d4eb2f) + 0x165667b1) >>> 0
  let scale = 1
  for (let i = 0; i < out.length; i++) {
    if ((i & 4095) === 0) scale = 0.25 + ((Math.imul(i >>> 12, 0x2c1b3c6d) ^ seed) >>> 0) / 2 ** 32
    s ^= s << 13
    s ^= s >>> 17
    s ^= s << 5
    c = (Math.imul(c, 1664525) + 1013904223) >>> 0
    const u = (s >>> 0) / 2 ** 31 - 1
    const shared = ((Math.imul(i, 0x9e3779b1) ^ c) >>> 0) / 2 ** 32 - 0.5
    out[i] = scale * (u * u * u + 0.1 * shared)
  }
}

/** Every rank's gradient for a step, as the parent recomputes them. */
export const gradientsOf = (n: number, seed: number, worldSize: number): Float32Array[] =>
  Array.from({ length: worldSize }, (_, r) => {
    const g = new Float32Array(n)
    fillGradient(g, seed, r)
    return g
  })
