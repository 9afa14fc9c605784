// The chaos benchmark's cluster of CLI agents (bench/chaos.ts, when its fault kinds include
// agent-kill): a head agent with its nats-server and more agents, each a `gradwire start --block`
// child of the bench on loopback, one CPU each (one worker per agent). An agent's kill -9 takes its
// workers with it (they exit when their agent's end of stdin closes); the bench starts a new agent
// in its place a moment later, as a machine's supervisor (systemd) would restart a crashed one.
// With `linkCut` (root only) the head's nats-server listens on the host end of a veth pair instead
// of loopback, and the first other agent runs in a network namespace of its own at the far end
// (its workers with it), so its link can be cut (`ip link set ... down`) and restored; an agent
// killed there is replaced there. Every process it starts is stopped by stop(), on an error too,
// and the namespace is deleted.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { freePort } from "../core/nats-server.ts"
import { readState } from "../actors/node/agent-state.ts"
import { CLI, ROOT, waitForAliveNodes } from "../test/support/actors-processes.ts"
import { killQuietly } from "../test/support/chaos.ts"
import { deleteNetns, nsExec, vethNamespace } from "../test/support/netns.ts"
import { createCpuGroup, inGroup, type CpuGroup } from "./cgroups.ts"

export interface AgentCluster {
  readonly url: string
  readonly clusterName: string
  /** Agents the bench may kill (all but the head, which holds the nats-server): node id and pid. */
  killable(): Array<{ readonly node: string; readonly pid: number }>
  /** kill -9 of that agent; a new agent starts in its place `restartMs` later. Returns the new node's id. */
  killAgent(node: string, restartMs: number): string
  /** The head's nats-server (kill -9: the head agent restarts it). */
  natsServerPid(): number | undefined
  /** Resolves once `n` agents are alive (at most 60 s). */
  waitForAgents(n: number): Promise<void>
  stop(): Promise<void>
  /** SIGKILL of every process it started, at once (the bench's exit handler); deletes the namespace. */
  killNow(): void
  /** With linkCut: the agent behind the cuttable link, when it is alive. */
  cuttable(): string | undefined
  /** With linkCut: takes that agent's link down for `ms`, then up again. Returns what was cut. */
  cutLink(ms: number): string
}

export interface AgentClusterOptions {
  /** Put the first agent other than the head behind a veth link in its own network namespace. */
  readonly linkCut?: boolean
  /**
   * Cap each agent, with all it starts (its workers, the head's nats-server too), at this much CPU
   * time through a cgroup of its own (bench/cgroups.ts; root): 0.6 gives three agents 1.8 of two
   * cores, so that a group short of a worker steps slower, as where each worker has a core.
   */
  readonly coresPerAgent?: number
}

const alive = (c: ChildProcess): boolean => c.exitCode === null && c.signalCode === null

export const startAgentCluster = async (dir: string, agents: number, opts: AgentClusterOptions = {}): Promise<AgentCluster> => {
  const clusterName = `chaosbench${process.pid}`
  const port = await freePort()
  const tag = String(process.pid % 100000)
  const ns = `gwB${tag}`
  const hostEnd = `gwbr${tag}`
  const nsEnd = `gwbn${tag}`
  const net = `10.234.${process.pid % 250}`
  const host = opts.linkCut ? `${net}.1` : "127.0.0.1"
  const url = `nats://${host}:${port}`
  const children = new Map<string, ChildProcess>()
  /** Agents (by node id) that run in the namespace. */
  const inNs = new Set<string>()
  const stateDir = (node: string): string => path.join(dir, `agent-${node}`)
  let next = 0
  let deleted = false
  const deleteNs = (): void => {
    if (!opts.linkCut || deleted) return
    deleted = true
    deleteNetns([ns])
  }
  if (opts.linkCut) {
    deleteNetns([ns])
    vethNamespace(ns, hostEnd, nsEnd, net)
  }
  /** Each capped agent's cgroup (coresPerAgent), by node id. */
  const groups = new Map<string, CpuGroup>()
  const removeGroups = (): void => {
    for (const g of groups.values()) {
      try {
        g.removeSync()
      } catch (e) {
        // A process in it that would not die: said, not thrown (the other groups are still removed).
        console.error(`chaos bench: ${(e as Error).message}`)
      }
    }
    groups.clear()
  }
  const start = (node: string, head: boolean, netns = false): void => {
    const log = fs.openSync(path.join(dir, `${node}.log`), "a")
    const args = [CLI, "start", "--block", "--node-id", node, "--num-cpus", "1", "--backends", "wasm,cpu", "--cluster", clusterName, "--state-dir", stateDir(node)]
    const role = head ? ["--head", "--port", String(port), ...(opts.linkCut ? ["--host", host, "--insecure"] : [])] : ["--address", url]
    let argv = [...(netns ? ["ip", "netns", "exec", ns] : []), process.execPath, ...args, ...role]
    if (opts.coresPerAgent !== undefined) {
      // A 10 ms period, as the hetero bench's: a capped worker waits at most a few ms when throttled.
      const g = createCpuGroup(`gwchaos${process.pid}-${node}`, 10_000)
      g.setCores(opts.coresPerAgent)
      groups.set(node, g)
      argv = inGroup(g, argv).flat()
    }
    // `ip netns exec` and the cgroup's shell exec the agent: the child's pid is the agent's.
    const c = spawn(argv[0]!, argv.slice(1), { cwd: ROOT, stdio: ["ignore", log, log] })
    fs.closeSync(log)
    children.set(node, c)
    if (netns) inNs.add(node)
  }
  const killNow = (): void => {
    const server = readState(stateDir("head"))?.natsServer?.pid
    for (const c of children.values()) if (alive(c)) c.kill("SIGKILL")
    if (server !== undefined) killQuietly(server, "SIGKILL")
    deleteNs()
    removeGroups()
  }
  /** SIGTERM to every agent (the head stops its nats-server), then SIGKILL of what is left after 10 s. */
  const stop = async (): Promise<void> => {
    for (const c of children.values()) if (alive(c)) c.kill("SIGTERM")
    const deadline = Date.now() + 10_000
    while ([...children.values()].some(alive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
    killNow()
  }
  /** Until `n` agents are alive (the head's nats-server may not listen yet: tried again), 60 s at most. */
  const waitForAgents = async (n: number): Promise<void> => {
    const deadline = Date.now() + 60_000
    for (;;) {
      const head = children.get("head")
      if (head && !alive(head)) throw new Error(`the head agent exited (${head.exitCode ?? head.signalCode}): see ${path.join(dir, "head.log")}`)
      try {
        return await waitForAliveNodes(url, clusterName, (a) => a.length >= n, Math.max(1, deadline - Date.now()))
      } catch (e) {
        if (Date.now() >= deadline) throw e
        await new Promise((r) => setTimeout(r, 300))
      }
    }
  }
  try {
    start("head", true)
    await waitForAgents(1)
    for (let i = 1; i < agents; i++) start(`a${next++}`, false, opts.linkCut === true && i === 1)
    await waitForAgents(agents)
  } catch (e) {
    await stop()
    throw e
  }
  return {
    url,
    clusterName,
    killable: () => [...children].filter(([node, c]) => node !== "head" && alive(c) && c.pid !== undefined).map(([node, c]) => ({ node, pid: c.pid! })),
    killAgent: (node, restartMs) => {
      const c = children.get(node)
      if (c && alive(c)) c.kill("SIGKILL")
      const id = `a${next++}`
      const there = inNs.delete(node)
      setTimeout(() => start(id, false, there), restartMs)
      return id
    },
    cuttable: () => [...inNs].find((node) => { const c = children.get(node); return c !== undefined && alive(c) }),
    cutLink: (ms) => {
      nsExec(ns, ["ip", "link", "set", nsEnd, "down"])
      setTimeout(() => {
        if (!deleted) nsExec(ns, ["ip", "link", "set", nsEnd, "up"])
      }, ms).unref()
      return `${nsEnd} down for ${(ms / 1000).toFixed(0)} s (agent ${[...inNs].join(",")})`
    },
    natsServerPid: () => readState(stateDir("head"))?.natsServer?.pid,
    waitForAgents,
    stop,
    killNow
  }
}
