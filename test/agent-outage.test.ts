// Node agents and their NATS, with real processes: a head (`gradwire start --head`) whose
// nats-server is killed with SIGKILL restarts it on the same port with the same JetStream store,
// and says so in its log, its state file and `gradwire status`; an agent joined with --address that
// loses its server logs the outage at once, every 10 s while it lasts and when it ends, never gives
// up, and `gradwire status` shows the outage from the advertisement once NATS is back, or from the
// local agent's state file while NATS cannot be reached.
// @module-tag faults (nats-server kills and outages: `npm run test:faults`, not `npm test`)
import * as fs from "node:fs"
import * as path from "node:path"
import { Objm } from "@nats-io/obj"
import * as Exit from "effect/Exit"
import { afterAll, describe, expect, it } from "vitest"
import { freePort } from "../core/nats-server.ts"
import type { AgentState } from "../actors/node/agent-state.ts"
import { describeLocalAgent, incidentLines, type NodeReport } from "../actors/node/cluster-status.ts"
import { decodeAdvertisement } from "../scheduler/node-info.ts"
import { TestRig, eventually, pidAlive } from "./support/actors-processes.ts"

const rig = new TestRig()

afterAll(() => rig.cleanup())

const readState = (dir: string): AgentState => JSON.parse(fs.readFileSync(path.join(dir, "agent.json"), "utf8")) as AgentState
const readLog = (dir: string): string => fs.readFileSync(path.join(dir, "agent.log"), "utf8")

describe("outages in advertisements and status (pure)", () => {
  const older = {
    v: 1, cluster: "c", nodeId: "old", hostname: "h", pid: 1, head: false, startedAt: 0, sentAt: 0, seq: 1, heartbeatMs: 500,
    cpus: 2, memoryBytes: 1e9, gpus: [], backends: ["cpu"], backendsProbed: true, backendErrors: {},
    nats: { serverId: "s", serverName: "s", url: "nats://127.0.0.1:4222", cluster: "" }, labels: {}, custom: {},
    used: { cpus: 0, memoryBytes: 0, gpuIndices: [], custom: {} }, processes: [], leaving: false, version: "0.0.9"
  }

  it("decodes an older agent's advertisement (no outage fields) and a newer one's, and rejects malformed outage fields", () => {
    const old = decodeAdvertisement(older)
    expect(Exit.isSuccess(old) && old.value.natsOutages).toBeUndefined()
    const now = decodeAdvertisement({ ...older, natsOutages: { count: 2, lastAt: 5, lastMs: 1500 }, natsServer: { pid: 9, url: "nats://127.0.0.1:4222", restarts: 1, lastRestartAt: 7 } })
    expect(Exit.isSuccess(now) && now.value.natsOutages).toEqual({ count: 2, lastAt: 5, lastMs: 1500 })
    expect(Exit.isSuccess(decodeAdvertisement({ ...older, natsOutages: { count: "2" } }))).toBe(false)
  })

  it("says which servers restarted and which agents lost NATS, and nothing for nodes without either", () => {
    const node = (nodeId: string, extra: Partial<NodeReport>): NodeReport => ({ nodeId, ...extra }) as NodeReport
    const at = Date.UTC(2025, 0, 2, 3, 4, 5)
    expect(
      incidentLines([
        node("head", { natsServer: { pid: 42, url: "u", restarts: 2, lastRestartAt: at }, natsOutages: { count: 2, lastAt: at, lastMs: 1234 } }),
        node("quiet", { natsServer: { pid: 43, url: "u", restarts: 0, lastRestartAt: 0 }, natsOutages: { count: 0, lastAt: 0, lastMs: 0 } }),
        node("older", {})
      ])
    ).toEqual([
      "nats-server of head (pid 42) restarted 2 times, last at 2025-01-02T03:04:05.000Z",
      "head lost NATS 2 times, the last at 2025-01-02T03:04:05.000Z for 1.2 s"
    ])
  })

  it("describes a local agent whose pid is gone as not running", () => {
    const text = describeLocalAgent(
      { pid: 2 ** 22 + 12345, nodeId: "n1", cluster: "c", address: "nats://127.0.0.1:4222", head: false, natsServer: null, logFile: null, startedAt: 0 },
      "/x/agent.json"
    )
    expect(text).toContain('the local agent recorded in /x/agent.json (node n1, pid 4206649) is not running')
  })
})

describe("a head's supervised nats-server", () => {
  it("is restarted on the same port with the same JetStream store after kill -9, and the restart shows in the log, the state file and status", async () => {
    const dir = rig.tempDir("gw-head-")
    const port = await freePort()
    // Info lines too ("back on", "NATS back after"): the background agent logs at the level it inherits.
    const env = { GRADWIRE_STATE_DIR: dir, GRADWIRE_LOG: "info" }
    const start = await rig.cli(["start", "--head", "--port", String(port), "--cluster", "sup", "--node-id", "head-1", "--num-cpus", "2", "--backends", "wasm,cpu"], env)
    expect(start.code).toBe(0)
    const first = readState(dir)
    rig.killAtCleanup(first.pid, first.natsServer!.pid)
    const url = `nats://127.0.0.1:${port}`
    expect(first.natsServer!.url).toBe(url)

    // Something in the head's JetStream store: an object, as a checkpoint bucket would hold.
    const nc = await rig.connect(url)
    const store = await new Objm(nc).create("sup-survives")
    await store.putBlob({ name: "weights" }, new Uint8Array([1, 2, 3, 4]))

    process.kill(first.natsServer!.pid, "SIGKILL")
    const after = await eventually("the head to restart its nats-server", 20_000, () => {
      const s = readState(dir)
      return (s.natsServer?.restarts ?? 0) >= 1 && s.natsServer!.pid !== first.natsServer!.pid && pidAlive(s.natsServer!.pid) && s
    })
    rig.killAtCleanup(after.natsServer!.pid)
    expect(pidAlive(first.natsServer!.pid)).toBe(false)
    expect(after.pid).toBe(first.pid)
    expect(after.natsServer).toMatchObject({ url, restarts: 1 })
    expect(after.natsServer!.lastRestartAt!).toBeGreaterThanOrEqual(after.natsServer!.lastExitAt!)

    // Same port, same store: the object written before the kill is still there.
    const blob = await eventually("the object store to answer again", 15_000, async () => {
      try {
        return (await (await new Objm(nc).open("sup-survives")).getBlob("weights")) ?? undefined
      } catch {
        return undefined
      }
    })
    expect([...blob]).toEqual([1, 2, 3, 4])

    const log = await eventually("the agent log to record the restart and the agent's outage", 10_000, () => {
      const text = readLog(dir)
      return /NATS back after/.test(text) && text
    })
    expect(log).toContain(`the NATS server (pid ${first.natsServer!.pid}) exited unexpectedly`)
    expect(log).toContain(`restarting it on 127.0.0.1:${port} with the same JetStream store`)
    expect(log).toContain(`the NATS server is back on 127.0.0.1:${port} (pid ${after.natsServer!.pid})`)
    expect(log).toContain(`lost NATS at 127.0.0.1:${port}`)

    const json = await eventually("status to show the restart", 10_000, async () => {
      const r = await rig.cli(["status", "--json", "--cluster", "sup"], env)
      const report = r.code === 0 ? (JSON.parse(r.stdout) as { nodes: Array<{ nodeId: string; natsServer?: { restarts: number; pid: number } }> }) : undefined
      return report?.nodes[0]?.natsServer?.restarts === 1 && report
    })
    expect(json.nodes[0].natsServer!.pid).toBe(after.natsServer!.pid)
    const table = await rig.cli(["status", "--cluster", "sup"], env)
    expect(table.code).toBe(0)
    expect(table.stdout).toContain(`nats-server of head-1 (pid ${after.natsServer!.pid}) restarted 1 time, last at ${new Date(after.natsServer!.lastRestartAt!).toISOString()}`)
    expect(table.stdout).toMatch(/head-1 lost NATS 1 time, the last at \S+ for \d+\.\d s/)

    await nc.close()
    const stop = await rig.cli(["stop"], env)
    expect(stop.code).toBe(0)
    expect(pidAlive(first.pid)).toBe(false)
    await eventually("the restarted nats-server to exit with its agent", 10_000, () => !pidAlive(after.natsServer!.pid))
  })
})

describe("an agent that loses NATS", () => {
  it("logs it at once, every 10 s while it lasts and when it is back, never gives up, and status shows it", { timeout: 90_000 }, async () => {
    const server = await rig.server()
    const agent = await rig.agent("a1", ["--address", server.url], { cluster: "outage" })
    const env = { GRADWIRE_STATE_DIR: agent.stateDir }
    const host = server.url.replace("nats://", "")
    server.kill("SIGKILL")
    await eventually("the agent to log the outage", 10_000, () => agent.lines.some((l) => l.includes(`lost NATS at ${host}`) && l.includes("retrying")))
    const down = await eventually("the state file to record the outage", 10_000, () => {
      const s = readState(agent.stateDir)
      return s.nats?.up === false && s
    })
    expect(down.nats).toMatchObject({ up: false, server: host, outages: 1 })

    // NATS itself is out of reach: status says what the local agent's state file knows.
    const status = await rig.cli(["status", "--cluster", "outage"], env)
    expect(status.code).toBe(1)
    expect(status.stderr).toContain(`cannot reach NATS at ${server.url}`)
    expect(status.stderr).toContain(`the local agent (node a1, cluster "outage", pid ${agent.pid}) is running`)
    expect(status.stderr).toMatch(new RegExp(`it lost NATS at ${host} \\d+\\.\\d s ago \\(\\S+\\) and keeps retrying`))
    const json = await rig.cli(["status", "--json", "--cluster", "outage"], env)
    expect(json.code).toBe(1)
    const local = JSON.parse(json.stdout) as { reachable: boolean; localAgent: AgentState }
    expect(local.reachable).toBe(false)
    expect(local.localAgent).toMatchObject({ pid: agent.pid, nodeId: "a1", nats: { up: false, outages: 1 } })

    // Every ~10 s while it lasts.
    await eventually("the agent to repeat the notice", 15_000, () => agent.lines.some((l) => /still no NATS at \S+ after 1\d s/.test(l)))
    expect(pidAlive(agent.pid)).toBe(true)

    await server.restart()
    const back = await eventually("the agent to log that NATS is back", 15_000, () => agent.lines.find((l) => /NATS back after \d+\.\d s/.test(l)))
    expect(Number(/after (\d+\.\d) s/.exec(back)![1])).toBeGreaterThanOrEqual(10)
    const up = await eventually("the state file to record the end of the outage", 10_000, () => {
      const s = readState(agent.stateDir)
      return s.nats?.up === true && s
    })
    expect(up.nats!.outages).toBe(1)
    expect(up.nats!.lastOutageMs!).toBeGreaterThanOrEqual(10_000)

    // Back on the bus: status shows the outage from the agent's advertisement.
    const report = await eventually("status to show the outage", 10_000, async () => {
      const r = await rig.cli(["status", "--json", "--cluster", "outage"], env)
      const rep = r.code === 0 ? (JSON.parse(r.stdout) as { nodes: Array<{ natsOutages?: { count: number; lastMs: number } }> }) : undefined
      return rep?.nodes[0]?.natsOutages?.count === 1 && rep
    })
    expect(report.nodes[0].natsOutages!.lastMs).toBeGreaterThanOrEqual(10_000)
    const table = await rig.cli(["status", "--cluster", "outage"], env)
    expect(table.stdout).toMatch(/a1 lost NATS 1 time, the last at \S+ for 1\d\.\d s/)
  })
})
