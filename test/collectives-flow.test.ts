// Flow control: the patterns where many ranks send to one (hierarchical fan-in to a node leader,
// tree reduce, fan-out all-gather, concurrent calls) with large buffers and a small max_payload,
// so thousands of chunks are in flight. Core NATS would drop a receiver that falls behind (slow
// consumer) and lose data silently. The server here allows only 4 MiB pending per client (64 MiB
// by default) and a 250 ms write deadline, so a receiver that stops reading while senders push at it
// without flow control is cut off (checked by hand: with an unlimited window the stall test fails
// with ConnectionLost). With credits (1 MiB per receiver and call) nothing is lost: results match
// the reference and the server reports no slow consumer.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import type { Case, CaseResult } from "./support/collectives-cases.ts"
import { RankFleet } from "./support/collectives-fleet.ts"

const P = 4
let server: NatsServerProcess
let fleet: RankFleet

beforeAll(async () => {
  server = await launchNatsServer({ jetstream: false, maxPayload: 64 * 1024, monitor: true, extraConfig: 'max_pending: 4MB\nwrite_deadline: "250ms"' })
  fleet = await RankFleet.start({ size: P, server: () => server.url })
})

afterAll(async () => {
  await fleet?.stop()
  await server?.stop()
})

const varz = async (): Promise<{ slow_consumers: number; in_msgs: number }> => {
  const res = await fetch(`http://127.0.0.1:${server.monitorPort}/varz`)
  return (await res.json()) as { slow_consumers: number; in_msgs: number }
}

describe("collectives flow control", () => {
  it("fan-in with large buffers and a 64 KiB max_payload loses nothing", async () => {
    const group = "fanin"
    // All ranks on one node: hierarchical is a pure 3-to-1 fan-in to the leader, then a fan-out.
    const created = await fleet.all<{ chunkElems: number }>(P, (rank) => ({ cmd: "create", group, rank, worldSize: P, node: "one-node", timeoutMs: 30_000, windowBytes: 1024 * 1024 }))
    expect(created[0].chunkElems * 4).toBeLessThanOrEqual(64 * 1024)
    const before = await varz()
    const list: Case[] = [
      { op: "allReduce", algorithm: "hierarchical", reduce: "sum", length: 1_500_000, seed: 11 },
      { op: "allReduce", algorithm: "tree", reduce: "mean", length: 1_500_000, seed: 12 },
      { op: "allReduce", algorithm: "ring", reduce: "sum", length: 1_500_000, seed: 13 },
      { op: "allGather", algorithm: "fanout", length: 750_000, seed: 14 },
      { op: "allReduce", algorithm: "hierarchical", reduce: "weightedMean", length: 400_000, seed: 15, concurrent: 3 }
    ]
    const results = await fleet.all<Array<CaseResult & { index: number }>>(P, () => ({ cmd: "run", group, cases: list }), 240_000)
    await fleet.all(P, () => ({ cmd: "close", group }))
    const failures: string[] = []
    list.forEach((c, i) => {
      const per = results.map((r) => r[i])
      per.forEach((r, rank) => {
        if (!r.ok) failures.push(`case ${i} ${c.op}/${c.algorithm} rank ${rank}: ${r.detail}`)
      })
      if (new Set(per.map((r) => r.hash)).size !== 1) failures.push(`case ${i} ${c.op}/${c.algorithm}: results differ across ranks`)
    })
    expect(failures).toEqual([])
    const after = await varz()
    expect(after.slow_consumers).toBe(before.slow_consumers)
    // Thousands of chunks really went through the server.
    expect(after.in_msgs - before.in_msgs).toBeGreaterThan(2_000)
  })

  it("a receiver that stops reading for a second mid fan-in is not overrun", async () => {
    const group = "stalled-leader"
    await fleet.all(P, (rank) => ({ cmd: "create", group, rank, worldSize: P, node: "one-node", timeoutMs: 30_000, windowBytes: 1024 * 1024 }))
    const before = await varz()
    const c: Case = { op: "allReduce", algorithm: "hierarchical", reduce: "sum", length: 2_000_000, seed: 21 }
    await fleet.all(P, () => ({ cmd: "start", group, case: c }))
    // The leader (rank 0) stops reading while three members push 8 MB each at it: without credits
    // the server's backlog for it would pass max_pending and it would be cut off, losing data.
    await new Promise((r) => setTimeout(r, 50))
    fleet.kill(0, "SIGSTOP")
    await new Promise((r) => setTimeout(r, 1_000))
    fleet.kill(0, "SIGCONT")
    const outcomes = await fleet.all<{ ok: boolean; value?: CaseResult; error?: { message: string } }>(P, () => ({ cmd: "result" }), 60_000)
    for (const o of outcomes) {
      expect(o.error?.message).toBeUndefined()
      expect(o.value?.ok).toBe(true)
    }
    expect(new Set(outcomes.map((o) => o.value?.hash)).size).toBe(1)
    expect((await varz()).slow_consumers).toBe(before.slow_consumers)
    await fleet.all(P, () => ({ cmd: "close", group }))
  })
})
