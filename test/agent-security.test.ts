// What a node agent lets a client do. A head refuses to open its NATS server beyond loopback
// without credentials (unless --insecure). Agents run only gradwire's own actor modules and those
// under --allow-module-root: a spawn of anything else is a typed ModuleNotAllowed naming the
// module and the flag; a train loop is held to the roots when there are any; and a worker imports
// only the loop its spawn declared (so the agent saw it), whatever its args say.
import * as path from "node:path"
import type { NatsConnection } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ModuleNotAllowed } from "../actors/node/errors.ts"
import { listenerRefusal } from "../actors/node/daemon.ts"
import { refuseActorModule, refuseImport, modulePolicy, GRADWIRE_ACTORS_DIR } from "../actors/node/module-policy.ts"
import { spawnActor } from "../actors/node/spawn.ts"
import { defineActor, launchActor } from "../actors/runtime/actor.ts"
import { silentLogger } from "../actors/runtime/log.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { ControllerProtocol, WorkerProtocol, type WorkerArgs } from "../actors/train/train-protocol.ts"
import { freePort } from "../core/nats-server.ts"
import { Trainer, TrainingFailed, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { FIXTURES, ROOT, TestRig } from "./support/actors-processes.ts"

const rig = new TestRig()
afterAll(() => rig.cleanup())

const WORKER_MODULE = path.join(ROOT, "actors", "train", "worker.ts")
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
