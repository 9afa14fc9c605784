// The embedded nats-server: starts the real binary on free loopback ports with JetStream in a
// fresh temp dir, waits until it answers, and makes sure it never outlives us. Used by
// `Trainer.fit()` without a cluster address, by `gradwire start --head`, and by every integration
// test. Promise API (`launchNatsServer`, `launchNatsCluster`) for plain code, Effect API
// (`launchNatsServerEffect`, `launchNatsClusterEffect`) for scoped use.
//
// How "never an orphan" is guaranteed:
// - The server is not our child: a tiny POSIX sh guardian is. The guardian starts the server,
//   reports its pid, and blocks reading its stdin, which is a pipe from this process. Only this
//   process holds the write end, so the read sees EOF exactly when we die, however we die
//   (SIGKILL included): the guardian then SIGTERMs the server, SIGKILLs it after a grace period and
//   removes its temp dir. An orderly stop writes "stop" into the pipe instead (dir kept, so that
//   `restart()` can reuse the store dir; `stop()` removes it itself).
// - The guardian runs in its own process group (`detached`), so a terminal Ctrl-C reaches only
//   us; our SIGINT/SIGTERM handlers stop the servers in order and then re-raise the signal so the
//   process still dies of it, with the usual exit status.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { isMainThread } from "node:worker_threads"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { NatsServerNotFound, NatsServerStartError } from "./errors.ts"
import { ownSignalListener, programListens } from "./signals.ts"
import * as settings from "./settings.ts"

// ---------------------------------------------------------------------------------------------
// Options and public shapes

export interface NatsServerAuth {
  /** user + password (`authorization { user, password }`). */
  readonly user?: string
  readonly password?: string
  /** A bearer token (`authorization { token }`). Exclusive with user/password. */
  readonly token?: string
  /** A user's public nkey ("U…"; `authorization { users = [{ nkey }] }`). Exclusive with the others. */
  readonly nkey?: string
}

export interface NatsClusterConfig {
  /** Cluster name; servers only route to servers of the same name. Default "gradwire". */
  readonly name?: string
  /** Route listen port on 127.0.0.1; default a free one. */
  readonly port?: number
  /** Routes to other servers: "nats-route://127.0.0.1:6222" or "127.0.0.1:6222". */
  readonly routes?: ReadonlyArray<string>
}

export interface NatsLeafConfig {
  /** Accept leaf connections: `true` for a free port, or a port number. */
  readonly listen?: boolean | number
  /** Hub servers to connect to as a leaf: "nats-leaf://127.0.0.1:7422" or "127.0.0.1:7422". */
  readonly remotes?: ReadonlyArray<string>
}

export interface NatsServerOptions {
  /** Path of the nats-server binary. Default: $NATS_SERVER_BIN, else PATH, /usr/sbin, /usr/local/bin. */
  readonly binary?: string
  /** Client port; default a free one (on 127.0.0.1). */
  readonly port?: number
  /**
   * Address the client port listens on. Default 127.0.0.1; "0.0.0.0" or "::" for every interface,
   * or one address of this host (the server is then reached there only, not on loopback).
   */
  readonly host?: string
  /** Largest message the server accepts, in bytes (nats-server default: 1 MiB). */
  readonly maxPayload?: number
  /** JetStream with its store in the temp dir. Default true. */
  readonly jetstream?: boolean
  /** Where JetStream keeps its data; default the server's temp dir (removed when it stops). */
  readonly jetstreamStoreDir?: string
  /** server_name; default a unique "gw-<port>-<random>" (JetStream clusters need unique names). */
  readonly serverName?: string
  readonly auth?: NatsServerAuth
  readonly cluster?: NatsClusterConfig
  readonly leafnodes?: NatsLeafConfig
  /** HTTP monitoring endpoint (/varz, /routez …): `true` for a free port, or a port number. */
  readonly monitor?: boolean | number
  /** Extra nats-server config text, appended verbatim. */
  readonly extraConfig?: string
  /** How long to wait for the server to accept clients. Default 15 s. */
  readonly startTimeoutMs?: number
  /** After SIGTERM, how long before SIGKILL. Default 5 s. */
  readonly stopGraceMs?: number
}

export interface RunningNatsServer {
  /** nats://HOST:PORT (127.0.0.1 unless the server listens on one other address only) */
  readonly url: string
  readonly port: number
  readonly clusterPort?: number
  readonly leafPort?: number
  readonly monitorPort?: number
  readonly name: string
  /** The temp dir holding the config, the log and the JetStream store. */
  readonly dir: string
  /** pid of the nats-server process (changes on restart). */
  readonly pid: number
  /** The tail of the server's log. */
  log(): string
}

const DEFAULT_START_TIMEOUT_MS = 15_000
const DEFAULT_STOP_GRACE_MS = 5_000
const LOG_TAIL_CHARS = 4_000

// ---------------------------------------------------------------------------------------------
// Binary lookup

const isExecutableFile = (file: string): boolean => {
  try {
    if (!fs.statSync(file).isFile()) return false
    fs.accessSync(file, fs.constants.X_OK)
    return true
  } catch {
    return false
  }
}

/**
 * Finds the nats-server binary: `explicit`, else $NATS_SERVER_BIN (no fallback when set: the user
 * asked for that one), else PATH plus the usual install dirs that are often missing from PATH.
 */
export const findNatsServerBinary = (explicit?: string): string => {
  const wanted = explicit ?? settings.natsServerBin.read()
  if (wanted) {
    if (isExecutableFile(wanted)) return path.resolve(wanted)
    throw new NatsServerNotFound({ binary: wanted })
  }
  const dirs = [
    ...settings.searchPath.read(),
    "/usr/sbin",
    "/usr/local/bin",
    "/opt/homebrew/bin",
    "/usr/bin"
  ]
  for (const dir of dirs) {
    const candidate = path.join(dir, "nats-server")
    if (isExecutableFile(candidate)) return candidate
  }
  throw new NatsServerNotFound({ binary: "nats-server" })
}

// ---------------------------------------------------------------------------------------------
// Ports

/**
 * Picks `count` distinct free ports on 127.0.0.1 by binding port 0. All are held open until all
 * are picked so they differ; someone may still take one before the server binds it (start retries
 * once on "address already in use").
 */
export const freePorts = async (count: number): Promise<number[]> => {
  const servers: net.Server[] = []
  try {
    for (let i = 0; i < count; i++) {
      const srv = net.createServer()
      servers.push(srv)
      await new Promise<void>((resolve, reject) => {
        srv.once("error", reject)
        srv.listen(0, "127.0.0.1", () => resolve())
      })
    }
    return servers.map((s) => (s.address() as net.AddressInfo).port)
  } finally {
    await Promise.all(servers.map((s) => new Promise<void>((resolve) => s.close(() => resolve()))))
  }
}

export const freePort = async (): Promise<number> => (await freePorts(1))[0]

// ---------------------------------------------------------------------------------------------
// Config file

interface ResolvedConfig {
  readonly name: string
  readonly port: number
  readonly clusterPort?: number
  readonly leafPort?: number
  readonly monitorPort?: number
}

const q = (s: string): string => JSON.stringify(s)
/** The client listen address as nats-server's config wants it (an IPv6 address in brackets). */
const listenHost = (host: string | undefined): string => (host === undefined ? "127.0.0.1" : host.includes(":") && !host.startsWith("[") ? `[${host}]` : host)
/** Where this host reaches a server listening on `host`: loopback when it listens on every interface. */
const reachableHost = (host: string | undefined): string =>
  host === undefined || host === "0.0.0.0" ? "127.0.0.1" : host === "::" || host === "[::]" ? "::1" : host.replace(/^\[|\]$/g, "")
const withScheme = (url: string, scheme: string): string => (url.includes("://") ? url : `${scheme}://${url}`)

/** Seconds a client may take to authenticate after it connects (nats-server's `authorization.timeout`). */
export const AUTH_TIMEOUT_S = 20

const renderConfig = (options: NatsServerOptions, resolved: ResolvedConfig, dir: string): string => {
  const lines = [
    "# written by gradwire (core/nats-server.ts)",
    `server_name: ${q(resolved.name)}`,
    `listen: ${q(`${listenHost(options.host)}:${resolved.port}`)}`
  ]
  if (options.maxPayload !== undefined) {
    lines.push(`max_payload: ${Math.floor(options.maxPayload)}`)
    // The server refuses a max_payload above max_pending (64 MiB by default).
    if (options.maxPayload > 64 * 1024 * 1024) lines.push(`max_pending: ${Math.floor(options.maxPayload)}`)
  }
  if (options.jetstream ?? true) lines.push(`jetstream { store_dir: ${q(options.jetstreamStoreDir ?? path.join(dir, "jetstream"))} }`)
  const auth = options.auth
  // The server drops a client that has not authenticated within `timeout` seconds (2 s by
  // default). A process starting on a loaded machine (a worker host loading its modules while its
  // group trains on every core) can take longer to answer the nonce, and nats.js then waits out
  // its whole connect deadline without a word: give clients as long as they give themselves
  // (core/connection-spec.ts SPAWNED_CONNECT_TIMEOUT_MS).
  const timeout = `timeout: ${AUTH_TIMEOUT_S}`
  if (auth?.nkey !== undefined) lines.push(`authorization { ${timeout}, users = [ { nkey: ${q(auth.nkey)} } ] }`)
  else if (auth?.token !== undefined) lines.push(`authorization { ${timeout}, token: ${q(auth.token)} }`)
  else if (auth?.user !== undefined) {
    lines.push(`authorization { ${timeout}, user: ${q(auth.user)}, password: ${q(auth.password ?? "")} }`)
  }
  if (options.cluster) {
    const routes = (options.cluster.routes ?? []).map((r) => q(withScheme(r, "nats-route")))
    lines.push(
      "cluster {",
      `  name: ${q(options.cluster.name ?? "gradwire")}`,
      `  listen: ${q(`127.0.0.1:${resolved.clusterPort}`)}`,
      `  routes: [${routes.join(", ")}]`,
      "}"
    )
  }
  if (options.leafnodes) {
    lines.push("leafnodes {")
    if (resolved.leafPort !== undefined) lines.push(`  listen: ${q(`127.0.0.1:${resolved.leafPort}`)}`)
    const remotes = (options.leafnodes.remotes ?? []).map((r) => `{ url: ${q(withScheme(r, "nats-leaf"))} }`)
    if (remotes.length > 0) lines.push(`  remotes: [${remotes.join(", ")}]`)
    lines.push("}")
  }
  if (resolved.monitorPort !== undefined) lines.push(`http: ${q(`127.0.0.1:${resolved.monitorPort}`)}`)
  if (options.extraConfig) lines.push(options.extraConfig)
  return lines.join("\n") + "\n"
}

const resolvePorts = async (options: NatsServerOptions, fixedName?: string): Promise<ResolvedConfig> => {
  const wantCluster = options.cluster !== undefined && options.cluster.port === undefined
  const leafListen = options.leafnodes?.listen
  const wantLeaf = leafListen === true
  const wantMonitor = options.monitor === true
  const picked = await freePorts(
    (options.port === undefined ? 1 : 0) + (wantCluster ? 1 : 0) + (wantLeaf ? 1 : 0) + (wantMonitor ? 1 : 0)
  )
  const take = (): number => picked.shift() as number
  const port = options.port ?? take()
  const clusterPort = options.cluster ? (options.cluster.port ?? take()) : undefined
  const leafPort = wantLeaf ? take() : typeof leafListen === "number" ? leafListen : undefined
  const monitorPort = wantMonitor ? take() : typeof options.monitor === "number" ? options.monitor : undefined
  const name = fixedName ?? options.serverName ?? `gw-${port}-${Math.random().toString(36).slice(2, 8)}`
  return { name, port, clusterPort, leafPort, monitorPort }
}

// ---------------------------------------------------------------------------------------------
// The guardian

// $1 binary, $2 config, $3 dir, $4 grace in tenths of a second. stdin: a pipe from us.
// Background lists get stdin from /dev/null in sh, hence the copy to fd 3 for the watcher.
const GUARDIAN_SH = `
bin=$1; conf=$2; dir=$3; ticks=$4
exec 3<&0
"$bin" -c "$conf" </dev/null >>"$dir/server.log" 2>&1 3<&- &
srv=$!
echo "pid $srv"
(
  if read -r cmd <&3; then
    [ "$cmd" = gone ] && exit 0
    cleanup=no
  else
    cleanup=yes
  fi
  kill -TERM "$srv" 2>/dev/null
  i=0
  while kill -0 "$srv" 2>/dev/null && [ "$i" -lt "$ticks" ]; do sleep 0.1; i=$((i+1)); done
  kill -KILL "$srv" 2>/dev/null
  if [ "$cleanup" = yes ]; then
    i=0
    while kill -0 "$srv" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    rm -rf "$dir"
  fi
) &
wat=$!
exec 3<&-
wait "$srv"
code=$?
echo "exit $code"
wait "$wat"
exit "$code"
`

interface Guardian {
  readonly child: ChildProcess
  /** The server's pid, once the guardian has reported it. */
  readonly serverPid: Promise<number>
  /** Resolves with the server's exit status (null if unknown) when it has exited. */
  readonly serverExit: Promise<number | null>
  /** Resolves when the guardian itself has exited (server gone, watcher done). */
  readonly done: Promise<void>
  exited: boolean
  /** Ask for an orderly stop (SIGTERM, SIGKILL after the grace period); keeps the dir. */
  stop(): void
  /** Immediate SIGKILL of server and guardian: the last resort when stop() hangs. */
  forceKill(): void
}

const spawnGuardian = (bin: string, confPath: string, dir: string, graceMs: number): Guardian => {
  const child = spawn("/bin/sh", ["-c", GUARDIAN_SH, "gradwire-nats-guardian", bin, confPath, dir, String(Math.max(1, Math.ceil(graceMs / 100)))], {
    stdio: ["pipe", "pipe", "ignore"],
    detached: true
  })
  // A guardian that already exited makes writes fail with EPIPE; that is not an error for us.
  child.stdin!.on("error", () => {})
  let resolvePid!: (pid: number) => void
  let rejectPid!: (e: Error) => void
  let resolveExit!: (code: number | null) => void
  const serverPid = new Promise<number>((res, rej) => {
    resolvePid = res
    rejectPid = rej
  })
  serverPid.catch(() => {})
  const serverExit = new Promise<number | null>((res) => (resolveExit = res))
  let buffered = ""
  let pid = 0
  let stdinClosed = false
  const closeStdin = (line: string): void => {
    if (stdinClosed) return
    stdinClosed = true
    child.stdin!.end(line)
  }
  child.stdout!.setEncoding("utf8")
  child.stdout!.on("data", (chunk: string) => {
    buffered += chunk
    let nl: number
    while ((nl = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, nl).trim()
      buffered = buffered.slice(nl + 1)
      if (line.startsWith("pid ")) {
        pid = Number(line.slice(4))
        resolvePid(pid)
      } else if (line.startsWith("exit ")) {
        resolveExit(Number(line.slice(5)))
        // The server is gone: release the watcher without it signalling a pid that may be reused.
        closeStdin("gone\n")
      }
    }
  })
  const guardian: Guardian = {
    child,
    serverPid,
    serverExit,
    done: new Promise<void>((resolve) => {
      child.once("exit", () => {
        guardian.exited = true
        rejectPid(new Error("guardian exited before reporting the server pid"))
        resolveExit(null)
        resolve()
      })
      child.once("error", (e) => {
        guardian.exited = true
        rejectPid(e)
        resolveExit(null)
        resolve()
      })
    }),
    exited: false,
    stop: () => closeStdin("stop\n"),
    forceKill: () => {
      for (const target of [pid, child.pid]) {
        if (!target) continue
        try {
          process.kill(target, "SIGKILL")
        } catch {
          // already gone
        }
      }
    }
  }
  return guardian
}

/**
 * Whether the guardian keeps the event loop alive. Off while a server just runs: a script that
 * forgets to stop it still exits (and the guardian cleans up); on while we wait for it.
 */
const holdLoop = (guardian: Guardian, hold: boolean): void => {
  for (const handle of [guardian.child, guardian.child.stdout, guardian.child.stdin] as Array<{ ref?: () => void; unref?: () => void } | null>) {
    if (hold) handle?.ref?.()
    else handle?.unref?.()
  }
}

const withTimeout = <A>(promise: Promise<A>, ms: number): Promise<A | typeof TIMED_OUT> =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(TIMED_OUT), ms)
    promise.then(
      (a) => {
        clearTimeout(timer)
        resolve(a)
      },
      (e) => {
        clearTimeout(timer)
        reject(e)
      }
    )
  })
const TIMED_OUT: unique symbol = Symbol("timed out")

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * One attempt to read the INFO line of a NATS server at host:port. Checking server_name (and
 * not just that something accepts TCP) matters: when our server fails with "address in use", the
 * port does accept connections - someone else's.
 */
const probeInfo = (host: string, port: number, timeoutMs: number): Promise<{ server_name?: string } | undefined> =>
  new Promise((resolve) => {
    const socket = net.connect({ host, port })
    let data = ""
    const finish = (value: { server_name?: string } | undefined): void => {
      clearTimeout(timer)
      socket.destroy()
      resolve(value)
    }
    const timer = setTimeout(() => finish(undefined), timeoutMs)
    socket.setEncoding("utf8")
    socket.on("data", (chunk: string) => {
      data += chunk
      const nl = data.indexOf("\r\n")
      if (nl < 0) return
      const line = data.slice(0, nl)
      if (!line.startsWith("INFO ")) return finish(undefined)
      try {
        finish(JSON.parse(line.slice(5)))
      } catch {
        finish(undefined)
      }
    })
    socket.on("error", () => finish(undefined))
    socket.on("close", () => finish(undefined))
  })

// ---------------------------------------------------------------------------------------------
// Process-wide registry: cleanup on exit and on SIGINT/SIGTERM

const live = new Set<NatsServerProcess>()
let handlersInstalled = false
let shuttingDown = false

const onExit = (): void => {
  // Only synchronous work is possible here. The guardians see EOF right after we are gone and do
  // the full cleanup; the direct SIGTERM just saves them a round trip.
  for (const server of live) server.signalSync("SIGTERM")
}

const onSignal = (signal: NodeJS.Signals): void => {
  // With other listeners the user (or a framework) owns this signal: leave the servers alone; the
  // guardians clean up when the process does exit.
  if (process.listenerCount(signal) > 1) return
  if (shuttingDown) {
    // Second Ctrl-C while stopping: stop waiting.
    for (const server of live) server.signalSync("SIGKILL")
    reraise(signal)
    return
  }
  shuttingDown = true
  const stops = [...live].map((server) => server.stop().catch(() => {}))
  void withTimeout(Promise.all(stops), DEFAULT_STOP_GRACE_MS + 2_000).finally(() => reraise(signal))
}

const reraise = (signal: NodeJS.Signals): void => {
  uninstallHandlers()
  // With no listener left the default action applies: the process dies of the signal, so the
  // parent sees the usual status (130 for SIGINT, 143 for SIGTERM). A program listening for it
  // itself has taken the signal over (core/signals.ts).
  if (!programListens(signal)) process.kill(process.pid, signal)
}

const onSigint = ownSignalListener((): void => onSignal("SIGINT"))
const onSigterm = ownSignalListener((): void => onSignal("SIGTERM"))

const installHandlers = (): void => {
  if (handlersInstalled) return
  handlersInstalled = true
  process.on("exit", onExit)
  // Signal listeners in worker threads never fire, and would only confuse.
  if (isMainThread) {
    process.on("SIGINT", onSigint)
    process.on("SIGTERM", onSigterm)
  }
}

const uninstallHandlers = (): void => {
  if (!handlersInstalled) return
  handlersInstalled = false
  process.off("exit", onExit)
  process.off("SIGINT", onSigint)
  process.off("SIGTERM", onSigterm)
}

const register = (server: NatsServerProcess): void => {
  live.add(server)
  installHandlers()
}

const unregister = (server: NatsServerProcess): void => {
  live.delete(server)
  // Without live servers our listeners would only change how the process reacts to signals.
  if (live.size === 0 && !shuttingDown) uninstallHandlers()
}

/** pids of the nats-server processes this process has started and not yet stopped. */
export const liveNatsServerPids = (): number[] => [...live].map((s) => s.pid).filter((pid) => pid > 0)

// ---------------------------------------------------------------------------------------------
// A running server

const readTail = (file: string): string | undefined => {
  try {
    const text = fs.readFileSync(file, "utf8")
    return text.length > LOG_TAIL_CHARS ? text.slice(-LOG_TAIL_CHARS) : text
  } catch {
    return undefined
  }
}

/** A nats-server started by `launchNatsServer`. Stop it with `stop()`; it is idempotent. */
export class NatsServerProcess implements RunningNatsServer {
  readonly url: string
  readonly port: number
  readonly clusterPort?: number
  readonly leafPort?: number
  readonly monitorPort?: number
  readonly name: string
  readonly dir: string
  readonly #bin: string
  readonly #confPath: string
  readonly #options: NatsServerOptions
  /** Where this host reaches the server: its listen address, or loopback when it listens on every interface. */
  readonly #host: string
  #guardian: Guardian | undefined
  #pid = 0
  #lastLog = ""
  #removed = false
  #stopping: Promise<void> | undefined

  /** @internal use launchNatsServer */
  constructor(bin: string, dir: string, confPath: string, options: NatsServerOptions, resolved: ResolvedConfig) {
    this.#bin = bin
    this.dir = dir
    this.#confPath = confPath
    this.#options = options
    this.name = resolved.name
    this.port = resolved.port
    this.#host = reachableHost(options.host)
    this.url = `nats://${this.#host.includes(":") ? `[${this.#host}]` : this.#host}:${resolved.port}`
    if (resolved.clusterPort !== undefined) this.clusterPort = resolved.clusterPort
    if (resolved.leafPort !== undefined) this.leafPort = resolved.leafPort
    if (resolved.monitorPort !== undefined) this.monitorPort = resolved.monitorPort
  }

  get pid(): number {
    return this.#pid
  }

  /** True once stop() was called: the server will not run again. */
  get stopped(): boolean {
    return this.#stopping !== undefined
  }

  /** True while the server process is up. */
  get running(): boolean {
    return this.#guardian !== undefined && !this.#guardian.exited && this.#pid > 0 && pidAlive(this.#pid)
  }

  log(): string {
    const tail = readTail(path.join(this.dir, "server.log"))
    if (tail !== undefined) this.#lastLog = tail
    return this.#lastLog
  }

  /** @internal Starts the server process and waits until it answers; throws NatsServerStartError. */
  async start(): Promise<void> {
    const timeoutMs = this.#options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS
    const deadline = Date.now() + timeoutMs
    const guardian = spawnGuardian(this.#bin, this.#confPath, this.dir, this.#options.stopGraceMs ?? DEFAULT_STOP_GRACE_MS)
    this.#guardian = guardian
    register(this)
    try {
      const pid = await withTimeout(guardian.serverPid, timeoutMs)
      if (pid === TIMED_OUT) throw this.#startError(`the guardian shell did not start nats-server within ${timeoutMs} ms`)
      this.#pid = pid
      let serverGone: number | null | undefined
      void guardian.serverExit.then((code) => (serverGone = code))
      for (;;) {
        if (serverGone !== undefined || guardian.exited) {
          throw this.#startError(`nats-server exited with status ${serverGone ?? "?"} before accepting connections`)
        }
        const left = deadline - Date.now()
        if (left <= 0) throw this.#startError(`it did not accept connections on ${this.#host}:${this.port} within ${timeoutMs} ms`)
        // Racing the exit: a dead server's port may belong to someone who never answers.
        const info = await Promise.race([probeInfo(this.#host, this.port, Math.min(1_000, left)), guardian.serverExit.then(() => undefined)])
        if (info?.server_name === this.name) break
        if (serverGone === undefined) await sleep(Math.min(50, Math.max(0, deadline - Date.now())))
      }
    } catch (e) {
      await this.#halt()
      throw e
    }
    // A live server must not keep the event loop alive by itself: plain scripts that forget to stop
    // it still exit, and the guardian cleans up when they do.
    holdLoop(guardian, false)
  }

  #startError(reason: string): NatsServerStartError {
    return new NatsServerStartError({ reason, log: this.log() })
  }

  /** Stops the server process (SIGTERM, then SIGKILL after the grace period); keeps the dir. */
  async #halt(): Promise<void> {
    const guardian = this.#guardian
    if (!guardian) return
    holdLoop(guardian, true)
    guardian.stop()
    const graceMs = this.#options.stopGraceMs ?? DEFAULT_STOP_GRACE_MS
    const done = await withTimeout(guardian.done, graceMs + 3_000)
    if (done === TIMED_OUT) {
      guardian.forceKill()
      await withTimeout(guardian.done, 2_000)
    }
    this.log()
    this.#guardian = undefined
    unregister(this)
  }

  /** Stops the server and removes its temp dir. Safe to call more than once. */
  stop(): Promise<void> {
    this.#stopping ??= (async () => {
      await this.#halt()
      this.log()
      if (!this.#removed) {
        this.#removed = true
        await fs.promises.rm(this.dir, { recursive: true, force: true, maxRetries: 3 })
      }
    })()
    return this.#stopping
  }

  /**
   * Stops the server and starts it again on the same ports with the same config and store dir,
   * e.g. to test that clients reconnect. Works after `kill()` too.
   */
  async restart(): Promise<void> {
    if (this.#stopping) throw new NatsServerStartError({ reason: "restart() after stop(): the server's dir is gone", log: this.#lastLog })
    await this.#halt()
    // The old process has just released the port; another process may grab it meanwhile, or the
    // kernel may be slow to let go: retry "address in use" until the start deadline.
    const deadline = Date.now() + (this.#options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS)
    for (;;) {
      try {
        await this.start()
        return
      } catch (e) {
        if (!(e instanceof NatsServerStartError) || !/address already in use/i.test(e.log) || Date.now() > deadline) throw e
        await sleep(200)
      }
    }
  }

  /**
   * Sends a signal to the server process itself (default SIGKILL), e.g. to simulate a crash. The
   * guardian notices; `stop()` or `restart()` still work afterwards.
   */
  kill(signal: NodeJS.Signals = "SIGKILL"): void {
    if (this.#pid > 0 && this.#guardian && !this.#guardian.exited) {
      try {
        process.kill(this.#pid, signal)
      } catch {
        // already gone
      }
    }
  }

  /** Resolves when the server process has exited (immediately if it is not running). */
  async exited(): Promise<void> {
    const guardian = this.#guardian
    if (!guardian) return
    holdLoop(guardian, true)
    try {
      await guardian.serverExit
    } finally {
      if (this.#guardian === guardian) holdLoop(guardian, false)
    }
  }

  /** @internal synchronous signal to the server, for exit/signal handlers. */
  signalSync(signal: NodeJS.Signals): void {
    this.kill(signal)
  }
}

const pidAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}

// ---------------------------------------------------------------------------------------------
// Promise API

const toStartError = (e: unknown): NatsServerNotFound | NatsServerStartError =>
  e instanceof NatsServerNotFound || e instanceof NatsServerStartError
    ? e
    : new NatsServerStartError({ reason: e instanceof Error ? e.message : String(e), log: "" })

/**
 * Starts a nats-server on 127.0.0.1 (free ports unless given), JetStream in a fresh temp dir, and
 * waits until it accepts clients. Rejects with NatsServerNotFound or NatsServerStartError.
 */
export const launchNatsServer = async (options: NatsServerOptions = {}): Promise<NatsServerProcess> => {
  const bin = findNatsServerBinary(options.binary)
  if ([options.auth?.token, options.auth?.user, options.auth?.nkey].filter((a) => a !== undefined).length > 1) {
    throw new NatsServerStartError({ reason: "auth: give one of token, user/password or nkey", log: "" })
  }
  // Ports we pick ourselves can be taken by someone else before the server binds them: one retry
  // with fresh ports.
  const canRetry = options.port === undefined
  for (let attempt = 0; ; attempt++) {
    const dir = await fs.promises.mkdtemp(path.join(os.tmpdir(), "gradwire-nats-"))
    let server: NatsServerProcess | undefined
    try {
      const resolved = await resolvePorts(options)
      const confPath = path.join(dir, "nats.conf")
      // Only we read it: with auth it may hold a password or token (the dir itself is 0700).
      await fs.promises.writeFile(confPath, renderConfig(options, resolved, dir), { mode: 0o600 })
      server = new NatsServerProcess(bin, dir, confPath, options, resolved)
      await server.start()
      return server
    } catch (e) {
      if (server) await server.stop().catch(() => {})
      else await fs.promises.rm(dir, { recursive: true, force: true }).catch(() => {})
      const err = toStartError(e)
      if (canRetry && attempt === 0 && err instanceof NatsServerStartError && /address already in use/i.test(err.log)) continue
      throw err
    }
  }
}

export interface NatsClusterOptions extends Omit<NatsServerOptions, "port" | "cluster" | "monitor" | "serverName"> {
  /** Cluster name. Default "gradwire". */
  readonly clusterName?: string
  /** How long to wait until every server has routes to all others. Default 20 s. */
  readonly routeTimeoutMs?: number
}

export interface NatsCluster {
  readonly servers: ReadonlyArray<NatsServerProcess>
  readonly urls: ReadonlyArray<string>
  stop(): Promise<void>
}

const routeCount = async (monitorPort: number, timeoutMs: number): Promise<number> => {
  try {
    const res = await fetch(`http://127.0.0.1:${monitorPort}/routez`, { signal: AbortSignal.timeout(timeoutMs) })
    const body = (await res.json()) as { num_routes?: number }
    return body.num_routes ?? 0
  } catch {
    return 0
  }
}

/**
 * Starts `n` servers joined by routes on loopback (each lists all others, so the mesh does not
 * depend on gossip) and waits until every server has a route to every other one.
 */
export const launchNatsCluster = async (n = 3, options: NatsClusterOptions = {}): Promise<NatsCluster> => {
  if (!Number.isInteger(n) || n < 1) throw new NatsServerStartError({ reason: `cluster size must be a positive integer, got ${n}`, log: "" })
  findNatsServerBinary(options.binary)
  const routeTimeoutMs = options.routeTimeoutMs ?? 20_000
  for (let attempt = 0; ; attempt++) {
    // All ports up front: every server's config must name the route ports of all the others.
    const ports = await freePorts(3 * n)
    const clientPorts = ports.slice(0, n)
    const clusterPorts = ports.slice(n, 2 * n)
    const monitorPorts = ports.slice(2 * n)
    const started = await Promise.allSettled(
      clientPorts.map((port, i) =>
        launchNatsServer({
          ...options,
          port,
          monitor: monitorPorts[i],
          serverName: `gw-c${i}-${port}`,
          cluster: {
            name: options.clusterName ?? "gradwire",
            port: clusterPorts[i],
            routes: clusterPorts.filter((_, j) => j !== i).map((p) => `nats-route://127.0.0.1:${p}`)
          }
        })
      )
    )
    const servers = started.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []))
    const stopAll = async (): Promise<void> => {
      await Promise.all(servers.map((s) => s.stop().catch(() => {})))
    }
    const failed = started.find((r): r is PromiseRejectedResult => r.status === "rejected")
    if (failed) {
      await stopAll()
      const err = toStartError(failed.reason)
      if (attempt === 0 && err instanceof NatsServerStartError && /address already in use/i.test(err.log)) continue
      throw err
    }
    const deadline = Date.now() + routeTimeoutMs
    for (;;) {
      const counts = await Promise.all(servers.map((s) => routeCount(s.monitorPort as number, 1_000)))
      if (counts.every((c) => c >= n - 1)) break
      if (Date.now() > deadline) {
        const logs = servers.map((s, i) => `[server ${i}: ${counts[i]} route(s)]\n${s.log().slice(-1_500)}`).join("\n")
        await stopAll()
        throw new NatsServerStartError({
          reason: `cluster routes not established within ${routeTimeoutMs} ms (route counts ${counts.join(", ")}, wanted ${n - 1} each)`,
          log: logs
        })
      }
      await sleep(100)
    }
    return { servers, urls: servers.map((s) => s.url), stop: stopAll }
  }
}

// ---------------------------------------------------------------------------------------------
// Effect API

/** A nats-server that lives as long as the enclosing scope. */
export const launchNatsServerEffect = (
  options?: NatsServerOptions
): Effect.Effect<NatsServerProcess, NatsServerNotFound | NatsServerStartError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({ try: () => launchNatsServer(options), catch: toStartError }),
    (server) => Effect.promise(() => server.stop())
  )

/** A routed cluster of `n` nats-servers that lives as long as the enclosing scope. */
export const launchNatsClusterEffect = (
  n = 3,
  options?: NatsClusterOptions
): Effect.Effect<NatsCluster, NatsServerNotFound | NatsServerStartError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({ try: () => launchNatsCluster(n, options), catch: toStartError }),
    (cluster) => Effect.promise(() => cluster.stop())
  )
