// Auth-enabled NATS (user/password, and token): agents and the actor processes they spawn work
// with the credentials; without them (or with wrong ones) the CLI refuses with a clear error that
// says which flags to pass.
import { afterAll, describe, expect, it } from "vitest"
import { silentLogger } from "../actors/runtime/log.ts"
import { spawnActor } from "../actors/node/spawn.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { EchoProtocol } from "./support/actors-fixtures.ts"
import { FIXTURES, TestRig } from "./support/actors-processes.ts"

const rig = new TestRig()
afterAll(() => rig.cleanup())

describe("auth-enabled NATS", () => {
  it("user/password: works with credentials, refuses without", async () => {
    const server = await rig.server({ auth: { user: "gw", password: "pa55" } })
    await rig.agent("auth-u", ["--address", server.url, "--user", "gw", "--password", "pa55"])
    const nc = await rig.connect(server.url, { user: "gw", pass: "pa55" })
    const driver = new ActorSystem({ nc, cluster: "test", job: "authjob", log: silentLogger })
    rig.onCleanup(() => driver.close())
    // The spawned process connects with the agent's credentials.
    const s = await spawnActor(driver, { node: "auth-u", name: "w", module: FIXTURES, export: "echoActor" })
    expect(await driver.askPromise(s.ref(EchoProtocol), "echo", "authorized")).toBe("authorized")

    const dir = rig.tempDir()
    const none = await rig.cli(["start", "--block", "--address", server.url, "--state-dir", dir, "--backends", "cpu"])
    expect(none.code).toBe(1)
    expect(none.stderr).toContain(`NATS at ${server.url} requires credentials`)
    expect(none.stderr).toContain("--user and --password")
    const wrong = await rig.cli(["start", "--block", "--address", server.url, "--user", "gw", "--password", "nope", "--state-dir", dir])
    expect(wrong.code).toBe(1)
    expect(wrong.stderr).toContain("refused the credentials")
    expect(wrong.stderr.match(/check them/g)).toHaveLength(1)
    const status = await rig.cli(["status", "--address", server.url, "--cluster", "test", "--user", "gw", "--password", "pa55", "--json"])
    expect(status.code).toBe(0)
    expect(JSON.parse(status.stdout).nodes.map((x: { nodeId: string }) => x.nodeId)).toEqual(["auth-u"])
  })

  it("token: works with it, refuses without", async () => {
    const server = await rig.server({ auth: { token: "t0ken" } })
    await rig.agent("auth-t", ["--address", server.url, "--token", "t0ken"])
    const nc = await rig.connect(server.url, { token: "t0ken" })
    const driver = new ActorSystem({ nc, cluster: "test", job: "tokenjob", log: silentLogger })
    rig.onCleanup(() => driver.close())
    const s = await spawnActor(driver, { node: "auth-t", name: "w", module: FIXTURES, export: "echoActor" })
    expect(await driver.askPromise(s.ref(EchoProtocol), "echo", 1)).toBe(1)
    const none = await rig.cli(["status", "--address", server.url, "--cluster", "test"])
    expect(none.code).toBe(1)
    expect(none.stderr).toContain("requires credentials")
    expect(none.stderr).toContain("--token")
    // With the address from the environment (or a local agent's state): the refusal is about the
    // credentials, not "is a head running?".
    const fromEnv = await rig.cli(["status", "--cluster", "test"], { GRADWIRE_ADDRESS: server.url })
    expect(fromEnv.code).toBe(1)
    expect(fromEnv.stderr).toContain("requires credentials")
    expect(fromEnv.stderr).not.toContain("is a head running")
  })
})
