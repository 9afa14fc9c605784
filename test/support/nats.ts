// NATS for test suites: real nats-server processes on free loopback ports, stopped by vitest hooks
// even when a test fails, and NATS connections closed with them. Thin on purpose: the work is done
// by core/nats-server.ts and core/connection.ts.
import { afterAll, afterEach } from "vitest"
import {
  launchNatsCluster,
  launchNatsServer,
  type NatsCluster,
  type NatsClusterOptions,
  type NatsServerOptions,
  type NatsServerProcess
} from "../../core/nats-server.ts"
import { openNats, type NatsConnectOptions, type NatsHandle } from "../../core/connection.ts"

type OpenedNats = NatsHandle & { close(): Promise<void> }

export interface NatsFixtures {
  /** A server that is stopped after the current test (or the suite, if started in beforeAll). */
  server(options?: NatsServerOptions): Promise<NatsServerProcess>
  cluster(n?: number, options?: NatsClusterOptions): Promise<NatsCluster>
  /** A connection that is closed before the servers are stopped. */
  connect(servers: string | ReadonlyArray<string>, options?: Omit<NatsConnectOptions, "servers">): Promise<OpenedNats>
  /** Every nats-server pid these fixtures have seen (restarts included once cleaned up). */
  readonly pids: ReadonlySet<number>
  /** Stops everything started so far; the hooks call it, tests may too. */
  cleanup(): Promise<void>
}

/**
 * Registers hooks that stop everything started through the returned fixtures: per test when
 * `scope` is "each" (default), else once after the suite.
 */
export const natsFixtures = (scope: "each" | "all" = "each"): NatsFixtures => {
  const servers: NatsServerProcess[] = []
  const connections: OpenedNats[] = []
  const pids = new Set<number>()
  const track = (s: NatsServerProcess): void => {
    pids.add(s.pid)
    servers.push(s)
  }
  const cleanup = async (): Promise<void> => {
    // Connections first: closing them against running servers is quick, against dead ones it
    // waits out the drain deadline.
    await Promise.all(connections.splice(0).map((c) => c.close().catch(() => {})))
    const stopping = servers.splice(0)
    for (const s of stopping) if (s.pid > 0) pids.add(s.pid)
    await Promise.all(stopping.map((s) => s.stop()))
  }
  if (scope === "each") afterEach(cleanup)
  // Also for "each": anything started in beforeAll.
  afterAll(cleanup)
  return {
    async server(options) {
      const s = await launchNatsServer(options)
      track(s)
      return s
    },
    async cluster(n = 3, options) {
      const c = await launchNatsCluster(n, options)
      c.servers.forEach(track)
      return c
    },
    async connect(target, options = {}) {
      const handle = await openNats({ ...options, servers: target })
      connections.push(handle)
      return handle
    },
    pids,
    cleanup
  }
}

/** Runs `fn` with a server that is stopped afterwards, whatever happens. */
export const withServer = async <A>(options: NatsServerOptions, fn: (server: NatsServerProcess) => Promise<A>): Promise<A> => {
  const server = await launchNatsServer(options)
  try {
    return await fn(server)
  } finally {
    await server.stop()
  }
}

/** Runs `fn` with an n-server routed cluster that is stopped afterwards, whatever happens. */
export const withCluster = async <A>(n: number, options: NatsClusterOptions, fn: (cluster: NatsCluster) => Promise<A>): Promise<A> => {
  const cluster = await launchNatsCluster(n, options)
  try {
    return await fn(cluster)
  } finally {
    await cluster.stop()
  }
}

/** True while a process with this pid exists. */
export const pidAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}

/** Polls `check` every 50 ms until it is true; throws after `timeoutMs` naming `what`. */
export const eventually = async (what: string, timeoutMs: number, check: () => boolean | Promise<boolean>): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await check()) return
    if (Date.now() > deadline) throw new Error(`${what}: not true within ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}
