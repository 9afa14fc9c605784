// The chaos benchmark's cluster of CLI agents (bench/chaos.ts, when its fault kinds include
// agent-kill): a head agent with its nats-server and more agents, each a `gradwire start --block`
// child of the bench on loopback, one CPU each (one worker per agent). An agent's kill -9 takes its
// workers with it (they exit when their agent's end of stdin closes); the bench starts a new agent
// in its place a moment later, as a machine's supervisor (systemd) would restart a crashed one.
// Every process it starts is stopped by stop(), on an error too.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { freePort } from "../core/nats-server.ts"
import { readState } from "../actors/node/agent-state.ts"
import { CLI, ROOT, waitForAliveNodes } from "../test/support/actors-processes.ts"
import { killQuietly } from "../test/support/chaos.ts"

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
  /** SIGKILL of every process it started, at once (the bench's exit handler). */
  killNow(): void
}

const alive = (c: ChildProcess): boolean => c.exitCode === null && c.signalCode === null

export const startAgentCluster = async (dir: string, agents: number): Promise<AgentCluster> => {
  const clusterName = `chaosbench${process.pid}`
  const port = await freePort()
  const url = `nats://127.0.0.1:${port}`
  const children = new Map<string, ChildProcess>()
  const stateDir = (node: string): string => path.join(dir, `agent-${node}`)
  let next = 0
  const start = (node: string, head: boolean): void => {
    const log = fs.openSync(path.join(dir, `${node}.log`), "a")
    const args = [CLI, "start", "--block", "--node-id", node, "--num-cpus", "1", "--backends", "wasm,cpu", "--cluster", clusterName, "--state-dir", stateDir(node)]
    const c = spawn(process.execPath, [...args, ...(head ? ["--head", "--port", String(port)] : ["--address", url])], { cwd: ROOT, stdio: ["ignore", log, log] })
    fs.closeSync(log)
    children.set(node, c)
  }
  const killNow = (): void => {
    const server = readState(stateDir("head"))?.natsServer?.pid
    for (const c of children.values()) if (alive(c)) c.kill("SIGKILL")
    if (server !== undefined) killQuietly(server, "SIGKILL")
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
    for (let i = 1; i < agents; i++) start(`a${next++}`, false)
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
      setTimeout(() => start(id, false), restartMs)
      return id
    },
    natsServerPid: () => readState(stateDir("head"))?.natsServer?.pid,
    waitForAgents,
    stop,
    killNow
  }
}
