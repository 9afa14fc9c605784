// Communicator.create's abort signal: a group being formed that its owner no longer wants (a
// member died during the handshake, and the driver regroups again: group-session.ts) is given up
// at once with CommunicatorClosed, which groupBroke counts as a broken group, instead of waiting
// for the missing rank until the handshake's deadline (CollectiveTimeout). Real nats-server.
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Communicator } from "../collectives/communicator.ts"
import { CommunicatorClosed, groupBroke } from "../collectives/errors.ts"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"

let server: NatsServerProcess
let nc: NatsConnection

beforeAll(async () => {
  server = await launchNatsServer({ jetstream: false })
  nc = await connect({ servers: server.url, noEcho: true })
})

afterAll(async () => {
  await nc?.close()
  await server?.stop()
})

describe("Communicator.create with an abort signal", () => {
  it("gives up a handshake that waits for a rank that never comes once aborted, as a broken group", async () => {
    const controller = new AbortController()
    // Rank 1 never joins; the handshake's own deadline is far beyond the abort.
    const creating = Communicator.create({ nc, cluster: "t", job: "abort", group: "waits", rank: 0, worldSize: 2, createTimeoutMs: 120_000, signal: controller.signal })
    setTimeout(() => controller.abort(new Error("paused for regroup 3")), 300)
    const e = await creating.then(
      () => undefined,
      (err: unknown) => err
    )
    expect(e).toBeInstanceOf(CommunicatorClosed)
    expect(groupBroke(e)).toBe(true)
    expect((e as CommunicatorClosed).op).toBe("create")
    expect((e as CommunicatorClosed).message).toContain("paused for regroup 3")
  })

  it("with the direct links on too: the listener is closed and the group can be formed again under its name", async () => {
    const controller = new AbortController()
    controller.abort(new Error("not wanted"))
    const direct = { secret: Buffer.alloc(32, 7), host: "127.0.0.1" }
    await expect(Communicator.create({ nc, cluster: "t", job: "abort", group: "again", rank: 0, worldSize: 2, signal: controller.signal, direct })).rejects.toBeInstanceOf(CommunicatorClosed)
    // Both ranks form it now (fresh connections: one per rank).
    const other = await connect({ servers: server.url, noEcho: true })
    try {
      const comms = await Promise.all([nc, other].map((c, rank) => Communicator.create({ nc: c, cluster: "t", job: "abort", group: "again", rank, worldSize: 2, direct: { ...direct, transport: "direct" as const } })))
      const sums = await Promise.all(comms.map((c, rank) => c.allReduce(Float32Array.of(rank + 1, 10))))
      for (const s of sums) expect([...s]).toEqual([3, 20])
      // Over the direct links: the aborted handshake's listener left nothing in the way.
      for (const c of comms) expect(c.transport.links.map((l) => l.via)).not.toContain("nats")
      await Promise.all(comms.map((c) => c.close()))
    } finally {
      await other.close()
    }
  })
})
