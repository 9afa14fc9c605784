// The socket read pool (core/nats-internals/read.ts) over a real nats-server: a connection reads into reused
// buffers, and every message arrives intact even when its receiver keeps it while later reads
// land in the same buffers: the views the parser hands on (payloads that fit in one read, their
// subjects, reply subjects and headers) are copied as they are dispatched.
import { spawnSync } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect, headers } from "@nats-io/transport-node"
import type { Msg } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { runScript } from "./support/run-script.ts"
import { installNatsPatches, readPoolStats, READ_BYTES } from "../core/nats-internals/index.ts"
import { payload } from "./support/nats-payload.ts"

let server: NatsServerProcess

beforeAll(async () => {
  installNatsPatches()
  server = await launchNatsServer({ jetstream: false, maxPayload: 8 * 1024 * 1024 })
})

afterAll(async () => {
  await server?.stop()
})

describe("socket reads into pooled buffers", () => {
  it("the hooks are installed on this nats.js", () => {
    expect(installNatsPatches()).toEqual({ installed: true })
  })

  it("messages kept by their receiver stay intact while the read buffers are reused: payloads, subjects, replies, headers", async () => {
    // many small messages per read, ones that straddle reads, and large ones (the receive pool)
    const sizes = [0, 1, 17, 200, 4096, 40_000, READ_BYTES - 100, READ_BYTES + 5, 300_000, 1 << 20]
    const rounds = 6
    const pub = await connect({ servers: server.url })
    const sub = await connect({ servers: server.url })
    try {
      const kept: Msg[] = []
      const total = sizes.length * rounds
      const done = new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`only ${kept.length} of ${total} messages arrived`)), 20_000)
        sub.subscribe("read.>", {
          callback: (_e, m) => {
            kept.push(m) // kept as delivered: no copy
            if (kept.length === total) {
              clearTimeout(timer)
              resolve()
            }
          }
        })
      })
      await sub.flush()
      const before = { ...readPoolStats }
      for (let r = 0; r < rounds; r++) {
        for (const [i, n] of sizes.entries()) {
          const h = headers()
          h.set("x-round", `${r}-${i}`)
          pub.publish(`read.${r}.${"s".repeat(1 + ((i * 7) % 40))}.${i}`, payload(n, 100 * r + i + 1), { reply: `reply.${r}.${i}`, headers: i % 3 === 0 ? h : undefined })
        }
        await pub.flush()
      }
      await done
      // the subscriber read through the pool and reused its buffers on the way
      expect(readPoolStats.taken - before.taken).toBeGreaterThan(10)
      expect(readPoolStats.reused - before.reused).toBeGreaterThan(0)
      expect(readPoolStats.returned - before.returned).toBeGreaterThan(0)
      // every kept message still reads as sent
      for (let k = 0; k < total; k++) {
        const r = Math.floor(k / sizes.length)
        const i = k % sizes.length
        const m = kept[k]
        expect(m.subject).toBe(`read.${r}.${"s".repeat(1 + ((i * 7) % 40))}.${i}`)
        expect(m.reply).toBe(`reply.${r}.${i}`)
        expect(m.data.length).toBe(sizes[i])
        expect(Buffer.from(m.data).equals(Buffer.from(payload(sizes[i], 100 * r + i + 1))), `round ${r} message ${i}`).toBe(true)
        if (i % 3 === 0) expect(m.headers?.get("x-round")).toBe(`${r}-${i}`)
      }
    } finally {
      await pub.close()
      await sub.close()
    }
  })

  const openssl = spawnSync("openssl", ["version"], { stdio: "ignore" }).status === 0
  it.skipIf(!openssl)("a server that offers TLS: the client upgrades over the socket the pool dialled and carries traffic (needs openssl for a self-signed certificate)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gw-tls-"))
    let tlsServer: NatsServerProcess | undefined
    try {
      const made = spawnSync(
        "openssl",
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        { stdio: "ignore", timeout: 30_000 }
      )
      expect(made.status).toBe(0)
      // TLS offered, not required: nats.js upgrades on its own when the client names no TLS options
      tlsServer = await launchNatsServer({
        jetstream: false,
        extraConfig: `tls { cert_file: "${join(dir, "cert.pem")}", key_file: "${join(dir, "key.pem")}" }\nallow_non_tls: true\n`
      })
      const run = await runScript("test/support/tls-client.ts", [], { timeoutMs: 30_000, env: { GW_TLS_URL: tlsServer.url, NODE_EXTRA_CA_CERTS: join(dir, "cert.pem") } })
      expect(run.code, run.output).toBe(0)
      const r = JSON.parse(run.output.trim().split("\n").pop() as string) as { got: number[][]; encrypted: boolean; taken: number; returned: number }
      expect(r.encrypted).toBe(true)
      expect(r.taken).toBeGreaterThan(0) // dialled through the pool, then upgraded
      expect(r.got).toEqual([
        [10, 1],
        [5000, 1],
        [100_000, 1]
      ])
    } finally {
      await tlsServer?.stop()
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
