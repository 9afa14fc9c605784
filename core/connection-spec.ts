// How node agents, actor processes and the CLI reach NATS: a serializable description of the
// connection (servers and credentials), so an agent can hand its own to the processes it spawns,
// and one function that opens it with the reconnect behaviour the runtime relies on (retry
// forever, short waits: a restarted server or a failed-over cluster member must not end a job).
import type { NatsConnection } from "@nats-io/nats-core"
import { NatsConnectError } from "./errors.ts"
import { openNats } from "./connection.ts"

export interface ConnectionSpec {
  /** nats://host:port URLs (several for a cluster). */
  readonly servers: ReadonlyArray<string>
  readonly user?: string
  readonly password?: string
  readonly token?: string
  /** Path of a .creds file (JWT + NKey seed). */
  readonly creds?: string
}

export interface OpenedConnection {
  readonly nc: NatsConnection
  readonly maxPayload: number
  close(): Promise<void>
}

/** Opens the connection; rejects with NatsConnectError saying what failed and how to fix it. */
export const openConnection = async (
  spec: ConnectionSpec,
  name: string,
  options: { readonly timeoutMs?: number } = {}
): Promise<OpenedConnection> => {
  const opened = await openNats({
    servers: [...spec.servers],
    name,
    ...(spec.user !== undefined ? { user: spec.user, pass: spec.password ?? "" } : {}),
    ...(spec.token !== undefined ? { token: spec.token } : {}),
    ...(spec.creds !== undefined ? { creds: spec.creds } : {}),
    timeoutMs: options.timeoutMs ?? 5_000,
    // Agents and actor processes ride out server restarts and failovers for as long as they take;
    // their owners' liveness checks, not the connection, decide when they are gone.
    maxReconnectAttempts: -1,
    reconnectTimeWaitMs: 250
  }).catch((e: unknown) => {
    throw e instanceof NatsConnectError ? e : new NatsConnectError({ servers: spec.servers.join(","), reason: e instanceof Error ? e.message : String(e) })
  })
  return {
    nc: opened.nc,
    get maxPayload() {
      return opened.maxPayload
    },
    close: () => opened.close()
  }
}
