// How every gradwire process reaches NATS, described once: a serializable ConnectionSpec (servers
// plus one kind of credentials: user/password, token, nkey seed or creds file, and TLS files),
// parsed from the URL forms the NATS CLI and the Go client accept (nats://user:pass@host,
// nats://token@host, tls://host, comma-separated lists), shown only through the redaction below,
// and opened by one function (openConnection) with the reconnect behaviour the runtime relies on.
// The driver (Trainer `cluster`), the node agents (`gradwire start`), the actor processes the
// agents spawn (they get the spec on stdin) and the workers' collective connections all use it.
import type { NatsConnection } from "@nats-io/nats-core"
import * as Schema from "effect/Schema"
import { ConfigError, NatsConnectError } from "./errors.ts"
import { openNats } from "./connection.ts"
import { publicNkey } from "./nkey.ts"

/** Client-side TLS files (paths on the machine that connects). Any of them, or a tls:// server, makes TLS required. */
export const TlsFiles = Schema.Struct({
  /** CA certificate(s) to trust for the server's certificate (default: the system's and NODE_EXTRA_CA_CERTS). */
  caFile: Schema.optional(Schema.String),
  /** Client certificate, for servers that verify clients (`verify: true`). */
  certFile: Schema.optional(Schema.String),
  keyFile: Schema.optional(Schema.String)
})
export type TlsFiles = typeof TlsFiles.Type

/** The credential fields, shared by ConnectionSpec and the Trainer's `cluster` option. */
export const ConnectionAuth = Schema.Struct({
  user: Schema.optional(Schema.String),
  password: Schema.optional(Schema.String),
  token: Schema.optional(Schema.String),
  /** A user nkey seed ("SU…"), as `nsc` or `nk -gen user` print it. */
  nkeySeed: Schema.optional(Schema.String),
  /** Path of a .creds file (user JWT + nkey seed), as `nsc generate creds` writes it. */
  credsFile: Schema.optional(Schema.String),
  tls: Schema.optional(TlsFiles)
})
export type ConnectionAuth = typeof ConnectionAuth.Type

/** Servers and credentials: plain data, so an agent can hand its own to the processes it spawns. */
export const ConnectionSpec = Schema.Struct({
  /** nats://host:port or tls://host:port URLs, without credentials (several for a cluster). */
  servers: Schema.Array(Schema.String),
  ...ConnectionAuth.fields
})
export type ConnectionSpec = typeof ConnectionSpec.Type

// -------------------------------------------------------------------------------------------------
// Redaction: the only way a spec or an address is shown (logs, events, status, errors, config.json).

const MASK = "***"

/**
 * An address (or any text) with the password or token of every URL's user info masked:
 * nats://gw:***@host:4222, nats://***@host.
 */
export const redactUrl = (text: string): string =>
  text.replace(/([A-Za-z][A-Za-z0-9+.-]*:\/\/)([^\s/?#,]*)@/g, (_m, scheme: string, info: string) => {
    const colon = info.indexOf(":")
    return colon >= 0 ? `${scheme}${info.slice(0, colon)}:${MASK}@` : `${scheme}${MASK}@`
  })

export { publicNkey }

/**
 * The spec as it may be shown: servers, user name, creds file path and TLS files as they are; the
 * password, token and nkey seed masked (an nkey shows its public key, which the server config
 * lists). A creds file's path is kept: the secret is the file's content, and the path is what a
 * user needs to fix a bad one.
 */
export const redactConnection = (spec: ConnectionSpec): Record<string, unknown> => ({
  servers: spec.servers.map(redactUrl),
  ...(spec.user !== undefined ? { user: spec.user, password: MASK } : {}),
  ...(spec.token !== undefined ? { token: MASK } : {}),
  ...(spec.nkeySeed !== undefined ? { nkey: publicNkey(spec.nkeySeed) ?? MASK } : {}),
  ...(spec.credsFile !== undefined ? { credsFile: spec.credsFile } : {}),
  ...(spec.tls !== undefined ? { tls: { ...spec.tls } } : {})
})

/** Which credentials a spec carries, in words without their values ("user gw", "token", ...). */
export const credentialKind = (spec: ConnectionAuth): string =>
  [
    spec.user !== undefined ? `user "${spec.user}" with a password` : undefined,
    spec.token !== undefined ? "a token" : undefined,
    spec.nkeySeed !== undefined ? `nkey ${publicNkey(spec.nkeySeed) ?? "(invalid seed)"}` : undefined,
    spec.credsFile !== undefined ? `creds file ${spec.credsFile}` : undefined
  ]
    .filter(Boolean)
    .join(", ") || "no credentials"

/** One line for logs and errors: "nats://a:4222, nats://b:4222 (user "gw" with a password, TLS)". */
export const describeConnection = (spec: ConnectionSpec): string => {
  const extras = [...(hasCredentials(spec) ? [credentialKind(spec)] : []), ...(spec.tls !== undefined ? ["TLS"] : [])]
  return `${spec.servers.map(redactUrl).join(", ")}${extras.length ? ` (${extras.join(", ")})` : ""}`
}

export const hasCredentials = (spec: ConnectionAuth): boolean =>
  spec.user !== undefined || spec.token !== undefined || spec.nkeySeed !== undefined || spec.credsFile !== undefined

/** Masks every secret of `spec` (also percent-encoded, as it may appear in a URL) in `text`. */
export const scrubSecrets = (text: string, spec: ConnectionAuth): string => {
  const secrets = [spec.password, spec.token, spec.nkeySeed]
    .filter((s): s is string => s !== undefined && s.length > 0)
    .flatMap((s) => [s, encodeURIComponent(s)])
    .sort((a, b) => b.length - a.length)
  let out = redactUrl(text)
  for (const s of secrets) out = out.split(s).join(MASK)
  return out
}

// -------------------------------------------------------------------------------------------------
// Parsing: addresses with credentials in them, merged with the explicit fields.

const fail = (field: string, reason: string): never => {
  throw new ConfigError({ field, reason })
}

interface UrlCredentials {
  readonly user?: string
  readonly password?: string
  readonly token?: string
}

const decodeInfo = (s: string, field: string, shown: string): string => {
  try {
    return decodeURIComponent(s)
  } catch {
    return fail(field, `${shown}: the user info is not valid percent-encoding (encode "@", ":", "/" and "%" in passwords as %40, %3A, %2F, %25)`)
  }
}

/**
 * One server address: "nats://[user:pass@|token@]host[:port]", "tls://…", or "host:port". Returns
 * the address without credentials and the credentials it carried. As in the Go client, user info
 * without a ":" is a token.
 */
const parseServer = (raw: string, field: string): { url: string; tls: boolean; creds: UrlCredentials } => {
  const shown = `"${redactUrl(raw)}"`
  const withScheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(raw) ? raw : `nats://${raw}`
  const scheme = withScheme.slice(0, withScheme.indexOf(":")).toLowerCase()
  if (scheme === "ws" || scheme === "wss") {
    fail(field, `${shown}: websocket URLs are not supported here (gradwire connects over TCP): use nats://host:4222 or tls://host:4222`)
  }
  if (scheme !== "nats" && scheme !== "tls") fail(field, `${shown}: expected a NATS URL such as nats://host:4222 or tls://host:4222`)
  let rest = withScheme.slice(scheme.length + 3)
  let creds: UrlCredentials = {}
  const at = rest.lastIndexOf("@")
  if (at >= 0) {
    const info = rest.slice(0, at)
    rest = rest.slice(at + 1)
    const colon = info.indexOf(":")
    if (colon >= 0) creds = { user: decodeInfo(info.slice(0, colon), field, shown), password: decodeInfo(info.slice(colon + 1), field, shown) }
    else if (info.length > 0) creds = { token: decodeInfo(info, field, shown) }
  }
  const host = rest.replace(/\/$/, "")
  if (host.length === 0 || /[\s/?#@]/.test(host)) fail(field, `${shown}: expected nats://host:port (no path), e.g. nats://10.0.0.5:4222`)
  let parsed: URL
  try {
    parsed = new URL(`${scheme}://${host}`)
  } catch {
    return fail(field, `${shown}: not a valid host[:port]`)
  }
  if (parsed.hostname === "") fail(field, `${shown}: no host`)
  return { url: `${scheme}://${host}`, tls: scheme === "tls", creds }
}

const sameCreds = (a: UrlCredentials, b: UrlCredentials): boolean => a.user === b.user && a.password === b.password && a.token === b.token

/**
 * Builds a spec from an address (one URL, or several separated by commas) and explicit credential
 * fields. Credentials in the URLs are taken out of them; giving them both ways, or two kinds of
 * credentials, is a ConfigError (named under `field`) that never shows a secret.
 */
export const connectionFromAddress = (address: string | ReadonlyArray<string>, auth: ConnectionAuth = {}, field = "address"): ConnectionSpec => {
  const parts = (typeof address === "string" ? address.split(",") : [...address]).map((s) => s.trim()).filter(Boolean)
  if (parts.length === 0) fail(field, 'no server address given: use e.g. "nats://127.0.0.1:4222"')
  const servers = parts.map((p) => parseServer(p, field))
  const withCreds = servers.filter((s) => s.creds.user !== undefined || s.creds.token !== undefined)
  const fromUrl = withCreds[0]?.creds
  if (fromUrl && withCreds.some((s) => !sameCreds(s.creds, fromUrl))) {
    fail(field, "the server URLs carry different credentials: give one set (in every URL or in one of them)")
  }
  const explicitKinds = [auth.user !== undefined || auth.password !== undefined, auth.token !== undefined, auth.nkeySeed !== undefined, auth.credsFile !== undefined]
  if (fromUrl && explicitKinds.some(Boolean)) {
    const same = fromUrl.user !== undefined ? fromUrl.user === auth.user && fromUrl.password === auth.password : fromUrl.token === auth.token
    if (!same) fail(field, "credentials given both in the URL and as options: give them one way")
  }
  const merged: ConnectionAuth = { ...auth, ...(fromUrl ?? {}) }
  const tlsRequired = servers.some((s) => s.tls)
  return checkAuth(
    {
      servers: servers.map((s) => s.url),
      ...(merged.user !== undefined ? { user: merged.user, password: merged.password ?? "" } : {}),
      ...(merged.password !== undefined && merged.user === undefined ? { password: merged.password } : {}),
      ...(merged.token !== undefined ? { token: merged.token } : {}),
      ...(merged.nkeySeed !== undefined ? { nkeySeed: merged.nkeySeed.trim() } : {}),
      ...(merged.credsFile !== undefined ? { credsFile: merged.credsFile } : {}),
      ...(merged.tls !== undefined || tlsRequired ? { tls: { ...merged.tls } } : {})
    },
    field
  )
}

/** Checks a spec's credentials: at most one kind, a password only with a user, a real user seed. */
export const checkAuth = (spec: ConnectionSpec, field = "connection"): ConnectionSpec => {
  if (spec.password !== undefined && spec.user === undefined) fail(field, "a password needs a user")
  const kinds = [
    spec.user !== undefined ? "user/password" : undefined,
    spec.token !== undefined ? "token" : undefined,
    spec.nkeySeed !== undefined ? "nkey seed" : undefined,
    spec.credsFile !== undefined ? "creds file" : undefined
  ].filter((k): k is string => k !== undefined)
  if (kinds.length > 1) fail(field, `give one kind of credentials, not ${kinds.join(" and ")}`)
  if (spec.nkeySeed !== undefined && (!spec.nkeySeed.startsWith("SU") || publicNkey(spec.nkeySeed) === undefined)) {
    fail(field, 'the nkey seed is not a user nkey seed: it starts with "SU" (the public key, "U…", goes into the server config; the seed stays with the client)')
  }
  return normalizeConnection(spec)
}

/** A copy without keys whose value is undefined (the spec travels msgpack-encoded, where they would not survive). */
export const normalizeConnection = (spec: ConnectionSpec): ConnectionSpec => {
  const tls = spec.tls && Object.fromEntries(Object.entries(spec.tls).filter(([, v]) => v !== undefined))
  return {
    ...(Object.fromEntries(Object.entries(spec).filter(([k, v]) => v !== undefined && k !== "tls")) as ConnectionSpec),
    servers: [...spec.servers],
    ...(tls !== undefined ? { tls } : {})
  }
}

// -------------------------------------------------------------------------------------------------
// Opening.

export interface OpenedConnection {
  readonly nc: NatsConnection
  readonly maxPayload: number
  close(): Promise<void>
}

/**
 * The first-connection deadline of a process an agent spawned (actor hosts, a worker's collective
 * connections). Its agent already reached the same server, so a slow handshake means a starved
 * machine, not a wrong address (a refused or unreachable port still fails at once); the agent's
 * 60 s readiness deadline, not this one, decides when the process is given up on.
 */
export const SPAWNED_CONNECT_TIMEOUT_MS = 20_000

export interface OpenConnectionOptions {
  /** Deadline for the initial connection. Default 5 s (SPAWNED_CONNECT_TIMEOUT_MS for spawned processes). */
  readonly timeoutMs?: number
  /** Do not deliver this connection's own publishes back to its subscriptions. */
  readonly noEcho?: boolean
  /** Servers to try first, in order, before the spec's (e.g. the one this node's agent uses). */
  readonly preferServers?: ReadonlyArray<string>
  /**
   * Reconnect attempts per server after a lost connection. Default -1: forever (agents and actor
   * processes); the driver bounds it so a dead cluster ends a run instead of stalling it.
   */
  readonly maxReconnectAttempts?: number
}

/**
 * Opens a spec; the one place gradwire processes connect to a cluster. Rejects with
 * NatsConnectError saying what failed and how to fix it, never showing a secret.
 */
export const openConnection = async (spec: ConnectionSpec, name: string, options: OpenConnectionOptions = {}): Promise<OpenedConnection> => {
  const prefer = options.preferServers ?? []
  const servers = [...new Set([...prefer, ...spec.servers])]
  const opened = await openNats({
    servers,
    name,
    ...(spec.user !== undefined ? { user: spec.user, pass: spec.password ?? "" } : {}),
    ...(spec.token !== undefined ? { token: spec.token } : {}),
    ...(spec.nkeySeed !== undefined ? { nkey: spec.nkeySeed } : {}),
    ...(spec.credsFile !== undefined ? { creds: spec.credsFile } : {}),
    ...(spec.tls !== undefined ? { tls: spec.tls } : {}),
    ...(options.noEcho === true ? { noEcho: true } : {}),
    ...(prefer.length > 0 ? { noRandomize: true } : {}),
    timeoutMs: options.timeoutMs ?? 5_000,
    // Agents and actor processes ride out server restarts and failovers for as long as they take;
    // their owners' liveness checks, not the connection, decide when they are gone.
    maxReconnectAttempts: options.maxReconnectAttempts ?? -1,
    reconnectTimeWaitMs: 250
  }).catch((e: unknown) => {
    const reason = e instanceof NatsConnectError ? e.reason : e instanceof Error ? e.message : String(e)
    const credentials = e instanceof NatsConnectError ? e.credentials : undefined
    throw new NatsConnectError({ servers: servers.map(redactUrl).join(", "), reason: scrubSecrets(reason, spec), ...(credentials !== undefined ? { credentials } : {}) })
  })
  return {
    nc: opened.nc,
    get maxPayload() {
      return opened.maxPayload
    },
    close: () => opened.close()
  }
}
