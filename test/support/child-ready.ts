// Forked rank processes of the test fleets. Parent side: wait until each has sent its first IPC
// message ("ready") under a deadline (a child that exits first fails the wait), and kill them all.
// Child side: connect to the server, serve the parent's commands, report errors as plain values.
import type { ChildProcess } from "node:child_process"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/nats-core"

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
