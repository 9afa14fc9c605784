// The NATS connection every gradwire process holds: one nats.js v3 connection with reconnect
// settings that suit a trainer, the server's max_payload (what chunking needs), and errors that say
// what to do. Effect service `Nats` (+ `openNatsEffect`, `NatsLayer`) for scoped use, `openNats` for
// plain Promise code.
import * as fs from "node:fs"
import {
  AuthorizationError,
  ConnectionError,
  TimeoutError,
  connect,
  type NatsConnection,
  type NodeConnectionOptions
} from "@nats-io/transport-node"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import { installNatsPatches } from "./nats-internals/index.ts"
import { credsAuthenticator, nkeyAuthenticator } from "./nkey.ts"
import { NatsConnectError } from "./errors.ts"

export interface NatsTlsOptions {
  readonly caFile?: string
  readonly certFile?: string
  readonly keyFile?: string
}

export interface NatsConnectOptions {
  /** "nats://host:4222", "host:4222", a comma-separated list, or an array. */
  readonly servers: string | ReadonlyArray<string>
  /** Connection name shown by the server's monitoring (e.g. "gradwire-worker-3"). */
  readonly name?: string
  readonly user?: string
  readonly pass?: string
  readonly token?: string
  /** An nkey seed ("SU…"). */
  readonly nkey?: string
  /** Path of a .creds file (JWT + nkey seed), as issued by nsc. */
  readonly creds?: string
  readonly tls?: NatsTlsOptions
  /** Do not deliver this connection's own publishes to its own subscriptions. */
  readonly noEcho?: boolean
  /** Try the servers in the order given instead of shuffling them. */
  readonly noRandomize?: boolean
  /** Deadline for the initial connection (TCP + handshake). Default 5 s. */
  readonly timeoutMs?: number
  /** Reconnect after a lost connection. Default true. */
  readonly reconnect?: boolean
  /** Reconnect attempts per server before giving up (-1: forever). Default 280, about a minute. */
  readonly maxReconnectAttempts?: number
  /**
   * Pause between reconnect attempts to the same server. Default 250 ms; for the first
   * FAST_RECONNECT_MS of an outage 50 ms (reconnectDelay).
   */
  readonly reconnectTimeWaitMs?: number
  /** Client pings; 3 missed pongs mark the connection stale. Default 10 s. */
  readonly pingIntervalMs?: number
  /** Deadline for draining on close; past it the connection is closed hard. Default 5 s. */
  readonly drainTimeoutMs?: number
}

export interface NatsHandle {
  readonly nc: NatsConnection
  /** The largest message the connected server accepts (its max_payload), in bytes. */
  readonly maxPayload: number
  /** The servers this connection was asked to use. */
  readonly servers: ReadonlyArray<string>
}

/** The process's NATS connection. */
export class Nats extends Context.Service<Nats, NatsHandle>()("gradwire/Nats") {}

const DEFAULT_CONNECT_TIMEOUT_MS = 5_000
const DEFAULT_DRAIN_TIMEOUT_MS = 5_000
// A trainer waits out a NATS restart of up to about a minute; past that, a dead server is better
// surfaced as an error (heartbeats and collective deadlines catch the rest) than retried forever
// (40 fast attempts in the outage's first 2 s, then 240 at 250 ms).
const DEFAULT_MAX_RECONNECT_ATTEMPTS = 280
const DEFAULT_RECONNECT_TIME_WAIT_MS = 250
/** How long into an outage reconnect attempts to a server come FAST_RECONNECT_WAIT_MS apart. */
const FAST_RECONNECT_MS = 2_000
const FAST_RECONNECT_WAIT_MS = 50

/**
 * The pause between reconnect attempts to one server (nats.js asks before every try and while it
 * waits): FAST_RECONNECT_WAIT_MS for the first FAST_RECONNECT_MS of an outage, then `waitMs`, each
 * with some jitter. A restarted nats-server listens again 60-70 ms after it died; with a flat
 * 250 ms (+ up to 100 ms jitter) the clients' first try fell in that gap and the second came
 * 0.35 s after the kill. An outage starts at the first ask after a quiet second (the client asks
 * only while it is disconnected).
 */
export const reconnectDelay = (waitMs: number, now: () => number = Date.now, random: () => number = Math.random): (() => number) => {
  let first = 0
  let last = -Infinity
  return () => {
    const t = now()
    if (t - last > 1_000) first = t
    last = t
    return t - first < FAST_RECONNECT_MS ? FAST_RECONNECT_WAIT_MS + Math.floor(random() * 26) : waitMs + Math.floor(random() * 101)
  }
}
const DEFAULT_PING_INTERVAL_MS = 10_000
// nats-server's own default, for the moment before INFO arrives (never in practice).
const DEFAULT_MAX_PAYLOAD = 1024 * 1024

const normalizeServers = (servers: string | ReadonlyArray<string>): string[] =>
  (typeof servers === "string" ? servers.split(",") : [...servers]).map((s) => s.trim()).filter(Boolean)

const hasCredentials = (options: NatsConnectOptions): boolean =>
  options.user !== undefined || options.token !== undefined || options.nkey !== undefined || options.creds !== undefined

/** What went wrong, and for an authorization violation whether the credentials given were refused or none were given. */
const describeError = (error: unknown, options: NatsConnectOptions, where: string, timeoutMs: number): { reason: string; credentials?: "refused" | "required" } => {
  if (error instanceof AuthorizationError) {
    return hasCredentials(options)
      ? {
          credentials: "refused",
          reason:
            `authorization violation: the server rejected the credentials given (${credentialKind(options)}); check them, ` +
            `or that the server's authorization block expects this kind of credentials`
        }
      : {
          credentials: "required",
          reason:
            `authorization violation: the server requires credentials: pass user/pass or token (or an nkey seed / creds file) ` +
            `in the connection options, e.g. { user, pass } or { token }`
        }
  }
  if (error instanceof TimeoutError) {
    return { reason: `no NATS handshake within ${timeoutMs} ms: is ${where} a NATS client port (not a cluster, leaf or monitoring port), and reachable?` }
  }
  const code = (error as { code?: string } | undefined)?.code
  const message = error instanceof Error ? error.message : String(error)
  if ((error instanceof ConnectionError && /refused/i.test(message)) || code === "ECONNREFUSED") {
    return { reason: `connection refused: is nats-server running at ${where}? start one with \`gradwire start --head\` (or \`nats-server -p <port>\`), or fix the address` }
  }
  if (code === "ENOTFOUND" || code === "EAI_AGAIN") return { reason: `cannot resolve the host of ${where} (${message}); check the address` }
  return { reason: message }
}

const credentialKind = (options: NatsConnectOptions): string =>
  [
    options.user !== undefined ? `user "${options.user}"` : undefined,
    options.token !== undefined ? "token" : undefined,
    options.nkey !== undefined ? "nkey seed" : undefined,
    options.creds !== undefined ? `creds file ${options.creds}` : undefined
  ]
    .filter(Boolean)
    .join(", ")

/**
 * Connects to NATS. Rejects with NatsConnectError (unreachable, refused, bad or missing credentials,
 * unreadable creds file). The returned `close()` drains under a deadline and is idempotent.
 */
export const openNats = async (options: NatsConnectOptions): Promise<NatsHandle & { close(): Promise<void> }> => {
  installNatsPatches() // pooled socket reads and large-message buffers (nats-internals/README.md); once per process
  const servers = normalizeServers(options.servers)
  const where = servers.join(", ") || "(no servers given)"
  const fail = ({ reason, credentials }: { reason: string; credentials?: "refused" | "required" }): NatsConnectError =>
    new NatsConnectError({ servers: where, reason, ...(credentials !== undefined ? { credentials } : {}) })
  if (servers.length === 0) throw fail({ reason: "no server address given: pass servers, e.g. \"nats://127.0.0.1:4222\"" })
  const timeoutMs = options.timeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS

  const authenticators = []
  if (options.creds !== undefined) {
    let bytes: Uint8Array
    try {
      bytes = await fs.promises.readFile(options.creds)
    } catch (e) {
      throw fail({ reason: `cannot read creds file ${options.creds}: ${(e as Error).message}` })
    }
    authenticators.push(credsAuthenticator(bytes))
  }
  if (options.nkey !== undefined) authenticators.push(nkeyAuthenticator(options.nkey))

  const connectOptions: NodeConnectionOptions = {
    servers,
    timeout: timeoutMs,
    reconnect: options.reconnect ?? true,
    maxReconnectAttempts: options.maxReconnectAttempts ?? DEFAULT_MAX_RECONNECT_ATTEMPTS,
    // nats.js reads reconnectTimeWait only in its default delay handler, which this replaces.
    reconnectDelayHandler: reconnectDelay(options.reconnectTimeWaitMs ?? DEFAULT_RECONNECT_TIME_WAIT_MS),
    pingInterval: options.pingIntervalMs ?? DEFAULT_PING_INTERVAL_MS,
    maxPingOut: 3,
    ...(options.name !== undefined && { name: options.name }),
    ...(options.noEcho === true && { noEcho: true }),
    ...(options.noRandomize === true && { noRandomize: true }),
    ...(options.user !== undefined && { user: options.user, pass: options.pass ?? "" }),
    ...(options.token !== undefined && { token: options.token }),
    ...(authenticators.length > 0 && { authenticator: authenticators }),
    ...(options.tls !== undefined && { tls: { ...options.tls } })
  }

  let nc: NatsConnection
  try {
    nc = await connect(connectOptions)
  } catch (e) {
    throw fail(describeError(e, options, where, timeoutMs))
  }

  const drainTimeoutMs = options.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS
  let closing: Promise<void> | undefined
  return {
    nc,
    servers,
    // Read on every use: after a reconnect to another server of a cluster the limit may differ.
    get maxPayload(): number {
      return nc.info?.max_payload ?? DEFAULT_MAX_PAYLOAD
    },
    close(): Promise<void> {
      closing ??= (async () => {
        if (nc.isClosed()) return
        // Draining flushes what we published and lets subscriptions finish, but a dead server
        // would make it wait forever: bound it, then close hard.
        let timer: ReturnType<typeof setTimeout> | undefined
        const drained = await Promise.race([
          nc.drain().then(
            () => true,
            () => false
          ),
          new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), drainTimeoutMs)))
        ])
        clearTimeout(timer)
        if (!drained && !nc.isClosed()) await nc.close().catch(() => {})
      })()
      return closing
    }
  }
}

/** A NATS connection that is drained and closed when the scope closes. */
export const openNatsEffect = (options: NatsConnectOptions): Effect.Effect<NatsHandle, NatsConnectError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => openNats(options),
      catch: (e) =>
        e instanceof NatsConnectError
          ? e
          : new NatsConnectError({ servers: normalizeServers(options.servers).join(", "), reason: String(e) })
    }),
    (handle) => Effect.promise(() => handle.close())
  ).pipe(Effect.map((handle): NatsHandle => handle))

/** Provides `Nats` for the lifetime of the layer. */
export const NatsLayer = (options: NatsConnectOptions): Layer.Layer<Nats, NatsConnectError> => Layer.effect(Nats, openNatsEffect(options))
