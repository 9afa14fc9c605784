// Elastic groups (scalingConfig.numWorkers: { min, max }): the sizing logic on its own (pure), and a
// run on two CLI-started agents of 2 CPUs each that survives kill -9 of one agent by shrinking to
// 2 workers, then grows back to 4 when a new agent joins, finishing every epoch with identical
// weights on every rank. Real nats-server, real agent and worker processes.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs/promises"
import { rmSync, writeFileSync } from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as R from "effect/Result"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { growTo, idle, planLargest, releasingJob } from "../actors/train/driver/elastic.ts"
import { toNodeResources, type NodeAdvertisement } from "../scheduler/node-info.ts"
import { freeResources, usageOfProcesses } from "../scheduler/resources.ts"
import { formatClusterTable, report } from "../actors/node/cluster-status.ts"
import { CLI, waitForAliveNodes } from "./support/actors-processes.ts"
import { nodeAd } from "./support/node-ads.ts"

const ad = (nodeId: string, cpus: number, used: number, processes: Array<{ job: string; cpus: number }>): NodeAdvertisement =>
  nodeAd({
    nodeId,
    cpus,
    used: { cpus: used, memoryBytes: 0, gpuIndices: [], custom: {} },
    processes: processes.map((p, i) => ({
      job: p.job,
      name: `w${i}`,
      instance: `i${i}`,
      pid: 100 + i,
      owner: "driver",
      resources: { CPU: p.cpus },
      gpus: [],
      startedAt: 0
    }))
  })

describe("elastic sizing (pure)", () => {
  const request = { jobId: "mine", backend: "wasm" as const }

  it("places the largest size between min and max that fits, or fails with min's reason", () => {
    const nodes = [ad("a", 2, 0, []), ad("b", 1, 0, [])].map((a) => releasingJob([a], "mine")[0])
    const plan = planLargest(request, { min: 2, max: 4 }, nodes)
    expect(R.isSuccess(plan) && plan.success.ranks.length).toBe(3)
    const none = planLargest(request, { min: 4, max: 6 }, nodes)
    expect(R.isFailure(none) && none.failure.message).toMatch(/4 workers/)
  })

  it("counts the job's own workers as free when deciding whether a running group could grow", () => {
    // Node a runs 2 of our workers (2 CPUs used, by us); node b just joined with 2 free CPUs.
    const ads = [ad("a", 2, 2, [{ job: "mine", cpus: 1 }, { job: "mine", cpus: 1 }]), ad("b", 2, 0, [])]
    expect(growTo(request, 2, 4, releasingJob(ads, "mine"))).toBe(4)
    // Another job's processes are not ours to release.
    const busy = [ad("a", 2, 2, [{ job: "other", cpus: 2 }]), ad("b", 2, 0, [])]
    expect(growTo(request, 2, 4, releasingJob(busy, "mine"))).toBeUndefined()
    // Nothing above the current size: no growth.
    expect(growTo(request, 4, 4, releasingJob(ads, "mine"))).toBeUndefined()
  })

  it("a node's processes that share a GPU: the agent's usage counts their fractions, and the job's own are released for its grow", () => {
    const gpus = [{ index: 0, name: "H200", memoryMiB: 1 }, { index: 1, name: "H200", memoryMiB: 1 }]
    const proc = (job: string, i: number, resources: Record<string, number>, gpu: number[]) => ({ job, name: `w${i}`, instance: `i${i}`, pid: 100 + i, owner: "d", resources, gpus: gpu, startedAt: 0 })
    const processes = [proc("mine", 0, { CPU: 1, GPU: 0.5 }, [0]), proc("other", 1, { CPU: 1, GPU: 0.5 }, [0]), proc("other", 2, { GPU: 1 }, [1]), proc("other", 3, { CPU: 2, licence: 1 }, [])]
    const used = usageOfProcesses(processes)
    expect(used).toEqual({ cpus: 4, memoryBytes: 0, gpuIndices: [1], gpuShares: { "0": 1 }, custom: { licence: 1 } })
    const a = nodeAd({ nodeId: "a", gpus, backends: ["webgpu", "wasm"], used, processes })
    const gpuRequest = { jobId: "mine", numWorkers: 1, useGpu: true, resourcesPerWorker: { GPU: 0.5 } }
    // as the cluster sees it, GPU 0 is full and GPU 1 taken; with our worker released, half of GPU 0 is ours again
    expect(freeResources(toNodeResources(a)).gpuFractions).toEqual([])
    const released = releasingJob([a], "mine")
    expect(freeResources(released[0]!).gpuFractions).toEqual([{ gpu: gpus[0], free: 0.5 }])
    expect(R.isSuccess(planLargest(gpuRequest, { min: 1, max: 1 }, released))).toBe(true)
    expect(R.isFailure(planLargest(gpuRequest, { min: 2, max: 2 }, released))).toBe(true)
    // `gradwire status` counts GPU 1 whole and the shares of GPU 0; fractions are shown rounded
    expect(report(a, "alive", 0).resources.used.GPU).toBe(2)
    const tenths = [proc("x", 4, { GPU: 0.1 }, [0]), proc("x", 5, { GPU: 0.2 }, [0])]
    const b = nodeAd({ nodeId: "b", gpus, backends: ["webgpu", "wasm"], used: usageOfProcesses(tenths), processes: tenths })
    const table = formatClusterTable({ cluster: "c", address: "nats://127.0.0.1:4222", source: "agents", nodes: [report(b, "alive", 0)], totals: { total: {}, used: {} } })
    expect(table).toMatch(/ 0\.3\/2 H200 /)
    // a dead node's last advertisement is not what it holds now: its use and actors are not shown, nor counted
    const gone = formatClusterTable({ cluster: "c", address: "nats://127.0.0.1:4222", source: "head-view", nodes: [report(b, "dead", 0)], totals: { total: {}, used: {} } })
    const row = gone.split("\n").find((l) => l.startsWith("b "))!
    expect(row).toMatch(/^b +dead .* -\/2 H200 /)
    expect(row.split(/ {2,}/)[8]).toBe("-")
  })

  it("idle() drops usage, so a request the cluster could never hold is told apart from a busy cluster", () => {
    const nodes = releasingJob([ad("a", 2, 2, [{ job: "other", cpus: 2 }])], "mine")
    expect(R.isFailure(planLargest(request, { min: 2, max: 2 }, nodes))).toBe(true)
    expect(R.isSuccess(planLargest(request, { min: 2, max: 2 }, idle(nodes)))).toBe(true)
  })
})

describe("an elastic run on two agents", { tags: ["faults"] }, () => {
  let server: NatsServerProcess
  let work: string
  let train: ArrayDataset
  let test: ArrayDataset
  const agents = new Map<string, ChildProcess>()

  const startAgent = (node: string, cluster = "elastic"): ChildProcess => {
    const p = spawn(
      process.execPath,
      [CLI, "start", "--address", server.url, "--cluster", cluster, "--node-id", node, "--num-cpus", "2", "--backends", "wasm,cpu", "--block", "--state-dir", path.join(work, node)],
      { stdio: ["ignore", "ignore", "ignore"] }
    )
    agents.set(node, p)
    return p
  }

  beforeAll(async () => {
    work = await fs.mkdtemp(path.join(os.tmpdir(), "gw-elastic-"))
    ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
    server = await launchNatsServer({ maxPayload: 8 * 1024 * 1024 })
  })
  afterAll(async () => {
    for (const p of agents.values()) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL")
    await server?.stop()
    await fs.rm(work, { recursive: true, force: true })
  })

  /** Resolves once the alive nodes of `cluster` are `nodeIds` (30 s at most, or `ms`). */
  const waitForAlive = (cluster: string, nodeIds: ReadonlyArray<string>, ms?: number): Promise<void> =>
    waitForAliveNodes(server.url, cluster, (alive) => [...alive].sort().join(",") === [...nodeIds].sort().join(","), ms)

  /**
   * How long a test waits for an agent it started mid-run (the group held meanwhile, hold.ts): a
   * fresh agent's start (node, its modules, the backend probe) took over 30 s once in CI beside a
   * type check, and then the run ended short and unresized. The held group has room for it.
   */
  const AGENT_JOIN_MS = 90_000

  /**
   * Waits for the agents `nodeIds` to be the alive ones; if they are not within AGENT_JOIN_MS, takes
   * the hold off (the run then ends unresized) and says so, for the test to fail with that cause.
   */
  const joinedOrWhy = (cluster: string, nodeIds: ReadonlyArray<string>, holdFile: string): Promise<string | undefined> =>
    waitForAlive(cluster, nodeIds, AGENT_JOIN_MS).then(
      () => undefined,
      (e: unknown) => {
        rmSync(holdFile, { force: true })
        return `the alive nodes of ${cluster} were not ${nodeIds.join(", ")} within ${AGENT_JOIN_MS / 1000} s of the new agent's start: ${String(e)}`
      }
    )

  /**
   * Two agents of `cluster` ("<prefix>a", "<prefix>b"), a 7-epoch elastic digits run (12 for a hand-written loop; 2..4 workers):
   * after report 1 agent b is killed (the group shrinks to 2), and once a round ran at 2 a third
   * agent starts (the group grows back to 4). Checks what every such run must show and returns it.
   * From b's death until the group is back at 4, the shrunk group's steps are slowed (the loops'
   * `holdFile`, hold.ts): on a loaded machine an agent can take longer to start than the epochs left.
   */
  const shrinkAndGrow = async (cluster: string, prefix: string, collectiveConfig: Record<string, unknown> = {}, steps = false, recoverFrom?: "checkpoint") => {
    startAgent(`${prefix}a`, cluster)
    startAgent(`${prefix}b`, cluster)
    await waitForAlive(cluster, [`${prefix}a`, `${prefix}b`])
    const holdFile = path.join(work, `${cluster}.hold`)
    const pidDir = await fs.mkdtemp(path.join(work, `${cluster}-pids-`))
    const loop = steps ? path.resolve("test/support/step-loop.ts") + "#stepLoop" : path.resolve("test/support/chaos-loop.ts") + "#trainLoop"
    let joined: Promise<string | undefined> | undefined
    let phase: "full" | "shrunk" | "grown" = "full"
    const r = await new Trainer({
      trainLoopPerWorker: loop,
      // The new agent (a few seconds to start) joins while the shrunk group trains: held, each of
      // the epochs after the kill takes over 5 s at 2 workers (23 steps of 250 ms, 1 s once held
      // 5 s). A hand-written loop grows only at a report() call, and its replacements prepare at
      // the lowest CPU priority: on a loaded CI machine 7 epochs (5 held) were not enough for it.
      trainLoopConfig: { epochs: steps ? 12 : 7, holdFile, ...(steps ? {} : { pidDir }) },
      scalingConfig: { numWorkers: { min: 2, max: 4 }, placementTimeoutMs: 30_000 },
      collectiveConfig,
      runConfig: {
        name: cluster,
        storagePath: work,
        progress: false,
        failureConfig: { maxFailures: 2, ...(recoverFrom ? { recoverFrom } : {}) },
        callbacks: [
          {
            onReport: ({ index, perRank }) => {
              if (phase === "full" && index === 1 && perRank.length === 4) {
                phase = "shrunk"
                writeFileSync(holdFile, "4")
                agents.get(`${prefix}b`)!.kill("SIGKILL")
              } else if (phase === "shrunk" && perRank.length === 2) {
                phase = "grown"
                startAgent(`${prefix}c`, cluster)
                // The hold ends when the group is back at 4, or here when agent c does not come up.
                joined = joinedOrWhy(cluster, [`${prefix}a`, `${prefix}c`], holdFile)
              }
            }
          }
        ]
      },
      datasets: { train, test },
      cluster: { address: server.url, clusterName: cluster }
    })
      .fit()
      .finally(() => rmSync(holdFile, { force: true }))
    expect(await joined).toBeUndefined()
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([
      [4, 2],
      [2, 4]
    ])
    expect(r.resizes[0].reason).toMatch(/lost a node|node-lost|died/)
    // Every epoch trained; the last round ran at full size with one set of weights.
    const epochs = r.metricsHistory.map((m) => m.epoch as number)
    expect(new Set(epochs)).toEqual(new Set(Array.from({ length: steps ? 12 : 7 }, (_, i) => i)))
    const last = r.metricsPerRank.at(-1)!
    expect(last).toHaveLength(4)
    expect(new Set(last.map((m) => m.weights)).size).toBe(1)
    const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as { type: string; recovery?: string; survivors?: number; joiners?: number })
    expect(events.filter((e) => e.type === "resize")).toHaveLength(2)
    return { r, events }
  }

  it("survives kill -9 of one agent by shrinking to 2 workers, and grows back to 4 when a new agent joins", { timeout: 240_000 }, async () => {
    const { r, events } = await shrinkAndGrow("elastic", "")
    // The shrunk rounds ran at world size 2.
    expect(r.metricsPerRank.some((round) => round.length === 2 && round.every((m) => m.world_size === 2))).toBe(true)
    // Both changes kept the running workers (recovery from peers, the default): the two on node a
    // survived the lost node, then two new ones joined the running two.
    expect(events.find((e) => e.type === "restart")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 0 })
    expect(events.find((e) => e.type === "grow")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 2 })
  })

  it("a hand-written trainStep loop shrinks and grows back the same way: the new workers replay it to the running ones", { timeout: 240_000 }, async () => {
    const { r, events } = await shrinkAndGrow("elastic-steps", "s", {}, true)
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.9)
    expect(events.find((e) => e.type === "restart")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 0 })
    expect(events.find((e) => e.type === "grow")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 2, position: { inFit: false } })
    // Grown once: no grow without joiners, no repeated requests.
    expect(events.filter((e) => e.type === "resize-requested")).toHaveLength(1)
  })

  it("a hand-written trainStep loop that started small grows at a report() call, where its next epoch is cut for the grown group", { timeout: 240_000 }, async () => {
    // One agent with room for 2 workers of max 4: the run starts at 2; after the first report a
    // second agent brings room for 4 and the group is held (hold.ts) until it has grown. The
    // running ranks park for the grow inside a report() call (their generation is below its size),
    // so every rank cuts the next epoch for 4.
    const cluster = "elastic-small"
    startAgent("sma", cluster)
    await waitForAlive(cluster, ["sma"])
    const holdFile = path.join(work, `${cluster}.hold`)
    let joined: Promise<string | undefined> | undefined
    const r = await new Trainer({
      trainLoopPerWorker: path.resolve("test/support/step-loop.ts") + "#stepLoop",
      // Batches of 96 (8 steps an epoch at 2 workers): a held epoch ends, and the group can grow
      // at its report() call, within about 8 s of the joiners being ready (23 s with 32); 7 held
      // epochs (about 40 s) for the agent and its workers to come up on a loaded machine.
      trainLoopConfig: { epochs: 8, holdFile, batchSize: 96 },
      scalingConfig: { numWorkers: { min: 2, max: 4 }, placementTimeoutMs: 30_000 },
      runConfig: {
        name: cluster,
        storagePath: work,
        progress: false,
        callbacks: [
          {
            onReport: ({ index }) => {
              if (index !== 0 || joined) return
              writeFileSync(holdFile, "4")
              startAgent("smb", cluster)
              joined = joinedOrWhy(cluster, ["sma", "smb"], holdFile)
            }
          }
        ]
      },
      datasets: { train, test },
      cluster: { address: server.url, clusterName: cluster }
    })
      .fit()
      .finally(() => rmSync(holdFile, { force: true }))
    expect(await joined).toBeUndefined()
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([[2, 4]])
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual(Array.from({ length: 8 }, (_, i) => i))
    const last = r.metricsPerRank.at(-1)!
    expect(last).toHaveLength(4)
    expect(new Set(last.map((m) => m.weights)).size).toBe(1)
    const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
    expect(events.find((e) => e.type === "grow")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 2, position: { inFit: false, stepsSinceReport: 0 } })
    // placed by its report() calls: dp.fit()'s epoch fields, zeros outside it, are left out
    expect(Object.keys(events.find((e) => e.type === "grow")!.position as object)).not.toEqual(expect.arrayContaining(["epoch"]))
  })

  it("with ZeRO stage 2 and recoverFrom \"checkpoint\", shrinks and grows through the checkpoint, re-sharding the optimizer state each time", { timeout: 240_000 }, async () => {
    const { r, events } = await shrinkAndGrow("elastic-zero", "z", { zeroStage: 2 }, false, "checkpoint")
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.9)
    // The last checkpoint holds the full group's four shards; both changes went through the checkpoint.
    expect((await fs.readdir(r.checkpoint!.path)).filter((f) => f.startsWith("optimizer.shard-")).sort()).toEqual([0, 1, 2, 3].map((i) => `optimizer.shard-${i}-of-4.msgpack`))
    expect(events.filter((e) => e.recovery === "peers")).toEqual([])
  })
})
