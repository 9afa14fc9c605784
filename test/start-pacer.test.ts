// The pacing of process starts per node (actors/train/driver/start-pacer.ts): at most a node's
// limit under way at once, the rest in the order asked, a failed start giving its place back, nodes
// independent; the limit a node's cores give; and what a spawn says when the agent that does not
// answer is the embedded one, in the asking process (actors/node/errors.ts). And a real job on the
// embedded cluster with two more workers than that limit: its process starts, as events.jsonl
// records them, never overlap past the limit, and some waited for a place (real nats-server and
// worker processes).
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { StartPacer, startsAtOnce } from "../actors/train/driver/start-pacer.ts"
import { AgentUnreachable } from "../actors/node/errors.ts"
import { Trainer } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import { readEvents } from "./support/trainer-runs.ts"

/** A start that settles when told to. */
const gate = () => {
  let open!: () => void
  let fail!: (e: Error) => void
  const settled = new Promise<void>((resolve, reject) => {
    open = resolve
    fail = reject
  })
  return { settled, open, fail }
}

const turns = () => new Promise((resolve) => setImmediate(resolve))

describe("StartPacer", () => {
  it("runs at most the node's limit at once, the rest in the order asked, each as a place frees", async () => {
    const pacer = new StartPacer(() => 2)
    const gates = Array.from({ length: 5 }, gate)
    const began: number[] = []
    const done = gates.map((g, i) =>
      pacer.run("a", async () => {
        began.push(i)
        await g.settled
        return i
      })
    )
    await turns()
    expect(began).toEqual([0, 1])
    expect(pacer.running("a")).toBe(2)
    expect(pacer.waiting("a")).toBe(3)
    gates[1]!.open()
    await turns()
    expect(began).toEqual([0, 1, 2])
    expect(pacer.running("a")).toBe(2)
    gates[0]!.open()
    gates[2]!.open()
    await turns()
    expect(began).toEqual([0, 1, 2, 3, 4])
    gates[3]!.open()
    gates[4]!.open()
    expect(await Promise.all(done)).toEqual([0, 1, 2, 3, 4])
    expect(pacer.running("a")).toBe(0)
    expect(pacer.waiting("a")).toBe(0)
  })

  it("gives a failed start's place to the next and passes its error on", async () => {
    const pacer = new StartPacer(() => 1)
    const first = gate()
    const began: string[] = []
    const failing = pacer.run("a", async () => {
      began.push("first")
      await first.settled
    })
    const next = pacer.run("a", async () => {
      began.push("next")
      return "ok"
    })
    await turns()
    expect(began).toEqual(["first"])
    first.fail(new Error("it went down before it was ready"))
    await expect(failing).rejects.toThrow("it went down before it was ready")
    expect(await next).toBe("ok")
    expect(began).toEqual(["first", "next"])
    expect(pacer.running("a")).toBe(0)
  })

  it("paces each node on its own limit", async () => {
    const pacer = new StartPacer((node) => (node === "small" ? 1 : 3))
    const g = gate()
    const began: string[] = []
    const all = ["small", "small", "big", "big", "big"].map((node, i) =>
      pacer.run(node, async () => {
        began.push(`${node}${i}`)
        await g.settled
      })
    )
    await turns()
    expect(began).toEqual(["small0", "big2", "big3", "big4"])
    expect(pacer.waiting("small")).toBe(1)
    g.open()
    await Promise.all(all)
    expect(began).toContain("small1")
  })

  it("treats a limit below one as one, so a start is never held for good", async () => {
    const pacer = new StartPacer(() => 0)
    expect(await pacer.run("a", async () => 7)).toBe(7)
  })
})

describe("startsAtOnce", () => {
  it("is one more than the node's cores, and no bound when they are unknown", () => {
    expect(startsAtOnce(2)).toBe(3)
    expect(startsAtOnce(16)).toBe(17)
    expect(startsAtOnce(2.5)).toBe(3)
    expect(startsAtOnce(undefined)).toBe(Infinity)
    expect(startsAtOnce(0)).toBe(Infinity)
    expect(startsAtOnce(Number.NaN)).toBe(Infinity)
  })
})

describe("AgentUnreachable", () => {
  it("points at `gradwire status` for an agent elsewhere, and at the busy machine for one in this process", () => {
    const away = new AgentUnreachable({ node: "n1", reason: "no answer within 10000 ms" })
    expect(away.message).toBe('node agent n1 does not answer: no answer within 10000 ms; is it running ("gradwire status")?')
    const here = new AgentUnreachable({ node: "local", reason: "no answer within 10000 ms", embedded: true })
    expect(here.message).toContain("the embedded cluster's node agent (in this process) does not answer: no answer within 10000 ms")
    expect(here.message).toContain("too busy")
    expect(here.message).not.toContain("gradwire status")
  })
})

describe("a job with more workers than its node starts at once", () => {
  let storage: string
  beforeAll(async () => {
    storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-start-pacer-"))
  })
  afterAll(async () => {
    await fs.rm(storage, { recursive: true, force: true })
    expect(liveNatsServerPids()).toEqual([])
  })

  it("starts them at most the node's cores + 1 at a time, the rest waiting for a place, each start in events.jsonl", { timeout: 180_000 }, async () => {
    const limit = startsAtOnce(os.availableParallelism())
    const numWorkers = limit + 2
    const r = await new Trainer({
      trainLoopPerWorker: path.resolve("test/support/report-loop.ts") + "#reportLoop",
      trainLoopConfig: { mode: "scalar", epochs: 1 },
      scalingConfig: { numWorkers },
      runConfig: { name: "paced", storagePath: storage, progress: false, failureConfig: { maxFailures: 0 } }
    }).fit()
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0])
    const starts = (await readEvents(r.path)).filter((e) => e.type === "process-start") as Array<{ time: string; name: string; node: string; pid: number; queuedMs: number; readyMs: number }>
    expect(starts).toHaveLength(numWorkers)
    expect(new Set(starts.map((s) => s.pid)).size).toBe(numWorkers)
    for (const s of starts) expect(s).toMatchObject({ node: "local", name: expect.stringMatching(/^w0-\d+$/) })
    // Each start held its place from its spawn request to its ready notice (recorded then): at no
    // moment more than `limit` of those spans at once (10 ms off each end for the clock's rounding).
    const spans = starts.map((s) => {
      const end = Date.parse(s.time)
      return [end - s.readyMs + 10, end - 10] as const
    })
    const most = Math.max(...spans.map(([t]) => spans.filter(([a, b]) => a <= t && t < b).length))
    expect(most, JSON.stringify(starts)).toBeLessThanOrEqual(limit)
    // The two past the limit waited for a place: a start's time at least (before, all were asked of
    // the agent at once, which on a 2-core machine left it unable to answer a 50-worker job).
    const waited = starts.filter((s) => s.queuedMs > 0).sort((a, b) => b.queuedMs - a.queuedMs)
    expect(waited.length, JSON.stringify(starts)).toBeGreaterThanOrEqual(2)
    expect(waited[1]!.queuedMs).toBeGreaterThanOrEqual(Math.min(...starts.map((s) => s.readyMs)) - 20)
  })
})
