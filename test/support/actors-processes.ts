// Test helpers for the actor, agent and CLI suites: real nats-servers, NATS connections and node
// agents as real processes (the CLI with --block), all tracked so afterAll/afterEach stop every
// one of them, also when a test fails. Agents run in their own process group, so killing the
// group also takes the actor processes they spawned.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/nats-core"
import { launchNatsCluster, launchNatsServer, type NatsCluster, type NatsServerOptions, type NatsServerProcess } from "../../core/nats-server.ts"
import { openNats } from "../../core/connection.ts"
import { openClusterView } from "../../scheduler/cluster-view.ts"

export const ROOT = fileURLToPath(new URL("../../", import.meta.url))
export const CLI = path.join(ROOT, "bin", "gradwire.js")
export const FIXTURES = path.join(ROOT, "test", "support", "actors-fixtures.ts")

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

/**
 * Resolves once the ids of `cluster`'s alive nodes satisfy `ok` (`ms` at most), through a
 * connection and a cluster view of its own, closed after.
 */
export const waitForAliveNodes = async (url: string, cluster: string, ok: (alive: ReadonlyArray<string>) => boolean, ms = 30_000): Promise<void> => {
  const conn = await openNats({ servers: url, name: `${cluster} test` })
  const view = await openClusterView({ nc: conn.nc, cluster })
  try {
    await view.waitFor((nodes) => ok(nodes.filter((x) => x.state === "alive").map((x) => x.ad.nodeId)), ms)
  } finally {
    view.close()
    await conn.close()
  }
}

/** Polls `check` every 20 ms until it returns a value other than undefined/false, or throws after `ms`. */
export const eventually = async <A>(what: string, ms: number, check: () => A | undefined | false | Promise<A | undefined | false>): Promise<A> => {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await check()
    if (v !== undefined && v !== false) return v
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await sleep(20)
  }
}

export { pidAlive } from "./nats.ts"

export interface AgentProc {
  readonly child: ChildProcess
  readonly pid: number
  readonly nodeId: string
  readonly stateDir: string
  /** Lines the agent printed (forwarded actor output included). */
  readonly lines: string[]
  readonly exited: Promise<{ code: number | null; signal: string | null }>
}

export interface CliResult {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** Everything a suite starts; `cleanup()` stops it all (call it from afterAll/afterEach). */
export class TestRig {
  readonly servers: NatsServerProcess[] = []
  readonly clusters: NatsCluster[] = []
  readonly connections: NatsConnection[] = []
  readonly agents: AgentProc[] = []
  readonly dirs: string[] = []
  readonly #closers: Array<() => unknown> = []

  async server(options: NatsServerOptions = {}): Promise<NatsServerProcess> {
    const s = await launchNatsServer(options)
    this.servers.push(s)
    return s
  }

  async cluster(n: number, options = {}): Promise<NatsCluster> {
    const c = await launchNatsCluster(n, options)
    this.clusters.push(c)
    return c
  }

  async connect(servers: string | string[], options: Record<string, unknown> = {}): Promise<NatsConnection> {
    const nc = await connect({ servers, maxReconnectAttempts: -1, reconnectTimeWait: 100, timeout: 5_000, ...options })
    this.connections.push(nc)
    return nc
  }

  /** Runs `fn` at cleanup (before connections and servers go). */
  onCleanup(fn: () => unknown): void {
    this.#closers.push(fn)
  }

  /** Kills these processes at cleanup if they still run: what a failed test left behind (background agents, their servers). */
  killAtCleanup(...pids: number[]): void {
    this.onCleanup(() => {
      for (const pid of pids) {
        try {
          process.kill(pid, "SIGKILL")
        } catch {
          // gone
        }
      }
    })
  }

  tempDir(prefix = "gw-test-"): string {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix))
    this.dirs.push(dir)
    return dir
  }

  /** Runs the CLI to completion (bounded by `timeoutMs`). */
  cli(args: ReadonlyArray<string>, env: NodeJS.ProcessEnv = {}, timeoutMs = 60_000): Promise<CliResult> {
    return new Promise((resolve) => {
      const child = spawn(process.execPath, [CLI, ...args], { cwd: ROOT, env: { ...process.env, GRADWIRE_LOG: "warn", ...env }, stdio: ["ignore", "pipe", "pipe"] })
      let stdout = ""
      let stderr = ""
      child.stdout.setEncoding("utf8").on("data", (c: string) => (stdout += c))
      child.stderr.setEncoding("utf8").on("data", (c: string) => (stderr += c))
      const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
      child.on("exit", (code) => {
        clearTimeout(timer)
        resolve({ code, stdout, stderr })
      })
    })
  }

  /**
   * Starts a node agent process (`gradwire start --block`) and waits until it has written its
   * state file. `args` are extra CLI flags (e.g. --address, --head, --user). It may run modules
   * under test/support (`allowFixtures: false` leaves it at the default roots).
   */
  async agent(
    nodeId: string,
    args: ReadonlyArray<string>,
    options: { readonly cluster?: string; readonly readyMs?: number; readonly allowFixtures?: boolean } = {}
  ): Promise<AgentProc> {
    const stateDir = this.tempDir("gw-agent-")
    // The test actors live in test/support: agents allow that root unless a test says otherwise.
    const roots = options.allowFixtures === false ? [] : ["--allow-module-root", path.dirname(FIXTURES)]
    const child = spawn(
      process.execPath,
      [CLI, "start", "--block", "--node-id", nodeId, "--cluster", options.cluster ?? "test", "--backends", "cpu", "--state-dir", stateDir, ...roots, ...args],
      { cwd: ROOT, env: { ...process.env, GRADWIRE_LOG: "info" }, stdio: ["ignore", "pipe", "pipe"], detached: true }
    )
    const lines: string[] = []
    for (const stream of [child.stdout, child.stderr]) {
      let buf = ""
      stream.setEncoding("utf8").on("data", (c: string) => {
        buf += c
        let nl: number
        while ((nl = buf.indexOf("\n")) >= 0) {
          lines.push(buf.slice(0, nl))
          buf = buf.slice(nl + 1)
        }
      })
    }
    const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })))
    const proc: AgentProc = { child, pid: child.pid as number, nodeId, stateDir, lines, exited }
    this.agents.push(proc)
    let gone: { code: number | null } | undefined
    void exited.then((e) => (gone = e))
    await eventually(`agent ${nodeId} to start`, options.readyMs ?? 30_000, () => {
      if (gone) throw new Error(`agent ${nodeId} exited with ${gone.code} while starting:\n${lines.join("\n")}`)
      try {
        return (JSON.parse(fs.readFileSync(path.join(stateDir, "agent.json"), "utf8")) as { pid: number }).pid === child.pid
      } catch {
        return false
      }
    })
    return proc
  }

  /** SIGKILLs an agent's whole process group (agent and the actor processes it spawned). */
  killAgent(agent: AgentProc, signal: NodeJS.Signals = "SIGKILL"): void {
    try {
      process.kill(-agent.pid, signal)
    } catch {
      // already gone
    }
  }

  async cleanup(): Promise<void> {
    for (const fn of this.#closers.splice(0).reverse()) {
      try {
        await fn()
      } catch {
        // keep cleaning
      }
    }
    for (const a of this.agents.splice(0)) {
      if (a.child.exitCode === null && a.child.signalCode === null) {
        // SIGTERM first so the agent stops its actors politely, then the whole group for sure.
        this.killAgent(a, "SIGTERM")
        await Promise.race([a.exited, sleep(5_000)])
      }
      this.killAgent(a, "SIGKILL")
    }
    await Promise.all(this.connections.splice(0).map((nc) => nc.close().catch(() => {})))
    await Promise.all(this.clusters.splice(0).map((c) => c.stop().catch(() => {})))
    await Promise.all(this.servers.splice(0).map((s) => s.stop().catch(() => {})))
    for (const d of this.dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
  }
}
