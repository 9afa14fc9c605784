// The body of a beat thread (heartbeat.ts startThreadBeating): a worker thread of an actor process
// that publishes the process's beat on a NATS connection of its own, so the beats go on while the
// main thread runs a long synchronous computation (tfjs runs kernels synchronously: a training
// step, an evaluation loop whose awaits resolve at once). Each beat carries `heldMs`, how long ago
// the main thread's event loop last ticked (a shared clock it stores into every TICK_MS), so its
// watcher still tells a busy process from a hung one, and a stopped or partitioned process (no
// beat at all) from both; and `cpuMs`, the process's CPU time so far (every thread's), so a
// process that works outside its collectives (its loop free) is told from one waiting on nothing.
// On `stackSubject` it answers with the main thread's JavaScript stack, taken through the inspector
// (a pause at the main thread's next interrupt check, inside a long loop too, then a resume): where
// a held event loop is held; an idle one (nothing to pause) is asked where it is instead (a message
// to the main thread, which its free event loop answers). Posts "up" once its first beat is out;
// exits on "stop".
//
// It loads nats.js alone (about 19 MB a thread, against 55 MB with gradwire's connection and wire
// modules and the Effect schemas they bring): the beat comes encoded from the main thread, with
// `cpuMs` and `heldMs` last as msgpack float64s whose 8 bytes it overwrites (heartbeat.ts
// beatTemplate, beat-bytes.ts withHeld).
import * as fs from "node:fs"
import * as path from "node:path"
import { parentPort, workerData } from "node:worker_threads"
import { connect, type NodeConnectionOptions } from "@nats-io/transport-node"
import { credsAuthenticator, nkeyAuthenticator } from "../../core/nkey.ts"
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
    ...(c.nkeySeed !== undefined ? [nkeyAuthenticator(c.nkeySeed)] : [])
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

/** How long a stack request may take (connect, pause, resume). */
const STACK_TIMEOUT_MS = 2_000
/** Frames kept from the innermost (a tfjs kernel's stack down to the loop that called it runs to 30 and more). */
const STACK_FRAMES = 64

interface CallFrame {
  readonly functionName: string
  readonly url: string
  readonly location: { readonly scriptId: string; readonly lineNumber: number; readonly columnNumber?: number }
}

const frameText = (f: CallFrame, urls: ReadonlyMap<string, string>): string => {
  // a module's frames may leave the url to the script's scriptParsed notice
  const url = f.url || urls.get(f.location.scriptId) || ""
  let where = url.startsWith("file://") ? decodeURIComponent(url.slice("file://".length)) : url
  if (where.startsWith(process.cwd() + path.sep)) where = path.relative(process.cwd(), where)
  return `${f.functionName || "<anonymous>"} (${where}:${f.location.lineNumber + 1}:${(f.location.columnNumber ?? 0) + 1})`
}

/** A main thread whose loop ticked this recently is idle: a pause would only land in whatever runs next (a timer). */
const IDLE_HELD_MS = 300
/** How long an idle main thread may take to say where it is. */
const PLACE_TIMEOUT_MS = 500

let placeAsked = 0
const placeAnswers = new Map<number, (where: string | undefined) => void>()

/** Where the idle main thread says it is (heartbeat.ts setIdlePlace), if it says so in time. */
const idlePlace = (): Promise<string | undefined> =>
  new Promise((resolve) => {
    const id = ++placeAsked
    const timer = setTimeout(() => {
      placeAnswers.delete(id)
      resolve(undefined)
    }, PLACE_TIMEOUT_MS)
    placeAnswers.set(id, (where) => {
      clearTimeout(timer)
      placeAnswers.delete(id)
      resolve(where)
    })
    parentPort!.postMessage({ place: id })
  })

/**
 * The main thread's stack: the inspector pauses it where it runs (a held loop at its next interrupt
 * check), reads the frames, resumes it. An idle main thread (its loop free: waiting on I/O, a timer
 * or a promise) is said to be so instead.
 */
const mainStack = async (): Promise<{ frames?: string[]; idle?: boolean; where?: string; error?: string }> => {
  if (Date.now() - Number(Atomics.load(ticks, 0)) < IDLE_HELD_MS) {
    const where = await idlePlace()
    return { idle: true, ...(where !== undefined ? { where } : {}) }
  }
  const inspector = await import("node:inspector")
  const session = new inspector.Session()
  session.connectToMainThread()
  const post = (method: string): Promise<void> => new Promise((resolve, reject) => session.post(method, (err) => (err ? reject(err) : resolve())))
  let timer: ReturnType<typeof setTimeout> | undefined
  const urls = new Map<string, string>()
  session.on("Debugger.scriptParsed", (m: { params: { scriptId: string; url: string } }) => {
    if (m.params.url) urls.set(m.params.scriptId, m.params.url)
  })
  try {
    const paused = new Promise<string[]>((resolve) =>
      session.once("Debugger.paused", (m: { params: { callFrames: CallFrame[] } }) => {
        resolve(m.params.callFrames.slice(0, STACK_FRAMES).map((f) => frameText(f, urls)))
        post("Debugger.resume").catch(() => {})
      })
    )
    const late = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), STACK_TIMEOUT_MS)))
    const frames = await Promise.race([(async () => (await post("Debugger.enable"), await post("Debugger.pause"), await paused))(), late])
    return frames ? { frames } : { error: `the main thread did not pause within ${STACK_TIMEOUT_MS} ms` }
  } catch (e) {
    return { error: e instanceof Error ? e.message : String(e) }
  } finally {
    clearTimeout(timer)
    // a paused main thread is resumed by the disconnect too
    session.disconnect()
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
  if (data.stackSubject !== undefined) {
    let taking: Promise<unknown> = Promise.resolve()
    nc.subscribe(data.stackSubject, {
      callback: (_err, msg) => {
        // one at a time: a second request waits for the first's pause to end
        taking = taking
          .then(async () => {
            const reply = await mainStack().catch((e: unknown) => ({ error: String(e) }))
            msg.respond(new TextEncoder().encode(JSON.stringify(reply)))
          })
          // (the connection closed meanwhile: the next request still gets its turn)
          .catch(() => {})
      }
    })
  }
  parentPort!.on("message", (m: unknown) => {
    if (typeof m === "object" && m !== null && "place" in m) {
      const { place, where } = m as { place: number; where?: unknown }
      placeAnswers.get(place)?.(typeof where === "string" ? where : undefined)
      return
    }
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
