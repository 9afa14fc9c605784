// The node agent as a real process (`gradwire start --block`) on one nats-server: spawning actor
// processes (env, CUDA_VISIBLE_DEVICES, readiness), forwarding their output with a prefix,
// reporting exits, killing them when the job ends or their owner goes silent, supervision of a
// spawned child, resources used in the advertisement, and spawn errors.
import type { NatsConnection } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ChildEscalated } from "../actors/runtime/errors.ts"
import { launchAgent } from "../actors/node/agent.ts"
import { AgentUnreachable, SpawnError } from "../actors/node/errors.ts"
import { agentsInThisProcess } from "../actors/node/agent-protocol.ts"
import { silentLogger } from "../actors/runtime/log.ts"
import { spawnActor, spawnedChild } from "../actors/node/spawn.ts"
import { launchSupervisor, restartOnFailure } from "../actors/runtime/supervisor.ts"
import type { ActorDown } from "../actors/runtime/watcher.ts"
import { mainThreadStack } from "../actors/runtime/heartbeat.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { openClusterView, type ClusterView, type NodeStatus } from "../scheduler/cluster-view.ts"
import { clusterSubjects, jobSubjects } from "../core/subjects.ts"
import { decodeMessage } from "../core/wire.ts"
import { EchoProtocol } from "./support/actors-fixtures.ts"
import { FIXTURES, TestRig, eventually, pidAlive, sleep, type AgentProc } from "./support/actors-processes.ts"

const rig = new TestRig()
let url: string
let nc: NatsConnection
let driver: ActorSystem
let view: ClusterView
let agent: AgentProc
let n = 0
const fresh = (prefix: string): string => `${prefix}-${++n}`

beforeAll(async () => {
  url = (await rig.server()).url
  agent = await rig.agent("n1", ["--address", url, "--num-cpus", "4", "--labels", "zone=a"])
  nc = await rig.connect(url)
  driver = new ActorSystem({ nc, cluster: "test", job: "agentjob", log: silentLogger })
  view = await openClusterView({ nc, cluster: "test" })
  rig.onCleanup(() => {
    view.close()
    driver.close()
  })
})

afterAll(() => rig.cleanup())

describe("node agent", () => {
  it("spawns an actor process with its env and GPUs, forwards its output with a prefix, and reports its exit", async () => {
    const logs: string[] = []
    const logSub = nc.subscribe(jobSubjects("test", "agentjob").logs, {
      callback: (_e, m) => void logs.push((decodeMessage(m.data) as { line: string }).line)
    })
    rig.onCleanup(() => logSub.unsubscribe())
    const name = fresh("w")
    const spawned = await spawnActor(driver, {
      node: "n1",
      name,
      module: FIXTURES,
      export: "echoActor",
      env: { GRADWIRE_TEST_ENV: "hello" },
      gpus: [2, 3],
      resources: { CPU: 1 },
      logPrefix: "worker rank=0"
    })
    expect(spawned.pid).toBeGreaterThan(0)
    const ref = spawned.ref(EchoProtocol)
    const me = await driver.askPromise(ref, "whoami", null)
    expect(me).toMatchObject({ name, pid: spawned.pid, node: "n1", env: { GRADWIRE_TEST_ENV: "hello", CUDA_VISIBLE_DEVICES: "2,3" } })

    // Resources used show up in the node's advertisement.
    await view.waitFor((nodes) => nodes.some((x) => x.ad.nodeId === "n1" && x.ad.used.cpus === 1 && x.ad.processes.length === 1), 5_000)

    await driver.askPromise(ref, "log", "line-from-actor")
    const prefix = `(worker rank=0 pid=${spawned.pid} node=n1)`
    await eventually("forwarded lines", 5_000, () => agent.lines.some((l) => l === `${prefix} line-from-actor`) && agent.lines.some((l) => l === `${prefix} err:line-from-actor`))
    await eventually("published log lines", 5_000, () => logs.includes("line-from-actor") && logs.includes("err:line-from-actor"))

    const down = spawned.down()
    await driver.askPromise(ref, "crash", 3)
    const d = await down
    expect(d).toMatchObject({ reason: "exited", code: 3, signal: null, node: "n1" })
    expect(d.detail).toContain("err:line-from-actor")
    await view.waitFor((nodes) => nodes.some((x) => x.ad.nodeId === "n1" && x.ad.used.cpus === 0 && x.ad.processes.length === 0), 5_000)
    expect(pidAlive(spawned.pid)).toBe(false)
  })

  it("kills a job's processes when the job ends", async () => {
    const sys = new ActorSystem({ nc, cluster: "test", job: fresh("ending"), log: silentLogger })
    rig.onCleanup(() => sys.close())
    const s = await spawnActor(sys, { node: "n1", name: "w", module: FIXTURES, export: "echoActor" })
    const down = s.down()
    sys.endJob()
    const d = await down
    expect(d.reason).toBe("exited")
    expect(d.detail).toContain("job ended")
    await eventually("process gone", 5_000, () => !pidAlive(s.pid))
  })

  it("a stopped process (SIGSTOP) is continued when killed: it exits on the SIGTERM at once, not by SIGKILL after the grace period", async () => {
    const sys = new ActorSystem({ nc, cluster: "test", job: fresh("stopped"), log: silentLogger })
    rig.onCleanup(() => sys.close())
    const s = await spawnActor(sys, { node: "n1", name: "w", module: FIXTURES, export: "echoActor" })
    process.kill(s.pid, "SIGSTOP")
    const down = s.down()
    sys.endJob()
    const d = await down
    expect(d.reason).toBe("exited")
    // The host's SIGTERM handler ran (exit code 143); SIGKILL would show as the signal.
    expect(d).toMatchObject({ code: 143, signal: null })
    await eventually("process gone", 5_000, () => !pidAlive(s.pid))
  })

  it("kills a process stopped (SIGSTOP) for 0.25 s with SIGKILL, naming why; one continued sooner runs on", async () => {
    const sys = new ActorSystem({ nc, cluster: "test", job: fresh("frozen"), log: silentLogger })
    rig.onCleanup(() => sys.close())
    const brief = await spawnActor(sys, { node: "n1", name: "brief", module: FIXTURES, export: "echoActor" })
    const frozen = await spawnActor(sys, { node: "n1", name: "frozen", module: FIXTURES, export: "echoActor" })
    // Silence alone would call it down after 2 s (the watch's default): the agent's word is awaited.
    const down = frozen.down({ deadAfterMs: 15_000 })
    const stoppedAt = Date.now()
    process.kill(brief.pid, "SIGSTOP")
    process.kill(frozen.pid, "SIGSTOP")
    await sleep(30)
    process.kill(brief.pid, "SIGCONT")
    const d = await down
    expect(Date.now() - stoppedAt).toBeGreaterThanOrEqual(250)
    expect(d.reason).toBe("exited")
    expect(d.detail).toMatch(/\(stopped \(SIGSTOP\) for 0\.[2-9] s: a stopped process holds its group up\)/)
    // SIGKILL at once: not continued to run its SIGTERM handler (a hung rank must not step again).
    expect(d).toMatchObject({ signal: "SIGKILL" })
    await eventually("process gone", 5_000, () => !pidAlive(frozen.pid))
    // Stopped for less than the limit: still there, and answering.
    expect(pidAlive(brief.pid)).toBe(true)
    expect((await sys.askPromise(brief.ref(EchoProtocol), "whoami", null)).pid).toBe(brief.pid)
    expect(await brief.kill()).toBe(true)
  })

  it("a spawned actor beats from a thread: its event loop held past the silence deadline is not its death, held past heldAfterMs it is taken for hung", async () => {
    const sys = new ActorSystem({ nc, cluster: "test", job: fresh("held"), log: silentLogger })
    rig.onCleanup(() => sys.close())
    const s = await spawnActor(sys, { node: "n1", name: "w", module: FIXTURES, export: "echoActor" })
    rig.onCleanup(() => void s.kill().catch(() => false))
    // Its thread is up once a beat says how long the event loop has been held.
    const held: number[] = []
    const sub = nc.subscribe(sys.subjects.heartbeat("w"), { callback: (_e, m) => void held.push((decodeMessage(m.data) as { heldMs?: number }).heldMs ?? -1) })
    rig.onCleanup(() => sub.unsubscribe())
    await eventually("a beat from the beat thread", 10_000, () => held.some((h) => h >= 0))
    let down: ActorDown | undefined
    void s.down({ deadAfterMs: 1_000, silentAfterMs: 3_000, heldAfterMs: 4_000 }).then((d) => (down = d))
    // Its stack, asked of its beat thread: idle (its loop free) says so, instead of a frame of whatever runs next
    expect(await eventually("an idle answer", 5_000, async () => (await mainThreadStack(nc, sys.subjects.stack("w")))?.idle)).toBe(true)
    // 2.5 s held: silent for a timer's beats (dead after 1 s), alive by its thread's (3 s of silence allowed: a loaded machine)
    held.length = 0
    const holding = sys.askPromise(s.ref(EchoProtocol), "hold", 2_500, { timeoutMs: 10_000 })
    await sleep(700)
    // ... and held, where: the handler's loop, inside the computation
    const st = await mainThreadStack(nc, sys.subjects.stack("w"))
    expect(st?.frames?.[0], JSON.stringify(st)).toMatch(/^hold \(test\/support\/actors-fixtures\.ts:\d+:\d+\)$/)
    expect(await holding).toBe(2_500)
    await sleep(300)
    expect(down).toBeUndefined()
    expect(Math.max(...held)).toBeGreaterThanOrEqual(1_500)
    // held past heldAfterMs: taken for hung, named as such, while its process still runs
    void sys.askPromise(s.ref(EchoProtocol), "hold", 8_000, { timeoutMs: 15_000 }).catch(() => undefined)
    const d = await eventually("taken for hung", 12_000, () => down)
    expect(d.reason).toBe("missed-heartbeats")
    expect(d.detail).toMatch(/^its event loop has been held for \d+ ms \(taken for hung after 4000 ms\)/)
    // where: the holding handler's loop, as the beat thread took it
    expect(d.detail, d.detail).toMatch(/; its main thread is at hold \(test\/support\/actors-fixtures\.ts:\d+:\d+\)/)
    expect(d.stack?.[0]).toMatch(/^hold \(/)
    expect(pidAlive(s.pid)).toBe(true)
    expect(await s.kill()).toBe(true)
  })

  it("kills a process when its owner stops heartbeating", async () => {
    const job = fresh("orphan")
    const ownerConn = await rig.connect(url)
    const owner = new ActorSystem({ nc: ownerConn, cluster: "test", job, heartbeatMs: 100, log: silentLogger })
    const watcher = new ActorSystem({ nc, cluster: "test", job, log: silentLogger })
    rig.onCleanup(() => watcher.close())
    await watcher.watcherReady()
    const s = await spawnActor(owner, { node: "n1", name: "w", module: FIXTURES, export: "echoActor", ownerTimeoutMs: 800 })
    const down = watcher.watchPromise("w", { instance: s.instance, deadAfterMs: 10_000 })
    // The driver vanishes without a word.
    await ownerConn.close()
    const d = await down
    expect(d.reason).toBe("exited")
    expect(d.detail).toMatch(/owner "drv-[^"]+" stopped heartbeating/)
    await eventually("process gone", 5_000, () => !pidAlive(s.pid))
  })

  it("a hold of the watching process itself (its event loop blocked past every deadline) is not taken for the silence of the nodes and actors it watches", async () => {
    // The embedded cluster's driver holds the view, the death watcher and the agent in one process:
    // a long synchronous stretch or a starved CPU there stops the beats being read (or sent), and
    // after it Node runs the due timers before it reads the socket.
    // Here: an agent in this process (as the embedded cluster's), and one in its own (n1).
    const job = fresh("held")
    const system = new ActorSystem({ nc, cluster: "test", job, log: silentLogger })
    const inner = await launchAgent({ nc: (await rig.connect(url)), connection: { servers: [url] }, cluster: "test", nodeId: "n-in", log: silentLogger, output: () => {} })
    const strict = await openClusterView({ nc, cluster: "test", deadAfterMs: 800 })
    rig.onCleanup(async () => {
      strict.close()
      system.close()
      await inner.stop("test finished").catch(() => {})
    })
    const bothAlive = (nodes: ReadonlyArray<NodeStatus>): boolean => ["n1", "n-in"].every((id) => nodes.some((x) => x.ad.nodeId === id && x.state === "alive"))
    await strict.waitFor(bothAlive, 10_000)
    const dead: string[] = []
    strict.onEvent((e) => {
      if (e.type === "node-dead") dead.push(e.node.ad.nodeId)
    })
    await system.watcherReady()
    const s = await spawnActor(system, { node: "n1", name: "w", module: FIXTURES, export: "echoActor" })
    let down: ActorDown | undefined
    void system.watchPromise("w", { instance: s.instance, deadAfterMs: 800 }).then((d) => (down = d))
    await sleep(300)
    const until = Date.now() + 2_000
    while (Date.now() < until) {
      // held: nothing else runs in this process
    }
    await sleep(1_000)
    expect(dead).toEqual([])
    expect(bothAlive(strict.nodes())).toBe(true)
    expect(down).toBeUndefined()
    // A node that really goes silent is still found: the view's deadline is unchanged.
    process.kill(agent.pid, "SIGSTOP")
    try {
      await eventually("n1 taken for dead", 5_000, () => dead.includes("n1"))
    } finally {
      process.kill(agent.pid, "SIGCONT")
    }
    await strict.waitFor(bothAlive, 10_000)
    expect(await s.kill()).toBe(true)
    // (this view's short deadline would take the next test's held agent for dead)
    strict.close()
    await inner.stop("test finished")
  })

  it("an agent held (SIGSTOP) past an owner's timeout does not kill the owner's processes: the owner's beats wait in its socket", async () => {
    const job = fresh("agent-held")
    const owner = new ActorSystem({ nc, cluster: "test", job, heartbeatMs: 100, log: silentLogger })
    rig.onCleanup(() => owner.close())
    await owner.watcherReady()
    const s = await spawnActor(owner, { node: "n1", name: "w", module: FIXTURES, export: "echoActor", ownerTimeoutMs: 800 })
    let down: ActorDown | undefined
    void owner.watchPromise("w", { instance: s.instance, deadAfterMs: 30_000 }).then((d) => (down = d))
    process.kill(agent.pid, "SIGSTOP")
    try {
      await sleep(2_000)
    } finally {
      process.kill(agent.pid, "SIGCONT")
    }
    await sleep(1_500)
    expect(down, JSON.stringify(down)).toBeUndefined()
    expect(pidAlive(s.pid)).toBe(true)
    expect(await owner.askPromise(owner.ref(EchoProtocol, "w"), "echo", { back: 1 })).toEqual({ back: 1 })
    expect(await s.kill()).toBe(true)
  })

  it("supervises a spawned child: restarts it after abnormal exits, then escalates", async () => {
    const name = fresh("fragile")
    const decisions: string[] = []
    const sup = await launchSupervisor({
      name,
      start: spawnedChild(driver, { node: "n1", name, module: FIXTURES, export: "shortLivedActor", args: { exitCode: 2, afterMs: 200 } }),
      policy: restartOnFailure(1),
      backoffMs: () => 50,
      onDecision: (down, decision) => decisions.push(`${down.reason}:${down.code}:${decision}`)
    })
    const e = await sup.result.catch((x: unknown) => x)
    expect(e).toBeInstanceOf(ChildEscalated)
    expect(decisions).toEqual(["exited:2:restart", "exited:2:escalate"])
    await sup.close()
  })

  it("knows an agent that runs in this process (the embedded cluster's) while it runs, so that its silence is told apart from an agent elsewhere", async () => {
    const inner = await launchAgent({ nc: await rig.connect(url), connection: { servers: [url] }, cluster: "test", nodeId: "n-here", log: silentLogger, output: () => {} })
    rig.onCleanup(() => inner.stop("test finished").catch(() => {}))
    expect(agentsInThisProcess.has("test/n-here")).toBe(true)
    expect(agentsInThisProcess.has("test/n1")).toBe(false)
    await inner.stop("test finished")
    expect(agentsInThisProcess.has("test/n-here")).toBe(false)
  })

  it("says why a spawn fails", async () => {
    const bad = await spawnActor(driver, { node: "n1", name: fresh("bad"), module: FIXTURES, export: "noSuchExport" }).catch((x: unknown) => x)
    expect(bad).toBeInstanceOf(SpawnError)
    expect((bad as SpawnError).reason).toContain('export "noSuchExport"')
    const broken = await spawnActor(driver, { node: "n1", name: fresh("broken"), module: FIXTURES, export: "brokenActor" }).catch((x: unknown) => x)
    expect(broken).toBeInstanceOf(SpawnError)
    expect((broken as SpawnError).reason).toContain("setup exploded on purpose")
    const nowhere = await spawnActor(driver, { node: "no-such-node", name: fresh("x"), module: FIXTURES, export: "echoActor" }).catch((x: unknown) => x)
    expect(nowhere).toBeInstanceOf(AgentUnreachable)
    const dup = fresh("dup")
    await spawnActor(driver, { node: "n1", name: dup, module: FIXTURES, export: "echoActor" })
    const again = await spawnActor(driver, { node: "n1", name: dup, module: FIXTURES, export: "echoActor" }).catch((x: unknown) => x)
    expect(again).toBeInstanceOf(SpawnError)
    expect((again as SpawnError).reason).toContain("already runs here")
  })

  it("advertises the node: overrides, labels, backends, NATS server", async () => {
    const node = await view.waitFor((nodes) => nodes.some((x) => x.ad.nodeId === "n1"), 5_000).then((ns) => ns.find((x) => x.ad.nodeId === "n1")!)
    expect(node.state).toBe("alive")
    expect(node.ad).toMatchObject({ cpus: 4, labels: { zone: "a" }, backends: ["cpu"], backendsProbed: true, head: false })
    expect(node.ad.nats.serverId).toBe(nc.info?.server_id)
    expect(clusterSubjects("test").nodeHeartbeat("n1")).toBe("gw.test.node.n1.hb")
  })
})
