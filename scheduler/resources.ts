// The scheduler's own picture of a node: what it has, what is already in use, and the arithmetic
// of "what is free". The cluster view (scheduler/cluster-view.ts) builds these from the node
// agents' advertisements; keeping the type here lets placement stay pure and be tested over
// hand-made clusters without a network.
import type { BackendKind } from "../core/engine.ts"

export type TfjsBackend = BackendKind

/** One GPU as nvidia-smi reports it. `index` is the CUDA device index used in CUDA_VISIBLE_DEVICES. */
export interface GpuInfo {
  readonly index: number
  readonly name: string
  readonly memoryMiB: number
  /** A software WebGPU adapter standing in for a GPU (GRADWIRE_WEBGPU_SOFTWARE=1): tests only. */
  readonly software?: boolean
}

/** Resources already taken on a node (by other jobs, or by the node's own advertisement). */
export interface ResourceUsage {
  readonly cpus: number
  readonly memoryBytes: number
  /** GPU indices that are taken whole. */
  readonly gpuIndices: readonly number[]
  /**
   * GPUs shared by workers that each asked for a fraction of one (resourcesPerWorker.GPU < 1, as
   * Ray's fractional GPUs): the fraction in use, by GPU index. Absent: none shared.
   */
  readonly gpuShares?: Readonly<Record<string, number>>
  readonly custom: Readonly<Record<string, number>>
}

/**
 * A schedulable node. Totals are after the agent's overrides: with `--num-gpus 2` the adapter
 * passes only the GPUs the node may use; with `--num-cpus 8`, `cpus: 8`.
 */
export interface NodeResources {
  readonly nodeId: string
  readonly hostname: string
  readonly cpus: number
  readonly memoryBytes: number
  readonly gpus: readonly GpuInfo[]
  /** tfjs backends that load on this node. */
  readonly backends: readonly TfjsBackend[]
  /** Why other backends do not (the agent's probe), for the reasons placement gives. */
  readonly backendErrors?: Readonly<Record<string, string>>
  /** Id of the NATS server the node's agent is connected to (for the topology / cost model). */
  readonly natsServer: string
  readonly labels: Readonly<Record<string, string>>
  /** User-defined resources, e.g. { "licence": 2 }. */
  readonly custom: Readonly<Record<string, number>>
  /** The head node's ranks come first (the driver usually runs there). */
  readonly isHead?: boolean
  /** Already in use before this scheduler's own ledger is applied. */
  readonly used?: ResourceUsage
}

/** Resource names with a built-in meaning; any other key is a custom resource. */
export const CPU = "CPU"
export const GPU = "GPU"
/** Bytes, as in Ray's `memory` resource. */
export const MEMORY = "memory"

export const emptyUsage: ResourceUsage = { cpus: 0, memoryBytes: 0, gpuIndices: [], custom: {} }

/** Sum of two usages (GPU indices are unioned and sorted, shares of a GPU added). */
export const addUsage = (a: ResourceUsage, b: ResourceUsage): ResourceUsage => {
  const custom: Record<string, number> = { ...a.custom }
  for (const [k, v] of Object.entries(b.custom)) custom[k] = (custom[k] ?? 0) + v
  const shares: Record<string, number> = { ...a.gpuShares }
  for (const [k, v] of Object.entries(b.gpuShares ?? {})) shares[k] = (shares[k] ?? 0) + v
  return {
    cpus: a.cpus + b.cpus,
    memoryBytes: a.memoryBytes + b.memoryBytes,
    gpuIndices: [...new Set([...a.gpuIndices, ...b.gpuIndices])].sort((x, y) => x - y),
    ...(Object.keys(shares).length > 0 ? { gpuShares: shares } : {}),
    custom
  }
}

/**
 * What a node's running processes hold (the agent's advertisement): CPU, memory and custom
 * resources summed; the GPUs of a process given a fraction of one (resources.GPU < 1) shared,
 * any other's taken whole.
 */
export const usageOfProcesses = (processes: ReadonlyArray<{ readonly resources: Readonly<Record<string, number>>; readonly gpus: ReadonlyArray<number> }>): ResourceUsage => {
  let cpus = 0
  let memoryBytes = 0
  const whole = new Set<number>()
  const shares: Record<string, number> = {}
  const custom: Record<string, number> = {}
  for (const p of processes) {
    for (const [k, v] of Object.entries(p.resources)) {
      if (k === CPU) cpus += v
      else if (k === MEMORY) memoryBytes += v
      else if (k !== GPU) custom[k] = (custom[k] ?? 0) + v
    }
    const share = p.resources[GPU] ?? 0
    if (isGpuShare(share)) for (const g of p.gpus) shares[String(g)] = (shares[String(g)] ?? 0) + share
    else for (const g of p.gpus) whole.add(g)
  }
  return { cpus, memoryBytes, gpuIndices: [...whole].sort((a, b) => a - b), ...(Object.keys(shares).length > 0 ? { gpuShares: shares } : {}), custom }
}

/** Whether a worker's GPU request is a fraction of one (resourcesPerWorker.GPU < 1): it shares its GPU. */
export const isGpuShare = (gpus: number): boolean => gpus > 0 && gpus < 1

/**
 * A usage less another (what a job holds of it), each amount clamped at 0: the GPUs the other
 * holds whole are removed, its shares taken off, and only the first usage's custom resources kept.
 */
export const subtractUsage = (a: ResourceUsage, b: ResourceUsage): ResourceUsage => {
  const whole = new Set(b.gpuIndices)
  const less = (m: Readonly<Record<string, number>>, n: Readonly<Record<string, number>> | undefined) =>
    Object.fromEntries(Object.entries(m).map(([k, v]) => [k, Math.max(0, v - (n?.[k] ?? 0))]))
  return {
    cpus: Math.max(0, a.cpus - b.cpus),
    memoryBytes: Math.max(0, a.memoryBytes - b.memoryBytes),
    gpuIndices: a.gpuIndices.filter((g) => !whole.has(g)),
    ...(a.gpuShares ? { gpuShares: less(a.gpuShares, b.gpuShares) } : {}),
    custom: less(a.custom, b.custom)
  }
}

/** What is left on a node after its usage. Negative values are clamped to 0 (over-commit by others). */
export interface FreeResources {
  readonly cpus: number
  readonly memoryBytes: number
  /** Free GPUs (neither taken whole nor shared), ascending by index. */
  readonly gpus: readonly GpuInfo[]
  /** Every GPU not taken whole with the fraction of it still free (1 for a free one), ascending by index. */
  readonly gpuFractions: ReadonlyArray<{ readonly gpu: GpuInfo; readonly free: number }>
  readonly custom: Readonly<Record<string, number>>
}

/** Below this a GPU's remaining fraction counts as none (sums of fractions such as 0.1 + 0.2). */
export const GPU_SHARE_EPS = 1e-6

export const freeResources = (node: NodeResources): FreeResources => {
  const used = node.used ?? emptyUsage
  const taken = new Set(used.gpuIndices)
  const custom: Record<string, number> = {}
  for (const [k, v] of Object.entries(node.custom)) custom[k] = Math.max(0, v - (used.custom[k] ?? 0))
  const shared = used.gpuShares ?? {}
  const gpuFractions = node.gpus
    .filter((g) => !taken.has(g.index))
    .map((gpu) => ({ gpu, free: Math.max(0, 1 - (shared[String(gpu.index)] ?? 0)) }))
    .filter((f) => f.free > GPU_SHARE_EPS)
    .sort((a, b) => a.gpu.index - b.gpu.index)
  return {
    cpus: Math.max(0, node.cpus - used.cpus),
    memoryBytes: Math.max(0, node.memoryBytes - used.memoryBytes),
    gpus: gpuFractions.filter((f) => f.free >= 1 - GPU_SHARE_EPS).map((f) => f.gpu),
    gpuFractions,
    custom
  }
}

/**
 * Canonical node order: head first, then by nodeId. Placement sorts by this, so a plan does not
 * depend on the order in which advertisements happened to arrive.
 */
export const compareNodes = (a: NodeResources, b: NodeResources): number => {
  const ha = a.isHead === true ? 0 : 1
  const hb = b.isHead === true ? 0 : 1
  if (ha !== hb) return ha - hb
  return a.nodeId < b.nodeId ? -1 : a.nodeId > b.nodeId ? 1 : 0
}

/** Human-readable byte count (binary units), for error messages and explain output. */
export const formatBytes = (bytes: number): string => {
  if (!Number.isFinite(bytes)) return String(bytes)
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]
  let v = bytes
  let u = 0
  while (Math.abs(v) >= 1024 && u < units.length - 1) {
    v /= 1024
    u++
  }
  return `${u === 0 ? v : Number(v.toFixed(v >= 100 ? 0 : 1))} ${units[u]}`
}

/** A number with at most 3 decimals, without trailing zeros (0.5, 2, 1.333). */
export const formatNumber = (x: number): string => String(Number(x.toFixed(3)))
