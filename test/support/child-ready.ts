// Forked rank processes of the test fleets. Parent side: wait until each has sent its first IPC
// message ("ready") under a deadline (a child that exits first fails the wait), and kill them all.
// Child side: connect to the server, serve the parent's commands, report errors as plain values.
import { fork, type ChildProcess } from "node:child_process"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/nats-core"
import { installNatsPatches } from "../../core/nats-internals/index.ts"
import { FAST_START_ARGS } from "../../core/fast-start.ts"

export const awaitChildrenReady = (children: ReadonlyArray<ChildProcess>, timeoutMs: number): Promise<void> =>
  Promise.all(
    children.map(
      (child, rank) =>
        new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`rank ${rank} did not start within ${timeoutMs} ms`)), timeoutMs)
          child.once("message", () => {
            clearTimeout(timer)
            resolve()
          })
          child.once("exit", (code) => {
            clearTimeout(timer)
            reject(new Error(`rank ${rank} exited during start (code ${code})`))
          })
        })
    )
  ).then(() => undefined)

/** SIGKILLs every child still running (a SIGSTOPped one would ignore SIGTERM) and waits for the exits. */
export const killChildren = (children: ReadonlyArray<ChildProcess>, live: Set<ChildProcess>): Promise<void> =>
  Promise.all(
    children.map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) {
            live.delete(child)
            resolve()
            return
          }
          child.once("exit", () => resolve())
          child.kill("SIGKILL")
        })
    )
  ).then(() => undefined)

/** Every rank process a fleet started and that has not exited; killed when this process exits. */
const live = new Set<ChildProcess>()
let exitHookInstalled = false

/**
 * Forks `size` rank processes of `script` (GW_RANK_SERVER = server(rank), GW_RANK_INDEX = rank,
 * IPC with advanced serialization), hands them to `make` (which attaches the fleet's listeners),
 * and waits until all are ready; on a failed start the fleet is stopped and the error rethrown.
 */
export const startRanks = async <F extends { stop(): Promise<void> }>(
  script: string,
  size: number,
  server: (rank: number) => string,
  opts: {
    readonly startTimeoutMs?: number
    readonly execArgv?: ReadonlyArray<string>
    /** A command that execs node in its place, per rank (e.g. `ip netns exec NS`); the pid stays node's. */
    readonly wrap?: (rank: number) => ReadonlyArray<string>
  },
  make: (children: ChildProcess[]) => F
): Promise<F> => {
  if (!exitHookInstalled) {
    exitHookInstalled = true
    process.once("exit", () => {
      for (const child of live) {
        try {
          child.kill("SIGKILL")
        } catch {
          // gone
        }
      }
    })
  }
  const children = Array.from({ length: size }, (_, rank) => {
    const wrap = opts.wrap?.(rank) ?? []
    const child = fork(script, [], {
      ...(wrap.length > 0 ? { execPath: wrap[0] } : {}),
      execArgv: [...wrap.slice(1), ...(wrap.length > 0 ? [process.execPath] : []), ...FAST_START_ARGS, ...(opts.execArgv ?? [])],
      env: { ...process.env, GW_RANK_SERVER: server(rank), GW_RANK_INDEX: String(rank) },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
      serialization: "advanced"
    })
    live.add(child)
    child.once("exit", () => live.delete(child))
    return child
  })
  const fleet = make(children)
  try {
    await awaitChildrenReady(children, opts.startTimeoutMs ?? 30_000)
  } catch (e) {
    await fleet.stop()
    throw e
  }
  return fleet
}

/** Kills a fleet's rank processes still running and waits for their exits. */
export const stopRanks = (children: ReadonlyArray<ChildProcess>): Promise<void> => killChildren(children, live)

// ---- the child's side ----

/** A thrown error as a plain IPC value: its tag (Effect's _tag, or the Error's name), message and own fields. */
export const errorOf = (e: unknown) => {
  const fields: Record<string, unknown> = {}
  if (typeof e === "object" && e !== null) {
    for (const [k, v] of Object.entries(e)) if (typeof v !== "function" && k !== "stack") fields[k] = v
    for (const k of ["failedRanks"]) if (k in e) fields[k] = (e as Record<string, unknown>)[k]
  }
  return {
    tag: typeof e === "object" && e !== null && "_tag" in e ? String((e as { _tag: unknown })._tag) : e instanceof Error ? e.name : "Error",
    message: e instanceof Error ? e.message : String(e),
    fields
  }
}

/**
 * The rank's two connections (data and control) to GW_RANK_SERVER, named `<prefix>-<index>` and
 * `<prefix>-<index>-ctl`; no reconnects, so a lost server fails the rank instead of hanging it.
 */
export const connectRank = async (prefix: string): Promise<{ nc: NatsConnection; cnc: NatsConnection }> => {
  installNatsPatches() // as openNats does: the ranks' connections read into the pools from the first byte
  const opts = { servers: process.env.GW_RANK_SERVER as string, noEcho: true, maxReconnectAttempts: 0 }
  const name = `${prefix}-${process.env.GW_RANK_INDEX}`
  const nc = await connect({ ...opts, name })
  const cnc = await connect({ ...opts, name: `${name}-ctl` })
  return { nc, cnc }
}

/**
 * Runs the parent's commands ({ id, ... } over IPC) through `handle`, replying { id, ok, value } or
 * { id, ok: false, error }; exits when the parent goes away; then says it is ready.
 */
export const serveParent = (handle: (m: Record<string, any>) => Promise<unknown>): void => {
  process.on("disconnect", () => process.exit(0))
  process.on("message", (m: Record<string, any>) => {
    handle(m).then(
      (value) => process.send?.({ id: m.id, ok: true, value }),
      (e) => process.send?.({ id: m.id, ok: false, error: errorOf(e) })
    )
  })
  process.send?.({ ready: true })
}
