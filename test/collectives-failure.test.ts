// Collectives under failure: a rank that stalls (SIGSTOP) or dies (SIGKILL) mid-operation, ranks
// that disagree on lengths or on the collective, a rank that closes mid-call, a group that never
// forms. Every rank must end with a typed error naming the culprit, within the deadline: no hang.
// @module-tag faults (stopped, killed and held ranks: `npm run test:faults`, not `npm test`)
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import type { Case } from "./support/collectives-cases.ts"
import { RankFleet, type RankError, type Reply } from "./support/collectives-fleet.ts"
import { allReduceAlgorithmNames } from "../collectives/algorithms/index.ts"

const TIMEOUT_MS = 1_500
// The deadline, then the liveness probe (timeout / 4, at least 200 ms), then slack for a loaded
// machine (a CI run beside other test files once took 5.8 s). What the bound tells apart is a
// deadline-driven failure from a hang: without the deadline a survivor waits on the dead rank
// until `settle`'s 30 s.
const FAIL_WITHIN_MS = TIMEOUT_MS + 400 + 6_000

let server: NatsServerProcess
let fleet: RankFleet

beforeAll(async () => {
  server = await launchNatsServer({ jetstream: false })
  fleet = await RankFleet.start({ size: 4, server: () => server.url })
})

afterAll(async () => {
  await fleet?.stop()
  await server?.stop()
})

/** Fleet processes -> group ranks for one group. */
const create = async (group: string, procs: number[], extra: Record<string, unknown> = {}): Promise<void> => {
  await Promise.all(
    procs.map((proc, rank) =>
      fleet.call(proc, { cmd: "create", group, rank, worldSize: procs.length, node: `n${rank}`, timeoutMs: TIMEOUT_MS, chunkBytes: 16 * 1024, windowBytes: 64 * 1024, ...extra })
    )
  )
}

/** Runs one case per process (maybe different per rank) and returns each rank's outcome. */
const runEach = async (group: string, procs: number[], caseOf: (rank: number) => Case): Promise<Array<Reply<unknown>>> =>
  Promise.all(procs.map((proc, rank) => fleet.request(proc, { cmd: "run", group, cases: [caseOf(rank)] })))

type Outcome = { ok: true; ms: number } | { ok: false; error: RankError; ms: number }

/** Starts a long case on the given processes without waiting; `settle` collects the outcomes. */
const startEach = async (group: string, procs: number[], c: Case): Promise<{ settle: (who: number[]) => Promise<Outcome[]> }> => {
  await Promise.all(procs.map((proc) => fleet.call(proc, { cmd: "start", group, case: c })))
  return {
    settle: (who) => Promise.all(who.map((proc) => fleet.call<Outcome>(proc, { cmd: "result" }, 30_000)))
  }
}

const expectFailureNaming = (outcome: Outcome, culprit: number, withinMs = FAIL_WITHIN_MS): void => {
  expect(outcome.ok).toBe(false)
  if (outcome.ok) return
  const { tag, fields } = outcome.error
  expect(["CollectiveTimeout", "CollectiveAborted"]).toContain(tag)
  expect(fields.failedRanks as number[]).toContain(culprit)
  expect(outcome.ms).toBeLessThan(withinMs)
}

/** A collective large enough (with small chunks and windows) to be mid-flight for a while. */
const long = (algorithm: string): Case => ({ op: "allReduce", algorithm, reduce: "sum", length: 2_000_000, seed: 7 })

describe("collectives failure handling", () => {
  it("mismatched lengths fail fast with a typed error on every rank, for every algorithm", async () => {
    for (const algorithm of allReduceAlgorithmNames()) {
      const group = `mm-${algorithm}`
      const procs = [0, 1, 2, 3]
      await create(group, procs, { timeoutMs: 20_000 })
      const t0 = Date.now()
      // Rank 2 brings 5 elements more than the others.
      const replies = await runEach(group, procs, (rank) => ({ op: "allReduce", algorithm, reduce: "sum", length: 1000 + (rank === 2 ? 5 : 0), seed: 3 }))
      expect(Date.now() - t0).toBeLessThan(10_000) // half the 20 s deadline: nobody waited it out
      for (const r of replies) {
        expect(r.ok).toBe(false)
        if (r.ok) continue
        const { tag, fields } = r.error
        if (tag === "LengthMismatch") {
          expect(fields.expected === 1005 || fields.got === 1005).toBe(true)
        } else {
          expect(tag).toBe("CollectiveAborted")
          expect(fields.causeTag).toBe("LengthMismatch")
        }
      }
      expect(replies.some((r) => !r.ok && r.error.tag === "LengthMismatch")).toBe(true)
      await Promise.all(procs.map((proc) => fleet.call(proc, { cmd: "close", group })))
    }
  })

  it("ranks calling different collectives get OpMismatch (or the abort it causes)", async () => {
    const group = "opmm"
    const procs = [0, 1, 2, 3]
    await create(group, procs, { timeoutMs: 20_000 })
    const replies = await runEach(group, procs, (rank) => ({ op: "allReduce", algorithm: rank === 1 ? "tree" : "ring", reduce: "sum", length: 100, seed: 1 }))
    for (const r of replies) {
      expect(r.ok).toBe(false)
      if (!r.ok) expect(["OpMismatch", "CollectiveAborted", "CollectiveProtocolError"]).toContain(r.error.tag)
    }
    expect(replies.some((r) => !r.ok && r.error.tag === "OpMismatch")).toBe(true)
    await Promise.all(procs.map((proc) => fleet.call(proc, { cmd: "close", group })))
  })

  it("a rank stopped mid-operation (SIGSTOP) makes the others fail within the deadline, naming it", async () => {
    const group = "stall"
    const procs = [0, 1, 2, 3]
    await create(group, procs)
    const run = await startEach(group, procs, long("ring"))
    await new Promise((r) => setTimeout(r, 100))
    fleet.kill(1, "SIGSTOP")
    try {
      const outcomes = await run.settle([0, 2, 3])
      for (const o of outcomes) expectFailureNaming(o, 1)
    } finally {
      fleet.kill(1, "SIGCONT")
    }
    // The stopped rank, once resumed, fails too instead of hanging (aborted by its peers, or its own deadline).
    const [resumed] = await run.settle([1])
    expect(resumed.ok).toBe(false)
    // A later call on the others names the culprit too (CommunicatorClosed on a rank whose own
    // deadline closed it, CollectiveAborted on the rest): a loop often reports that call, not the first.
    const late = await runEach(group, [0, 2, 3], () => ({ op: "allReduce", algorithm: "ring", reduce: "sum", length: 10, seed: 1 }))
    for (const r of late) {
      expect(r.ok).toBe(false)
      if (!r.ok) expect(r.error.fields.failedRanks, JSON.stringify(r.error)).toEqual(expect.arrayContaining([1]))
    }
    expect(late.some((r) => !r.ok && r.error.tag === "CommunicatorClosed"), JSON.stringify(late)).toBe(true)
    await Promise.all(procs.map((proc) => fleet.call(proc, { cmd: "close", group })))
  })

  it("a silent rank its owner knows alive, its event loop held, is waited for past the deadline; one not heard from, stopped after a free turn of its loop, or held past its limit, is not", async () => {
    // SIGSTOP stands in for a rank whose event loop one long computation holds: it answers no probe.
    // The others' owner (the driver, in a training run) says whether it still beats from its thread.
    const held = { ranks: [1], heardAgoMs: 300, heldMs: 5_000, hungAfterMs: 120_000 }
    const stopFor = async (group: string, vouch: typeof held, ms: number): Promise<Outcome[]> => {
      const procs = [0, 1, 2, 3]
      await create(group, procs, { heldPeers: vouch })
      const run = await startEach(group, procs, long("ring"))
      await new Promise((r) => setTimeout(r, 100))
      fleet.kill(1, "SIGSTOP")
      try {
        // past the deadline (1.5 s, then the probe) twice for the first case, once for the others
        await new Promise((r) => setTimeout(r, ms))
      } finally {
        fleet.kill(1, "SIGCONT")
      }
      const outcomes = await run.settle(procs)
      await Promise.all(procs.map((proc) => fleet.call(proc, { cmd: "close", group })))
      return outcomes
    }
    // alive and held: every rank finishes the call once the held one goes on
    const waited = await stopFor("held", held, 4_500)
    for (const o of waited) expect(o, JSON.stringify(o)).toMatchObject({ ok: true })
    expect(Math.min(...waited.map((o) => o.ms))).toBeGreaterThan(2 * TIMEOUT_MS)
    // its last beat too old (a process stopped or cut off): taken for gone, as without an owner
    for (const o of (await stopFor("unheard", { ...held, heardAgoMs: 5_000 }, 3_000)).filter((_, proc) => proc !== 1)) expectFailureNaming(o, 1)
    // heard lately, but its last beat saw a free event loop (stopped since): taken for gone
    for (const o of (await stopFor("stopped", { ...held, heardAgoMs: 1_000, heldMs: 1_100 }, 3_000)).filter((_, proc) => proc !== 1)) expectFailureNaming(o, 1)
    // held longer than it may be: taken for hung
    for (const o of (await stopFor("hung", { ...held, hungAfterMs: 4_000 }, 3_000)).filter((_, proc) => proc !== 1)) expectFailureNaming(o, 1)
  })

  it("a rank behind the call whose process works (its loop free) is waited for past the deadline; one idle, or behind past busyPeerWaitMs, is named", async () => {
    // Rank 1 starts the call late, as a rank evaluating alone between steps does: it answers the
    // probe, but has not started the call. The owner says how busy its process is.
    // (A longer deadline than the other tests': its probe, a quarter of it, gives rank 1 625 ms to
    // answer over the bus on a loaded machine, and in the cases where rank 1 is to be named it
    // starts 7.5 s late, 4.4 s after the others would name it. With a 375 ms probe and a 1.1 s
    // margin the test failed once in a loaded CI run, which did not record the failing assertion;
    // with 1.4 s (rank 1 4.5 s late) once more, in a fresh-clone CI run: the idle case's call
    // finished, not yet named when rank 1 came. Frames the other ranks still pass among themselves
    // keep their waits alive past the bare deadline, and on a loaded machine longer.)
    const timeoutMs = 2_500
    const working = { ranks: [1], heardAgoMs: 300, heldMs: 0, cpu: 0.9, hungAfterMs: 120_000 }
    const lateBy = async (group: string, vouch: typeof working, ms: number, busyPeerWaitMs?: number): Promise<Outcome[]> => {
      await create(group, [0, 1, 2, 3], { timeoutMs, heldPeers: vouch, ...(busyPeerWaitMs !== undefined ? { busyPeerWaitMs } : {}) })
      const others = await startEach(group, [0, 2, 3], long("ring"))
      await new Promise((r) => setTimeout(r, ms))
      const one = await startEach(group, [1], long("ring"))
      const outcomes = [...(await others.settle([0, 2, 3])), ...(await one.settle([1]))]
      await Promise.all([0, 1, 2, 3].map((proc) => fleet.call(proc, { cmd: "close", group })))
      return outcomes
    }
    // (working on a loaded machine: a fifth of a core, as a busy process gets beside seven others on two cores)
    const waited = await lateBy("busy", { ...working, cpu: 0.2 }, 2.4 * timeoutMs)
    for (const o of waited) expect(o, JSON.stringify(o)).toMatchObject({ ok: true })
    expect(Math.min(...waited.slice(0, 3).map((o) => o.ms))).toBeGreaterThan(2 * timeoutMs)
    // Named before rank 1 comes (7.5 s late), so not waited for: at the deadline and its probe
    // (about 3.1 s), which a loaded CI run stretched past the other tests' bound (4.6 s against
    // 4.4 s; a waited-for rank's call would have finished, not failed, once it came).
    const named = (o: Outcome): void => {
      expectFailureNaming(o, 1, 7_000)
      if (!o.ok && o.error.tag === "CollectiveTimeout") expect(o.error.fields.behind).toEqual([1])
    }
    // idle (waiting on something that never comes): hung, named at the deadline
    // (named at the deadline and its probe, about 3.1 s)
    // The timeout says why the rank was not waited for.
    const why = (o: Outcome): unknown => (o.ok ? undefined : o.error.tag === "CollectiveTimeout" ? o.error.fields.notWaitedOn : "(another rank's timeout)")
    const idle = (await lateBy("idle", { ...working, cpu: 0.01 }, 7_500)).slice(0, 3)
    for (const o of idle) named(o)
    expect(idle.map(why), JSON.stringify(idle)).toContain("rank 1's process used 0.01 of a core (a peer at work uses at least 0.1)")
    // working, but behind for longer than busyPeerWaitMs (named at the first deadline past it, as above)
    const tooLong = (await lateBy("too-long", working, 7_500, 1_000)).slice(0, 3)
    for (const o of tooLong) named(o)
    expect(tooLong.map(why), JSON.stringify(tooLong)).toContain("they worked past the 1 s a busy peer is waited for")
  })

  it("a rank closing mid-operation aborts the others at once", async () => {
    const group = "closing"
    const procs = [0, 1, 2, 3]
    await create(group, procs, { timeoutMs: 20_000 })
    const run = await startEach(group, procs, long("tree"))
    await new Promise((r) => setTimeout(r, 100))
    await fleet.call(3, { cmd: "close", group })
    const outcomes = await run.settle([0, 1, 2])
    for (const o of outcomes) {
      expect(o.ok).toBe(false)
      if (o.ok) continue
      expect(o.error.tag).toBe("CollectiveAborted")
      expect(o.error.fields.causeTag).toBe("CommunicatorClosed")
      expect(o.ms).toBeLessThan(10_000) // half the 20 s deadline
    }
    // A call started after the abort reached this rank fails the same way, with the peer's cause
    // (this is what a rank that is late to a collective sees), and sends nothing.
    const [late] = await runEach(group, [0], () => ({ op: "allReduce", algorithm: "ring", reduce: "sum", length: 10, seed: 1 }))
    expect(late.ok).toBe(false)
    if (!late.ok) {
      expect(late.error.tag).toBe("CollectiveAborted")
      expect(late.error.fields.by).toBe(3)
      expect(late.error.fields.causeTag).toBe("CommunicatorClosed")
    }
    await Promise.all([0, 1, 2].map((proc) => fleet.call(proc, { cmd: "close", group })))
  })

  it("a group that never forms fails create() with a timeout naming the missing rank", async () => {
    const group = "incomplete"
    const replies = await Promise.all(
      [0, 1].map((proc, rank) => fleet.request(proc, { cmd: "create", group, rank, worldSize: 3, node: "n", createTimeoutMs: 1_000 }))
    )
    for (const r of replies) {
      expect(r.ok).toBe(false)
      if (r.ok) continue
      expect(r.error.tag).toBe("CollectiveTimeout")
      expect(r.error.fields.op).toBe("create")
      expect(r.error.fields.waitingFor).toEqual([2])
    }
  })

  it("a rank killed mid-operation (SIGKILL) makes the others fail within the deadline, naming it", async () => {
    for (const algorithm of ["ring", "hierarchical"]) {
      // Kills are final: the last test, killing process 3 then 2.
      const victim = algorithm === "ring" ? 3 : 2
      const procs = algorithm === "ring" ? [0, 1, 2, 3] : [0, 1, 2]
      const group = `kill-${algorithm}`
      await create(group, procs)
      const run = await startEach(group, procs, long(algorithm))
      await new Promise((r) => setTimeout(r, 100))
      fleet.kill(victim, "SIGKILL")
      const survivors = procs.filter((p) => p !== victim)
      const outcomes = await run.settle(survivors)
      for (const o of outcomes) expectFailureNaming(o, procs.indexOf(victim))
    }
  })
})
