// `gradwire start` and `gradwire stop`: running the node agent on this machine.
//
// Lifecycle (decided here, documented in the CLI help):
// - `gradwire start` runs the agent in the background by default, like `ray start`: it re-runs
//   itself with --block as a detached process writing to <state dir>/agent.log, waits until that
//   agent has written <state dir>/agent.json (it is connected and advertising), prints how to join
//   and stop, and exits. `--block` runs the agent in the foreground instead (Ctrl-C stops it).
// - With --head and no --address the agent starts the NATS server itself (core/nats-server.ts)
//   and owns it: the server lives exactly as long as the agent process (its guardian kills it if
//   the agent dies, even by SIGKILL). With --head --address it joins an existing server.
// - That server is supervised (core/nats-supervisor.ts): when it exits unexpectedly it is started
//   again on the same host:port with the same JetStream store (<state dir>/jetstream), with backoff.
//   Every exit and restart goes to the agent log, the state file (current pid, restarts) and the
//   head's advertisement, which `gradwire status` shows.
// - The state file also keeps what the agent knows of its NATS connection (lost since when, its
//   outages), so `gradwire status` can still say something when NATS cannot be reached.
// - `gradwire stop` reads the state file, SIGTERMs the agent (which kills its actor processes,
//   announces it is leaving and stops its NATS server), waits, and SIGKILLs after the deadline.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { launchNatsServer, type NatsServerAuth, type NatsServerProcess } from "../../core/nats-server.ts"
import { superviseNatsServer, type NatsSupervision } from "../../core/nats-supervisor.ts"
import { NatsConnectError, NatsServerNotFound, NatsServerStartError } from "../../core/errors.ts"
import { launchAgent, type NodeAgent } from "./agent.ts"
import { defaultStateDir, logFile, pidAlive, readState, removeState, runningAgents, stateFile, writeState, type AgentState } from "./agent-state.ts"
import {
  checkAuth,
  credentialKind,
  hasCredentials,
  openConnection,
  publicNkey,
  redactUrl,
  scrubSecrets,
  type ConnectionAuth,
  type ConnectionSpec,
  type OpenedConnection
} from "../../core/connection-spec.ts"
import { AgentError } from "./errors.ts"
import { stderrLogger, type ActorLogger } from "../runtime/log.ts"
import type { BackendName } from "./node-probe.ts"

export const DEFAULT_PORT = 4222

export interface StartOptions {
  readonly head: boolean
  /** Join these servers (--address, parsed: credentials taken out into `auth`); with --head too, instead of starting one. */
  readonly servers?: ReadonlyArray<string>
  /** Head's NATS client port (default 4222). */
  readonly port?: number
  /** Head's NATS listen address (default 127.0.0.1; 0.0.0.0 to let other machines join). */
  readonly host?: string
  readonly maxPayload?: number
  /** Credentials to connect with; a head that starts its server requires them from every client. */
  readonly auth: ConnectionAuth
  /** Let a head's server listen beyond loopback without credentials. */
  readonly insecure?: boolean
  /** Folders whose modules spawned actor processes may run, besides gradwire's own (module-policy.ts). */
  readonly allowModuleRoots?: ReadonlyArray<string>
  readonly cluster: string
  readonly nodeId?: string
  readonly labels: Readonly<Record<string, string>>
  readonly numCpus?: number
  /** Warm actor processes the agent keeps (AgentOptions.warmHosts). */
  readonly warmHosts?: number
  readonly numGpus?: number
  readonly custom: Readonly<Record<string, number>>
  readonly backends?: ReadonlyArray<BackendName>
  readonly ownerTimeoutMs?: number
  readonly stateDir: string
}

/** Whether a connect failure is the server refusing the client's credentials, or their absence (core/connection.ts says which). */
export const refusedCredentials = (e: unknown): boolean => e instanceof NatsConnectError && e.credentials !== undefined

/** Turns a connect failure into advice; never shows a secret of `spec`. */
export const explainConnectError = (spec: ConnectionSpec, e: unknown): AgentError => {
  const address = spec.servers.map(redactUrl).join(",")
  const reason = scrubSecrets(e instanceof NatsConnectError ? e.reason : e instanceof Error ? e.message : String(e), spec)
  if (e instanceof NatsConnectError && e.credentials === "refused") {
    return new AgentError({
      reason: `NATS at ${address} refused the credentials given (${credentialKind(spec)}): check them, or that the server's authorization block expects this kind of credentials`
    })
  }
  if (e instanceof NatsConnectError && e.credentials === "required") {
    return new AgentError({
      reason: `NATS at ${address} requires credentials (${reason}): pass --user and --password, --token, --nkey FILE or --creds FILE (or put them in the URL: nats://user:pass@host:4222)`
    })
  }
  return new AgentError({
    reason:
      `cannot reach NATS at ${address}: ${reason}. Check the address and port (on the head, "gradwire start --head" prints the ` +
      `address to use), that the head is running ("gradwire status" there), that its server listens on an interface this ` +
      `machine can reach (--host 0.0.0.0 on the head), and firewalls`
  })
}

const isLoopback = (host: string): boolean => /^127\.\d+\.\d+\.\d+$/.test(host) || host === "::1" || host === "[::1]" || host === "localhost"

/**
 * Why a head may not start its server listening on `host` (undefined: it may). Whoever reaches an
 * open port can join the cluster and have its agents spawn processes, so beyond loopback the
 * server needs credentials, or the owner's explicit --insecure.
 */
export const listenerRefusal = (host: string, port: number, withCredentials: boolean, insecure: boolean): string | undefined =>
  isLoopback(host) || withCredentials || insecure
    ? undefined
    : `refusing to listen on ${host}:${port} without credentials (anyone who reaches the port could join the cluster and run jobs ` +
      `on its agents): pass --user U --password P, --token T or --nkey FILE (every agent and driver then needs them), or --insecure`

/** What a head's own server requires of clients: the credentials it was started with. */
const serverAuth = (auth: ConnectionAuth): NatsServerAuth | undefined => {
  if (auth.credsFile !== undefined) {
    throw new AgentError({
      reason:
        "a head that starts its own NATS server takes --user/--password, --token or --nkey; creds files (JWT) need a server in " +
        "operator mode: run nats-server yourself and join it with --head --address"
    })
  }
  if (auth.tls !== undefined) {
    throw new AgentError({
      reason: "--tlsca/--tlscert/--tlskey are for joining a server that serves TLS (--address tls://...); the head's own server does not serve TLS"
    })
  }
  if (auth.nkeySeed !== undefined) return { nkey: publicNkey(auth.nkeySeed)! }
  if (auth.token !== undefined) return { token: auth.token }
  if (auth.user !== undefined) return { user: auth.user, password: auth.password ?? "" }
  return undefined
}

const ensureNotRunning = (stateDir: string): void => {
  const state = readState(stateDir)
  if (state && state.pid !== process.pid && pidAlive(state.pid)) {
    throw new AgentError({
      reason: `an agent is already running from ${stateDir} (pid ${state.pid}, node ${state.nodeId}, ${state.address}); run "gradwire stop" first, or use another --state-dir`
    })
  }
}

const startServer = async (o: StartOptions): Promise<NatsServerProcess> => {
  const port = o.port ?? DEFAULT_PORT
  const host = o.host ?? "127.0.0.1"
  const auth = serverAuth(o.auth)
  const refused = listenerRefusal(host, port, auth !== undefined, o.insecure === true)
  if (refused !== undefined) throw new AgentError({ reason: refused })
  try {
    return await launchNatsServer({
      port,
      // JetStream data (checkpoint buckets) lives in the state dir, so it outlives a stop/start.
      jetstreamStoreDir: path.join(o.stateDir, "jetstream"),
      ...(o.maxPayload !== undefined ? { maxPayload: o.maxPayload } : {}),
      ...(auth !== undefined ? { auth } : {}),
      ...(host !== "127.0.0.1" ? { host } : {})
    })
  } catch (e) {
    if (e instanceof NatsServerStartError && /address already in use/i.test(e.log)) {
      throw new AgentError({
        reason: `port ${port} is already in use (another NATS server?): join it with "gradwire start --head --address nats://127.0.0.1:${port}", or pick another --port`
      })
    }
    if (e instanceof NatsServerNotFound || e instanceof NatsServerStartError) throw new AgentError({ reason: e.message })
    throw e
  }
}

/** Addresses other machines could use to reach a server listening on `host`. */
const joinAddresses = (host: string, port: number): string[] => {
  if (host !== "0.0.0.0" && host !== "::") return [`nats://${host}:${port}`]
  const out: string[] = []
  for (const addrs of Object.values(os.networkInterfaces())) {
    for (const a of addrs ?? []) if (a.family === "IPv4" && !a.internal) out.push(`nats://${a.address}:${port}`)
  }
  return out.length ? out : [`nats://<this-host>:${port}`]
}

export interface RunningAgent {
  readonly agent: NodeAgent
  readonly state: AgentState
  /** Stops the agent, its connection and (head) its NATS server; removes the state file. */
  shutdown(reason: string): Promise<void>
}

/** Starts server (head), connection and agent in this process, and writes the state file. */
export const runAgent = async (o: StartOptions, log?: ActorLogger): Promise<RunningAgent> => {
  ensureNotRunning(o.stateDir)
  let server: NatsServerProcess | undefined
  let supervision: NatsSupervision | undefined
  let conn: OpenedConnection | undefined
  // The state file once written; rewritten when the server restarts or the connection changes.
  let state: AgentState | undefined
  const update = (change: (s: AgentState) => AgentState): void => {
    if (state === undefined) return
    state = change(state)
    try {
      writeState(o.stateDir, state)
    } catch {
      // a full disk must not take the agent down; the log has the same facts
    }
  }
  const serverInfo = { restarts: 0, lastExitAt: 0, lastRestartAt: 0 }
  try {
    if (o.head && o.servers === undefined) {
      const srv = await startServer(o)
      server = srv
      const serverLog = log ?? stderrLogger("nats-server")
      const where = `${o.host ?? "127.0.0.1"}:${srv.port}`
      supervision = superviseNatsServer(srv, {
        onExit: (x) => {
          serverInfo.lastExitAt = x.at
          const last = x.log.trim().split("\n").at(-1) ?? ""
          serverLog.warn(
            `the NATS server (pid ${x.pid}) exited unexpectedly at ${new Date(x.at).toISOString()}; restarting it on ${where} with the same ` +
              `JetStream store${last ? ` (its last log line: ${last})` : ""}`
          )
          update((s) => ({ ...s, natsServer: { pid: x.pid, url: srv.url, ...serverInfo } }))
        },
        onRestart: (x) => {
          serverInfo.restarts = x.restarts
          serverInfo.lastRestartAt = Date.now()
          serverLog.info(`the NATS server is back on ${where} (pid ${x.pid}), ${x.downMs} ms after it exited; restarted ${x.restarts} time(s) so far`)
          update((s) => ({ ...s, natsServer: { pid: x.pid, url: srv.url, ...serverInfo } }))
        },
        onRestartFailed: (x) => {
          const message = x.error instanceof Error ? x.error.message : String(x.error)
          serverLog.error(`restarting the NATS server failed (attempt ${x.attempt + 1}; trying again): ${message.split("\n")[0]}`)
        }
      })
    }
    const spec = checkAuth({ servers: o.servers ?? [(server as NatsServerProcess).url], ...o.auth })
    const address = spec.servers.join(",")
    conn = await openConnection(spec, `gradwire agent ${o.nodeId ?? os.hostname()}`).catch((e: unknown) => {
      throw explainConnectError(spec, e)
    })
    const agent = await launchAgent({
      nc: conn.nc,
      connection: spec,
      ...(o.allowModuleRoots !== undefined ? { allowModuleRoots: o.allowModuleRoots } : {}),
      cluster: o.cluster,
      head: o.head,
      labels: o.labels,
      custom: o.custom,
      stateDir: o.stateDir,
      ...(o.nodeId !== undefined ? { nodeId: o.nodeId } : {}),
      ...(o.numCpus !== undefined ? { numCpus: o.numCpus } : {}),
      ...(o.numGpus !== undefined ? { numGpus: o.numGpus } : {}),
      ...(o.backends !== undefined ? { backends: o.backends } : {}),
      ...(o.ownerTimeoutMs !== undefined ? { ownerTimeoutMs: o.ownerTimeoutMs } : {}),
      ...(o.warmHosts !== undefined ? { warmHosts: o.warmHosts } : {}),
      ...(log ? { log } : {}),
      ...(server !== undefined
        ? {
            supervisedServer: () =>
              server && { pid: server.pid, url: server.url, restarts: serverInfo.restarts, lastRestartAt: serverInfo.lastRestartAt }
          }
        : {}),
      onNatsStatus: (nats) => update((s) => ({ ...s, nats: { ...nats, updatedAt: Date.now() } }))
    })
    const initial: AgentState = {
      pid: process.pid,
      nodeId: agent.nodeId,
      cluster: o.cluster,
      address,
      head: o.head,
      natsServer: server ? { pid: server.pid, url: server.url } : null,
      logFile: fs.existsSync(logFile(o.stateDir)) ? logFile(o.stateDir) : null,
      startedAt: Date.now(),
      nats: { ...agent.natsStatus(), updatedAt: Date.now() }
    }
    writeState(o.stateDir, initial)
    state = initial
    const opened = conn
    const srv = server
    const sup = supervision
    let done: Promise<void> | undefined
    return {
      agent,
      state: initial,
      shutdown: (reason) =>
        (done ??= (async () => {
          sup?.stop()
          await agent.stop(reason).catch(() => {})
          await opened.close().catch(() => {})
          await srv?.stop().catch(() => {})
          removeState(o.stateDir, process.pid)
        })())
    }
  } catch (e) {
    supervision?.stop()
    await conn?.close().catch(() => {})
    await server?.stop().catch(() => {})
    throw e instanceof AgentError ? e : new AgentError({ reason: e instanceof Error ? e.message : String(e) })
  }
}

/** What `start` prints once the agent is up. */
export const describeStarted = (state: AgentState, o: Pick<StartOptions, "host" | "port" | "auth" | "stateDir">): string => {
  const lines = [
    `gradwire agent running: node ${state.nodeId}, cluster "${state.cluster}", pid ${state.pid}`,
    state.natsServer ? `NATS server started by this head: ${state.address} (pid ${state.natsServer.pid})` : `connected to NATS at ${state.address}`
  ]
  if (state.head) {
    const host = o.host ?? "127.0.0.1"
    const port = o.port ?? DEFAULT_PORT
    const joins = state.natsServer ? joinAddresses(host, port) : [state.address]
    const creds = hasCredentials(o.auth) ? " <the same credentials>" : ""
    lines.push(`join from other machines:  gradwire start --address ${joins[0]}${state.cluster !== "default" ? ` --cluster ${state.cluster}` : ""}${creds}`)
    if (state.natsServer && host === "127.0.0.1") lines.push(`  (this server listens on loopback only: restart with --host 0.0.0.0 to let other machines join)`)
  }
  if (state.logFile) lines.push(`logs: ${state.logFile}`)
  // (another state dir than the default: the commands that find this agent need it too)
  const dir = o.stateDir !== undefined && path.resolve(o.stateDir) !== path.resolve(defaultStateDir()) ? ` --state-dir ${o.stateDir}` : ""
  // (a cluster with credentials: status and jobs need them too; stop reads the state dir alone)
  const creds = hasCredentials(o.auth) ? " <the same credentials>" : ""
  lines.push(`status: gradwire status${dir}${creds}    stop: gradwire stop${dir}`)
  return lines.join("\n")
}

/**
 * Runs `entry` (this CLI) with `args` + --block as a detached background process logging to the
 * state dir, and waits until it has written its state file. `stdinLine` (credentials) goes to its
 * stdin, never into its arguments or environment, where process listings would show it. Rejects
 * with AgentError (and the log tail) when it exits or is not up within `timeoutMs`.
 */
export const startInBackground = async (
  entry: ReadonlyArray<string>,
  args: ReadonlyArray<string>,
  stateDir: string,
  timeoutMs = 60_000,
  stdinLine?: string
): Promise<AgentState> => {
  ensureNotRunning(stateDir)
  fs.mkdirSync(stateDir, { recursive: true })
  const log = logFile(stateDir)
  const before = readState(stateDir)
  fs.writeFileSync(log, `--- gradwire start ${new Date().toISOString()}: ${args.join(" ")}\n`, { flag: "a" })
  const fd = fs.openSync(log, "a")
  const child = spawn(process.execPath, [...entry, ...args, "--block"], {
    detached: true,
    stdio: [stdinLine !== undefined ? "pipe" : "ignore", fd, fd],
    // GRADWIRE_ADDRESS may hold credentials: the child gets its address as an argument (without
    // them) and its credentials on stdin.
    env: { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== "GRADWIRE_ADDRESS")), GRADWIRE_STATE_DIR: stateDir }
  })
  fs.closeSync(fd)
  if (stdinLine !== undefined) {
    child.stdin!.on("error", () => {})
    child.stdin!.end(`${stdinLine}\n`)
  }
  let exited: string | undefined
  child.on("exit", (code, signal) => (exited = signal ? `killed by ${signal}` : `exited with code ${code}`))
  child.unref()
  const tail = (): string => {
    try {
      return fs.readFileSync(log, "utf8").split("\n").slice(-15).join("\n")
    } catch {
      return ""
    }
  }
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const state = readState(stateDir)
    if (state && state.pid === child.pid && state !== before) return state
    if (exited !== undefined) throw new AgentError({ reason: `the agent ${exited} while starting:\n${tail()}` })
    if (Date.now() > deadline) {
      try {
        if (child.pid) process.kill(child.pid, "SIGKILL")
      } catch {
        // gone
      }
      throw new AgentError({ reason: `the agent did not come up within ${timeoutMs} ms; log (${log}):\n${tail()}` })
    }
    await new Promise((r) => setTimeout(r, 100))
  }
}

const waitGone = async (pid: number, ms: number): Promise<boolean> => {
  const deadline = Date.now() + ms
  while (pidAlive(pid)) {
    if (Date.now() > deadline) return false
    await new Promise((r) => setTimeout(r, 100))
  }
  return true
}

/** `gradwire stop`: stops the agent recorded in the state dir. Returns what it did, for printing. */
export const stopAgent = async (stateDir: string, timeoutMs = 20_000): Promise<string> => {
  const state = readState(stateDir)
  if (!state) {
    const others = runningAgents().filter((a) => path.resolve(a.stateDir) !== path.resolve(stateDir))
    const none = `no gradwire agent recorded in ${stateDir}; nothing to stop`
    if (others.length === 0) return none
    // (not an error: a script's stop of its own state dir goes on; a user sees which are left)
    return `${none} there. Running on this machine with another state dir: ${others.map((a) => `pid ${a.pid} (gradwire stop --state-dir ${a.stateDir})`).join(", ")}`
  }
  if (!pidAlive(state.pid)) {
    removeState(stateDir, state.pid)
    if (state.natsServer && pidAlive(state.natsServer.pid)) {
      process.kill(state.natsServer.pid, "SIGTERM")
      await waitGone(state.natsServer.pid, 5_000)
    }
    return `the agent recorded in ${stateFile(stateDir)} (pid ${state.pid}) was not running; removed its state`
  }
  process.kill(state.pid, "SIGTERM")
  let forced = false
  if (!(await waitGone(state.pid, timeoutMs))) {
    forced = true
    process.kill(state.pid, "SIGKILL")
    await waitGone(state.pid, 5_000)
  }
  // The server's guardian stops it when the agent dies; make sure, in case the guardian was lost.
  if (state.natsServer && !(await waitGone(state.natsServer.pid, 8_000))) {
    try {
      process.kill(state.natsServer.pid, "SIGKILL")
    } catch {
      // gone
    }
  }
  removeState(stateDir, state.pid)
  const what = state.natsServer ? `agent (node ${state.nodeId}) and the NATS server it started (${state.address})` : `agent (node ${state.nodeId})`
  return `stopped the ${what}${forced ? ` (it did not stop within ${timeoutMs} ms and was killed)` : ""}`
}

export { defaultStateDir }
