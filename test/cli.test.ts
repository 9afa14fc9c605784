// The gradwire CLI end to end: `start --head` in the background (it starts NATS and an agent and
// returns), `status` as JSON and as a table, refusing a second start, `stop` (agent and its NATS
// server gone, state removed), and clear errors for bad flags and unreachable addresses.
import * as fs from "node:fs"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { freePort } from "../core/nats-server.ts"
import { TestRig, eventually, pidAlive } from "./support/actors-processes.ts"

const rig = new TestRig()
const started: number[] = []

afterAll(async () => {
  // Whatever a failed test left behind: agents started in the background and their servers.
  for (const pid of started) {
    try {
      process.kill(pid, "SIGKILL")
    } catch {
      // gone
    }
  }
  await rig.cleanup()
})

describe("gradwire CLI", () => {
  it("start --head (background), status --json, status, stop", async () => {
    const dir = rig.tempDir("gw-cli-")
    const port = await freePort()
    const env = { GRADWIRE_STATE_DIR: dir }
    const start = await rig.cli(
      ["start", "--head", "--port", String(port), "--cluster", "clitest", "--node-id", "head-1", "--num-cpus", "3", "--num-gpus", "0", "--labels", "zone=a,tier=spot", "--backends", "wasm,cpu"],
      env
    )
    expect(start.stderr).toBe("")
    expect(start.code).toBe(0)
    expect(start.stdout).toContain("node head-1")
    expect(start.stdout).toContain(`nats://127.0.0.1:${port}`)
    expect(start.stdout).toContain("gradwire start --address")
    const state = JSON.parse(fs.readFileSync(path.join(dir, "agent.json"), "utf8")) as { pid: number; natsServer: { pid: number } }
    started.push(state.pid, state.natsServer.pid)
    expect(pidAlive(state.pid)).toBe(true)
    expect(pidAlive(state.natsServer.pid)).toBe(true)

    const again = await rig.cli(["start", "--head", "--port", String(port)], env)
    expect(again.code).toBe(1)
    expect(again.stderr).toContain("already running")

    // No --address: status finds the local agent's server through the state dir.
    const json = await rig.cli(["status", "--json", "--cluster", "clitest"], env)
    expect(json.code).toBe(0)
    const report = JSON.parse(json.stdout)
    expect(report.source).toBe("head-view")
    expect(report.nodes).toHaveLength(1)
    expect(report.nodes[0]).toMatchObject({
      nodeId: "head-1",
      state: "alive",
      head: true,
      backends: ["wasm", "cpu"],
      labels: { zone: "a", tier: "spot" },
      resources: { total: { CPU: 3, GPU: 0 }, used: { CPU: 0, GPU: 0 } }
    })
    expect(report.totals.total.CPU).toBe(3)

    const table = await rig.cli(["status", "--cluster", "clitest"], env)
    expect(table.code).toBe(0)
    expect(table.stdout).toMatch(/NODE\s+STATE\s+HOST\s+CPU/)
    expect(table.stdout).toMatch(/head-1 \(head\)\s+alive/)
    expect(table.stdout).toContain("zone=a,tier=spot")

    const stop = await rig.cli(["stop"], env)
    expect(stop.code).toBe(0)
    expect(stop.stdout).toContain("stopped the agent (node head-1) and the NATS server it started")
    expect(pidAlive(state.pid)).toBe(false)
    await eventually("the head's NATS server to exit", 10_000, () => !pidAlive(state.natsServer.pid))
    expect(fs.existsSync(path.join(dir, "agent.json"))).toBe(false)
    // The head's JetStream store (checkpoint buckets) lives in the state dir and outlives the stop.
    expect(fs.existsSync(path.join(dir, "jetstream"))).toBe(true)

    const after = await rig.cli(["status", "--address", `nats://127.0.0.1:${port}`], env)
    expect(after.code).toBe(1)
    expect(after.stderr).toContain(`cannot reach NATS at nats://127.0.0.1:${port}`)
    const nothing = await rig.cli(["stop"], env)
    expect(nothing.code).toBe(0)
    expect(nothing.stdout).toContain("nothing to stop")
  })

  it("explains bad usage and unreachable addresses", async () => {
    const dir = rig.tempDir("gw-cli-")
    const env = { GRADWIRE_STATE_DIR: dir }
    const bare = await rig.cli(["start"], env)
    expect(bare.code).toBe(2)
    expect(bare.stderr).toContain("start needs --head")
    const badUrl = await rig.cli(["start", "--address", "localhost"], env)
    expect(badUrl.code).toBe(2)
    expect(badUrl.stderr).toContain("is not a NATS URL")
    const badFlag = await rig.cli(["status", "--nope"], env)
    expect(badFlag.code).toBe(2)
    expect(badFlag.stderr).toContain("--nope")
    const port = await freePort()
    const unreachable = await rig.cli(["start", "--block", "--address", `nats://127.0.0.1:${port}`, "--backends", "cpu"], env)
    expect(unreachable.code).toBe(1)
    expect(unreachable.stderr).toContain(`cannot reach NATS at nats://127.0.0.1:${port}`)
    expect(unreachable.stderr).toContain("gradwire start --head")
    const help = await rig.cli(["--help"], env)
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("usage: gradwire")
  })
})
