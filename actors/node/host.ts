// Entry point of an actor process started by a node agent. Reads its spec from stdin, connects to
// NATS, loads the module export holding the ActorDefinition, starts the actor (which heartbeats, from
// a thread with a connection of its own so that its computations do not silence it, and
// announces itself ready) and exits when the actor stops: 0 when it was asked to stop, 1 when it
// failed, 143 on SIGTERM (the agent killing it). When stdin closes the agent is gone (crashed,
// killed): the process exits too, so no actor outlives the agent that owns it.
//
// Warm (argv --warm): started by the agent ahead of any request, the process loads gradwire's
// worker modules (tfjs among them: most of a worker's cold start) while it waits, with no deadline,
// for its spec; the spec then carries the environment and working directory of the actor, which it
// takes before anything reads them (gradwire reads its settings when used, not at import).
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { launchActor, isActorDefinition, type ActorHandle } from "../runtime/actor.ts"
import { openConnection, SPAWNED_CONNECT_TIMEOUT_MS, type OpenedConnection } from "../../core/connection-spec.ts"
import { settleWithin } from "../runtime/deadline.ts"
import { toWireFailure } from "../runtime/envelope.ts"
import { decodeHostSpec, type HostSpec } from "./host-spec.ts"
import { stderrLogger } from "../runtime/log.ts"
import { ActorSystem } from "../runtime/system.ts"
import { AGENT_GONE } from "../runtime/watcher.ts"
import { backgroundPriority, foregroundPriority } from "../../core/priority.ts"
import { startNice } from "../../core/settings.ts"

/** What a warm host loads while it waits: the training worker's actor module, and with it tfjs. */
export const WARM_PRELOAD = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "../train/worker/worker.ts" : "../train/worker/worker.js", import.meta.url))

const warm = process.argv.includes("--warm")

const readSpecLine = (timeoutMs: number | undefined): Promise<string> =>
  new Promise((resolve, reject) => {
    let buffered = ""
    const timer = timeoutMs === undefined ? undefined : setTimeout(() => reject(new Error(`no spawn spec on stdin within ${timeoutMs} ms`)), timeoutMs)
    // The agent holds the other end: EOF before a spec means it is gone (a warm host waits on it alone).
    const onEnd = (): void => {
      clearTimeout(timer)
      reject(new Error("stdin closed before a spawn spec came (the agent is gone)"))
    }
    const onData = (chunk: string): void => {
      buffered += chunk
      const nl = buffered.indexOf("\n")
      if (nl < 0) return
      clearTimeout(timer)
      process.stdin.off("data", onData)
      process.stdin.off("end", onEnd)
      resolve(buffered.slice(0, nl))
    }
    process.stdin.setEncoding("utf8")
    process.stdin.on("data", onData)
    process.stdin.once("end", onEnd)
  })

const moduleUrl = (spec: string): string => {
  if (spec.startsWith("file:")) return spec
  if (path.isAbsolute(spec) || spec.startsWith(".")) return pathToFileURL(path.resolve(spec)).href
  return spec // a package specifier
}

const loadDefinition = async (spec: HostSpec) => {
  const mod = (await import(moduleUrl(spec.module))) as Record<string, unknown>
  const found = mod[spec.export]
  if (!isActorDefinition(found)) {
    const exports = Object.keys(mod).filter((k) => isActorDefinition(mod[k]))
    throw new Error(
      `export "${spec.export}" of ${spec.module} is not an actor definition (make one with defineActor); ` +
        `actor definitions it exports: ${exports.length ? exports.join(", ") : "none"}`
    )
  }
  return found
}

const main = async (): Promise<void> => {
  // A standby worker (GRADWIRE_START_NICE, set by the driver) runs lowered until it joins, and so
  // does a warm process an agent starts on a fully used node until a spawn takes it: every
  // thread, V8's compilers among them (the agent lowered the main thread at spawn already).
  // A warm process keeps no limit: nothing waits for it, and a spawn that takes it raises it.
  backgroundPriority(startNice.read(), warm ? Infinity : undefined)
  // Loaded in the background; a failure here shows again, with its context, when the actor loads it.
  const preloading = warm ? import(pathToFileURL(WARM_PRELOAD).href).then(() => undefined, () => undefined) : undefined
  const spec = decodeHostSpec(await readSpecLine(warm ? undefined : 10_000))
  if (warm) {
    if (spec.env) Object.assign(process.env, spec.env)
    // Taken: a standby stays lowered (for a new limit), any other actor runs at its own priority.
    foregroundPriority()
    if (spec.env?.GRADWIRE_START_NICE !== undefined) backgroundPriority(startNice.read())
    if (spec.cwd !== undefined) process.chdir(spec.cwd)
    // What a cold start shows in its environment, for ps and /proc/<pid>/cmdline (argv made room).
    process.title = `gradwire-host GRADWIRE_JOB=${spec.job} GRADWIRE_ACTOR=${spec.name}`
    await preloading
  }
  const log = stderrLogger(`${spec.job}/${spec.name}`)
  let handle: ActorHandle | undefined
  let conn: OpenedConnection | undefined
  let live: ActorSystem | undefined
  let exiting = false
  const exit = (code: number, agentGone = false): void => {
    if (exiting) return
    exiting = true
    // Give the stop notice and last log lines a moment to leave, but never hang here.
    setTimeout(() => process.exit(code), 2_000).unref()
    void (async () => {
      // The agent's exit notice says what happened (and why it killed us), except when the agent
      // itself is gone: then this process says so first, so whoever watches it does not wait for
      // its heartbeats to stop (runtime/watcher.ts reads it as the node lost).
      if (agentGone && live && handle) {
        live.publishEvent({ type: "stopped", name: spec.name, instance: spec.instance, reason: AGENT_GONE, at: Date.now() })
        await settleWithin(conn!.nc.flush(), 500)
      }
      await handle?.stop({ drain: false, reason: code === 143 ? "SIGTERM" : AGENT_GONE, timeoutMs: 1_500, announce: false }).catch(() => {})
      await conn?.close().catch(() => {})
      process.exit(code)
    })()
  }
  // The agent holds the other end of stdin: EOF means it is gone.
  process.stdin.on("end", () => exit(1, true))
  process.stdin.on("close", () => exit(1, true))
  process.on("SIGTERM", () => exit(143))
  process.on("SIGINT", () => exit(130))

  conn = await openConnection(spec.connection, `gradwire ${spec.job}/${spec.name}`, { timeoutMs: SPAWNED_CONNECT_TIMEOUT_MS })
  const system = new ActorSystem({
    nc: conn.nc,
    connection: spec.connection,
    allowedImports: spec.imports,
    cluster: spec.cluster,
    job: spec.job,
    identity: `h-${spec.instance}`,
    heartbeat: false,
    node: spec.node,
    log
  })
  live = system
  try {
    const definition = await loadDefinition(spec)
    handle = await launchActor(system, definition, { name: spec.name, instance: spec.instance, args: spec.args, heartbeatMs: spec.heartbeatMs, beatThread: true })
  } catch (e) {
    const failure = toWireFailure(e)
    log.error(`cannot start: ${failure.message}`)
    system.publishEvent({ type: "stopped", name: spec.name, instance: spec.instance, reason: "start failed", failure, at: Date.now() })
    await settleWithin(conn.nc.flush(), 2_000)
    system.close()
    await settleWithin(conn.close(), 5_000)
    process.exit(1)
  }
  const how = await handle.awaitExit()
  if (exiting) return
  await settleWithin(conn.nc.flush(), 2_000)
  system.close()
  await settleWithin(conn.close(), 5_000)
  process.exit(how._tag === "Failed" ? 1 : 0)
}

main().catch((e: unknown) => {
  process.stderr.write(`[gradwire host] fatal: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`)
  process.exit(1)
})
