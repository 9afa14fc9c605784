// The receive-side buffer reservation (core/nats-internals/receive.ts) over a real nats-server: messages of
// sizes around the socket read size and far beyond it arrive byte-for-byte, in order, several
// interleaved on one connection.
import { connect } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { payload } from "./support/nats-payload.ts"
import { installNatsPatches, isPooledReceive, receivePoolStats, releaseReceived, RECEIVE_POOL_MIN_BYTES } from "../core/nats-internals/index.ts"

let server: NatsServerProcess

beforeAll(async () => {
  installNatsPatches()
  server = await launchNatsServer({ jetstream: false, maxPayload: 8 * 1024 * 1024 })
})

afterAll(async () => {
  await server?.stop()
})

describe("large NATS messages", () => {
  it("the parser hook is installed on this nats.js", () => {
    expect(installNatsPatches()).toEqual({ installed: true })
  })

  it("arrive intact whatever their size relative to the socket reads", async () => {
    const sizes = [0, 1, 65_535, 65_536, 65_537, 200_001, 1 << 20, (3 << 20) + 7, 8 * 1024 * 1024 - 256]
    const pub = await connect({ servers: server.url })
    const sub = await connect({ servers: server.url })
    try {
      const got: Uint8Array[] = []
      const done = new Promise<void>((resolve) => {
        sub.subscribe("big", {
          callback: (_e, m) => {
            got.push(m.data.slice())
            if (got.length === sizes.length * 2) resolve()
          }
        })
      })
      await sub.flush()
      // twice over, back to back, so a large message often starts mid-read after another one
      for (let round = 0; round < 2; round++) for (const [i, n] of sizes.entries()) pub.publish("big", payload(n, i + 1))
      await pub.flush()
      await Promise.race([done, new Promise((_, reject) => setTimeout(() => reject(new Error(`only ${got.length} messages arrived`)), 20_000))])
      for (let k = 0; k < got.length; k++) {
        const i = k % sizes.length
        expect(got[k].length).toBe(sizes[i])
        expect(Buffer.from(got[k]).equals(Buffer.from(payload(sizes[i], i + 1)))).toBe(true)
      }
    } finally {
      await pub.close()
      await sub.close()
    }
  })

  it("large ones land in pooled buffers: one per live message, reused once given back, never twice at once", async () => {
    const pub = await connect({ servers: server.url })
    const sub = await connect({ servers: server.url })
    try {
      const n = 300_000
      const count = 6
      const take = (subject: string): Promise<Uint8Array[]> =>
        new Promise<Uint8Array[]>((resolve, reject) => {
          const got: Uint8Array[] = []
          const timer = setTimeout(() => reject(new Error(`only ${got.length} messages arrived`)), 20_000)
          sub.subscribe(subject, {
            max: count,
            callback: (_e, m) => {
              got.push(m.data) // kept as received: a view of the pool's buffer
              if (got.length === count) {
                clearTimeout(timer)
                resolve(got)
              }
            }
          })
        })
      const round = async (subject: string, seed: number): Promise<Uint8Array[]> => {
        const done = take(subject)
        await sub.flush()
        for (let i = 0; i < count; i++) pub.publish(subject, payload(n, seed + i))
        await pub.flush()
        const got = await done
        got.forEach((g, i) => expect(Buffer.from(g).equals(Buffer.from(payload(n, seed + i)))).toBe(true))
        return got
      }
      const before = { ...receivePoolStats }
      const first = await round("first", 100)
      expect(first.every((g) => isPooledReceive(g))).toBe(true)
      // held messages never share a buffer
      expect(new Set(first.map((g) => g.buffer)).size).toBe(count)
      for (const g of first) {
        releaseReceived(g)
        releaseReceived(g) // a second release is ignored
      }
      expect(receivePoolStats.returned - before.returned).toBe(0) // given back only after the current task
      await new Promise((resolve) => setImmediate(resolve))
      expect(receivePoolStats.returned - before.returned).toBe(count)
      const second = await round("second", 200)
      expect(receivePoolStats.reused - before.reused).toBeGreaterThan(0)
      expect(second.some((g) => first.some((f) => f.buffer === g.buffer))).toBe(true)
      expect(new Set(second.map((g) => g.buffer)).size).toBe(count)
      // an array the pool did not make is not taken in
      const foreign = new Uint8Array(RECEIVE_POOL_MIN_BYTES)
      expect(isPooledReceive(foreign)).toBe(false)
      releaseReceived(foreign)
      await new Promise((resolve) => setImmediate(resolve))
      expect(receivePoolStats.returned - before.returned).toBe(count)
    } finally {
      await pub.close()
      await sub.close()
    }
  })
})
