// Placement: decides which node (and which GPUs) each worker rank gets, with Ray's four strategies,
// and keeps a ledger of what running jobs hold so two jobs never take the same GPU whole (workers
// that ask for a fraction of one, resourcesPerWorker.GPU < 1, share GPUs up to all of each, packed
// in index order, one GPU per worker; a shared GPU is not free for a whole-GPU worker). Pure: it reads a list
// of NodeResources and returns a plan or a typed error, so it is tested over hand-made clusters.
//
// Semantics (Ray placement groups, one bundle = one worker's resourcesPerWorker): the strategies
// (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD) are declared in placement-strategies.ts, each with
// how it spreads workers over the eligible nodes; this module decides which nodes are eligible
// and how many workers each can take, and plans through the requested strategy's entry.
// A node is eligible only if the worker's tfjs backend loads there (useGpu needs a GPU backend,
// 'tensorflow-gpu' or else 'webgpu' (gpu-backend.ts), and a free GPU), its labels match the
// selector, and, with acceleratorType, it has a GPU whose name contains that string (only those
// GPUs are handed out). Ranks are ordered by node (head first, then nodeId), then by GPU index,
// as Ray Train does; CPU-only workers get CUDA_VISIBLE_DEVICES="" so a GPU build of tfjs on their
// node does not grab a GPU it was not given.
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import type { PlacementStrategy } from "../core/config.ts"
import { ConfigError } from "../core/errors.ts"
import { findPlacementStrategy, placementStrategyEntries, type PlacementStrategyEntry, type Selection } from "./placement-strategies.ts"
import { gpuBackendFor, isGpuBackend, type GpuBackend } from "./gpu-backend.ts"
import {
  CPU,
  GPU,
  MEMORY,
  addUsage,
  compareNodes,
  emptyUsage,
  formatBytes,
  formatNumber,
  freeResources,
  GPU_SHARE_EPS,
  isGpuShare,
  type FreeResources,
  type GpuInfo,
  type NodeResources,
  type ResourceUsage,
  type TfjsBackend
} from "./resources.ts"

export type { PlacementStrategy } from "../core/config.ts"
/** The strategies' names, in the config's order (placement-strategies.ts). */
export const placementStrategies: readonly PlacementStrategy[] = placementStrategyEntries().map((e) => e.name)

/**
 * Label selector, Ray style. Per key: "v" (equals), "!v" (absent or different), "in(a,b)",
 * "!in(a,b)", or an array of allowed values. Every key must match.
 */
export type LabelSelector = Readonly<Record<string, string | readonly string[]>>

/** Field names follow core/config.ts ScalingConfig, so a validated ScalingConfig can be passed as is. */
export interface PlacementRequest {
  /** Owner of the allocation in the ledger; default "job". */
  readonly jobId?: string
  readonly numWorkers: number
  /**
   * true: GPU workers; false (default): CPU workers; "auto": a GPU worker ({GPU: 1}) on each node
   * that has a free GPU and a GPU backend, CPU workers ({CPU: 1}) elsewhere, in one job.
   */
  readonly useGpu?: boolean | "auto"
  /** Per worker: CPU, GPU (whole GPUs), memory (bytes), or custom names. Default {GPU: 1} with useGpu, else {CPU: 1}. */
  readonly resourcesPerWorker?: Readonly<Record<string, number>>
  /** Default PACK (Ray Train's default). */
  readonly placementStrategy?: PlacementStrategy
  /** Substring of the GPU name, case-insensitive ("H100", "A100"). */
  readonly acceleratorType?: string
  readonly nodeLabels?: LabelSelector
  /** "auto" (default): with useGpu 'tensorflow-gpu' > 'webgpu', else the best that loads: tensorflow > wasm > cpu. */
  readonly backend?: TfjsBackend | "auto"
  /**
   * Parameter servers (collectiveConfig.strategy "parameter-server" / "auto"): CPU-only actors of
   * SERVER_CPUS each, placed after the workers on the nodes the label selector allows, each on the
   * node with the most CPUs left (the servers spread, and sit beside workers only where there is
   * room). Default 0.
   */
  readonly servers?: number
}

/** CPUs a parameter server reserves. */
export const SERVER_CPUS = 1

/** Where parameter server `index` runs. */
export interface ServerAssignment {
  readonly index: number
  readonly nodeId: string
  readonly hostname: string
}

export interface RankAssignment {
  readonly rank: number
  readonly nodeId: string
  readonly hostname: string
  readonly natsServer: string
  readonly nodeRank: number
  readonly localRank: number
  readonly localWorldSize: number
  readonly gpuIndices: readonly number[]
  /** Value for the worker's CUDA_VISIBLE_DEVICES ("" hides every GPU). */
  readonly cudaVisibleDevices: string
  readonly backend: TfjsBackend
  /** What this rank holds on its node (the plan's resourcesPerWorker, or with useGpu "auto" its kind's). */
  readonly resources: Readonly<Record<string, number>>
}

/** What one job holds on one node; the ledger sums these. */
export interface NodeAllocation {
  readonly nodeId: string
  readonly workers: number
  readonly cpus: number
  readonly memoryBytes: number
  /** GPUs taken whole. */
  readonly gpuIndices: readonly number[]
  /** GPUs shared by workers that each asked for a fraction of one: the fraction this job takes, by index. */
  readonly gpuShares?: Readonly<Record<string, number>>
  readonly custom: Readonly<Record<string, number>>
}

export interface PlacementPlan {
  readonly jobId: string
  readonly strategy: PlacementStrategy
  readonly useGpu: boolean | "auto"
  /** After defaults; zero entries dropped (with useGpu "auto": a CPU worker's; each rank has its own). */
  readonly resourcesPerWorker: Readonly<Record<string, number>>
  /** Ordered by rank. */
  readonly ranks: readonly RankAssignment[]
  /** Ordered by nodeRank; nodes that hold only parameter servers (workers 0) come last. */
  readonly nodes: readonly NodeAllocation[]
  /** The parameter servers' nodes (empty without servers). */
  readonly servers: readonly ServerAssignment[]
}

/** One node as the error message shows it. */
export const NodeReport = Schema.Struct({
  nodeId: Schema.String,
  hostname: Schema.String,
  freeCpus: Schema.Number,
  totalCpus: Schema.Number,
  freeGpus: Schema.Number,
  totalGpus: Schema.Number,
  gpuNames: Schema.Array(Schema.String),
  freeMemoryBytes: Schema.Number,
  backends: Schema.Array(Schema.String),
  labels: Schema.Record(Schema.String, Schema.String),
  freeCustom: Schema.Record(Schema.String, Schema.Number),
  /** How many workers of this request fit on the node now. */
  fits: Schema.Number,
  /** Why the node cannot take a worker at all ("" when it can). */
  excluded: Schema.String
})
export type NodeReport = typeof NodeReport.Type

/** The request cannot be satisfied by the cluster as it is now. */
export class PlacementInfeasible extends Schema.TaggedError<PlacementInfeasible>()("PlacementInfeasible", {
  jobId: Schema.String,
  strategy: Schema.String,
  numWorkers: Schema.Number,
  /** The request in words: workers, per-worker resources, backend, selectors. */
  requested: Schema.String,
  reason: Schema.String,
  /** Most workers of this shape the strategy could place now (0 when none). */
  maxPlaceable: Schema.Number,
  nodes: Schema.Array(NodeReport),
  hint: Schema.String
}) {
  override get message(): string {
    const lines = [
      `cannot place job "${this.jobId}": ${this.reason}`,
      `  asked: ${this.requested}`,
      `  cluster (${this.nodes.length} node${this.nodes.length === 1 ? "" : "s"}, free/total):`,
      ...(this.nodes.length === 0 ? ["    (no live nodes)"] : this.nodes.map(describeNodeReport)),
      `  hint: ${this.hint}`
    ]
    return lines.join("\n")
  }
}

/** A plan cannot be booked in the ledger (its GPUs or resources are already held). */
export class AllocationConflict extends Schema.TaggedError<AllocationConflict>()("AllocationConflict", {
  jobId: Schema.String,
  nodeId: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return (
      `cannot allocate job "${this.jobId}"${this.nodeId ? ` on node ${this.nodeId}` : ""}: ${this.reason}. ` +
      `Plan again against the ledger's current view (AllocationLedger.place), or release the other job first.`
    )
  }
}

const describeNodeReport = (n: NodeReport): string => {
  const labels = Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(",")
  const custom = Object.entries(n.freeCustom).map(([k, v]) => `${k} ${formatNumber(v)}`).join(", ")
  const gpuNames = n.gpuNames.length > 0 ? ` (${[...new Set(n.gpuNames)].join(", ")})` : ""
  return (
    `    ${n.nodeId} [${n.hostname}]: CPU ${formatNumber(n.freeCpus)}/${formatNumber(n.totalCpus)}, ` +
    `GPU ${n.freeGpus}/${n.totalGpus}${gpuNames}, memory ${formatBytes(n.freeMemoryBytes)} free` +
    `${custom ? `, ${custom}` : ""}; backends ${n.backends.join(",") || "none"}; labels ${labels || "none"}` +
    ` -> ${n.excluded ? `excluded: ${n.excluded}` : `fits ${n.fits}`}`
  )
}

// Capacities are floors of free/needed; the epsilon keeps 0.1+0.2 CPUs from reading as 0.2999….
const EPS = 1e-9
const fitCount = (free: number, need: number): number => Math.floor(free / need + EPS)

interface NormalizedRequest {
  readonly jobId: string
  readonly numWorkers: number
  readonly useGpu: boolean
  /** useGpu "auto": this is the CPU workers' request, and `gpu` the GPU workers'. */
  readonly gpu?: NormalizedRequest
  readonly resources: Readonly<Record<string, number>>
  readonly strategy: PlacementStrategy
  readonly strategyEntry: PlacementStrategyEntry
  readonly acceleratorType: string | undefined
  readonly selector: readonly LabelMatcher[]
  readonly backend: TfjsBackend | "auto"
  readonly servers: number
}

interface LabelMatcher {
  readonly key: string
  readonly negate: boolean
  readonly values: readonly string[]
  readonly text: string
}

const parseSelector = (selector: LabelSelector | undefined): Result.Result<readonly LabelMatcher[], ConfigError> => {
  const out: LabelMatcher[] = []
  for (const [key, raw] of Object.entries(selector ?? {})) {
    if (Array.isArray(raw)) {
      const values = raw as readonly string[]
      if (values.length === 0) {
        return Result.fail(new ConfigError({ field: `nodeLabels.${key}`, reason: "an empty list matches no node; give at least one value" }))
      }
      out.push({ key, negate: false, values, text: `${key} in (${values.join(",")})` })
      continue
    }
    const s = String(raw).trim()
    const negate = s.startsWith("!")
    const body = negate ? s.slice(1).trim() : s
    const m = /^in\((.*)\)$/.exec(body)
    const values = m ? m[1]!.split(",").map((v) => v.trim()).filter((v) => v.length > 0) : [body]
    if (m && values.length === 0) {
      return Result.fail(new ConfigError({ field: `nodeLabels.${key}`, reason: `"${s}" lists no values; write e.g. "in(a,b)"` }))
    }
    out.push({
      key,
      negate,
      values,
      text: m ? `${key} ${negate ? "not in" : "in"} (${values.join(",")})` : `${key}${negate ? "!=" : "="}${body}`
    })
  }
  return Result.succeed(out)
}

const labelMatches = (m: LabelMatcher, labels: Readonly<Record<string, string>>): boolean => {
  const v = Object.hasOwn(labels, m.key) ? labels[m.key] : undefined
  const inSet = v !== undefined && m.values.includes(v)
  return m.negate ? !inSet : inSet
}

const invalid = (field: string, reason: string) => Result.fail(new ConfigError({ field, reason }))

/** Applies Ray Train's defaults and checks the request; errors name the field and what is allowed. */
export const normalizeRequest = (req: PlacementRequest): Result.Result<NormalizedRequest, ConfigError> => {
  if (req.useGpu === "auto") {
    // GPU workers where a node offers a GPU, CPU workers elsewhere: each kind sized by Ray's default.
    if (req.resourcesPerWorker !== undefined) {
      return invalid("scalingConfig.resourcesPerWorker", 'useGpu "auto" sizes each worker itself ({GPU: 1} on a GPU node, {CPU: 1} elsewhere); drop resourcesPerWorker, or set useGpu to true or false')
    }
    if ((req.backend ?? "auto") !== "auto") {
      return invalid("scalingConfig.backend", `useGpu "auto" picks each node's backend (a GPU one where the worker gets a GPU); drop backend "${req.backend}" or set useGpu to true or false`)
    }
    const gpu = normalizeRequest({ ...req, useGpu: true })
    if (Result.isFailure(gpu)) return gpu
    const cpu = normalizeRequest({ ...req, useGpu: false, acceleratorType: undefined })
    if (Result.isFailure(cpu)) return cpu
    return Result.succeed({ ...cpu.success, gpu: gpu.success })
  }
  const useGpu = req.useGpu === true
  if (!Number.isInteger(req.numWorkers) || req.numWorkers < 1) {
    return invalid("scalingConfig.numWorkers", `must be an integer >= 1, got ${String(req.numWorkers)}`)
  }
  const strategy = req.placementStrategy ?? "PACK"
  const strategyEntry = findPlacementStrategy(strategy)
  if (strategyEntry === undefined) {
    return invalid("scalingConfig.placementStrategy", `must be one of ${placementStrategies.join(", ")}, got ${String(strategy)}`)
  }
  const resources: Record<string, number> = {}
  if (req.resourcesPerWorker === undefined) {
    resources[useGpu ? GPU : CPU] = 1
  } else {
    for (const [k, v] of Object.entries(req.resourcesPerWorker)) {
      if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
        return invalid(`scalingConfig.resourcesPerWorker.${k}`, `must be a finite number >= 0, got ${String(v)}`)
      }
      if (v > 0) resources[k] = v
    }
    // Ray: with useGpu and no GPU entry, a worker still gets one GPU.
    if (useGpu && !Object.hasOwn(req.resourcesPerWorker, GPU)) resources[GPU] = 1
  }
  const gpus = resources[GPU] ?? 0
  if (useGpu && gpus === 0) {
    return invalid("scalingConfig.resourcesPerWorker.GPU", "useGpu is true but GPU is 0; give GPU >= 1 or set useGpu: false")
  }
  if (!useGpu && gpus > 0) {
    return invalid(
      "scalingConfig.resourcesPerWorker.GPU",
      `GPU is ${gpus} but useGpu is false; set useGpu: true to train on GPUs, or drop GPU from resourcesPerWorker`
    )
  }
  if (!Number.isInteger(gpus) && !isGpuShare(gpus)) {
    return invalid(
      "scalingConfig.resourcesPerWorker.GPU",
      `must be whole GPUs or a fraction of one (0 < GPU < 1: workers share a GPU, as Ray's fractional GPUs), got ${gpus}`
    )
  }
  const backend = req.backend ?? "auto"
  if (useGpu && backend !== "auto" && !isGpuBackend(backend)) {
    return invalid("scalingConfig.backend", `useGpu needs a GPU backend ("tensorflow-gpu" or "webgpu", or "auto"), got "${backend}"`)
  }
  if (!useGpu && isGpuBackend(backend)) {
    return invalid("scalingConfig.backend", `"${backend}" needs useGpu: true; for CPU workers use "auto", "tensorflow", "wasm" or "cpu"`)
  }
  const acceleratorType = req.acceleratorType?.trim() || undefined
  const servers = req.servers ?? 0
  if (!Number.isInteger(servers) || servers < 0) return invalid("collectiveConfig.parameterServer.numServers", `must be a whole number >= 0, got ${String(servers)}`)
  const selector = parseSelector(req.nodeLabels)
  if (Result.isFailure(selector)) return Result.fail(selector.failure)
  return Result.succeed({
    jobId: req.jobId ?? "job",
    numWorkers: req.numWorkers,
    useGpu,
    resources,
    strategy,
    strategyEntry,
    acceleratorType,
    selector: selector.success,
    backend,
    servers
  })
}

const CPU_BACKENDS: readonly TfjsBackend[] = ["tensorflow", "wasm", "cpu"]

interface NodeFit {
  readonly node: NodeResources
  readonly free: FreeResources
  /** Free GPUs this request may use (after acceleratorType), ascending by index. */
  readonly gpus: readonly GpuInfo[]
  /** The same with shared ones: every GPU not taken whole and the fraction of it free (a request for a fraction of a GPU). */
  readonly fractions: FreeResources["gpuFractions"]
  readonly backend: TfjsBackend | undefined
  /** What one worker takes here (the request's; with useGpu "auto", the GPU or the CPU worker's). */
  readonly resources: Readonly<Record<string, number>>
  /** Workers that fit now; 0 when excluded. */
  readonly capacity: number
  /** "" when the node can take at least one worker. */
  readonly excluded: string
}

/** The GPU backend a useGpu request asks for (normalizeRequest allows only these and "auto"). */
const gpuWant = (req: NormalizedRequest): GpuBackend | "auto" => (isGpuBackend(req.backend) ? req.backend : "auto")

const matchesAccelerator = (g: GpuInfo, acceleratorType: string): boolean =>
  g.name.toLowerCase().includes(acceleratorType.toLowerCase())

const assessNode = (node: NodeResources, req: NormalizedRequest): NodeFit => {
  const free = freeResources(node)
  const base = { node, free, gpus: [] as readonly GpuInfo[], fractions: [] as FreeResources["gpuFractions"], backend: undefined, resources: req.resources, capacity: 0 }
  // Backend first: it is the most common reason a GPU request lands nowhere.
  let backend: TfjsBackend | undefined
  // What the node's probe said about webgpu ("no WebGPU adapter ..."), for the exclusion reason.
  const webgpuWhy = node.backendErrors?.webgpu ? ` (${node.backendErrors.webgpu})` : ""
  if (req.useGpu) {
    backend = gpuBackendFor(node.backends, gpuWant(req))
    if (backend === undefined) {
      const excluded =
        req.backend === "webgpu"
          ? `the 'webgpu' backend does not load here${webgpuWhy}`
          : req.backend === "tensorflow-gpu"
            ? "the 'tensorflow-gpu' backend does not load here"
            : `the 'tensorflow-gpu' backend does not load here, nor does 'webgpu'${webgpuWhy}`
      return { ...base, excluded }
    }
    if (node.gpus.length === 0) return { ...base, excluded: "no GPUs" }
  } else if (req.backend === "auto") {
    backend = CPU_BACKENDS.find((b) => node.backends.includes(b))
    if (backend === undefined) return { ...base, excluded: "no CPU tfjs backend (tensorflow, wasm, cpu) loads here" }
  } else {
    if (!node.backends.includes(req.backend)) return { ...base, excluded: `the '${req.backend}' backend does not load here` }
    backend = req.backend
  }
  for (const m of req.selector) {
    if (!labelMatches(m, node.labels)) {
      const has = Object.hasOwn(node.labels, m.key) ? `${m.key}=${node.labels[m.key]}` : `no label ${m.key}`
      return { ...base, backend, excluded: `label selector ${m.text} does not match (${has})` }
    }
  }
  let gpus = free.gpus
  let fractions = free.gpuFractions
  if (req.acceleratorType !== undefined) {
    const acc = req.acceleratorType
    if (!node.gpus.some((g) => matchesAccelerator(g, acc))) {
      const names = [...new Set(node.gpus.map((g) => g.name))]
      return { ...base, backend, excluded: `no GPU matching "${acc}" (${names.length ? `has ${names.join(", ")}` : "has no GPUs"})` }
    }
    gpus = gpus.filter((g) => matchesAccelerator(g, acc))
    fractions = fractions.filter((f) => matchesAccelerator(f.gpu, acc))
  }
  let capacity = Number.MAX_SAFE_INTEGER
  let limit = ""
  for (const [k, need] of Object.entries(req.resources)) {
    let have: number
    let fits: number
    if (k === CPU) {
      have = free.cpus
      fits = fitCount(have, need)
    } else if (k === MEMORY) {
      have = free.memoryBytes
      fits = fitCount(have, need)
    } else if (k === GPU && isGpuShare(need)) {
      // a fraction of a GPU: as many as fit in what each GPU has left (workers never span two)
      have = Math.max(0, ...fractions.map((f) => f.free))
      fits = fractions.reduce((s, f) => s + fitCount(f.free, need), 0)
    } else if (k === GPU) {
      have = gpus.length
      fits = Math.floor(have / need)
    } else {
      if (!Object.hasOwn(node.custom, k)) return { ...base, backend, gpus, fractions, excluded: `no resource "${k}"` }
      have = free.custom[k] ?? 0
      fits = fitCount(have, need)
    }
    if (fits < capacity) {
      capacity = fits
      const shown = k === MEMORY ? `${formatBytes(have)} free < ${formatBytes(need)}` : `${formatNumber(have)} free < ${formatNumber(need)}`
      limit = `${k === GPU && req.acceleratorType ? `GPU "${req.acceleratorType}"` : k}: ${shown} per worker`
    }
  }
  if (capacity === 0) return { ...base, backend, gpus, fractions, excluded: limit }
  return { node, free, gpus, fractions, backend, resources: req.resources, capacity, excluded: "" }
}

/** Workers per node through the requested strategy, over the nodes that can take one. */
const select = (fits: readonly NodeFit[], req: NormalizedRequest): Selection => req.strategyEntry.select(fits.filter((f) => f.capacity > 0), req.numWorkers)

const describeRequest = (req: NormalizedRequest): string => {
  const res = Object.entries(req.resources)
    .map(([k, v]) => `${k}: ${k === MEMORY ? formatBytes(v) : formatNumber(v)}`)
    .join(", ")
  const parts = [
    `${req.numWorkers} worker${req.numWorkers === 1 ? "" : "s"} x {${res}}`,
    req.strategy,
    `useGpu ${req.gpu ? "auto" : req.useGpu}`,
    `backend ${req.backend !== "auto" ? req.backend : req.gpu ? "tensorflow-gpu|webgpu where a GPU is free, else tensorflow|wasm|cpu" : req.useGpu ? "tensorflow-gpu|webgpu" : "tensorflow|wasm|cpu"}`
  ]
  if (req.acceleratorType !== undefined) parts.push(`acceleratorType "${req.acceleratorType}"`)
  if (req.selector.length > 0) parts.push(`labels ${req.selector.map((m) => m.text).join(", ")}`)
  if (req.servers > 0) parts.push(`${req.servers} parameter server${req.servers === 1 ? "" : "s"} x {CPU: ${SERVER_CPUS}}`)
  return parts.join(", ")
}

const nodeReport = (f: NodeFit): NodeReport => ({
  nodeId: f.node.nodeId,
  hostname: f.node.hostname,
  freeCpus: f.free.cpus,
  totalCpus: f.node.cpus,
  freeGpus: f.free.gpus.length,
  totalGpus: f.node.gpus.length,
  gpuNames: f.node.gpus.map((g) => g.name),
  freeMemoryBytes: f.free.memoryBytes,
  backends: [...f.node.backends],
  labels: { ...f.node.labels },
  freeCustom: { ...f.free.custom },
  fits: f.capacity,
  excluded: f.excluded
})

const hintFor = (req: NormalizedRequest, fits: readonly NodeFit[], sel: { maxPlaceable: number }): string => {
  const hints: string[] = []
  const eligible = fits.filter((f) => f.capacity > 0)
  if (fits.length === 0) {
    return "no node agents are alive: start one with `gradwire start --head` (or `gradwire start --address nats://...` on another machine)"
  }
  const gpuWanted = gpuWant(req)
  if (req.useGpu && !fits.some((f) => gpuBackendFor(f.node.backends, gpuWanted) !== undefined && f.node.gpus.length > 0)) {
    hints.push(
      gpuWanted === "webgpu"
        ? "no node can run webgpu workers: the 'webgpu' backend needs a GPU with a Vulkan driver (Mesa's lavapipe cannot stand in) and " +
            "webgpu and @tensorflow/tfjs-backend-webgpu installed on that node (restart its agent after installing); " +
            'or use backend "auto" (tensorflow-gpu where @tensorflow/tfjs-node-gpu is installed), or useGpu: false to train on CPU'
        : "no node can run GPU workers: set useGpu: false to train on CPU, or install @tensorflow/tfjs-node-gpu (with CUDA)" +
            `${gpuWanted === "auto" ? ", or webgpu and @tensorflow/tfjs-backend-webgpu (with a Vulkan driver)," : ""} on a GPU node and restart its agent`
    )
  }
  const backend = req.backend
  if (!req.useGpu && backend !== "auto" && !fits.some((f) => f.node.backends.includes(backend))) {
    const loads = [...new Set(fits.flatMap((f) => f.node.backends))]
    hints.push(
      (req.backend === "tensorflow"
        ? "no node loads the 'tensorflow' backend: it needs @tensorflow/tfjs-node installed where the agent runs (npm runs its install script, which downloads libtensorflow, only when allowed), then the agent restarted; "
        : `no node loads the '${backend}' backend; `) + `use backend "auto" (each node's fastest that loads: here ${loads.join(", ") || "none"})`
    )
  }
  if (req.acceleratorType !== undefined && !fits.some((f) => f.node.gpus.some((g) => matchesAccelerator(g, req.acceleratorType!)))) {
    const names = [...new Set(fits.flatMap((f) => f.node.gpus.map((g) => g.name)))]
    hints.push(`drop acceleratorType or use one the cluster has${names.length ? ` (${names.join(", ")})` : " (it has no GPUs)"}`)
  }
  if (req.selector.length > 0 && fits.every((f) => f.excluded.startsWith("label selector"))) {
    hints.push("no node matches nodeLabels: relax the selector, or start an agent with matching `--labels k=v`")
  }
  for (const k of Object.keys(req.resources)) {
    if (k !== CPU && k !== GPU && k !== MEMORY && !fits.some((f) => Object.hasOwn(f.node.custom, k))) {
      hints.push(`no node advertises the custom resource "${k}": add it to an agent or drop it from resourcesPerWorker`)
    }
  }
  if (sel.maxPlaceable > 0) {
    hints.push(req.strategyEntry.hint(req.numWorkers, sel.maxPlaceable))
  } else if (hints.length === 0) {
    hints.push(
      eligible.length === 0 && fits.some((f) => f.excluded.includes("free <"))
        ? "lower resourcesPerWorker, wait for running jobs to release resources, or add nodes"
        : "add nodes that can run this worker, or relax the request"
    )
  }
  if (fits.some((f) => (f.node.used?.gpuIndices.length ?? 0) > 0 || (f.node.used?.cpus ?? 0) > 0)) {
    hints.push("some resources are held by running jobs and free up when they end")
  }
  return hints.join("; ")
}

/**
 * Plans where each worker runs. Deterministic: the same request and the same set of nodes (in any
 * order) give the same plan. Nodes' `used` is respected; to account for this scheduler's other
 * jobs, plan through AllocationLedger.place (or pass ledger.view(nodes)).
 */
export const planPlacement = (
  request: PlacementRequest,
  nodes: readonly NodeResources[]
): Result.Result<PlacementPlan, PlacementInfeasible | ConfigError> => {
  const norm = normalizeRequest(request)
  if (Result.isFailure(norm)) return Result.fail(norm.failure)
  const req = norm.success
  const seen = new Set<string>()
  for (const n of nodes) {
    if (seen.has(n.nodeId)) return invalid("nodes", `node id "${n.nodeId}" appears twice; the cluster view must give each node once`)
    seen.add(n.nodeId)
  }
  const ordered = [...nodes].sort(compareNodes)
  // useGpu "auto": a node that can take a GPU worker takes GPU workers, any other CPU workers.
  const fits = ordered.map((n) => {
    const gpu = req.gpu ? assessNode(n, req.gpu) : undefined
    return gpu && gpu.capacity > 0 ? gpu : assessNode(n, req)
  })
  const infeasible = (reason: string, maxPlaceable: number, hint: string) =>
    Result.fail(
      new PlacementInfeasible({
        jobId: req.jobId,
        strategy: req.strategy,
        numWorkers: req.numWorkers,
        requested: describeRequest(req),
        reason,
        maxPlaceable,
        nodes: fits.map(nodeReport),
        hint
      })
    )
  const sel = select(fits, req)
  if (!sel.ok) return infeasible(sel.reason, sel.maxPlaceable, hintFor(req, fits, sel))
  const ranks: RankAssignment[] = []
  const allocations: NodeAllocation[] = []
  for (const f of fits) {
    const count = sel.counts.get(f.node.nodeId)
    if (count === undefined || count === 0) continue
    const resources = f.resources
    const gpuPer = resources[GPU] ?? 0
    const nodeRank = allocations.length
    const gpuIndices: number[] = []
    // A fraction of a GPU: workers packed onto the GPUs in index order, each on one GPU.
    const shares: Record<string, number> = {}
    const left = f.fractions.map((x) => ({ index: x.gpu.index, free: x.free }))
    const shareOf = (): number[] => {
      const g = left.find((x) => x.free + EPS >= gpuPer)!
      g.free -= gpuPer
      shares[String(g.index)] = (shares[String(g.index)] ?? 0) + gpuPer
      return [g.index]
    }
    for (let local = 0; local < count; local++) {
      const shared = isGpuShare(gpuPer)
      const mine = shared ? shareOf() : f.gpus.slice(local * gpuPer, (local + 1) * gpuPer).map((g) => g.index)
      if (!shared) gpuIndices.push(...mine)
      ranks.push({
        rank: ranks.length,
        nodeId: f.node.nodeId,
        hostname: f.node.hostname,
        natsServer: f.node.natsServer,
        nodeRank,
        localRank: local,
        localWorldSize: count,
        gpuIndices: mine,
        cudaVisibleDevices: mine.join(","),
        backend: f.backend!,
        resources
      })
    }
    const custom: Record<string, number> = {}
    for (const [k, v] of Object.entries(resources)) if (k !== CPU && k !== GPU && k !== MEMORY) custom[k] = v * count
    allocations.push({
      nodeId: f.node.nodeId,
      workers: count,
      cpus: (resources[CPU] ?? 0) * count,
      memoryBytes: (resources[MEMORY] ?? 0) * count,
      gpuIndices,
      ...(Object.keys(shares).length > 0 ? { gpuShares: shares } : {}),
      custom
    })
  }
  const servers = placeServers(req, fits, allocations)
  if (!servers.ok) {
    return infeasible(servers.reason, req.numWorkers, "add CPUs or nodes, use fewer workers or servers (collectiveConfig.parameterServer.numServers), or lower resourcesPerWorker.CPU")
  }
  return Result.succeed({
    jobId: req.jobId,
    strategy: req.strategy,
    useGpu: req.gpu ? "auto" : req.useGpu,
    resourcesPerWorker: req.resources,
    ranks,
    nodes: servers.allocations,
    servers: servers.assignments
  })
}

/**
 * The parameter servers after the workers: each on the node the label selector allows with the
 * most CPUs left (ties: a node that holds workers, then the nodes' order), SERVER_CPUS each,
 * booked in the node's allocation (a node with servers only gets one of its own, workers 0).
 */
const placeServers = (
  req: NormalizedRequest,
  fits: readonly NodeFit[],
  allocations: readonly NodeAllocation[]
): { ok: true; allocations: NodeAllocation[]; assignments: ServerAssignment[] } | { ok: false; reason: string } => {
  const out = allocations.map((a) => ({ ...a }))
  if (req.servers === 0) return { ok: true, allocations: out, assignments: [] }
  const candidates = fits
    .filter((f) => req.selector.every((m) => labelMatches(m, f.node.labels)))
    .map((f) => {
      const mine = allocations.find((a) => a.nodeId === f.node.nodeId)
      return { f, workers: mine?.workers ?? 0, left: f.free.cpus - (mine?.cpus ?? 0) }
    })
  const assignments: ServerAssignment[] = []
  for (let k = 0; k < req.servers; k++) {
    let best: (typeof candidates)[number] | undefined
    for (const c of candidates) {
      if (c.left < SERVER_CPUS - 1e-9) continue
      if (!best || c.left > best.left + 1e-9 || (Math.abs(c.left - best.left) <= 1e-9 && c.workers > 0 && best.workers === 0)) best = c
    }
    if (!best) {
      const left = candidates.reduce((s, c) => s + Math.max(0, c.left), 0)
      return {
        ok: false,
        reason:
          `no room for parameter server ${k + 1} of ${req.servers} (${SERVER_CPUS} CPU each) beside the ${req.numWorkers} worker${req.numWorkers === 1 ? "" : "s"}: ` +
          `${formatNumber(left)} CPU${left === 1 ? "" : "s"} left on the nodes the job may use`
      }
    }
    best.left -= SERVER_CPUS
    assignments.push({ index: k, nodeId: best.f.node.nodeId, hostname: best.f.node.hostname })
    const i = out.findIndex((a) => a.nodeId === best.f.node.nodeId)
    if (i >= 0) out[i] = { ...out[i]!, cpus: out[i]!.cpus + SERVER_CPUS }
    else out.push({ nodeId: best.f.node.nodeId, workers: 0, cpus: SERVER_CPUS, memoryBytes: 0, gpuIndices: [], custom: {} })
  }
  return { ok: true, allocations: out, assignments }
}

const allocationUsage = (a: NodeAllocation): ResourceUsage => ({
  cpus: a.cpus,
  memoryBytes: a.memoryBytes,
  gpuIndices: a.gpuIndices,
  ...(a.gpuShares ? { gpuShares: a.gpuShares } : {}),
  custom: a.custom
})

/**
 * What this scheduler has handed out, per job. Plans are booked all-or-nothing and released by job
 * id when the job ends, so concurrent jobs never get the same GPU and CPU/memory/custom resources
 * are counted once. In-memory state only; the cluster view owns persistence and liveness.
 */
export class AllocationLedger {
  readonly #jobs = new Map<string, PlacementPlan>()

  /** Job ids currently holding resources, in booking order. */
  jobs(): readonly string[] {
    return [...this.#jobs.keys()]
  }

  plan(jobId: string): PlacementPlan | undefined {
    return this.#jobs.get(jobId)
  }

  /** Everything the ledger's jobs hold on a node. */
  usage(nodeId: string): ResourceUsage {
    let u = emptyUsage
    for (const plan of this.#jobs.values()) {
      for (const a of plan.nodes) if (a.nodeId === nodeId) u = addUsage(u, allocationUsage(a))
    }
    return u
  }

  /** The nodes with the ledger's holdings added to their `used`: the view to plan against. */
  view(nodes: readonly NodeResources[]): NodeResources[] {
    return nodes.map((n) => ({ ...n, used: addUsage(n.used ?? emptyUsage, this.usage(n.nodeId)) }))
  }

  /**
   * Books a plan. Fails, booking nothing, when the job id is taken, a GPU is already held, or (when
   * `nodes` is given) a node would be over its capacity — a plan made against a stale view.
   */
  allocate(plan: PlacementPlan, nodes?: readonly NodeResources[]): Result.Result<void, AllocationConflict> {
    if (this.#jobs.has(plan.jobId)) {
      return Result.fail(new AllocationConflict({ jobId: plan.jobId, nodeId: "", reason: "a job with this id already holds resources" }))
    }
    for (const a of plan.nodes) {
      const usage = this.usage(a.nodeId)
      const held = new Set(usage.gpuIndices)
      const sharedHeld = usage.gpuShares ?? {}
      const clash = [
        ...a.gpuIndices.filter((g) => held.has(g) || (sharedHeld[String(g)] ?? 0) > 0),
        ...Object.entries(a.gpuShares ?? {})
          .filter(([g, v]) => held.has(Number(g)) || (sharedHeld[g] ?? 0) + v > 1 + GPU_SHARE_EPS)
          .map(([g]) => Number(g))
      ]
      if (clash.length > 0) {
        return Result.fail(new AllocationConflict({ jobId: plan.jobId, nodeId: a.nodeId, reason: `GPU ${clash.join(",")} already held by another job` }))
      }
      if (nodes !== undefined) {
        const node = nodes.find((n) => n.nodeId === a.nodeId)
        if (node === undefined) {
          return Result.fail(new AllocationConflict({ jobId: plan.jobId, nodeId: a.nodeId, reason: "node is not in the cluster view (dead or unknown)" }))
        }
        const free = freeResources(this.view([node])[0]!)
        const freeGpu = new Set(free.gpus.map((g) => g.index))
        const over: string[] = []
        if (a.cpus > free.cpus + EPS) over.push(`CPU ${formatNumber(a.cpus)} > ${formatNumber(free.cpus)} free`)
        if (a.memoryBytes > free.memoryBytes + EPS) over.push(`memory ${formatBytes(a.memoryBytes)} > ${formatBytes(free.memoryBytes)} free`)
        const freeShare = new Map(free.gpuFractions.map((x) => [x.gpu.index, x.free]))
        const notFree = [
          ...a.gpuIndices.filter((g) => !freeGpu.has(g)),
          ...Object.entries(a.gpuShares ?? {})
            .filter(([g, v]) => v > (freeShare.get(Number(g)) ?? 0) + GPU_SHARE_EPS)
            .map(([g]) => Number(g))
        ]
        if (notFree.length > 0) over.push(`GPU ${notFree.join(",")} not free or not on the node`)
        for (const [k, v] of Object.entries(a.custom)) {
          if (v > (free.custom[k] ?? 0) + EPS) over.push(`${k} ${formatNumber(v)} > ${formatNumber(free.custom[k] ?? 0)} free`)
        }
        if (over.length > 0) return Result.fail(new AllocationConflict({ jobId: plan.jobId, nodeId: a.nodeId, reason: over.join(", ") }))
      }
    }
    this.#jobs.set(plan.jobId, plan)
    return Result.succeed(undefined)
  }

  /** Frees a job's resources; false when the job held nothing (already released: harmless). */
  release(jobId: string): boolean {
    return this.#jobs.delete(jobId)
  }

  /** Plans against what is free after the ledger's jobs, and books the plan. */
  place(
    request: PlacementRequest,
    nodes: readonly NodeResources[]
  ): Result.Result<PlacementPlan, PlacementInfeasible | ConfigError | AllocationConflict> {
    const jobId = request.jobId ?? "job"
    if (this.#jobs.has(jobId)) {
      return Result.fail(new AllocationConflict({ jobId, nodeId: "", reason: "a job with this id already holds resources" }))
    }
    const planned = planPlacement(request, this.view(nodes))
    if (Result.isFailure(planned)) return planned
    const booked = this.allocate(planned.success, nodes)
    if (Result.isFailure(booked)) return Result.fail(booked.failure)
    return planned
  }
}
