// Placement over many hand-made cluster shapes: examples for each rule, and property tests that
// every plan respects capacities, the strict strategies' invariants, GPU exclusivity, rank order
// and determinism.
import { describe, expect, it } from "vitest"
import * as fc from "fast-check"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import {
  AllocationLedger,
  PlacementInfeasible,
  placementStrategies,
  planPlacement,
  type PlacementPlan,
  type PlacementRequest,
  type PlacementStrategy
} from "../scheduler/placement.ts"
import { compareNodes, freeResources, type NodeResources, type TfjsBackend } from "../scheduler/resources.ts"
import { findPlacementStrategy, placementStrategyEntries } from "../scheduler/placement-strategies.ts"
import { placementsOf, workerEnv } from "../actors/train/driver/worker-group.ts"
import { PlacementStrategy as PlacementStrategySchema, placementStrategyNames } from "../core/config.ts"

const ALL: TfjsBackend[] = ["tensorflow-gpu", "tensorflow", "wasm", "cpu"]
const GiB = 1024 ** 3

const node = (nodeId: string, o: Partial<NodeResources> & { gpuNames?: string[] } = {}): NodeResources => ({
  nodeId,
  hostname: `host-${nodeId}`,
  cpus: o.cpus ?? 8,
  memoryBytes: o.memoryBytes ?? 32 * GiB,
  gpus: o.gpus ?? (o.gpuNames ?? []).map((name, index) => ({ index, name, memoryMiB: 40960 })),
  backends: o.backends ?? ((o.gpuNames ?? o.gpus ?? []).length > 0 ? ALL : ["tensorflow", "wasm", "cpu"]),
  natsServer: o.natsServer ?? "s1",
  labels: o.labels ?? {},
  custom: o.custom ?? {},
  ...(o.isHead !== undefined ? { isHead: o.isHead } : {}),
  ...(o.used !== undefined ? { used: o.used } : {})
})

const ok = (r: ReturnType<typeof planPlacement>): PlacementPlan => {
  if (Result.isFailure(r)) throw new Error(`expected a plan, got ${r.failure.message}`)
  return r.success
}
const err = (r: ReturnType<typeof planPlacement>) => {
  if (Result.isSuccess(r)) throw new Error(`expected an error, got a plan: ${JSON.stringify(r.success.ranks)}`)
  return r.failure
}
const where = (p: PlacementPlan) => p.ranks.map((r) => `${r.nodeId}:${r.cudaVisibleDevices}`)

describe("placement examples", () => {
  it("puts CPU workers on one node with the best CPU backend and hides GPUs from them", () => {
    const plan = ok(planPlacement({ numWorkers: 4 }, [node("a", { cpus: 4, backends: ["wasm", "cpu", "tensorflow"] })]))
    expect(plan.resourcesPerWorker).toEqual({ CPU: 1 })
    expect(plan.ranks.map((r) => [r.rank, r.localRank, r.localWorldSize, r.nodeRank, r.backend, r.cudaVisibleDevices])).toEqual([
      [0, 0, 4, 0, "tensorflow", ""],
      [1, 1, 4, 0, "tensorflow", ""],
      [2, 2, 4, 0, "tensorflow", ""],
      [3, 3, 4, 0, "tensorflow", ""]
    ])
    expect(plan.nodes).toEqual([{ nodeId: "a", workers: 4, cpus: 4, memoryBytes: 0, gpuIndices: [], custom: {} }])
  })

  it("prefers tensorflow > wasm > cpu per node", () => {
    const nodes = [node("a", { cpus: 1, backends: ["cpu"] }), node("b", { cpus: 1, backends: ["cpu", "wasm"] }), node("c", { cpus: 1, backends: ["wasm", "tensorflow"] })]
    const plan = ok(planPlacement({ numWorkers: 3, placementStrategy: "SPREAD" }, nodes))
    expect(plan.ranks.map((r) => `${r.nodeId}=${r.backend}`)).toEqual(["a=cpu", "b=wasm", "c=tensorflow"])
  })

  it("orders ranks head node first, then by node id, then by GPU index", () => {
    const nodes = [
      node("z", { gpuNames: ["A100", "A100"] }),
      node("m", { gpuNames: ["A100", "A100"], isHead: true }),
      node("b", { gpuNames: ["A100", "A100"] })
    ]
    const plan = ok(planPlacement({ numWorkers: 6, useGpu: true }, nodes))
    expect(where(plan)).toEqual(["m:0", "m:1", "b:0", "b:1", "z:0", "z:1"])
    expect(plan.ranks.map((r) => r.nodeRank)).toEqual([0, 0, 1, 1, 2, 2])
    expect(plan.ranks.every((r) => r.backend === "tensorflow-gpu")).toBe(true)
  })

  it("gives multi-GPU workers contiguous free GPUs", () => {
    const plan = ok(planPlacement({ numWorkers: 2, useGpu: true, resourcesPerWorker: { GPU: 2, CPU: 1 } }, [node("a", { gpuNames: ["H100", "H100", "H100", "H100"] })]))
    expect(plan.ranks.map((r) => r.cudaVisibleDevices)).toEqual(["0,1", "2,3"])
    expect(plan.resourcesPerWorker).toEqual({ GPU: 2, CPU: 1 })
  })

  it("useGpu goes only where tensorflow-gpu loads and a GPU exists", () => {
    const nodes = [node("a", { gpuNames: ["A100", "A100"], backends: ["wasm", "cpu"] }), node("b", { gpuNames: [], backends: ALL }), node("c", { gpuNames: ["T4"] })]
    const plan = ok(planPlacement({ numWorkers: 1, useGpu: true }, nodes))
    expect(where(plan)).toEqual(["c:0"])
    const e = err(planPlacement({ numWorkers: 2, useGpu: true }, nodes))
    expect(e).toBeInstanceOf(PlacementInfeasible)
    expect(e.message).toContain("the 'tensorflow-gpu' backend does not load here")
    expect(e.message).toContain("b [host-b]: CPU 8/8, GPU 0/0")
    expect(e.message).toContain("lower numWorkers to 1")
  })

  it("a CPU backend no node loads says how to get it, and what 'auto' would pick", () => {
    const nodes = [node("a", { cpus: 2, backends: ["wasm", "cpu"] })]
    const e = err(planPlacement({ numWorkers: 2, backend: "tensorflow" }, nodes))
    expect(e).toBeInstanceOf(PlacementInfeasible)
    expect(e.message).toMatch(/needs @tensorflow\/tfjs-node installed where the agent runs.*use backend "auto" \(each node's fastest that loads: here wasm, cpu\)/)
    // a backend some node loads: no such hint
    expect(err(planPlacement({ numWorkers: 3, backend: "wasm" }, nodes)).message).not.toContain("no node loads")
  })

  it("says to set useGpu:false when no node can run GPU workers", () => {
    const e = err(planPlacement({ numWorkers: 2, useGpu: true }, [node("a"), node("b")]))
    expect(e._tag).toBe("PlacementInfeasible")
    expect(e.message).toMatch(/useGpu: false/)
    expect(e.message).toMatch(/tfjs-node-gpu/)
  })

  it("ignores a node's usage and places on what is free", () => {
    const a = node("a", { gpuNames: ["A100", "A100", "A100"], used: { cpus: 7, memoryBytes: 0, gpuIndices: [0, 2], custom: {} } })
    expect(where(ok(planPlacement({ numWorkers: 1, useGpu: true }, [a])))).toEqual(["a:1"])
    const e = err(planPlacement({ numWorkers: 2, useGpu: true }, [a]))
    expect(e.message).toContain("GPU 1/3")
    expect(e.message).toContain("held by running jobs")
    expect(err(planPlacement({ numWorkers: 2 }, [a])).message).toContain("CPU 1/8")
  })

  it("PACK uses the fewest nodes and the smallest node that fits the rest", () => {
    const nodes = [node("big", { cpus: 8 }), node("small", { cpus: 4 }), node("tiny", { cpus: 2 })]
    expect(ok(planPlacement({ numWorkers: 4 }, nodes)).nodes.map((n) => [n.nodeId, n.workers])).toEqual([["small", 4]])
    expect(ok(planPlacement({ numWorkers: 10 }, nodes)).nodes.map((n) => [n.nodeId, n.workers])).toEqual([
      ["big", 8],
      ["tiny", 2]
    ])
    expect(ok(planPlacement({ numWorkers: 13 }, nodes)).nodes.length).toBe(3)
  })

  it("SPREAD spreads evenly, STRICT_SPREAD needs distinct nodes", () => {
    const nodes = [node("a", { cpus: 4 }), node("b", { cpus: 4 }), node("c", { cpus: 4 })]
    expect(ok(planPlacement({ numWorkers: 6, placementStrategy: "SPREAD" }, nodes)).nodes.map((n) => n.workers)).toEqual([2, 2, 2])
    expect(ok(planPlacement({ numWorkers: 3, placementStrategy: "STRICT_SPREAD" }, nodes)).nodes.map((n) => n.workers)).toEqual([1, 1, 1])
    const e = err(planPlacement({ numWorkers: 4, placementStrategy: "STRICT_SPREAD" }, nodes))
    expect(e.message).toContain("STRICT_SPREAD needs 4 distinct nodes, but only 3 can take a worker")
    expect(e.message).toContain('use placementStrategy "SPREAD"')
  })

  it("STRICT_PACK puts everything on one node or fails with a PACK hint", () => {
    const nodes = [node("a", { cpus: 4 }), node("b", { cpus: 6 })]
    expect(ok(planPlacement({ numWorkers: 5, placementStrategy: "STRICT_PACK" }, nodes)).nodes.map((n) => n.nodeId)).toEqual(["b"])
    const e = err(planPlacement({ numWorkers: 8, placementStrategy: "STRICT_PACK" }, nodes))
    expect(e._tag).toBe("PlacementInfeasible")
    if (e._tag === "PlacementInfeasible") expect(e.maxPlaceable).toBe(6)
    expect(e.message).toContain("roomiest node fits 6")
    expect(e.message).toContain('use placementStrategy "PACK"')
  })

  it("acceleratorType matches a GPU-name substring and hands out only those GPUs", () => {
    const nodes = [node("a", { gpuNames: ["NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA A100-SXM4-80GB"] }), node("b", { gpuNames: ["Tesla T4"] })]
    expect(where(ok(planPlacement({ numWorkers: 2, useGpu: true, acceleratorType: "a100" }, nodes)))).toEqual(["a:0", "a:2"])
    const e = err(planPlacement({ numWorkers: 1, useGpu: true, acceleratorType: "H100" }, nodes))
    expect(e.message).toContain('no GPU matching "H100"')
    expect(e.message).toContain("drop acceleratorType or use one the cluster has (NVIDIA A100-SXM4-80GB, Tesla T4)")
  })

  it("label selectors: equality, negation, in(), arrays", () => {
    const nodes = [node("a", { labels: { zone: "a", tier: "spot" } }), node("b", { labels: { zone: "b" } }), node("c", { labels: { zone: "c", tier: "ondemand" } })]
    const on = (sel: PlacementRequest["nodeLabels"]) =>
      ok(planPlacement({ numWorkers: 1, placementStrategy: "SPREAD", nodeLabels: sel }, nodes.map((n) => ({ ...n, cpus: 1 })))).ranks[0]!.nodeId
    expect(on({ zone: "b" })).toBe("b")
    expect(on({ tier: "!spot", zone: "!b" })).toBe("c")
    expect(on({ zone: "in(c, b)", tier: "ondemand" })).toBe("c")
    expect(on({ zone: ["b"] })).toBe("b")
    expect(on({ tier: "!in(spot,ondemand)" })).toBe("b")
    const e = err(planPlacement({ numWorkers: 1, nodeLabels: { zone: "x" } }, nodes))
    expect(e.message).toContain("label selector zone=x does not match (zone=a)")
    expect(e.message).toContain("relax the selector")
  })

  it("custom resources and memory are capacities too", () => {
    const nodes = [node("a", { custom: { licence: 2 }, memoryBytes: 10 * GiB }), node("b", { memoryBytes: 64 * GiB })]
    const plan = ok(planPlacement({ numWorkers: 2, resourcesPerWorker: { CPU: 1, licence: 1 } }, nodes))
    expect(plan.nodes).toEqual([{ nodeId: "a", workers: 2, cpus: 2, memoryBytes: 0, gpuIndices: [], custom: { licence: 2 } }])
    const e = err(planPlacement({ numWorkers: 3, resourcesPerWorker: { licence: 1 } }, nodes))
    expect(e.message).toContain('b [host-b]')
    expect(e.message).toContain('no resource "licence"')
    expect(err(planPlacement({ numWorkers: 1, resourcesPerWorker: { fpga: 1 } }, nodes)).message).toContain('no node advertises the custom resource "fpga"')
    const mem = ok(planPlacement({ numWorkers: 3, resourcesPerWorker: { CPU: 1, memory: 16 * GiB } }, nodes))
    expect(mem.nodes.map((n) => [n.nodeId, n.workers, n.memoryBytes])).toEqual([["b", 3, 48 * GiB]])
    expect(err(planPlacement({ numWorkers: 5, resourcesPerWorker: { memory: 16 * GiB } }, nodes)).message).toContain("memory: 10 GiB free < 16 GiB per worker")
  })

  it("rejects bad requests with a ConfigError naming the field", () => {
    const nodes = [node("a")]
    const cases: [PlacementRequest, string][] = [
      [{ numWorkers: 0 }, "scalingConfig.numWorkers"],
      [{ numWorkers: 1.5 }, "scalingConfig.numWorkers"],
      [{ numWorkers: 1, useGpu: true, resourcesPerWorker: { GPU: 1.5 } }, "scalingConfig.resourcesPerWorker.GPU"],
      [{ numWorkers: 1, useGpu: true, resourcesPerWorker: { GPU: 0 } }, "scalingConfig.resourcesPerWorker.GPU"],
      [{ numWorkers: 1, resourcesPerWorker: { GPU: 1 } }, "scalingConfig.resourcesPerWorker.GPU"],
      [{ numWorkers: 1, resourcesPerWorker: { CPU: -1 } }, "scalingConfig.resourcesPerWorker.CPU"],
      [{ numWorkers: 1, placementStrategy: "BEST" as PlacementStrategy }, "scalingConfig.placementStrategy"],
      [{ numWorkers: 1, useGpu: true, backend: "wasm" }, "scalingConfig.backend"],
      [{ numWorkers: 1, nodeLabels: { zone: [] } }, "nodeLabels.zone"]
    ]
    for (const [req, field] of cases) {
      const e = err(planPlacement(req, nodes))
      expect(e._tag).toBe("ConfigError")
      if (e._tag === "ConfigError") expect(e.field).toBe(field)
    }
    expect(err(planPlacement({ numWorkers: 1 }, [node("a"), node("a")]))._tag).toBe("ConfigError")
  })

  it("a fraction of a GPU per worker packs workers onto shared GPUs, which whole-GPU requests then leave alone", () => {
    const nodes = [node("a", { gpuNames: ["H200", "H200"] })]
    const plan = ok(planPlacement({ numWorkers: 3, useGpu: true, resourcesPerWorker: { GPU: 0.5 } }, nodes))
    expect(where(plan)).toEqual(["a:0", "a:0", "a:1"])
    expect(plan.ranks.map((r) => r.gpuIndices)).toEqual([[0], [0], [1]])
    expect(plan.nodes[0]).toMatchObject({ gpuIndices: [], gpuShares: { "0": 1, "1": 0.5 } })
    // five halves do not fit in two GPUs; workers of 0.3 of a GPU fill what each GPU has left (3 on the free one, 1 on the half-shared one)
    const e = err(planPlacement({ numWorkers: 5, useGpu: true, resourcesPerWorker: { GPU: 0.5 } }, nodes))
    expect(e._tag === "PlacementInfeasible" && e.maxPlaceable).toBe(4)
    const half = node("a", { gpuNames: ["H200", "H200"], used: { cpus: 0, memoryBytes: 0, gpuIndices: [], gpuShares: { "1": 0.5 }, custom: {} } })
    expect(where(ok(planPlacement({ numWorkers: 4, useGpu: true, resourcesPerWorker: { GPU: 0.3 } }, [half])))).toEqual(["a:0", "a:0", "a:0", "a:1"])
    // a shared GPU is not free for a worker that wants a whole one
    expect(where(ok(planPlacement({ numWorkers: 1, useGpu: true }, [half])))).toEqual(["a:0"])
    const none = err(planPlacement({ numWorkers: 2, useGpu: true }, [half]))
    expect(none._tag === "PlacementInfeasible" && none.maxPlaceable).toBe(1)
    // the same through the ledger: two jobs of halves share GPU 0, then a whole-GPU job takes GPU 1
    const ledger = new AllocationLedger()
    expect(where(Result.getOrThrow(ledger.place({ jobId: "p", numWorkers: 1, useGpu: true, resourcesPerWorker: { GPU: 0.5 } }, nodes)))).toEqual(["a:0"])
    expect(where(Result.getOrThrow(ledger.place({ jobId: "q", numWorkers: 1, useGpu: true, resourcesPerWorker: { GPU: 0.5 } }, nodes)))).toEqual(["a:0"])
    expect(ledger.usage("a").gpuShares).toEqual({ "0": 1 })
    expect(where(Result.getOrThrow(ledger.place({ jobId: "r", numWorkers: 1, useGpu: true }, nodes)))).toEqual(["a:1"])
    const full = ledger.place({ jobId: "s", numWorkers: 1, useGpu: true, resourcesPerWorker: { GPU: 0.25 } }, nodes)
    expect(Result.isFailure(full) && full.failure._tag).toBe("PlacementInfeasible")
    // a plan made before the others were booked: GPU 0's share is taken
    const stale = Result.getOrThrow(planPlacement({ jobId: "t", numWorkers: 1, useGpu: true, resourcesPerWorker: { GPU: 0.5 } }, nodes))
    const clash = ledger.allocate(stale)
    expect(Result.isFailure(clash) && clash.failure.message).toContain("GPU 0 already held by another job")
  })

  it("a worker that shares its GPU starts with TensorFlow's GPU memory growth on; one with a whole GPU or none does not", () => {
    const nodes = [node("a", { gpuNames: ["H200", "H200"] })]
    const envOf = (req: PlacementRequest) => placementsOf(ok(planPlacement(req, nodes)), 0).map((r) => workerEnv(r, false))
    expect(envOf({ numWorkers: 2, useGpu: true, resourcesPerWorker: { GPU: 0.5 } })).toEqual([
      { CUDA_VISIBLE_DEVICES: "0", GRADWIRE_RANK: "0", GRADWIRE_WORLD_SIZE: "2", TF_FORCE_GPU_ALLOW_GROWTH: "true" },
      { CUDA_VISIBLE_DEVICES: "0", GRADWIRE_RANK: "1", GRADWIRE_WORLD_SIZE: "2", TF_FORCE_GPU_ALLOW_GROWTH: "true" }
    ])
    for (const req of [{ numWorkers: 2, useGpu: true }, { numWorkers: 2 }] as PlacementRequest[]) {
      for (const env of envOf(req)) expect(env).not.toHaveProperty("TF_FORCE_GPU_ALLOW_GROWTH")
    }
  })

  it("useGpu with only CPU in resourcesPerWorker still asks for one GPU (Ray's default)", () => {
    const plan = ok(planPlacement({ numWorkers: 1, useGpu: true, resourcesPerWorker: { CPU: 2 } }, [node("a", { gpuNames: ["A100"] })]))
    expect(plan.resourcesPerWorker).toEqual({ CPU: 2, GPU: 1 })
  })

  it("an empty cluster says how to start an agent", () => {
    expect(err(planPlacement({ numWorkers: 1 }, [])).message).toContain("gradwire start --head")
  })
})

describe('useGpu "auto": GPU workers where a node offers a GPU, CPU workers elsewhere', () => {
  it("gives a GPU node's workers a GPU and its GPU backend, and a CPU node's workers a CPU and its CPU backend", () => {
    const nodes = [node("g", { cpus: 8, gpuNames: ["A10", "A10"] }), node("c", { cpus: 4, backends: ["wasm", "cpu"] })]
    const plan = ok(planPlacement({ numWorkers: 4, useGpu: "auto", placementStrategy: "SPREAD" }, nodes))
    expect(plan.useGpu).toBe("auto")
    expect(plan.ranks.map((r) => [r.nodeId, r.backend, r.cudaVisibleDevices, r.resources])).toEqual([
      ["c", "wasm", "", { CPU: 1 }],
      ["c", "wasm", "", { CPU: 1 }],
      ["g", "tensorflow-gpu", "0", { GPU: 1 }],
      ["g", "tensorflow-gpu", "1", { GPU: 1 }]
    ])
    expect(plan.nodes).toEqual([
      { nodeId: "c", workers: 2, cpus: 2, memoryBytes: 0, gpuIndices: [], custom: {} },
      { nodeId: "g", workers: 2, cpus: 0, memoryBytes: 0, gpuIndices: [0, 1], custom: {} }
    ])
  })

  it("a GPU node whose GPUs are all taken, or with no GPU backend, takes CPU workers", () => {
    const busy = node("g", { cpus: 2, gpuNames: ["A10"], used: { cpus: 0, memoryBytes: 0, gpuIndices: [0], custom: {} } })
    const noBackend = node("h", { cpus: 2, gpuNames: ["A10"], backends: ["wasm", "cpu"] })
    const plan = ok(planPlacement({ numWorkers: 4, useGpu: "auto" }, [busy, noBackend]))
    expect(plan.ranks.map((r) => `${r.nodeId}=${r.backend}:${JSON.stringify(r.resources)}`)).toEqual([
      'g=tensorflow:{"CPU":1}',
      'g=tensorflow:{"CPU":1}',
      'h=wasm:{"CPU":1}',
      'h=wasm:{"CPU":1}'
    ])
  })

  it("sizes the workers itself and picks the backend per node: resourcesPerWorker or a named backend is a ConfigError", () => {
    const nodes = [node("g", { gpuNames: ["A10"] })]
    expect(err(planPlacement({ numWorkers: 1, useGpu: "auto", resourcesPerWorker: { CPU: 2 } }, nodes)).message).toMatch(/useGpu "auto" sizes each worker itself/)
    expect(err(planPlacement({ numWorkers: 1, useGpu: "auto", backend: "wasm" }, nodes)).message).toMatch(/useGpu "auto" picks each node's backend/)
  })

  it("says so in an infeasible request", () => {
    const e = err(planPlacement({ numWorkers: 9, useGpu: "auto" }, [node("c", { cpus: 2, backends: ["wasm"] })]))
    expect(e.message).toMatch(/useGpu auto/)
  })
})

describe("allocation ledger", () => {
  it("keeps concurrent jobs off each other's GPUs and frees them on release", () => {
    const nodes = [node("a", { gpuNames: ["A100", "A100"] }), node("b", { gpuNames: ["A100", "A100"] })]
    const ledger = new AllocationLedger()
    const j1 = Result.getOrThrow(ledger.place({ jobId: "j1", numWorkers: 3, useGpu: true }, nodes))
    expect(where(j1)).toEqual(["a:0", "a:1", "b:0"])
    const j2 = Result.getOrThrow(ledger.place({ jobId: "j2", numWorkers: 1, useGpu: true }, nodes))
    expect(where(j2)).toEqual(["b:1"])
    const full = ledger.place({ jobId: "j3", numWorkers: 1, useGpu: true }, nodes)
    expect(Result.isFailure(full) && full.failure._tag).toBe("PlacementInfeasible")
    expect(ledger.usage("b").gpuIndices).toEqual([0, 1])
    expect(ledger.release("j1")).toBe(true)
    expect(ledger.release("j1")).toBe(false)
    expect(ledger.jobs()).toEqual(["j2"])
    const j3 = Result.getOrThrow(ledger.place({ jobId: "j3", numWorkers: 3, useGpu: true }, nodes))
    expect(where(j3)).toEqual(["a:0", "a:1", "b:0"])
  })

  it("refuses a stale plan, a GPU held twice and a duplicate job id, booking nothing", () => {
    const nodes = [node("a", { cpus: 4, gpuNames: ["A100", "A100"] })]
    const ledger = new AllocationLedger()
    const p1 = Result.getOrThrow(planPlacement({ jobId: "x", numWorkers: 2, useGpu: true, resourcesPerWorker: { GPU: 1, CPU: 1 } }, nodes))
    const p2 = Result.getOrThrow(planPlacement({ jobId: "y", numWorkers: 1, useGpu: true }, nodes))
    expect(Result.isSuccess(ledger.allocate(p1, nodes))).toBe(true)
    const clash = ledger.allocate(p2)
    expect(Result.isFailure(clash) && clash.failure.message).toContain("GPU 0 already held by another job")
    expect(ledger.jobs()).toEqual(["x"])
    const cpuHeavy = Result.getOrThrow(planPlacement({ jobId: "z", numWorkers: 3 }, nodes))
    const over = ledger.allocate(cpuHeavy, nodes)
    expect(Result.isFailure(over) && over.failure.message).toContain("CPU 3 > 2 free")
    const dup = ledger.allocate(p1)
    expect(Result.isFailure(dup) && dup.failure._tag).toBe("AllocationConflict")
    const gone = ledger.allocate(Result.getOrThrow(planPlacement({ jobId: "w", numWorkers: 1 }, [node("q")])), nodes)
    expect(Result.isFailure(gone) && gone.failure.message).toContain("not in the cluster view")
  })
})

// ---- property tests -------------------------------------------------------------------------

const gpuName = fc.constantFrom("NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "Tesla T4")
const arbNode = (id: string) =>
  fc
    .record({
      cpus: fc.constantFrom(0, 0.5, 1, 2, 3, 4, 8, 8, 16, 16),
      memGiB: fc.integer({ min: 0, max: 64 }),
      gpus: fc.array(gpuName, { maxLength: 4 }),
      // Mostly capable nodes, so that plenty of requests succeed and their plans get checked.
      backends: fc.oneof({ weight: 3, arbitrary: fc.constant(ALL) }, { weight: 1, arbitrary: fc.subarray(ALL) }),
      zone: fc.constantFrom("a", "a", "b", undefined),
      licence: fc.option(fc.integer({ min: 0, max: 3 }), { nil: undefined }),
      usedCpus: fc.constantFrom(0, 0, 1, 2.5),
      usedGpuMask: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 15 })),
      // GPUs (not taken whole) of which another job's workers share a part
      sharedGpuMask: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 15 })),
      sharedPart: fc.constantFrom(0.25, 0.5, 0.7),
      server: fc.constantFrom("s1", "s2"),
      head: fc.boolean()
    })
    .map(
      (r): NodeResources => ({
        nodeId: id,
        hostname: `h-${id}`,
        cpus: r.cpus,
        memoryBytes: r.memGiB * GiB,
        gpus: r.gpus.map((name, index) => ({ index, name, memoryMiB: 40960 })),
        backends: r.backends,
        natsServer: r.server,
        labels: r.zone ? { zone: r.zone } : {},
        custom: r.licence !== undefined ? { licence: r.licence } : {},
        isHead: r.head,
        used: {
          cpus: r.usedCpus,
          memoryBytes: 0,
          gpuIndices: [0, 1, 2, 3].filter((i) => (r.usedGpuMask >> i) & 1),
          gpuShares: Object.fromEntries([0, 1, 2, 3].filter((i) => (r.sharedGpuMask >> i) & 1 && !((r.usedGpuMask >> i) & 1)).map((i) => [String(i), r.sharedPart])),
          custom: {}
        }
      })
    )

const arbCluster = fc
  .integer({ min: 0, max: 7 })
  .chain((n) => fc.tuple(...Array.from({ length: n }, (_, i) => arbNode(`n${i}`))))
  // At most one head, as a real cluster has.
  .map((nodes) => {
    const head = nodes.findIndex((n) => n.isHead)
    return nodes.map((n, i) => ({ ...n, isHead: i === head }))
  })

const arbRequest: fc.Arbitrary<PlacementRequest> = fc
  .record({
    numWorkers: fc.oneof(fc.integer({ min: 1, max: 4 }), fc.integer({ min: 1, max: 12 })),
    useGpu: fc.boolean(),
    strategy: fc.constantFrom<PlacementStrategy>(...placementStrategies),
    shape: fc.constantFrom("default", "default", "cpu2", "halfcpu", "mem", "licence", "gpu2", "gpuhalf", "gputhird"),
    accel: fc.constantFrom(undefined, undefined, undefined, "A100", "h100"),
    zone: fc.constantFrom(undefined, undefined, "a", "!b")
  })
  .map((r) => {
    const res: Record<string, number> | undefined =
      r.shape === "default"
        ? undefined
        : r.shape === "cpu2"
          ? { CPU: 2, ...(r.useGpu ? { GPU: 1 } : {}) }
          : r.shape === "halfcpu"
            ? { CPU: 0.5, ...(r.useGpu ? { GPU: 1 } : {}) }
            : r.shape === "mem"
              ? { CPU: 1, memory: 8 * GiB, ...(r.useGpu ? { GPU: 1 } : {}) }
              : r.shape === "licence"
                ? { CPU: 1, licence: 1, ...(r.useGpu ? { GPU: 1 } : {}) }
                : r.shape === "gpuhalf" || r.shape === "gputhird"
                  ? r.useGpu
                    ? { GPU: r.shape === "gpuhalf" ? 0.5 : 0.3 }
                    : { CPU: 1 }
                  : r.useGpu
                    ? { GPU: 2 }
                    : { CPU: 1 }
    return {
      jobId: "job",
      numWorkers: r.numWorkers,
      useGpu: r.useGpu,
      placementStrategy: r.strategy,
      ...(res ? { resourcesPerWorker: res } : {}),
      ...(r.accel ? { acceleratorType: r.accel } : {}),
      ...(r.zone ? { nodeLabels: { zone: r.zone } } : {})
    }
  })

/** Independent re-statement of "how many workers fit on this node", for completeness checks. */
const capacityOf = (n: NodeResources, req: PlacementRequest, res: Record<string, number>): number => {
  const free = freeResources(n)
  if (req.useGpu ? !(n.backends.includes("tensorflow-gpu") && n.gpus.length > 0) : !n.backends.some((b) => b !== "tensorflow-gpu")) return 0
  const sel = req.nodeLabels?.zone as string | undefined
  if (sel !== undefined && (sel.startsWith("!") ? n.labels.zone === sel.slice(1) : n.labels.zone !== sel)) return 0
  const acc = req.acceleratorType?.toLowerCase()
  if (acc && !n.gpus.some((g) => g.name.toLowerCase().includes(acc))) return 0
  const gpus = free.gpus.filter((g) => !acc || g.name.toLowerCase().includes(acc)).length
  let cap = Infinity
  for (const [k, v] of Object.entries(res)) {
    if (k === "GPU" && v < 1) {
      // a fraction: what each GPU not taken whole has left, workers never across two
      const taken = new Set(n.used?.gpuIndices ?? [])
      const left = n.gpus.filter((g) => !taken.has(g.index) && (!acc || g.name.toLowerCase().includes(acc))).map((g) => 1 - (n.used?.gpuShares?.[String(g.index)] ?? 0))
      cap = Math.min(cap, left.reduce((s, f) => s + Math.floor(f / v + 1e-9), 0))
      continue
    }
    const have = k === "CPU" ? free.cpus : k === "GPU" ? gpus : k === "memory" ? free.memoryBytes : k in n.custom ? (free.custom[k] ?? 0) : -1
    cap = Math.min(cap, have < 0 ? 0 : Math.floor(have / v + 1e-9))
  }
  return cap
}

const checkPlan = (plan: PlacementPlan, req: PlacementRequest, nodes: readonly NodeResources[]) => {
  const byId = new Map(nodes.map((n) => [n.nodeId, n]))
  const res = plan.resourcesPerWorker
  const gpuPer = res.GPU ?? 0
  expect(plan.ranks.length).toBe(req.numWorkers)
  plan.ranks.forEach((r, i) => expect(r.rank).toBe(i))
  // Capacities: per node, what the plan takes fits in what was free.
  for (const a of plan.nodes) {
    const n = byId.get(a.nodeId)!
    const free = freeResources(n)
    expect(a.cpus).toBeLessThanOrEqual(free.cpus + 1e-9)
    expect(a.memoryBytes).toBeLessThanOrEqual(free.memoryBytes + 1e-9)
    for (const [k, v] of Object.entries(a.custom)) expect(v).toBeLessThanOrEqual((free.custom[k] ?? 0) + 1e-9)
    expect(new Set(a.gpuIndices).size).toBe(a.gpuIndices.length)
    const freeIdx = new Set(free.gpus.map((g) => g.index))
    for (const g of a.gpuIndices) expect(freeIdx.has(g)).toBe(true)
    if (gpuPer > 0 && gpuPer < 1) {
      // shared GPUs: no GPU given past what it had left, the shares adding up to the workers'
      expect(a.gpuIndices).toEqual([])
      const left = new Map(free.gpuFractions.map((f) => [f.gpu.index, f.free]))
      for (const [g, v] of Object.entries(a.gpuShares ?? {})) expect(v).toBeLessThanOrEqual((left.get(Number(g)) ?? 0) + 1e-9)
      expect(Object.values(a.gpuShares ?? {}).reduce((s, v) => s + v, 0)).toBeCloseTo(a.workers * gpuPer, 9)
    } else expect(a.gpuIndices.length).toBe(a.workers * gpuPer)
  }
  for (const r of plan.ranks) {
    const n = byId.get(r.nodeId)!
    expect(r.gpuIndices.length).toBe(Math.ceil(gpuPer))
    expect(r.cudaVisibleDevices).toBe(r.gpuIndices.join(","))
    if (req.acceleratorType) {
      for (const g of r.gpuIndices) expect(n.gpus.find((x) => x.index === g)!.name.toLowerCase()).toContain(req.acceleratorType.toLowerCase())
    }
    if (req.useGpu) expect(r.backend).toBe("tensorflow-gpu")
    else expect(r.backend).toBe((["tensorflow", "wasm", "cpu"] as const).find((b) => n.backends.includes(b)))
    expect(n.backends).toContain(r.backend)
  }
  // Strategy invariants.
  const used = [...new Set(plan.ranks.map((r) => r.nodeId))]
  if (req.placementStrategy === "STRICT_PACK") expect(used.length).toBe(1)
  if (req.placementStrategy === "STRICT_SPREAD") expect(used.length).toBe(req.numWorkers)
  if (req.placementStrategy === "PACK") {
    // Fewest nodes: no smaller set of nodes has room for everyone.
    const caps = nodes.map((n) => capacityOf(n, req, { ...res })).sort((a, b) => b - a)
    let k = 0
    for (let s = 0; s < req.numWorkers; k++) s += caps[k]!
    expect(used.length).toBe(k)
  }
  if (req.placementStrategy === "SPREAD") {
    // As many nodes as possible, and evenly: a node below its capacity has at most one worker
    // fewer than the busiest node.
    const caps = new Map(nodes.map((n) => [n.nodeId, capacityOf(n, req, { ...res })]))
    const eligible = [...caps.values()].filter((c) => c > 0).length
    expect(used.length).toBe(Math.min(req.numWorkers, eligible))
    const counts = new Map(plan.nodes.map((a) => [a.nodeId, a.workers]))
    const busiest = Math.max(...counts.values())
    for (const [id, cap] of caps) if (cap > 0 && (counts.get(id) ?? 0) < cap) expect(counts.get(id) ?? 0).toBeGreaterThanOrEqual(busiest - 1)
  }
  // Rank order: nodes in canonical order, then GPU index; local ranks count up within a node.
  const order = [...used].map((id) => byId.get(id)!)
  expect([...order].sort(compareNodes).map((n) => n.nodeId)).toEqual(used)
  plan.ranks.forEach((r, i) => {
    expect(r.nodeRank).toBe(used.indexOf(r.nodeId))
    const mates = plan.ranks.filter((x) => x.nodeId === r.nodeId)
    expect(r.localWorldSize).toBe(mates.length)
    expect(r.localRank).toBe(mates.indexOf(r))
    if (i > 0 && plan.ranks[i - 1]!.nodeId === r.nodeId && gpuPer >= 1) {
      expect(r.gpuIndices[0]!).toBeGreaterThan(plan.ranks[i - 1]!.gpuIndices[gpuPer - 1]!)
    }
    // workers sharing GPUs fill them in index order
    if (i > 0 && plan.ranks[i - 1]!.nodeId === r.nodeId && gpuPer > 0 && gpuPer < 1) expect(r.gpuIndices[0]!).toBeGreaterThanOrEqual(plan.ranks[i - 1]!.gpuIndices[0]!)
  })
}

describe("placement properties", () => {
  it("every plan respects capacities, strategies, GPU exclusivity and rank order; failures are real", () => {
    fc.assert(
      fc.property(arbCluster, arbRequest, (nodes, req) => {
        const r = planPlacement(req, nodes)
        const res = { ...(req.resourcesPerWorker ?? (req.useGpu ? { GPU: 1 } : { CPU: 1 })) }
        const caps = nodes.map((n) => capacityOf(n, req, res))
        const total = caps.reduce((s, c) => s + c, 0)
        const feasible =
          req.placementStrategy === "STRICT_PACK"
            ? caps.some((c) => c >= req.numWorkers)
            : req.placementStrategy === "STRICT_SPREAD"
              ? caps.filter((c) => c > 0).length >= req.numWorkers
              : total >= req.numWorkers
        if (Result.isSuccess(r)) checkPlan(r.success, req, nodes)
        else {
          expect(r.failure._tag).toBe("PlacementInfeasible")
          if (r.failure._tag === "PlacementInfeasible") {
            expect(r.failure.maxPlaceable).toBeLessThan(req.numWorkers)
            expect(r.failure.nodes.map((n) => n.fits)).toEqual([...nodes].sort(compareNodes).map((n) => capacityOf(n, req, res)))
            expect(r.failure.message).toContain("asked:")
            expect(r.failure.message).toContain("hint:")
          }
        }
        expect(Result.isSuccess(r)).toBe(feasible)
      }),
      { numRuns: 600 }
    )
  })

  it("is deterministic: the same nodes in any order give the same plan", () => {
    fc.assert(
      fc.property(arbCluster, arbRequest, fc.integer(), (nodes, req, seed) => {
        const shuffled = [...nodes].sort((a, b) => ((a.nodeId.charCodeAt(1) * 31 + seed) % 7) - ((b.nodeId.charCodeAt(1) * 31 + seed) % 7))
        expect(planPlacement(req, shuffled)).toEqual(planPlacement(req, nodes))
      }),
      { numRuns: 200 }
    )
  })

  it("the ledger never hands a GPU or a CPU out twice across concurrent jobs, and release restores it", () => {
    fc.assert(
      fc.property(arbCluster, fc.array(arbRequest, { minLength: 1, maxLength: 6 }), fc.array(fc.boolean(), { maxLength: 6 }), (nodes, reqs, releases) => {
        const ledger = new AllocationLedger()
        const before = nodes.map(freeResources)
        reqs.forEach((req, i) => {
          ledger.place({ ...req, jobId: `j${i}` }, nodes)
          if (releases[i]) ledger.release(`j${Math.floor(i / 2)}`)
          for (const n of nodes) {
            const held = ledger.jobs().flatMap((j) => ledger.plan(j)!.nodes.filter((a) => a.nodeId === n.nodeId))
            const gpus = held.flatMap((a) => a.gpuIndices)
            expect(new Set(gpus).size).toBe(gpus.length)
            for (const g of gpus) expect(n.used?.gpuIndices ?? []).not.toContain(g)
            // a GPU is held whole by one job, or shared up to all of it, never both
            const shared = new Map<string, number>(Object.entries(n.used?.gpuShares ?? {}))
            for (const a of held) for (const [g, v] of Object.entries(a.gpuShares ?? {})) shared.set(g, (shared.get(g) ?? 0) + v)
            for (const [g, v] of shared) {
              expect(v).toBeLessThanOrEqual(1 + 1e-6)
              if (v > 0) expect([...gpus, ...(n.used?.gpuIndices ?? [])]).not.toContain(Number(g))
            }
            const cpus = held.reduce((s, a) => s + a.cpus, 0)
            expect(cpus).toBeLessThanOrEqual(freeResources(n).cpus + 1e-9)
          }
        })
        for (const j of ledger.jobs()) ledger.release(j)
        expect(ledger.view(nodes).map(freeResources)).toEqual(before)
      }),
      { numRuns: 150 }
    )
  })
})

describe("the strategy table", () => {
  it("has one entry per name the config accepts, and the config accepts exactly those", () => {
    expect(placementStrategyEntries().map((e) => e.name)).toEqual([...placementStrategyNames])
    expect(placementStrategies).toEqual([...placementStrategyNames])
    for (const e of placementStrategyEntries()) {
      expect(findPlacementStrategy(e.name)).toBe(e)
      expect(e.description.length).toBeGreaterThan(10)
      expect(typeof e.select).toBe("function")
      // the config's schema accepts the name
      expect(Schema.is(PlacementStrategySchema)(e.name)).toBe(true)
    }
    expect(findPlacementStrategy("BEST")).toBeUndefined()
    expect(findPlacementStrategy("toString")).toBeUndefined()
    // the error for an unknown one lists them all
    const e = err(planPlacement({ numWorkers: 1, placementStrategy: "BEST" as PlacementStrategy }, [node("a")]))
    expect(e.message).toContain(placementStrategyNames.join(", "))
  })
})

describe("parameter servers in the plan", () => {
  it("places each server on the allowed node with the most CPUs left after the workers, booked in that node's allocation", () => {
    // PACK fills a with the 4 workers; both servers then go to b, where the CPUs are.
    const plan = ok(planPlacement({ numWorkers: 4, servers: 2 }, [node("a", { cpus: 4 }), node("b", { cpus: 4 })]))
    expect(plan.ranks.every((r) => r.nodeId === "a")).toBe(true)
    expect(plan.servers).toEqual([
      { index: 0, nodeId: "b", hostname: "host-b" },
      { index: 1, nodeId: "b", hostname: "host-b" }
    ])
    // A node with servers only comes after the workers' nodes, holding no workers.
    expect(plan.nodes).toEqual([
      { nodeId: "a", workers: 4, cpus: 4, memoryBytes: 0, gpuIndices: [], custom: {} },
      { nodeId: "b", workers: 0, cpus: 2, memoryBytes: 0, gpuIndices: [], custom: {} }
    ])
    // Beside the workers where there is room...
    const one = ok(planPlacement({ numWorkers: 2, servers: 2 }, [node("a", { cpus: 4 })]))
    expect(one.servers.map((s) => s.nodeId)).toEqual(["a", "a"])
    expect(one.nodes).toEqual([{ nodeId: "a", workers: 2, cpus: 4, memoryBytes: 0, gpuIndices: [], custom: {} }])
    // ...and where most CPUs are left: on two equal nodes, the one PACK left empty.
    const two = ok(planPlacement({ numWorkers: 4, servers: 2 }, [node("a", { cpus: 8 }), node("b", { cpus: 8 })]))
    const workersOn = two.ranks[0]!.nodeId
    expect(two.ranks.every((r) => r.nodeId === workersOn)).toBe(true)
    expect(two.servers.every((s) => s.nodeId !== workersOn)).toBe(true)
  })

  it("refuses a plan with no room for the servers, saying so, and keeps them off nodes the labels exclude", () => {
    const e = err(planPlacement({ numWorkers: 4, servers: 1 }, [node("a", { cpus: 4 })]))
    expect(e).toBeInstanceOf(PlacementInfeasible)
    expect((e as PlacementInfeasible).reason).toMatch(/no room for parameter server 1 of 1 \(1 CPU each\) beside the 4 workers: 0 CPUs left/)
    expect((e as PlacementInfeasible).requested).toMatch(/1 parameter server x \{CPU: 1\}/)
    const labelled = [node("a", { cpus: 4, labels: { zone: "x" } }), node("b", { cpus: 8, labels: { zone: "y" } })]
    const plan = ok(planPlacement({ numWorkers: 2, servers: 2, nodeLabels: { zone: "x" } }, labelled))
    expect(plan.servers.map((s) => s.nodeId)).toEqual(["a", "a"])
    expect(err(planPlacement({ numWorkers: 3, servers: 2, nodeLabels: { zone: "x" } }, labelled))).toBeInstanceOf(PlacementInfeasible)
    expect(Result.isFailure(planPlacement({ numWorkers: 2, servers: -1 }, labelled))).toBe(true)
  })

  it("books the servers' CPUs in the ledger, so another job cannot take them", () => {
    const ledger = new AllocationLedger()
    const nodes = [node("a", { cpus: 4 })]
    expect(Result.isSuccess(ledger.place({ jobId: "ps", numWorkers: 2, servers: 1 }, nodes))).toBe(true)
    expect(Result.isFailure(ledger.place({ jobId: "other", numWorkers: 2 }, nodes))).toBe(true)
    expect(Result.isSuccess(ledger.place({ jobId: "other", numWorkers: 1 }, nodes))).toBe(true)
  })
})
