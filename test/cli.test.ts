// The gradwire CLI end to end: `start --head` in the background (it starts NATS and an agent and
// returns), `status` as JSON and as a table, refusing a second start, `stop` (agent and its NATS
// server gone, state removed), and clear errors for bad flags and unreachable addresses.
import * as fs from "node:fs"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { freePort } from "../core/nats-server.ts"
import { TestRig, eventually, pidAlive } from "./support/actors-processes.ts"

const rig = new TestRig()

afterAll(() => rig.cleanup())

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
    rig.killAtCleanup(state.pid, state.natsServer.pid)
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

  it("an agent started with --state-dir: start's hints name it, and stop of another state dir says which agents it left running", async () => {
    const own = rig.tempDir("gw-cli-own-")
    const other = rig.tempDir("gw-cli-default-")
    const port = await freePort()
    // (the default state dir, GRADWIRE_STATE_DIR, is another than the agent's)
    const env = { GRADWIRE_STATE_DIR: other }
    const start = await rig.cli(["start", "--head", "--port", String(port), "--cluster", "clidir", "--state-dir", own], env)
    expect(start.code, start.stderr).toBe(0)
    const state = JSON.parse(fs.readFileSync(path.join(own, "agent.json"), "utf8")) as { pid: number; natsServer: { pid: number } }
    rig.killAtCleanup(state.pid, state.natsServer.pid)
    expect(start.stdout).toContain(`status: gradwire status --state-dir ${own}    stop: gradwire stop --state-dir ${own}`)
    const elsewhere = await rig.cli(["stop"], env)
    expect(elsewhere.code).toBe(0)
    expect(elsewhere.stdout).toContain(`no gradwire agent recorded in ${other}; nothing to stop there. Running on this machine with another state dir:`)
    expect(elsewhere.stdout).toContain(`pid ${state.pid} (gradwire stop --state-dir ${own})`)
    expect(pidAlive(state.pid)).toBe(true)
    // status without the state dir: not found at the default address, and says which agents run
    const status = await rig.cli(["status", "--cluster", "clidir"], env)
    expect(status.code).toBe(1)
    expect(status.stderr).toContain(`pid ${state.pid} (gradwire status --state-dir ${own})`)
    expect((await rig.cli(["status", "--cluster", "clidir", "--state-dir", own], env)).code).toBe(0)
    const stop = await rig.cli(["stop", "--state-dir", own], env)
    expect(stop.code).toBe(0)
    expect(pidAlive(state.pid)).toBe(false)
  })

  it("explains bad usage and unreachable addresses", async () => {
    const dir = rig.tempDir("gw-cli-")
    const env = { GRADWIRE_STATE_DIR: dir }
    const bare = await rig.cli(["start"], env)
    expect(bare.code).toBe(2)
    expect(bare.stderr).toContain("start needs --head")
    const badUrl = await rig.cli(["start", "--address", "http://localhost:4222"], env)
    expect(badUrl.code).toBe(2)
    expect(badUrl.stderr).toContain("expected a NATS URL")
    const badFlag = await rig.cli(["status", "--nope"], env)
    expect(badFlag.code).toBe(2)
    expect(badFlag.stderr).toContain("--nope")
    const port = await freePort()
    const unreachable = await rig.cli(["start", "--block", "--address", `nats://127.0.0.1:${port}`, "--backends", "cpu"], env)
    expect(unreachable.code).toBe(1)
    expect(unreachable.stderr).toContain(`cannot reach NATS at nats://127.0.0.1:${port}`)
    expect(unreachable.stderr).toContain("gradwire start --head")
    // A training run that cannot reach its cluster says why (it exited 1 saying nothing but its run directory).
    const train = await rig.cli(["train", "test/support/launch-loop.ts#launchLoop", "--workers", "1", "--address", `nats://127.0.0.1:${port}`, "--storage-path", dir, "--name", "unreached"], env)
    expect(train.code).toBe(1)
    expect(train.stdout + train.stderr).toMatch(new RegExp(`run failed: .*127\\.0\\.0\\.1:${port}`))
    expect(train.stdout + train.stderr).toContain(`run directory: ${path.join(dir, "unreached")}`)
    // A command's --help is its own part: its lines and options, not every command's.
    const trainHelp = await rig.cli(["train", "--help"], env)
    expect(trainHelp.code).toBe(0)
    expect(trainHelp.stdout).toContain("train FILE#EXPORT --workers N")
    expect(trainHelp.stdout).toContain("train options:  --workers N")
    expect(trainHelp.stdout).not.toContain("start options:")
    expect(trainHelp.stdout).toContain("every command and option: gradwire --help")
    const help = await rig.cli(["--help"], env)
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("usage: gradwire")
  })

  it("each command takes only its own options, and says which those are", async () => {
    const dir = rig.tempDir("gw-cli-")
    const env = { GRADWIRE_STATE_DIR: dir }
    const misplaced = await rig.cli(["stop", "--labels", "x=y"], env)
    expect(misplaced.code).toBe(2)
    expect(misplaced.stderr).toContain("gradwire stop does not take --labels (an option of gradwire start)")
    expect(misplaced.stderr).toContain("gradwire stop takes: --state-dir DIR, --timeout SECONDS, --help")
    expect(misplaced.stdout).toBe("")
    const statusHead = await rig.cli(["status", "--head"], env)
    expect(statusHead.code).toBe(2)
    expect(statusHead.stderr).toContain("gradwire status does not take --head (an option of gradwire start)")
    expect(statusHead.stderr).toContain("--json")
    const shared = await rig.cli(["stop", "--state-dir", dir, "--cluster", "x"], env)
    expect(shared.code).toBe(2)
    expect(shared.stderr).toContain("gradwire stop does not take --cluster (an option of gradwire start and gradwire status")
    const unknown = await rig.cli(["start", "--head", "--nope"], env)
    expect(unknown.code).toBe(2)
    expect(unknown.stderr).toContain("gradwire start does not take --nope;")
    // The internal option that hands the background agent its credentials is not advertised.
    expect(unknown.stderr).not.toContain("auth-stdin")
    expect(unknown.stderr).toContain("--allow-module-root DIR")
    const missing = await rig.cli(["stop", "--timeout"], env)
    expect(missing.code).toBe(2)
    expect(missing.stderr).toContain("gradwire stop: Option '--timeout <value>' argument missing")
    // A negative number is an option's value, as the docs write it ("-1 for no limit").
    const negative = await rig.cli(["train", path.join(dir, "none.ts#loop"), "--max-failures", "-1"], env)
    expect(negative.code).toBe(2)
    expect(negative.stderr).not.toContain("ambiguous")
    expect(negative.stderr).toContain("none.ts does not exist")
    // An export the file does not have is said before any cluster or worker starts.
    const noExport = await rig.cli(["train", "test/support/launch-loop.ts#nope", "--workers", "2", "--storage-path", dir], env)
    expect(noExport.code).toBe(2)
    expect(noExport.stderr).toMatch(/export "nope" of .*launch-loop\.ts is not a function; functions it exports: launchLoop/)
    expect(noExport.stdout + noExport.stderr).not.toContain("run directory")
    const fewer = await rig.cli(["train", "test/support/launch-loop.ts#launchLoop", "--workers", "-2"], env)
    expect(fewer.code).toBe(2)
    expect(fewer.stderr).toContain('--workers must be a number >= 1, got "-2"')
    const first = await rig.cli(["--head", "start"], env)
    expect(first.code).toBe(2)
    expect(first.stderr).toContain("the command comes first")
    const nope = await rig.cli(["launch"], env)
    expect(nope.code).toBe(2)
    expect(nope.stderr).toContain('unknown command "launch"; commands: start, status, stop, data')
    // Its own options still work: nothing is running, so stop says so.
    const ok = await rig.cli(["stop", "--state-dir", dir, "--timeout", "3"], env)
    expect(ok.code).toBe(0)
    expect(ok.stdout).toContain("nothing to stop")
  })
})
