// Keeping spares beside a whole group (actors/train/driver/refill.ts), with a fake controller,
// group and cluster view: spares alone start only once the watched generation has run for a
// while, so that a spare taken by a regroup is not replaced while the replacement still replays
// and takes its state (a process start competes for the cores); a group left short-handed gets its
// replacement at once.
import { afterEach, describe, expect, it, vi } from "vitest"
import { Refill } from "../actors/train/driver/refill.ts"
import type { NodeResources } from "../scheduler/resources.ts"

const node: NodeResources = { nodeId: "local", hostname: "h", cpus: 8, memoryBytes: 8e9, gpus: [], backends: ["wasm"], natsServer: "s", labels: {}, custom: {} }

/** A Refill over a fake controller (its generation `current()`), group (`standby` starts) and cluster view. */
const refillOver = (o: {
  current: () => unknown
  standby: (spawns: unknown, args: unknown, lowered: boolean) => Promise<unknown>
  max: number
  spares: number
  event: (e: Record<string, unknown>) => void
}): Refill =>
  new Refill({
    controller: { state: "running", get current() { return o.current() }, elastic: false, refill: () => false } as never,
    group: { members: new Map(), holds: () => true, standby: o.standby } as never,
    cluster: { view: { resources: () => [node], alive: () => [], onEvent: () => () => {} } } as never,
    request: { jobId: "j", backend: "wasm" },
    groupArgs: () => ({}) as never,
    max: o.max,
    spares: o.spares,
    job: "j",
    line: () => {},
    event: o.event
  })

/** Starts that never settle: a standby still starting. */
const starting = (): Promise<unknown> => new Promise(() => {})

const rig = (worldSize: number, max: number) => {
  const started: string[] = []
  const g = { number: 1, worldSize, settled: false } as never
  const refill = refillOver({ current: () => g, standby: starting, max, spares: 1, event: (e) => void (e.type === "standby-start" && started.push(String(e.for))) })
  return { refill, g, started }
}

afterEach(() => {
  vi.useRealTimers()
})

describe("spares beside a whole group", () => {
  it("starts a spare only once the generation has run 2 s, and a replacement for a short group at once", () => {
    vi.useFakeTimers()
    const whole = rig(3, 3)
    const stop = whole.refill.watch(whole.g)
    expect(whole.started).toEqual([])
    vi.advanceTimersByTime(1_500)
    expect(whole.started).toEqual([])
    vi.advanceTimersByTime(1_000)
    expect(whole.started).toEqual(["spare"])
    stop()
    // A regrouped generation short of its size: its replacement (and the spare with it) starts at once.
    const short = rig(2, 3)
    short.refill.formed(short.g)
    const stopShort = short.refill.watch(short.g)
    expect(short.started).toEqual(["replacement"])
    stopShort()
  })

  it("a second failure while a replacement starts starts the one it adds at once, not after the first is ready", () => {
    vi.useFakeTimers()
    const starts: number[] = []
    let current = { number: 1, worldSize: 2, settled: false }
    const refill = refillOver({ current: () => current, standby: starting, max: 3, spares: 0, event: (e) => void (e.type === "standby-start" && starts.push(e.workers as number)) })
    // A group of 3 lost one: its replacement starts.
    refill.formed(current as never)
    const stop1 = refill.watch(current as never)
    expect(starts).toEqual([1])
    // Checked again while it starts: nothing more is started.
    vi.advanceTimersByTime(2_000)
    expect(starts).toEqual([1])
    stop1()
    // Then the next regroup lost another, the first replacement still starting: one more starts, at once.
    current = { number: 2, worldSize: 1, settled: false }
    refill.formed(current as never)
    const stop2 = refill.watch(current as never)
    expect(starts).toEqual([1, 1])
    vi.advanceTimersByTime(2_000)
    expect(starts).toEqual([1, 1])
    stop2()
  })
})

describe("a standby that cannot start at the lowest CPU priority", () => {
  /** A short group whose standby starts fail as `failures` say, in turn; the `lowered` each start was asked with. */
  const failing = (failures: ReadonlyArray<{ tag: string; message: string } | undefined>) => {
    const asked: boolean[] = []
    const events: Array<Record<string, unknown>> = []
    const g = { number: 1, worldSize: 2, settled: false } as never
    const refill = refillOver({
      current: () => g,
      standby: (_spawns, _args, lowered) => {
        asked.push(lowered)
        const f = failures[asked.length - 1]
        return f ? Promise.resolve(f) : starting()
      },
      max: 3,
      spares: 0,
      event: (e) => void events.push(e)
    })
    refill.formed(g)
    return { refill, g, asked, events }
  }

  it("after a lowered start timed out, the next replacements start at the workers' priority; another failure keeps them lowered", async () => {
    vi.useFakeTimers()
    const timedOut = { tag: "SpawnError", message: 'spawning actor "w-standby1" on node local failed: not ready within 60000 ms (pid 7); it was killed' }
    const t = failing([timedOut, timedOut])
    const stop = t.refill.watch(t.g)
    await vi.advanceTimersByTimeAsync(6_000)
    await vi.advanceTimersByTimeAsync(6_000)
    stop()
    expect(t.asked).toEqual([true, false, false])
    expect(t.events.filter((e) => e.type === "standby-failed").map((e) => e.next)).toEqual(["not lowered", undefined])
    expect(t.events.filter((e) => e.type === "standby-start").map((e) => e.lowered)).toEqual([undefined, false, false])
    // A failure that is no timeout (a module the node refuses, say) says nothing of the cores.
    const other = failing([{ tag: "ModuleNotAllowed", message: "module /x.ts is not under an allowed root" }])
    const stopOther = other.refill.watch(other.g)
    await vi.advanceTimersByTimeAsync(6_000)
    stopOther()
    expect(other.asked).toEqual([true, true])
  })
})
