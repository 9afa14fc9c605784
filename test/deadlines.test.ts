// Collective deadlines from measurements (collectives/deadlines.ts), as pure logic: the fixed
// default while warming up, 2 x the median step + the floor after, capped; an explicit timeoutMs
// as given; spikes that a median ignores; and the deadline a hung rank is named within. And the
// driver's heartbeat deadline, which only grows for steps whose computation holds a worker longer.
import { describe, expect, it } from "vitest"
import { HeartbeatDeadline, MeasuredDeadlines, limitText, seconds } from "../collectives/deadlines.ts"
import {
  COLLECTIVE_DEADLINE_FLOOR_MS,
  COLLECTIVE_TIMEOUT_MS,
  DEADLINE_FACTOR,
  DEADLINE_WARMUP_STEPS,
  WORKER_DEAD_AFTER_MS,
  WORKER_HELD_DEAD_AFTER_MS,
  WORKER_START_DEAD_AFTER_MS
} from "../core/defaults.ts"

const steps = (d: MeasuredDeadlines, ms: number, n: number): void => {
  for (let i = 0; i < n; i++) d.noteStep(ms)
}

describe("measured collective deadlines", () => {
  it("states its constants: twice the step, a 10 s floor, 5 warm-up steps, capped at the 30 s default", () => {
    expect(DEADLINE_FACTOR).toBe(2)
    expect(COLLECTIVE_DEADLINE_FLOOR_MS).toBe(10_000)
    expect(DEADLINE_WARMUP_STEPS).toBe(5)
    expect(COLLECTIVE_TIMEOUT_MS).toBe(30_000)
  })

  it("uses the default until enough steps are measured, and says so", () => {
    const d = new MeasuredDeadlines()
    expect(d.current()).toMatchObject({ ms: COLLECTIVE_TIMEOUT_MS, measured: false })
    steps(d, 100, DEADLINE_WARMUP_STEPS - 1)
    expect(d.current()).toMatchObject({ ms: COLLECTIVE_TIMEOUT_MS, measured: false })
    expect(d.current().why).toBe("the default 30 s until 5 steps of this group are measured (4 so far)")
    d.noteStep(100)
    expect(d.current()).toEqual({ ms: 10_200, measured: true, why: "2 x median step 0.1 s + floor 10 s" })
  })

  it("is the floor plus twice the median step, for fast and for slow steps", () => {
    const fast = new MeasuredDeadlines()
    steps(fast, 4, 20)
    expect(fast.current().ms).toBe(10_008)
    const slow = new MeasuredDeadlines()
    steps(slow, 1_100, 20)
    expect(slow.current()).toEqual({ ms: 12_200, measured: true, why: "2 x median step 1.1 s + floor 10 s" })
  })

  it("never exceeds the cap (the default, or a given one)", () => {
    const d = new MeasuredDeadlines()
    steps(d, 20_000, 10)
    expect(d.current()).toMatchObject({ ms: COLLECTIVE_TIMEOUT_MS, measured: true })
    expect(d.current().why).toMatch(/^the cap 30 s, below 2 x median step 20 s \+ floor 10 s$/)
    const capped = new MeasuredDeadlines({ capMs: 6_000 })
    steps(capped, 1_000, 10)
    expect(capped.current().ms).toBe(6_000)
  })

  it("takes an explicit timeoutMs as given, shorter or longer than a derived one would be", () => {
    const short = new MeasuredDeadlines({ fixedMs: 3_000 })
    steps(short, 10_000, 10)
    expect(short.current()).toEqual({ ms: 3_000, measured: false, why: "timeoutMs 3 s, set explicitly" })
    const long = new MeasuredDeadlines({ fixedMs: 120_000 })
    steps(long, 10, 10)
    expect(long.current().ms).toBe(120_000)
  })

  it("ignores spikes: a few slow steps (a GC pause, a checkpoint) do not move the median", () => {
    const d = new MeasuredDeadlines()
    steps(d, 50, 30)
    d.noteStep(9_000)
    d.noteStep(12_000)
    d.noteStep(30_000)
    expect(d.current().ms).toBe(10_100)
  })

  it("follows a lasting change of step time within the window", () => {
    const d = new MeasuredDeadlines({ window: 16 })
    steps(d, 50, 16)
    steps(d, 2_000, 9)
    expect(d.current().ms).toBe(14_000)
  })

  it("takes the median collective time when it is the larger (a loop that notes short steps)", () => {
    const d = new MeasuredDeadlines()
    steps(d, 10, 10)
    for (let i = 0; i < 5; i++) d.noteCollective(500)
    expect(d.current()).toEqual({ ms: 11_000, measured: true, why: "2 x median collective 0.5 s + floor 10 s" })
  })

  it("goes back to the default when a new group forms, until it has run the warm-up steps", () => {
    const d = new MeasuredDeadlines()
    steps(d, 200, 20)
    expect(d.current().ms).toBe(10_400)
    d.newGroup()
    expect(d.current()).toMatchObject({ ms: COLLECTIVE_TIMEOUT_MS, measured: false })
    steps(d, 200, DEADLINE_WARMUP_STEPS)
    expect(d.current().ms).toBe(10_400)
  })

  it("drops measurements that are not times", () => {
    const d = new MeasuredDeadlines()
    d.noteStep(Number.NaN)
    d.noteStep(-1)
    d.noteStep(Number.POSITIVE_INFINITY)
    expect(d.stepsMeasured).toBe(0)
  })

  it("names a hung rank well before the fixed default: the deadline a peer waits for it", () => {
    // Ranks step in 300 ms; one stops entering the all-reduce. The others wait this long of silence.
    const d = new MeasuredDeadlines()
    steps(d, 300, 40)
    const { ms, why } = d.current()
    expect(ms).toBe(2 * 300 + COLLECTIVE_DEADLINE_FLOOR_MS)
    expect(ms).toBeLessThan(COLLECTIVE_TIMEOUT_MS)
    expect(why).toBe("2 x median step 0.3 s + floor 10 s")
  })

  it("describes itself for explain.txt and the start-up line", () => {
    const d = new MeasuredDeadlines()
    steps(d, 120, 8)
    d.noteCollective(30)
    const { text, json, summary } = d.describe()
    expect(summary).toBe("gradwire: collective deadline 10 s (2 x median step 0.12 s + floor 10 s)")
    expect(text).toMatch(/^collective deadline: 10 s \(2 x median step 0\.12 s \+ floor 10 s\); measured median step 0\.12 s over the latest 8 steps, median collective 0\.03 s\./)
    expect(json).toMatchObject({ collectiveDeadlineMs: 10_240, measured: true, medianStepMs: 120, medianCollectiveMs: 30, factor: 2, floorMs: 10_000, capMs: 30_000 })
    // ranks still working are waited for past it, up to their limits; with an explicit timeoutMs, not
    expect(text).toMatch(/its event loop held by one computation \(waited for up to 120 s\) or its process busy outside the collectives \(up to 30 min\)\.$/)
    expect(json).toMatchObject({ heldPeerWaitMs: 120_000, busyPeerWaitMs: 1_800_000 })
    const fixed = new MeasuredDeadlines({ fixedMs: 3_000 }).describe()
    expect(fixed.text).toMatch(/names the rank holding the group up\.$/)
    expect(fixed.json.busyPeerWaitMs).toBeUndefined()
  })

  it("writes seconds short", () => {
    expect(seconds(4.2)).toBe("0.0042 s")
    expect(seconds(110)).toBe("0.11 s")
    expect(seconds(1_100)).toBe("1.1 s")
    expect(seconds(5_000)).toBe("5 s")
    expect(seconds(12_345)).toBe("12 s")
    // limits: seconds below 10 min, minutes from there
    expect(limitText(120_000)).toBe("120 s")
    expect(limitText(1_800_000)).toBe("30 min")
  })
})

describe("the heartbeat deadline of a worker process", () => {
  it("is 60 s until a step is measured (a big model's first steps hold the worker as long), then the fixed 10 s while steps are short", () => {
    const h = new HeartbeatDeadline()
    expect(h.current()).toEqual({ ms: WORKER_START_DEAD_AFTER_MS, measured: false, why: "60 s until a step is measured, then at least the floor 10 s" })
    expect(WORKER_START_DEAD_AFTER_MS).toBe(60_000)
    // a floor above it (GPU workers') is kept from the start
    expect(new HeartbeatDeadline({ floorMs: 90_000 }).current().ms).toBe(90_000)
    h.noteCompute(300)
    expect(h.current().ms).toBe(WORKER_DEAD_AFTER_MS)
    for (let i = 0; i < 10; i++) h.noteCompute(300)
    expect(h.current()).toEqual({ ms: 10_000, measured: true, why: "the floor 10 s, above 2 x longest step computation 0.3 s" })
  })

  it("stays at 60 s for a worker that has not reported a step itself while the others' bring it down (a later starter, a replacement)", () => {
    const h = new HeartbeatDeadline()
    h.noteCompute(300, "w-a")
    expect(h.current("w-a").ms).toBe(WORKER_DEAD_AFTER_MS)
    expect(h.current("w-b")).toEqual({ ms: WORKER_START_DEAD_AFTER_MS, measured: false, why: "60 s until this worker's first step is measured" })
    h.noteCompute(400, "w-b")
    expect(h.current("w-b").ms).toBe(WORKER_DEAD_AFTER_MS)
    // without a worker named: the job's deadline, as explain.txt gives it
    expect(h.current().ms).toBe(WORKER_DEAD_AFTER_MS)
  })

  it("grows to twice the longest step computation, which holds the worker's event loop and its beats", () => {
    const h = new HeartbeatDeadline()
    for (let i = 0; i < 10; i++) h.noteCompute(1_000)
    h.noteCompute(7_000)
    expect(h.current()).toEqual({ ms: 14_000, measured: true, why: "2 x longest step computation 7 s" })
  })

  it("forgets a long step once it left the window", () => {
    const h = new HeartbeatDeadline({ window: 4 })
    h.noteCompute(8_000)
    for (let i = 0; i < 4; i++) h.noteCompute(100)
    expect(h.current().ms).toBe(WORKER_DEAD_AFTER_MS)
  })

  it("describes itself for explain.txt and the progress line", () => {
    const h = new HeartbeatDeadline()
    h.noteCompute(6_000)
    expect(h.describe().summary).toBe("gradwire: heartbeat deadline 12 s (2 x longest step computation 6 s)")
    expect(h.describe().text).toMatch(/^heartbeat deadline: 12 s \(2 x longest step computation 6 s\)\. Workers beat from a thread of their own: one not heard from for 10 s is counted as dead .*, one whose event loop is held for 120 s by one computation is taken for hung/)
    expect(h.describe().json).toMatchObject({ heartbeatDeadlineMs: 12_000, silentMs: 10_000, heldMs: 120_000 })
  })

  it("judges a worker beating from its thread by silence after the floor and by its held event loop after 120 s, or the deadline if longer", () => {
    expect(WORKER_HELD_DEAD_AFTER_MS).toBe(120_000)
    const h = new HeartbeatDeadline()
    // before any step: silence still counts after the floor (the thread beats through the dry step)
    expect(h.silentMs).toBe(WORKER_DEAD_AFTER_MS)
    expect(h.heldMs()).toBe(WORKER_HELD_DEAD_AFTER_MS)
    for (let i = 0; i < 10; i++) h.noteCompute(7_000, "w-a")
    expect(h.silentMs).toBe(WORKER_DEAD_AFTER_MS)
    expect(h.heldMs("w-a")).toBe(WORKER_HELD_DEAD_AFTER_MS)
    h.noteCompute(80_000, "w-a")
    expect(h.heldMs("w-a")).toBe(160_000)
    // a GPU job's floor is its silence deadline
    expect(new HeartbeatDeadline({ floorMs: 30_000 }).silentMs).toBe(30_000)
  })
})
