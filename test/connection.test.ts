// The NATS connection layer against real servers: connect and pub/sub, max_payload, typed and
// actionable connect errors (refused, no handshake, missing or wrong credentials), reconnect after
// a server restart on the same port, and the Effect service's scoped lifetime.
import * as net from "node:net"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import { afterAll, describe, expect, it } from "vitest"
import { Nats, NatsLayer, openNatsEffect, openNats, reconnectDelay, type NatsHandle } from "../core/connection.ts"
import { NatsConnectError } from "../core/errors.ts"
import { freePort } from "../core/nats-server.ts"
import { eventually, natsFixtures, pidAlive } from "./support/nats.ts"

const nats = natsFixtures()

const connectError = async (options: Parameters<typeof openNats>[0]): Promise<NatsConnectError> => {
  const result = await openNats(options).then(
    async (h) => {
      await h.close()
      return undefined
    },
    (e: unknown) => e
  )
  expect(result).toBeInstanceOf(NatsConnectError)
  return result as NatsConnectError
}

/** Publishes on `pub` until `sub` has received one message on `subject`, bounded by `timeoutMs`. */
const pingUntilReceived = async (sub: NatsHandle, pub: NatsHandle, subject: string, timeoutMs: number): Promise<void> => {
  let got = false
  const s = sub.nc.subscribe(subject, {
    callback: () => {
      got = true
    }
  })
  try {
    await eventually(`a message on ${subject}`, timeoutMs, async () => {
      try {
        pub.nc.publish(subject, new Uint8Array([1]))
        await pub.nc.flush()
      } catch {
        // Disconnected: nats.js buffers or rejects while reconnecting; try again.
      }
      await new Promise((r) => setTimeout(r, 50))
      return got
    })
  } finally {
    s.unsubscribe()
  }
}

describe("openNats", () => {
  it("connects, carries pub/sub, reports the server's max_payload, closes idempotently", async () => {
    const server = await nats.server({ jetstream: false })
    const a = await openNats({ servers: server.url, name: "gw-test-a" })
    const b = await nats.connect(server.url)
    expect(a.maxPayload).toBe(1024 * 1024)
    expect(a.servers).toEqual([server.url])
    await pingUntilReceived(b, a, "gw.test.conn", 5_000)
    await Promise.all([a.close(), a.close()])
    expect(a.nc.isClosed()).toBe(true)
  })

  it("accepts a comma-separated server list", async () => {
    const server = await nats.server({ jetstream: false })
    const deadPort = await freePort()
    const h = await nats.connect(`nats://127.0.0.1:${deadPort}, ${server.url}`)
    expect(h.servers).toEqual([`nats://127.0.0.1:${deadPort}`, server.url])
    expect(h.nc.info?.port).toBe(server.port)
  })

  it("nothing listening: NatsConnectError says connection refused and how to start a server", async () => {
    const port = await freePort()
    const err = await connectError({ servers: `nats://127.0.0.1:${port}`, timeoutMs: 2_000 })
    expect(err.servers).toBe(`nats://127.0.0.1:${port}`)
    expect(err.reason).toMatch(/connection refused/)
    expect(err.message).toMatch(/gradwire start --head/)
  })

  it("no servers given: NatsConnectError", async () => {
    const err = await connectError({ servers: [] })
    expect(err.reason).toMatch(/no server address/)
  })

  it("a port that does not speak NATS: NatsConnectError within the timeout", async () => {
    const sockets: net.Socket[] = []
    const silent = net.createServer((s) => sockets.push(s))
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", () => resolve()))
    try {
      const port = (silent.address() as net.AddressInfo).port
      const err = await connectError({ servers: `127.0.0.1:${port}`, timeoutMs: 500 })
      expect(err.reason).toMatch(/no NATS handshake within 500 ms/)
    } finally {
      for (const s of sockets) s.destroy()
      await new Promise((resolve) => silent.close(resolve))
    }
  })

  it("user/password server: right credentials connect, none or wrong ones are a clear NatsConnectError", async () => {
    const server = await nats.server({ jetstream: false, auth: { user: "trainer", password: "s3cret" } })
    const ok = await nats.connect(server.url, { user: "trainer", pass: "s3cret" })
    expect(ok.nc.isClosed()).toBe(false)
    const none = await connectError({ servers: server.url })
    expect(none.reason).toMatch(/requires credentials: pass user\/pass or token/)
    expect(none.credentials).toBe("required")
    const wrong = await connectError({ servers: server.url, user: "trainer", pass: "nope" })
    expect(wrong.reason).toMatch(/rejected the credentials given \(user "trainer"\)/)
    expect(wrong.credentials).toBe("refused")
  })

  it("token server: the right token connects, none or a wrong one is a clear NatsConnectError", async () => {
    const server = await nats.server({ jetstream: false, auth: { token: "t0ken" } })
    const ok = await nats.connect(server.url, { token: "t0ken" })
    expect(ok.nc.isClosed()).toBe(false)
    expect((await connectError({ servers: server.url })).reason).toMatch(/requires credentials/)
    expect((await connectError({ servers: server.url, token: "wrong" })).reason).toMatch(/rejected the credentials given \(token\)/)
  })

  it("an unreadable creds file is a NatsConnectError naming it", async () => {
    const server = await nats.server({ jetstream: false })
    const err = await connectError({ servers: server.url, creds: "/nonexistent/user.creds" })
    expect(err.reason).toMatch(/cannot read creds file \/nonexistent\/user\.creds/)
  })

  it("reconnects after its server restarts on the same port, and carries traffic again", async () => {
    const server = await nats.server({ jetstream: false })
    const sub = await nats.connect(server.url, { name: "gw-test-sub" })
    const pub = await nats.connect(server.url, { name: "gw-test-pub" })
    await pingUntilReceived(sub, pub, "gw.test.before", 5_000)
    const reconnected = (async () => {
      for await (const s of sub.nc.status()) if (s.type === "reconnect") return true
      return false
    })()
    const oldPid = server.pid
    await server.restart()
    expect(pidAlive(oldPid)).toBe(false)
    await pingUntilReceived(sub, pub, "gw.test.after", 15_000)
    expect(await reconnected).toBe(true)
    expect(sub.nc.isClosed()).toBe(false)
  })
})

describe("reconnectDelay", () => {
  it("tries again 50-75 ms apart for the first 2 s of an outage, then at the configured pause; a new outage starts fast again", () => {
    let now = 1_000_000
    const rolls = [0, 0.999, 0.5]
    let k = 0
    const delay = reconnectDelay(250, () => now, () => rolls[k++ % rolls.length]!)
    const asks: number[] = []
    // Asked on every pass of the client's dial loop while it is disconnected: here every 50 ms for 3 s.
    for (let t = 0; t <= 3_000; t += 50, now += 50) asks.push(delay())
    const early = asks.slice(0, 40)
    const late = asks.slice(41)
    expect(Math.min(...early)).toBe(50)
    expect(Math.max(...early)).toBe(75)
    expect(Math.min(...late)).toBe(250)
    expect(Math.max(...late)).toBe(350)
    // Connected for a while (no asks), then a new outage: fast again.
    now += 60_000
    expect(delay()).toBeLessThanOrEqual(75)
    now += 1_500
    expect(delay()).toBeLessThanOrEqual(75)
  })
})

describe("Effect API", () => {
  it("NatsLayer provides Nats for the layer's lifetime and drains it afterwards", async () => {
    const server = await nats.server({ jetstream: false })
    const { nc, text } = await Effect.runPromise(
      Effect.gen(function* () {
        const { nc, maxPayload } = yield* Nats
        expect(maxPayload).toBe(1024 * 1024)
        const text = yield* Effect.promise(async () => {
          const sub = nc.subscribe("gw.test.layer", { max: 1, timeout: 5_000 })
          nc.publish("gw.test.layer", new TextEncoder().encode("via layer"))
          for await (const m of sub) return new TextDecoder().decode(m.data)
          return ""
        })
        return { nc, text }
      }).pipe(Effect.provide(NatsLayer({ servers: server.url })))
    )
    expect(text).toBe("via layer")
    await eventually("connection closed after the layer", 5_000, () => nc.isClosed())
  })

  it("openNatsEffect fails with a typed NatsConnectError", async () => {
    const port = await freePort()
    const exit = await Effect.runPromiseExit(Effect.scoped(openNatsEffect({ servers: `127.0.0.1:${port}`, timeoutMs: 1_000 })))
    expect(Exit.isFailure(exit)).toBe(true)
    const error = await Effect.runPromise(Effect.flip(Effect.scoped(openNatsEffect({ servers: `127.0.0.1:${port}`, timeoutMs: 1_000 }))))
    expect(error._tag).toBe("NatsConnectError")
    expect(error.reason).toMatch(/connection refused/)
    // A Layer that cannot connect fails the same way.
    const viaLayer = await Effect.runPromiseExit(
      Effect.gen(function* () {
        return yield* Nats
      }).pipe(Effect.provide(NatsLayer({ servers: `127.0.0.1:${port}`, timeoutMs: 1_000 })))
    )
    expect(Exit.isFailure(viaLayer) && JSON.stringify(viaLayer.cause)).toMatch(/NatsConnectError/)
  })
})

afterAll(async () => {
  await nats.cleanup()
  const leftovers = [...nats.pids].filter(pidAlive)
  expect(leftovers, `nats-server processes started by this suite still alive: ${leftovers.join(", ")}`).toEqual([])
})
