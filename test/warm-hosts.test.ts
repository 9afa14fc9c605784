// Warm actor processes (AgentOptions.warmHosts, `gradwire start --warm-hosts N`): an agent keeps
// actor processes started with gradwire's worker modules and tfjs loaded, and a spawn takes one
// instead of starting cold (most of a replacement worker's start). The process a spawn took runs
// the actor with the spawn's environment (held to the allow-list as before), names its job and
// actor in its command line as a cold one does in its environment, and the pool fills again; with
// --warm-hosts 0 nothing waits; stopping the agent leaves no warm process behind. Real CLI agents,
// real nats-server, real processes.
import * as os from "node:os"
import type { NatsConnection } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { spawnActor } from "../actors/node/spawn.ts"
import { silentLogger } from "../actors/runtime/log.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { EchoProtocol } from "./support/actors-fixtures.ts"
import { FIXTURES, TestRig, eventually, pidAlive, sleep, type AgentProc } from "./support/actors-processes.ts"
import { mayRaiseTo } from "../core/priority.ts"
import { chrtRuns, SCHED_IDLE, threadNices, threadPolicies } from "./support/nice.ts"
import { standbySchedIdle } from "../core/settings.ts"
import { livePids, procLine, procStatFields } from "../core/proc.ts"

const rig = new TestRig()
afterAll(() => rig.cleanup())

/** A process's command line, its arguments joined by spaces. */
const read = (pid: number, file: "cmdline"): string => procLine(pid, file)

/** The agent's children that still wait as warm processes (their argv says --warm until assigned). */
const warmChildren = (agentPid: number): number[] =>
  livePids().filter((pid) => Number(procStatFields(pid)?.[1]) === agentPid && `${read(pid, "cmdline")} `.includes(" --warm "))

/** The nice values of a process's threads, distinct and sorted. */
const niceValues = (pid: number): number[] => [...new Set(threadNices(pid))].sort((a, b) => a - b)
/** The scheduling policies of a process's threads, distinct and sorted (0 normal, 5 SCHED_IDLE). */
const policies = (pid: number): number[] => [...new Set(threadPolicies(pid))].sort((a, b) => a - b)

describe("warm actor processes", () => {
  let url: string
  let nc: NatsConnection

  beforeAll(async () => {
    url = (await rig.server({ jetstream: false })).url
    nc = await rig.connect(url)
  })

  const driverFor = (cluster: string): ActorSystem => {
    const driver = new ActorSystem({ nc, cluster, job: "warmjob", log: silentLogger })
    rig.onCleanup(() => driver.close())
    return driver
  }

  it("a spawn takes the waiting process, which runs the actor with the spawn's environment; the pool fills again", { timeout: 90_000 }, async () => {
    const agent: AgentProc = await rig.agent("warm", ["--address", url, "--warm-hosts", "1"], { cluster: "warm" })
    const driver = driverFor("warm")
    const first = await eventually("a warm process", 30_000, () => warmChildren(agent.pid)[0])
    const a = await spawnActor(driver, { node: "warm", name: "a", module: FIXTURES, export: "echoActor", env: { GRADWIRE_TEST_ENV: "warm", OMP_NUM_THREADS: "1" } })
    expect(a.pid).toBe(first)
    const me = await driver.askPromise(a.ref(EchoProtocol), "whoami", null)
    expect(me).toMatchObject({ name: "a", pid: first, node: "warm", env: { GRADWIRE_TEST_ENV: "warm", OMP_NUM_THREADS: "1" } })
    // It names its job and actor where ps shows it (a cold start has them in its environment).
    expect(read(first, "cmdline")).toContain("GRADWIRE_JOB=warmjob GRADWIRE_ACTOR=a")
    expect(agent.lines.some((l) => l.includes(`(a pid=${first} node=warm) started (warm): `) && l.includes("actors-fixtures.ts#echoActor"))).toBe(true)
    // Another one waits a few seconds later, and the next spawn takes it.
    const second = await eventually("the pool to fill again", 30_000, () => warmChildren(agent.pid).find((p) => p !== first))
    const b = await spawnActor(driver, { node: "warm", name: "b", module: FIXTURES, export: "echoActor" })
    expect(b.pid).toBe(second)
    expect((await driver.askPromise(b.ref(EchoProtocol), "whoami", null)).env).toEqual({})
    expect(await a.kill()).toBe(true)
    expect(await b.kill()).toBe(true)
    // Stopping the agent stops the warm process that waits by then.
    const third = await eventually("the pool to fill again", 30_000, () => warmChildren(agent.pid).find((p) => p !== first && p !== second))
    agent.child.kill("SIGTERM")
    await agent.exited
    await eventually("the warm process to exit with its agent", 15_000, () => !pidAlive(third))
  })

  it("on a node whose cores are all reserved none waits until a standby was asked for, then a lowered one, which runs at its own priority once taken (a standby's stays lowered)", { timeout: 90_000 }, async () => {
    const agent: AgentProc = await rig.agent("full", ["--address", url, "--warm-hosts", "1", "--num-cpus", "1"], { cluster: "full" })
    const driver = driverFor("full")
    const base = os.getPriority()
    // One actor holds the node's one core.
    const busy = await spawnActor(driver, { node: "full", name: "busy", module: FIXTURES, export: "echoActor", resources: { CPU: 1 } })
    if (!mayRaiseTo(base)) {
      // Lowered or not at all: without a way back to its priority no process waits on a full node.
      await sleep(5_000)
      expect(warmChildren(agent.pid).filter((p) => p !== busy.pid)).toEqual([])
      expect(await busy.kill()).toBe(true)
      return
    }
    // None waits on the full node until a standby worker was asked of the agent (a job lost a worker).
    await sleep(5_000)
    expect(warmChildren(agent.pid).filter((p) => p !== busy.pid)).toEqual([])
    const standby = await spawnActor(driver, { node: "full", name: "standby", module: FIXTURES, export: "echoActor", env: { GRADWIRE_START_NICE: "19" } })
    // Lowered on every thread (the agent lowers its main thread just after the fork: read before
    // that, a process shows its inherited value for a moment), and on SCHED_IDLE where chrt runs.
    const idle = chrtRuns() && standbySchedIdle.read() ? SCHED_IDLE : 0
    const lowered = (p: number): boolean => niceValues(p).join() === "19" && policies(p).join() === String(idle)
    const first = await eventually("a lowered warm process", 30_000, () => warmChildren(agent.pid).find((p) => p !== busy.pid && lowered(p)))
    const a = await spawnActor(driver, { node: "full", name: "a", module: FIXTURES, export: "echoActor" })
    expect(a.pid).toBe(first)
    expect(niceValues(first)).toEqual([base])
    expect(policies(first)).toEqual([0])
    // The next one, taken by a standby worker's spawn, stays lowered (until its worker joins).
    const second = await eventually("the pool to fill again, lowered", 30_000, () => warmChildren(agent.pid).find((p) => p !== first && p !== busy.pid && lowered(p)))
    const b = await spawnActor(driver, { node: "full", name: "b", module: FIXTURES, export: "echoActor", env: { GRADWIRE_START_NICE: "19" } })
    expect(b.pid).toBe(second)
    expect(niceValues(second)).toEqual([19])
    expect(policies(second)).toEqual([idle])
    // The pool fills again beside the standby's start (the lost worker's CPU is free then), not
    // after the spawn's quiet time, when the standby may have joined its group; after the plain
    // spawn it waited for that time.
    const third = await eventually("the pool to fill beside the standby", 30_000, () => warmChildren(agent.pid).find((p) => ![first, second, busy.pid].includes(p)))
    const started = (pid: number): string | undefined => agent.lines.find((l) => l.includes(`warm process ${pid} started`))
    expect(started(third)).toContain("beside a standby worker's start")
    expect(started(second)).toBeDefined()
    expect(started(second)).not.toContain("beside a standby worker's start")
    for (const x of [busy, standby, a, b]) expect(await x.kill()).toBe(true)
  })

  it("with --warm-hosts 0 no process waits and a spawn starts cold", { timeout: 60_000 }, async () => {
    const agent = await rig.agent("cold", ["--address", url, "--warm-hosts", "0"], { cluster: "cold" })
    const driver = driverFor("cold")
    const c = await spawnActor(driver, { node: "cold", name: "c", module: FIXTURES, export: "echoActor", env: { GRADWIRE_TEST_ENV: "cold" } })
    expect((await driver.askPromise(c.ref(EchoProtocol), "whoami", null)).env).toEqual({ GRADWIRE_TEST_ENV: "cold" })
    expect(read(c.pid, "cmdline")).not.toContain("GRADWIRE_JOB=")
    await sleep(500)
    expect(warmChildren(agent.pid)).toEqual([])
    expect(agent.lines.some((l) => l.includes("started (warm)"))).toBe(false)
    expect(await c.kill()).toBe(true)
  })
})
