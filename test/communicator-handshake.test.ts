// Communicator.create's handshake: every regroup forms a new group, and the group waits for its
// slowest rank's create. A rank that subscribes after the others' last hello used to hear them only
// at their next resend (their interval doubling up to 250 ms); now each rank answers a rank it hears
// for the first time with a hello addressed to it, and the loop wakes on every message instead of
// polling. Real nats-server, direct links on.
import type { NatsConnection } from "@nats-io/nats-core"
import { beforeAll, describe, expect, it } from "vitest"
import { Communicator } from "../collectives/communicator.ts"
import { jobSubjects } from "../core/subjects.ts"
import { natsFixtures } from "./support/nats.ts"

// One server and four connections (three ranks and an observer), closed and stopped after the file.
const nats = natsFixtures("all")
const conns: NatsConnection[] = []

beforeAll(async () => {
  const server = await nats.server({ jetstream: false })
  for (let i = 0; i < 4; i++) conns.push((await nats.connect(server.url, { noEcho: true })).nc)
})

describe("Communicator.create's handshake", () => {
  it("answers a rank that joins late with hellos addressed to it, and the group forms with every link direct", async () => {
    const group = "late"
    const direct = { secret: Buffer.alloc(32, 7), host: "127.0.0.1", transport: "direct" as const }
    const create = (rank: number) => Communicator.create({ nc: conns[rank]!, cluster: "t", job: "hs", group, rank, worldSize: 3, createTimeoutMs: 30_000, direct })
    // Every control message to rank 2 alone, seen by a connection of its own: "<src> <dst>".
    const observer = conns[3]!
    const toRank2: string[] = []
    const subject = jobSubjects("t", "hs").collControlInbound(group, 2)
    observer.subscribe(subject, { callback: (_, m) => void toRank2.push(m.subject.split(".").slice(-2).join(" ")) })
    await observer.flush()
    const early = [create(0), create(1)]
    // Ranks 0 and 1 hear each other and keep sending hellos to all, at a growing interval.
    await new Promise((resolve) => setTimeout(resolve, 700))
    expect(toRank2).toEqual([])
    const comms = await Promise.all([...early, create(2)])
    try {
      // Both waiting ranks answered rank 2's first hello with one of their own, addressed to it.
      expect(new Set(toRank2)).toEqual(new Set(["0 2", "1 2"]))
      const sums = await Promise.all(comms.map((c, rank) => c.allReduce(Float32Array.of(rank + 1, 10))))
      for (const s of sums) expect([...s]).toEqual([6, 30])
      for (const c of comms) expect(c.transport.links.map((l) => l.via)).not.toContain("nats")
    } finally {
      await Promise.all(comms.map((c) => c.close()))
    }
  })
})
