// The send-side buffer pool (core/nats-internals/send.ts) over a real nats-server: large flushes pack into
// pooled buffers that come back when the socket has written them, and every message arrives
// byte-for-byte, in order, whatever its size against the pool's threshold.
import { connect } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { payload } from "./support/nats-payload.ts"
import { installNatsPatches, isPooledReceive, sendPoolStats, SEND_POOL_MIN_BYTES } from "../core/nats-internals/index.ts"
import { DataBuffer, ProtocolHandler } from "@nats-io/nats-core/internal"

let server: NatsServerProcess

beforeAll(async () => {
  installNatsPatches()
  server = await launchNatsServer({ jetstream: false, maxPayload: 8 * 1024 * 1024 })
})

afterAll(async () => {
  await server?.stop()
})

/** Subscribes to `subject` and resolves with the first `count` messages' bytes (copied), or rejects after 20 s. */
const collect = (sub: Awaited<ReturnType<typeof connect>>, subject: string, count: number): Promise<Uint8Array[]> => {
  const got: Uint8Array[] = []
  return new Promise<Uint8Array[]>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${got.length} of ${count} messages arrived`)), 20_000)
    sub.subscribe(subject, {
      max: count,
      callback: (_e, m) => {
        got.push(m.data.slice())
        if (got.length === count) {
          clearTimeout(timer)
          resolve(got)
        }
      }
    })
  })
}

describe("large NATS publishes", () => {
  it("the flush hook is installed on this nats.js", () => {
    expect(installNatsPatches()).toEqual({ installed: true })
  })

  it("arrive intact, in order, and reuse the pool's buffers", async () => {
    const sizes = [0, 1, SEND_POOL_MIN_BYTES - 64, SEND_POOL_MIN_BYTES, SEND_POOL_MIN_BYTES + 1, 1 << 20, (1 << 20) + 17, (3 << 20) + 7, 8 * 1024 * 1024 - 256]
    const pub = await connect({ servers: server.url })
    const sub = await connect({ servers: server.url })
    try {
      const rounds = 3
      const done = collect(sub, "big", sizes.length * rounds)
      await sub.flush()
      const before = { ...sendPoolStats }
      // back to back, so flushes pack several messages and the same sizes come round again
      for (let round = 0; round < rounds; round++) {
        for (const [i, n] of sizes.entries()) pub.publish("big", payload(n, i + 1))
        await pub.flush()
      }
      const got = await done
      expect(got.length).toBe(sizes.length * rounds)
      for (let k = 0; k < got.length; k++) {
        const i = k % sizes.length
        expect(got[k].length).toBe(sizes[i])
        expect(Buffer.from(got[k]).equals(Buffer.from(payload(sizes[i], i + 1)))).toBe(true)
      }
      const taken = sendPoolStats.taken - before.taken
      // large flushes went through the pool, and later rounds found buffers given back
      expect(taken).toBeGreaterThan(0)
      expect(sendPoolStats.reused - before.reused).toBeGreaterThan(0)
      // every buffer taken came back once its write was done
      expect(sendPoolStats.returned - before.returned).toBe(taken)
    } finally {
      await pub.close()
      await sub.close()
    }
  })

  it("a payload changed after its flush does not change what was sent", async () => {
    const pub = await connect({ servers: server.url })
    const sub = await connect({ servers: server.url })
    try {
      const done = collect(sub, "reused", 2)
      await sub.flush()
      const buf = payload(1 << 20, 7)
      const first = buf.slice()
      pub.publish("reused", buf)
      await pub.flush()
      buf.fill(0xab) // the caller reuses its buffer, as the collectives do with their chunks
      pub.publish("reused", buf)
      await pub.flush()
      const [a, b] = await done
      expect(Buffer.from(a).equals(Buffer.from(first))).toBe(true)
      expect(b.every((x) => x === 0xab)).toBe(true)
    } finally {
      await pub.close()
      await sub.close()
    }
  })

  it("a received (pooled) payload published while the connection cannot flush is copied, so its buffer can go back to the pool", async () => {
    const pub = await connect({ servers: server.url })
    const sub = await connect({ servers: server.url })
    try {
      const got = collect(sub, "pooled", 1)
      await sub.flush()
      pub.publish("pooled", payload(300_000, 3))
      await pub.flush()
      const [copy] = await got
      // a pooled receive buffer, as the collectives pass on: receive one for real
      const again = new Promise<Uint8Array>((resolve) => sub.subscribe("pooled2", { max: 1, callback: (_e, m) => resolve(m.data) }))
      await sub.flush()
      pub.publish("pooled2", copy)
      await pub.flush()
      const received = await again
      expect(isPooledReceive(received)).toBe(true)
      const send = (ProtocolHandler as unknown as { prototype: { sendCommand: (this: unknown, cmd: string, ...p: Uint8Array[]) => void } }).prototype.sendCommand
      const handler = (connected: boolean) => ({ infoReceived: true, connected, outbound: new DataBuffer(), pendingLimit: 1 << 30, flushPending() {} })
      const offline = handler(false)
      send.call(offline, "PUB x 300000\r\n", received)
      expect(offline.outbound.buffers[1]).not.toBe(received) // copied
      expect(Buffer.from(offline.outbound.buffers[1]).equals(Buffer.from(received))).toBe(true)
      const online = handler(true)
      send.call(online, "PUB x 300000\r\n", received)
      expect(online.outbound.buffers[1]).toBe(received) // flushed at once or in a microtask: no copy
    } finally {
      await pub.close()
      await sub.close()
    }
  })
})
