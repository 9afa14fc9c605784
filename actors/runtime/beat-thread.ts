// The body of a beat thread (heartbeat.ts startThreadBeating): a worker thread of an actor process
// that publishes the process's beat on a NATS connection of its own, so the beats go on while the
// main thread runs a long synchronous computation (tfjs runs kernels synchronously: a training
// step, an evaluation loop whose awaits resolve at once). Each beat carries `heldMs`, how long ago
// the main thread's event loop last ticked (a shared clock it stores into every TICK_MS), so its
// watcher still tells a busy process from a hung one, and a stopped or partitioned process (no
// beat at all) from both; and `cpuMs`, the process's CPU time so far (every thread's), so a
// process that works outside its collectives (its loop free) is told from one waiting on nothing.
// Posts "up" once its first beat is out; exits on "stop".
//
// It loads nats.js alone (about 19 MB a thread, against 55 MB with gradwire's connection and wire
// modules and the Effect schemas they bring): the beat comes encoded from the main thread, with
// `cpuMs` and `heldMs` last as msgpack float64s whose 8 bytes it overwrites (heartbeat.ts
// beatTemplate, beat-bytes.ts withHeld).
import * as fs from "node:fs"
import { parentPort, workerData } from "node:worker_threads"
import { connect, credsAuthenticator, nkeyAuthenticator, type NodeConnectionOptions } from "@nats-io/transport-node"
import { withHeld } from "./beat-bytes.ts"
import type { BeatThreadData } from "./heartbeat.ts"

const data = workerData as BeatThreadData
const ticks = new BigInt64Array(data.ticks)
const template = data.template

/** The process's connection spec as nats.js options, as core/connection-spec.ts openConnection makes them. */
const options = (): NodeConnectionOptions => {
  const c = data.connection
  const authenticator = [
    ...(c.credsFile !== undefined ? [credsAuthenticator(fs.readFileSync(c.credsFile))] : []),
    ...(c.nkeySeed !== undefined ? [nkeyAuthenticator(new TextEncoder().encode(c.nkeySeed))] : [])
  ]
  return {
    servers: [...c.servers],
    name: data.connectionName,
    timeout: data.connectTimeoutMs,
    reconnect: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    ...(c.user !== undefined ? { user: c.user, pass: c.password ?? "" } : {}),
    ...(c.token !== undefined ? { token: c.token } : {}),
    ...(authenticator.length > 0 ? { authenticator } : {}),
    ...(c.tls !== undefined ? { tls: { ...c.tls } } : {})
  }
}

const run = async (): Promise<void> => {
  const nc = await connect(options())
  const send = (): void => {
    if (nc.isClosed() || nc.isDraining()) return
    // a copy a beat: the client may hold a payload until it flushes (all of an outage)
    const cpu = process.cpuUsage()
    const bytes = withHeld(template, Math.max(0, Date.now() - Number(Atomics.load(ticks, 0))), (cpu.user + cpu.system) / 1000)
    try {
      nc.publish(data.subject, bytes)
    } catch {
      // closed between the check and the publish: the next tick sees it
    }
  }
  send()
  const timer = setInterval(send, data.intervalMs)
  parentPort!.on("message", (m: unknown) => {
    if (m !== "stop") return
    clearInterval(timer)
    void nc.close().finally(() => parentPort!.close())
  })
  await nc.flush()
  parentPort!.postMessage("up")
}

run().catch((e: unknown) => {
  parentPort!.postMessage({ failed: e instanceof Error ? e.message : String(e) })
  parentPort!.close()
})
