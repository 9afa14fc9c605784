// The "webgpu" backend (Dawn through the webgpu package) on a machine without a GPU: the probe's
// "no adapter" answer from the real dawn.node, the engine's typed error, config validation, and
// the GPU backend choice as pure logic (tensorflow-gpu first, then webgpu) through placement.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Exit from "effect/Exit"
import * as Result from "effect/Result"
import { ScalingConfig } from "../core/config.ts"
import { vulkanDriverFiles, vulkanIcdFilenames } from "../core/settings.ts"
import { ConfigError } from "../core/errors.ts"
import { decodeConfig } from "../core/validate.ts"
import { NO_ADAPTER, dawnFlags } from "../core/webgpu.ts"
import { probeBackends, probeGpus, probeWebGpu } from "../actors/node/node-probe.ts"
import { adapterLines, type NodeReport } from "../actors/node/cluster-status.ts"
import { GPU_BACKENDS, describeBackends, gpuBackendFor } from "../scheduler/gpu-backend.ts"
import { decodeAdvertisement, toNodeResources, type NodeAdvertisement } from "../scheduler/node-info.ts"
import { PlacementInfeasible, planPlacement } from "../scheduler/placement.ts"
import type { NodeResources, TfjsBackend } from "../scheduler/resources.ts"
import { TestRig } from "./support/actors-processes.ts"
import { nodeAd } from "./support/node-ads.ts"

const rig = new TestRig()
afterAll(() => rig.cleanup())

const ENGINE = new URL("../core/engine.ts", import.meta.url).href

// The "no adapter" answer holds where Vulkan has no driver to offer, as on the CI machine.
const vulkanDrivers = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"].flatMap((d) =>
  fs.existsSync(d) ? fs.readdirSync(d) : []
)
const noVulkan = vulkanDrivers.length === 0 && !vulkanIcdFilenames.read() && !vulkanDriverFiles.read()
const libvulkan = (spawnSync("ldconfig", ["-p"], { encoding: "utf8" }).stdout ?? "").includes("libvulkan.so.1")
const gpus = await probeGpus()
const noGpu = noVulkan && gpus.length === 0

const node = (nodeId: string, backends: TfjsBackend[], o: { gpus?: number; backendErrors?: Record<string, string> } = {}): NodeResources => ({
  nodeId,
  hostname: `host-${nodeId}`,
  cpus: 8,
  memoryBytes: 32 * 1024 ** 3,
  gpus: Array.from({ length: o.gpus ?? 1 }, (_, index) => ({ index, name: "NVIDIA A10", memoryMiB: 24_000 })),
  backends,
  ...(o.backendErrors ? { backendErrors: o.backendErrors } : {}),
  natsServer: "s1",
  labels: {},
  custom: {}
})

const backendsOf = (r: ReturnType<typeof planPlacement>): string[] => {
  if (Result.isFailure(r)) throw new Error(`expected a plan, got ${r.failure.message}`)
  return r.success.ranks.map((x) => `${x.nodeId}=${x.backend}`)
}
const failureOf = (r: ReturnType<typeof planPlacement>) => {
  if (Result.isSuccess(r)) throw new Error(`expected an error, got ${JSON.stringify(r.success.ranks)}`)
  return r.failure
}

describe("GPU backend choice", () => {
  it("says at start which backend each rank runs, where, and why", () => {
    const r = (rank: number, nodeId: string, backend: string, gpuIndices: number[] = []) => ({ rank, nodeId, backend, gpuIndices })
    expect(describeBackends([r(0, "a", "tensorflow"), r(1, "a", "tensorflow"), r(2, "b", "wasm"), r(3, "a", "tensorflow")], "auto", false)).toBe(
      'workers: tensorflow on a (ranks 0-1,3), wasm on b (rank 2) (backend "auto": each node\'s fastest that loads there, tensorflow, then wasm, then cpu)'
    )
    const soft = [{ nodeId: "local", gpus: [{ index: 0, name: "SwiftShader driver 5.0.0 (software)", software: true }, { index: 1, name: "x", software: true }] }]
    const line = describeBackends([r(0, "local", "webgpu", [0]), r(1, "local", "webgpu", [1])], "webgpu", true, soft)
    expect(line).toBe('workers: webgpu on local (ranks 0-1) (backend "webgpu"); their GPU is a software adapter (GRADWIRE_WEBGPU_SOFTWARE=1): this tests the GPU code path, not its speed')
    const real = [{ nodeId: "g", gpus: [{ index: 0, name: "NVIDIA H100" }] }]
    expect(describeBackends([r(0, "g", "tensorflow-gpu", [0])], "auto", true, real)).toBe(
      'workers: tensorflow-gpu on g (rank 0) (backend "auto": each node\'s fastest that loads there, tensorflow-gpu, then webgpu)'
    )
    // more than one CPU for a worker that computes on one thread: said, with what to do instead
    const cpus = (rank: number, backend: string, CPU: number) => ({ ...r(rank, "a", backend), resources: { CPU } })
    expect(describeBackends([cpus(0, "wasm", 4), cpus(1, "wasm", 4)], "auto", false)).toMatch(
      /; a wasm or cpu worker computes on one core, so resourcesPerWorker CPU 4 reserves 4 cores for each and it uses one: for more cores, run more workers of one CPU each$/
    )
    expect(describeBackends([cpus(0, "tensorflow", 4)], "auto", false)).not.toContain("one core")
    expect(describeBackends([cpus(0, "wasm", 1)], "auto", false)).not.toContain("one core")
  })

  it("prefers tensorflow-gpu, then webgpu, whatever order the node lists them in", () => {
    expect(GPU_BACKENDS).toEqual(["tensorflow-gpu", "webgpu"])
    expect(gpuBackendFor(["webgpu", "tensorflow-gpu", "wasm", "cpu"], "auto")).toBe("tensorflow-gpu")
    expect(gpuBackendFor(["webgpu", "wasm", "cpu"], "auto")).toBe("webgpu")
    expect(gpuBackendFor(["tensorflow", "wasm", "cpu"], "auto")).toBeUndefined()
  })

  it("gives the backend asked for only where it loads", () => {
    expect(gpuBackendFor(["tensorflow-gpu", "webgpu"], "webgpu")).toBe("webgpu")
    expect(gpuBackendFor(["tensorflow-gpu", "wasm"], "webgpu")).toBeUndefined()
    expect(gpuBackendFor(["webgpu", "wasm"], "tensorflow-gpu")).toBeUndefined()
  })

  it("placement puts each GPU worker on its node's best GPU backend", () => {
    const nodes = [node("a", ["tensorflow-gpu", "webgpu", "wasm", "cpu"]), node("b", ["webgpu", "wasm", "cpu"]), node("c", ["tensorflow-gpu", "wasm", "cpu"])]
    expect(backendsOf(planPlacement({ numWorkers: 3, useGpu: true, placementStrategy: "SPREAD" }, nodes))).toEqual([
      "a=tensorflow-gpu",
      "b=webgpu",
      "c=tensorflow-gpu"
    ])
    // Asked for by name, webgpu goes only where it loads, even where tensorflow-gpu would too.
    expect(backendsOf(planPlacement({ numWorkers: 2, useGpu: true, backend: "webgpu", placementStrategy: "SPREAD" }, nodes))).toEqual([
      "a=webgpu",
      "b=webgpu"
    ])
  })

  it("a webgpu node without GPUs to hand out takes no GPU worker", () => {
    const e = failureOf(planPlacement({ numWorkers: 1, useGpu: true }, [node("a", ["webgpu", "wasm", "cpu"], { gpus: 0 })]))
    expect(e).toBeInstanceOf(PlacementInfeasible)
    expect(e.message).toContain("excluded: no GPUs")
  })
})

describe("backend \"webgpu\" where no node has an adapter", () => {
  const noAdapter = `${NO_ADAPTER}: Couldn't load Vulkan: libvulkan.so.1: cannot open shared object file`
  const nodes = [
    node("a", ["tensorflow-gpu", "wasm", "cpu"], { backendErrors: { webgpu: noAdapter } }),
    node("b", ["wasm", "cpu"], { gpus: 0, backendErrors: { webgpu: "webgpu and @tensorflow/tfjs-backend-webgpu are not installed" } })
  ]

  it("is PlacementInfeasible naming each node's reason and what to do", () => {
    const e = failureOf(planPlacement({ numWorkers: 1, useGpu: true, backend: "webgpu" }, nodes))
    expect(e).toBeInstanceOf(PlacementInfeasible)
    const p = e as PlacementInfeasible
    expect(p.maxPlaceable).toBe(0)
    expect(p.requested).toContain("backend webgpu")
    expect(p.nodes.map((n) => n.excluded)).toEqual([
      `the 'webgpu' backend does not load here (${noAdapter})`,
      "the 'webgpu' backend does not load here (webgpu and @tensorflow/tfjs-backend-webgpu are not installed)"
    ])
    expect(p.hint).toContain("Vulkan driver")
    expect(p.hint).toContain("lavapipe")
    expect(p.hint).toContain("@tensorflow/tfjs-backend-webgpu")
    expect(p.hint).toContain('backend "auto"')
  })

  it("with backend \"auto\" the GPU worker still goes where tensorflow-gpu loads", () => {
    expect(backendsOf(planPlacement({ numWorkers: 1, useGpu: true }, nodes))).toEqual(["a=tensorflow-gpu"])
    const e = failureOf(planPlacement({ numWorkers: 1, useGpu: true }, [nodes[1]!, node("c", ["wasm", "cpu"])]))
    expect(e.message).toContain("the 'tensorflow-gpu' backend does not load here, nor does 'webgpu'")
    expect(e.message).toMatch(/tfjs-node-gpu .*webgpu and @tensorflow\/tfjs-backend-webgpu/)
  })
})

describe("config", () => {
  it("ScalingConfig takes backend \"webgpu\" and lists it for a typo", () => {
    expect(decodeConfig(ScalingConfig, { numWorkers: 1, useGpu: true, backend: "webgpu" }, "scalingConfig").backend).toBe("webgpu")
    let caught: unknown
    try {
      decodeConfig(ScalingConfig, { numWorkers: 1, backend: "web-gpu" }, "scalingConfig")
    } catch (e) {
      caught = e
    }
    expect(caught).toBeInstanceOf(ConfigError)
    expect((caught as ConfigError).field).toBe("scalingConfig.backend")
    expect((caught as ConfigError).message).toContain('"webgpu"')
  })

  it("\"webgpu\" needs useGpu, and useGpu takes only GPU backends", () => {
    const cpu = failureOf(planPlacement({ numWorkers: 1, backend: "webgpu" }, [node("a", ["webgpu", "cpu"])]))
    expect(cpu).toBeInstanceOf(ConfigError)
    expect((cpu as ConfigError).field).toBe("scalingConfig.backend")
    expect(cpu.message).toContain('"webgpu" needs useGpu: true')
    const gpu = failureOf(planPlacement({ numWorkers: 1, useGpu: true, backend: "wasm" }, [node("a", ["webgpu", "wasm"])]))
    expect(gpu).toBeInstanceOf(ConfigError)
    expect(gpu.message).toContain('"tensorflow-gpu" or "webgpu"')
  })
})

const adapter = {
  vendor: "nvidia",
  architecture: "ampere",
  device: "",
  description: "NVIDIA A10",
  maxBufferSize: 2 ** 32,
  maxStorageBufferBindingSize: 2 ** 31
}

describe("Dawn's instance", () => {
  it("is made without zero-filled workgroup memory unless GRADWIRE_WEBGPU_ZERO_WORKGROUP=1 asks for it", () => {
    const was = process.env.GRADWIRE_WEBGPU_ZERO_WORKGROUP
    try {
      delete process.env.GRADWIRE_WEBGPU_ZERO_WORKGROUP
      expect(dawnFlags()).toEqual(["enable-dawn-features=disable_workgroup_init"])
      process.env.GRADWIRE_WEBGPU_ZERO_WORKGROUP = "1"
      expect(dawnFlags()).toEqual([])
      process.env.GRADWIRE_WEBGPU_ZERO_WORKGROUP = "0"
      expect(dawnFlags()).toEqual(["enable-dawn-features=disable_workgroup_init"])
    } finally {
      if (was === undefined) delete process.env.GRADWIRE_WEBGPU_ZERO_WORKGROUP
      else process.env.GRADWIRE_WEBGPU_ZERO_WORKGROUP = was
    }
  })
})

describe("the advertisement", () => {
  const ad = (webgpu: unknown): unknown =>
    nodeAd({
      nodeId: "g",
      gpus: [{ index: 0, name: "NVIDIA A10", memoryMiB: 24_000 }],
      backends: ["webgpu", "wasm", "cpu"],
      backendErrors: { "tensorflow-gpu": "@tensorflow/tfjs-node-gpu is not installed" },
      ...(webgpu !== undefined ? { webgpu } : {})
    })

  it("carries the adapter; the scheduler places a GPU worker on webgpu there", () => {
    const decoded = decodeAdvertisement(ad(adapter))
    expect(Exit.isSuccess(decoded)).toBe(true)
    const a = (decoded as Exit.Success<NodeAdvertisement>).value
    expect(a.webgpu).toEqual(adapter)
    const n = toNodeResources(a)
    expect(n.backendErrors).toEqual({ "tensorflow-gpu": "@tensorflow/tfjs-node-gpu is not installed" })
    expect(backendsOf(planPlacement({ numWorkers: 1, useGpu: true }, [n]))).toEqual(["g=webgpu"])
  })

  it("decodes without it (older agents, no adapter) and drops a malformed one", () => {
    expect(Exit.isSuccess(decodeAdvertisement(ad(undefined)))).toBe(true)
    expect(Exit.isSuccess(decodeAdvertisement(ad({ ...adapter, maxBufferSize: "4 GiB" })))).toBe(false)
  })
})

describe("the status table", () => {
  it("prints the adapter a node found, with its buffer limits", () => {
    const lines = adapterLines([{ nodeId: "a", webgpu: adapter } as NodeReport, { nodeId: "b" } as NodeReport])
    expect(lines).toEqual(["webgpu adapter of a: NVIDIA A10 (nvidia ampere), max buffer 4 GiB, max storage binding 2 GiB"])
  })
})

describe.runIf(noGpu)("on this machine (no GPU, no Vulkan driver)", () => {
  it("the probe loads dawn.node in a child and answers \"no adapter\", with Dawn's reason", async () => {
    const r = await probeWebGpu()
    expect(r.ok).toBe(false)
    expect(r.adapter).toBeUndefined()
    expect(r.error?.startsWith(NO_ADAPTER), r.error).toBe(true)
    // Without the Vulkan loader at all, Dawn says so on stderr and the reason carries it.
    if (!libvulkan) expect(r.error).toContain(`${NO_ADAPTER}: Couldn't load Vulkan`)
  }, 60_000)

  it("the agent's probe leaves webgpu out, says why, and caches that", async () => {
    const cacheFile = path.join(rig.tempDir(), "backends.json")
    const first = await probeBackends({ gpus: [], cacheFile })
    expect(first.backends).not.toContain("webgpu")
    expect(first.backends).toContain("cpu")
    expect(first.webgpu).toBeUndefined()
    expect(first.errors.webgpu?.startsWith(NO_ADAPTER), first.errors.webgpu).toBe(true)
    expect(await probeBackends({ gpus: [], cacheFile })).toEqual(first)
  }, 120_000)

  it("a probe past its deadline is an answer too, never a hang", async () => {
    const r = await probeWebGpu(1)
    expect(r.ok).toBe(false)
    expect(r.error).toMatch(/^timed out after 1 ms/)
  })

  it("loadEngine(\"webgpu\") fails with a ConfigError that says what is missing and what to do", () => {
    const code = `
      const { loadEngine } = await import(${JSON.stringify(ENGINE)})
      try { await loadEngine("webgpu"); console.log(JSON.stringify({ loaded: true })) }
      catch (e) { console.log(JSON.stringify({ tag: e._tag, field: e.field, message: e.message })) }
      process.exit(0)`
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], { encoding: "utf8", timeout: 60_000 })
    expect(r.status, r.stderr).toBe(0)
    const out = JSON.parse(r.stdout.trim().split("\n").at(-1)!) as { tag?: string; field?: string; message?: string; loaded?: boolean }
    expect(out.loaded).toBeUndefined()
    expect(out.tag).toBe("ConfigError")
    expect(out.field).toBe("scalingConfig.backend")
    expect(out.message).toContain(`the "webgpu" backend has no GPU here: ${NO_ADAPTER}`)
    expect(out.message).toContain("Vulkan driver")
    expect(out.message).toContain('use backend "auto"')
  }, 60_000)
})
