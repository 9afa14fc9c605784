// What a node agent lets a client do. A head refuses to open its NATS server beyond loopback
// without credentials (unless --insecure). Agents run only gradwire's own actor modules and those
// under --allow-module-root: a spawn of anything else is a typed ModuleNotAllowed naming the
// module and the flag; a train loop is held to the roots when there are any; and a worker imports
// only the loop its spawn declared (so the agent saw it), whatever its args say. A spawn request
// sets only the environment variables on the agent's allow-list: raw requests with NODE_OPTIONS or
// LD_PRELOAD are a typed EnvNotAllowed and start nothing.
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { nuid, type NatsConnection } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { EnvNotAllowed, ModuleNotAllowed } from "../actors/node/errors.ts"
import { SPAWN_ENV_ALLOWED, refusedSpawnEnv, spawnEnvAllowed } from "../actors/node/env-policy.ts"
import { listenerRefusal } from "../actors/node/daemon.ts"
import { refuseActorModule, refuseImport, modulePolicy, GRADWIRE_ACTORS_DIR } from "../actors/node/module-policy.ts"
import { agentRef, spawnActor } from "../actors/node/spawn.ts"
import { RemoteFailure } from "../actors/runtime/errors.ts"
import { EchoProtocol } from "./support/actors-fixtures.ts"
import { defineActor, launchActor } from "../actors/runtime/actor.ts"
import { silentLogger } from "../actors/runtime/log.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { ControllerProtocol, WorkerProtocol, type WorkerArgs } from "../actors/train/common/train-protocol.ts"
import { freePort } from "../core/nats-server.ts"
import { Trainer, TrainingFailed, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { FIXTURES, ROOT, TestRig, type AgentProc } from "./support/actors-processes.ts"

const rig = new TestRig()
afterAll(() => rig.cleanup())

const WORKER_MODULE = path.join(ROOT, "actors", "train", "worker", "worker.ts")
const DIGITS_LOOP = path.join(ROOT, "examples", "digits", "train.ts")
const OTHER_LOOP = path.join(ROOT, "test", "support", "hetero-loop.ts")

const refusal = async (p: Promise<unknown>): Promise<ModuleNotAllowed> => {
  const e = await p.then(
    () => undefined,
    (x: unknown) => x
  )
  expect(e).toBeInstanceOf(ModuleNotAllowed)
  return e as ModuleNotAllowed
}

describe("a head's listener", () => {
  it("beyond loopback it needs credentials or --insecure", () => {
    expect(listenerRefusal("127.0.0.1", 4222, false, false)).toBeUndefined()
    expect(listenerRefusal("::1", 4222, false, false)).toBeUndefined()
    expect(listenerRefusal("0.0.0.0", 4222, true, false)).toBeUndefined()
    expect(listenerRefusal("0.0.0.0", 4222, false, true)).toBeUndefined()
    expect(listenerRefusal("10.1.2.3", 4222, false, false)).toMatch(/^refusing to listen on 10\.1\.2\.3:4222 without credentials .*--token T or --nkey FILE .*, or --insecure$/)
  })

  it("gradwire start --head --host 0.0.0.0 without credentials refuses in one line, before listening", async () => {
    const port = await freePort()
    const dir = rig.tempDir()
    const r = await rig.cli(["start", "--head", "--block", "--host", "0.0.0.0", "--port", String(port), "--state-dir", dir, "--backends", "cpu"])
    expect(r.code).toBe(1)
    const lines = r.stderr.trim().split("\n")
    expect(lines[0]).toBe(
      `gradwire: refusing to listen on 0.0.0.0:${port} without credentials (anyone who reaches the port could join the cluster and run jobs ` +
        `on its agents): pass --user U --password P, --token T or --nkey FILE (every agent and driver then needs them), or --insecure`
    )
    expect(lines).toHaveLength(1)
    // A creds file cannot be served by the head's own server.
    const jwt = await rig.cli(["start", "--head", "--block", "--port", String(port), "--creds", "/nonexistent.creds", "--state-dir", dir, "--backends", "cpu"])
    expect(jwt.code).toBe(1)
    expect(jwt.stderr).toContain("creds files (JWT) need a server in operator mode")
  })
})

describe("module roots", () => {
  it("policy: gradwire's actors always, roots when given; declared loops free without roots, held to them with", () => {
    const none = modulePolicy([])
    const examples = modulePolicy([path.join(ROOT, "examples")])
    expect(refuseActorModule(none, WORKER_MODULE, ROOT)).toBeUndefined()
    expect(WORKER_MODULE.startsWith(GRADWIRE_ACTORS_DIR)).toBe(true)
    expect(refuseActorModule(none, FIXTURES, ROOT)).toMatch(/outside gradwire's own actors .* allowed module roots \(none given\)/)
    expect(refuseActorModule(examples, "./examples/digits/train.ts", ROOT)).toBeUndefined()
    // ".." cannot climb out of a root.
    expect(refuseActorModule(examples, path.join(ROOT, "examples", "..", "test", "support", "actors-fixtures.ts"), ROOT)).toMatch(/outside/)
    expect(refuseActorModule(none, "data:text/javascript,export default 1", ROOT)).toMatch(/not a module file/)
    expect(refuseImport(none, `file://${OTHER_LOOP}`)).toBeUndefined()
    expect(refuseImport(none, "https://example.com/loop.js")).toMatch(/not a module file/)
    expect(refuseImport(examples, `file://${DIGITS_LOOP}`)).toBeUndefined()
    expect(refuseImport(examples, OTHER_LOOP)).toMatch(/outside/)
    expect(refuseImport(none, "./loop.ts")).toMatch(/relative path/)
  })

  describe("agents as real processes", () => {
    let url: string
    let nc: NatsConnection
    let driver: ActorSystem
    let train: ArrayDataset
    let test: ArrayDataset
    const storage = rig.tempDir("gw-modules-")

    beforeAll(async () => {
      url = (await rig.server()).url
      await rig.agent("strict", ["--address", url], { allowFixtures: false, cluster: "strict" })
      await rig.agent("examples", ["--address", url, "--allow-module-root", path.join(ROOT, "examples")], { allowFixtures: false, cluster: "roots" })
      nc = await rig.connect(url)
      driver = new ActorSystem({ nc, cluster: "strict", job: "modjob", log: silentLogger })
      rig.onCleanup(() => driver.close())
      ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
    })

    it("a spawn outside the roots is a ModuleNotAllowed naming the module and --allow-module-root", async () => {
      const e = await refusal(spawnActor(driver, { node: "strict", name: "w1", module: FIXTURES, export: "echoActor" }))
      expect(e.node).toBe("strict")
      expect(e.module).toBe(FIXTURES)
      expect(e.message).toContain(`node strict refuses to run module ${FIXTURES}`)
      expect(e.message).toContain("--allow-module-root")
      const inline = await refusal(spawnActor(driver, { node: "strict", name: "w2", module: "data:text/javascript,process.exit(7)", export: "x" }))
      expect(inline.message).toContain("not a module file on this node")
      // gradwire's own worker with a declared loop is allowed by default, a loop given as a URL is not.
      const remote = await refusal(spawnActor(driver, { node: "strict", name: "w3", module: WORKER_MODULE, export: "trainWorker", imports: ["https://example.com/loop.js"] }))
      expect(remote.module).toBe("https://example.com/loop.js")
    })

    it("with --allow-module-root: a Trainer job whose loop is under it trains, one whose loop is not fails with ModuleNotAllowed", async () => {
      const job = (name: string, loop: string) =>
        new Trainer({
          trainLoopPerWorker: loop,
          trainLoopConfig: { epochs: 1 },
          scalingConfig: { numWorkers: 2 },
          runConfig: { name, storagePath: storage, progress: false },
          datasets: { train, test },
          cluster: { address: url, clusterName: "roots" }
        }).fit()
      const ok = await job("allowed", `${DIGITS_LOOP}#trainLoop`)
      expect(ok.metricsHistory).toHaveLength(1)
      const refused = await job("refused", `${OTHER_LOOP}#heteroLoop`).then(() => undefined, (e: unknown) => e as TrainingFailed)
      expect(refused).toBeInstanceOf(TrainingFailed)
      expect(refused!.remoteTag).toBe("ModuleNotAllowed")
      expect(refused!.kind).toBe("config")
      expect(refused!.message).toContain(`refuses to run module file://${OTHER_LOOP}`)
      expect(refused!.message).toContain("--allow-module-root")
    })

    it("a worker imports only the loop its spawn declared, whatever its args name", async () => {
      const system = new ActorSystem({ nc, cluster: "roots", job: "swapjob", log: silentLogger })
      rig.onCleanup(() => system.close())
      let failed: { tag: string; message: string } | undefined
      let resolveFailed!: () => void
      const got = new Promise<void>((resolve) => (resolveFailed = resolve))
      const unexpected = (kind: string) => (): never => {
        throw new Error(`the worker sent "${kind}": it should have failed before anything else`)
      }
      await launchActor(
        system,
        defineActor(ControllerProtocol, () => ({
          failed: (r) => {
            failed = r
            resolveFailed()
          },
          report: unexpected("report"),
          dataset: unexpected("dataset"),
          peerState: unexpected("peerState"),
          liveness: unexpected("liveness"),
          checkpoint: unexpected("checkpoint"),
          progress: unexpected("progress"),
          explain: unexpected("explain"),
          trace: unexpected("trace"),
          finished: unexpected("finished")
        })),
        { name: "controller" }
      )
      const args: WorkerArgs = {
        attempt: 0,
        rank: 0,
        worldSize: 1,
        localRank: 0,
        localWorldSize: 1,
        nodeRank: 0,
        nodes: ["examples"],
        controller: "controller",
        loopModule: `file://${OTHER_LOOP}`,
        loopExport: "heteroLoop",
        loopConfig: {},
        group: "g0",
        backend: "cpu",
        collective: { algorithm: "ring", compression: "none", bucketSizeMiB: 25, firstBucketSizeMiB: 1, wireDtype: "float32", timeoutMs: 10_000 },
        seed: 0,
        timeline: false
      }
      // The agent checks the declared import (under its root); the args name another loop.
      const w = await spawnActor(system, { node: "examples", name: "swapped", module: WORKER_MODULE, export: "trainWorker", imports: [`file://${DIGITS_LOOP}`], args })
      await system.askPromise(w.ref(WorkerProtocol), "run", null)
      await got
      expect(failed!.tag).toBe("ModuleNotAllowed")
      expect(failed!.message).toContain(`refuses to run module file://${OTHER_LOOP}: the spawn request did not declare it`)
    })
  })
})

describe("spawn environment", () => {
  it("policy: gradwire's variables and the GPU/thread ones pass; loader, Node and Vulkan driver variables do not", () => {
    for (const ok of ["GRADWIRE_RANK", "GRADWIRE_WORLD_SIZE", "GRADWIRE_LOG", "CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL", "OMP_NUM_THREADS"]) {
      expect(spawnEnvAllowed(ok), ok).toBe(true)
    }
    for (const no of ["NODE_OPTIONS", "LD_PRELOAD", "LD_LIBRARY_PATH", "NODE_PATH", "PATH", "VK_ICD_FILENAMES", "VK_DRIVER_FILES", "GRADWIRE", "gradwire_log", "TF_XLA_FLAGS"]) {
      expect(spawnEnvAllowed(no), no).toBe(false)
    }
    expect(refusedSpawnEnv({ NODE_OPTIONS: "x", GRADWIRE_RANK: "0", LD_PRELOAD: "y" })).toEqual(["LD_PRELOAD", "NODE_OPTIONS"])
    expect(refusedSpawnEnv({ CUDA_VISIBLE_DEVICES: "0", GRADWIRE_RANK: "0", GRADWIRE_WORLD_SIZE: "2" })).toEqual([])
    // The deployment guide's Security section lists the allow-list as it is.
    const guide = fs.readFileSync(path.join(ROOT, "docs", "deployment.md"), "utf8")
    for (const entry of SPAWN_ENV_ALLOWED) expect(guide, entry).toContain(`\`${entry}\``)
  })

  describe("a real agent", () => {
    let nc: NatsConnection
    let driver: ActorSystem
    let agent: AgentProc
    let dir: string
    let marker: string
    let hook: string

    beforeAll(async () => {
      const url = (await rig.server({ jetstream: false })).url
      // It may run the test fixtures: only the environment stands between a request and a process.
      agent = await rig.agent("envs", ["--address", url], { cluster: "envs" })
      nc = await rig.connect(url)
      driver = new ActorSystem({ nc, cluster: "envs", job: "envjob", log: silentLogger })
      rig.onCleanup(() => driver.close())
      dir = rig.tempDir("gw-env-")
      // What NODE_OPTIONS would run in a child that got it: a file that leaves a mark.
      marker = path.join(dir, "hook-ran")
      hook = path.join(dir, "hook.cjs")
      fs.writeFileSync(hook, `require("node:fs").appendFileSync(${JSON.stringify(marker)}, process.pid + "\\n")\n`)
    })

    /** A spawn request as any client of the bus can send it, bypassing spawnActor. */
    const rawSpawn = (name: string, env: Record<string, string>): Promise<unknown> =>
      driver
        .askPromise(
          agentRef(driver, "envs"),
          "spawn",
          { job: driver.job, name, instance: nuid.next(), owner: driver.identity, module: FIXTURES, export: "echoActor", args: null, env, resources: {}, gpus: [] },
          { timeoutMs: 10_000 }
        )
        .then(
          (reply) => reply,
          (e: unknown) => e
        )

    it("raw spawn requests with NODE_OPTIONS or LD_PRELOAD are refused with EnvNotAllowed, and no process starts", async () => {
      // The hook is real: a Node process that gets this NODE_OPTIONS runs it.
      execFileSync(process.execPath, ["-e", ""], { env: { ...process.env, NODE_OPTIONS: `--require ${hook}` } })
      expect(fs.existsSync(marker)).toBe(true)
      fs.rmSync(marker)

      const cases: Array<[string, Record<string, string>, string[]]> = [
        ["node-options", { NODE_OPTIONS: `--require ${hook}` }, ["NODE_OPTIONS"]],
        ["ld-preload", { LD_PRELOAD: path.join(dir, "preload.so") }, ["LD_PRELOAD"]],
        // Allowed variables do not carry the others through.
        ["mixed", { GRADWIRE_RANK: "0", LD_PRELOAD: path.join(dir, "preload.so"), NODE_OPTIONS: `--require ${hook}` }, ["LD_PRELOAD", "NODE_OPTIONS"]]
      ]
      for (const [name, env, refused] of cases) {
        const e = await rawSpawn(name, env)
        expect(e, name).toBeInstanceOf(RemoteFailure)
        const f = e as RemoteFailure
        expect(f.tag).toBe("EnvNotAllowed")
        expect(f.remoteMessage).toContain(`node envs refuses to spawn actor "${name}" with environment variable${refused.length > 1 ? "s" : ""} ${refused.join(", ")}: `)
        expect(f.remoteMessage).toContain(`a spawn request may set only ${SPAWN_ENV_ALLOWED.join(", ")}`)
        expect(f.remoteMessage).toContain("set them in the environment its agent (gradwire start) runs in, which they inherit")
      }
      // Through spawnActor: the typed error, with the variables.
      const typed = await spawnActor(driver, { node: "envs", name: "typed", module: FIXTURES, export: "echoActor", env: { NODE_OPTIONS: `--require ${hook}` } }).then(
        () => undefined,
        (e: unknown) => e
      )
      expect(typed).toBeInstanceOf(EnvNotAllowed)
      expect(typed).toMatchObject({ node: "envs", actor: "typed", variables: ["NODE_OPTIONS"], allowed: [...SPAWN_ENV_ALLOWED] })

      // Nothing started: the agent runs no process and logged no start, and the hook never ran.
      expect(await driver.askPromise(agentRef(driver, "envs"), "list", null)).toEqual([])
      expect(agent.lines.filter((l) => l.includes(" started: "))).toEqual([])
      expect(agent.lines.filter((l) => l.includes("refused to spawn envjob/"))).toHaveLength(4)
      expect(fs.existsSync(marker)).toBe(false)
    })

    it("allowed variables reach the child", async () => {
      const s = await spawnActor(driver, {
        node: "envs",
        name: "allowed",
        module: FIXTURES,
        export: "echoActor",
        env: { GRADWIRE_TEST_ENV: "yes", OMP_NUM_THREADS: "1", CUDA_VISIBLE_DEVICES: "" }
      })
      const me = await driver.askPromise(s.ref(EchoProtocol), "whoami", null)
      expect(me.env).toEqual({ GRADWIRE_TEST_ENV: "yes", OMP_NUM_THREADS: "1", CUDA_VISIBLE_DEVICES: "" })
      expect(await s.kill()).toBe(true)
      expect(fs.existsSync(marker)).toBe(false)
    })
  })
})
