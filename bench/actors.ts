// Benchmark: actor ask round trip between two actors in different processes, next to a raw NATS
// request-reply of the same payload between the same two processes, in the same run (blocks of
// each alternate, so drift hits both alike); and actor spawn-to-ready time through a node agent.
// Usage: npm run bench -- actors [--n 2000] [--sizes 16,1024,65536] [--spawns 5]
// The actor definitions below are what the agent spawns (this module is also loaded by them).
import * as os from "node:os"
import * as path from "node:path"
import { execFileSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import { connect } from "@nats-io/transport-node"
import * as Schema from "effect/Schema"
import { defineActor } from "../actors/runtime/actor.ts"
import { launchAgent } from "../actors/node/agent.ts"
import { silentLogger } from "../actors/runtime/log.ts"
import { defineProtocol } from "../actors/runtime/protocol.ts"
import { spawnActor } from "../actors/node/spawn.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { launchNatsServer } from "../core/nats-server.ts"
import { installNatsPatches } from "../core/nats-internals/index.ts"

const Stats = Schema.Struct({ median: Schema.Number, p99: Schema.Number, mean: Schema.Number })

export const BenchEchoProtocol = defineProtocol("bench-echo", {
  echo: { request: Schema.Uint8Array, reply: Schema.Uint8Array }
})

export const BenchPingerProtocol = defineProtocol("bench-pinger", {
  measure: {
    request: Schema.Struct({ target: Schema.String, rawSubject: Schema.String, n: Schema.Number, bytes: Schema.Number, block: Schema.Number }),
    reply: Schema.Struct({ actor: Stats, raw: Stats })
  }
})

/** Echoes asks; also answers raw NATS requests on a subject of its job (the baseline). */
export const benchEcho = defineActor(BenchEchoProtocol, (ctx) => {
  const raw = ctx.system.nc.subscribe(ctx.system.subjects.inbox(`raw-${ctx.name}`), {
    callback: (_e, m) => {
      m.respond(m.data)
    }
  })
  ctx.onStop(() => raw.unsubscribe())
  return { echo: (bytes) => bytes }
})

const stats = (samples: number[]): { median: number; p99: number; mean: number } => {
  const s = [...samples].sort((a, b) => a - b)
  const at = (q: number): number => s[Math.min(s.length - 1, Math.floor(q * s.length))]
  return { median: at(0.5), p99: at(0.99), mean: s.reduce((x, y) => x + y, 0) / s.length }
}

/** Measures, from its own process, asks to `target` and raw requests to `rawSubject`, alternating blocks. */
export const benchPinger = defineActor(BenchPingerProtocol, (ctx) => ({
  measure: async ({ target, rawSubject, n, bytes, block }) => {
    const { system } = ctx
    const ref = system.ref(BenchEchoProtocol, target)
    const payload = new Uint8Array(bytes).map((_, i) => i & 0xff)
    const actor: number[] = []
    const raw: number[] = []
    // Warm up both paths (JIT, connections, subject interest).
    for (let i = 0; i < 1000; i++) {
      await system.askPromise(ref, "echo", payload)
      await system.nc.request(rawSubject, payload, { timeout: 5_000 })
    }
    while (actor.length < n) {
      for (let i = 0; i < block; i++) {
        const t = performance.now()
        await system.askPromise(ref, "echo", payload, { timeoutMs: 5_000 })
        actor.push((performance.now() - t) * 1000)
      }
      for (let i = 0; i < block; i++) {
        const t = performance.now()
        await system.nc.request(rawSubject, payload, { timeout: 5_000 })
        raw.push((performance.now() - t) * 1000)
      }
    }
    return { actor: stats(actor), raw: stats(raw) }
  }
}))

const flag = (args: ReadonlyArray<string>, name: string, fallback: string): string => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback
}

const us = (v: number): string => `${v.toFixed(0).padStart(6)} µs`

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const n = Math.max(2000, Number(flag(args, "n", "2000")))
  const sizes = flag(args, "sizes", "16,1024,65536").split(",").map(Number)
  const spawns = Number(flag(args, "spawns", "5"))
  const self = fileURLToPath(import.meta.url)
  const server = await launchNatsServer({ maxPayload: 8 * 1024 * 1024 })
  installNatsPatches() // as openNats does
  const nc = await connect({ servers: server.url })
  const agentConn = await connect({ servers: server.url })
  const agent = await launchAgent({
    nc: agentConn,
    connection: { servers: [server.url] },
    // The bench's own actors live in this file.
    allowModuleRoots: [path.dirname(self)],
    cluster: "bench",
    nodeId: "bench-node",
    backends: ["cpu"],
    log: silentLogger,
    output: () => {}
  })
  const driver = new ActorSystem({ nc, cluster: "bench", job: "actors", log: silentLogger })
  try {
    console.log(`actor ask round trip vs raw NATS request-reply (2 processes, loopback, ${n} of each, median / p99)`)
    console.log(`node ${process.version}, ${os.cpus().length} cores`)
    await spawnActor(driver, { node: "bench-node", name: "echo", module: self, export: "benchEcho" })
    await spawnActor(driver, { node: "bench-node", name: "pinger", module: self, export: "benchPinger" })
    const pinger = driver.ref(BenchPingerProtocol, "pinger")
    console.log(`${"payload".padEnd(10)} ${"actor median".padStart(13)} ${"raw median".padStart(13)} ${"overhead".padStart(9)}   ${"actor p99".padStart(10)} ${"raw p99".padStart(10)}`)
    // A whole round first, not shown: the first measured round otherwise pays for JIT warm-up of
    // both processes and the server.
    await driver.askPromise(pinger, "measure", { target: "echo", rawSubject: driver.subjects.inbox("raw-echo"), n: 2000, bytes: 16, block: 100 }, { timeoutMs: 300_000 })
    for (const bytes of sizes) {
      const r = await driver.askPromise(
        pinger,
        "measure",
        { target: "echo", rawSubject: driver.subjects.inbox("raw-echo"), n, bytes, block: 100 },
        { timeoutMs: 300_000 }
      )
      const overhead = (r.actor.median / r.raw.median - 1) * 100
      console.log(
        `${`${bytes} B`.padEnd(10)} ${us(r.actor.median).padStart(13)} ${us(r.raw.median).padStart(13)} ${`${overhead >= 0 ? "+" : ""}${overhead.toFixed(1)}%`.padStart(9)}   ${us(r.actor.p99).padStart(10)} ${us(r.raw.p99).padStart(10)}`
      )
    }

    console.log(`\nactor spawn-to-ready through the node agent (${spawns} spawns, one at a time)`)
    const ready: number[] = []
    for (let i = 0; i < spawns; i++) {
      const s = await spawnActor(driver, { node: "bench-node", name: `spawned-${i}`, module: self, export: "benchEcho" })
      ready.push(s.readyMs)
      await s.kill("bench done")
    }
    const bare: number[] = []
    for (let i = 0; i < 3; i++) {
      const t = performance.now()
      execFileSync(process.execPath, ["-e", "0"])
      bare.push(performance.now() - t)
    }
    const r = stats(ready)
    console.log(`spawn-to-ready: median ${r.median.toFixed(0)} ms, min ${Math.min(...ready).toFixed(0)} ms, max ${Math.max(...ready).toFixed(0)} ms`)
    console.log(`baseline: bare "node -e 0" start ${stats(bare).median.toFixed(0)} ms`)
  } finally {
    driver.endJob()
    driver.close()
    await agent.stop()
    await agentConn.close()
    await nc.close()
    await server.stop()
  }
}
