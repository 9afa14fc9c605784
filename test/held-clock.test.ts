// core/held-clock.ts: a periodic check tells its own lateness (the process held) from running on time.
import { describe, expect, it } from "vitest"
import { HELD_MIN_MS, HeldClock } from "../core/held-clock.ts"

describe("HeldClock", () => {
  it("is 0 for checks about on time, and the time not looked for a late one", () => {
    const c = new HeldClock(100, 0)
    expect(c.held(100)).toBe(0)
    expect(c.held(350)).toBe(0) // a slow turn, not a hold
    expect(c.held(350 + HELD_MIN_MS + 1)).toBe(HELD_MIN_MS + 1 - 100)
    expect(c.held(350 + HELD_MIN_MS + 101)).toBe(0) // counted from the late check
  })

  it("a long interval is late only past four of its intervals", () => {
    const c = new HeldClock(1_000, 0)
    expect(c.held(4_000)).toBe(0)
    expect(c.held(8_001)).toBe(3_001)
  })

  it("reset starts counting again, at a new interval", () => {
    const c = new HeldClock(100, 0)
    c.reset(50_000, 20)
    expect(c.held(50_020)).toBe(0)
    c.reset(60_000)
    expect(c.held(61_001)).toBe(981)
  })
})
