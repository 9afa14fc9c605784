// WebGPU in Node for the "webgpu" tfjs backend: Dawn from the `webgpu` package (an optional peer,
// with a prebuilt dawn.node) installed as navigator.gpu, which is where
// @tensorflow/tfjs-backend-webgpu looks (it registers itself only if navigator.gpu exists when it
// is imported). Dawn can block inside a broken driver, so every request to it has a deadline. A
// machine without a GPU or a Vulkan driver gets no adapter: that is an answer, not an error.
import { webgpuSoftware, webgpuZeroWorkgroup } from "./settings.ts"

/** The packages the "webgpu" backend needs (both optional peers of gradwire). */
export const WEBGPU_PACKAGES = ["webgpu", "@tensorflow/tfjs-backend-webgpu"] as const

/** What the node agent advertises about the adapter Dawn found. */
export interface WebGpuAdapterInfo {
  readonly vendor: string
  readonly architecture: string
  readonly device: string
  readonly description: string
  /** Largest buffer the adapter allows, in bytes (WebGPU does not tell the GPU's memory size). */
  readonly maxBufferSize: number
  /** Largest storage buffer one binding may see, in bytes: bounds a tensor tfjs can work on. */
  readonly maxStorageBufferBindingSize: number
  /** A software rasterizer (SwiftShader, lavapipe), not a GPU: accepted only with GRADWIRE_WEBGPU_SOFTWARE=1. */
  readonly software?: boolean
}

export type WebGpuAdapterResult =
  | { readonly ok: true; readonly adapter: WebGpuAdapterInfo }
  /** `adapter`: the one found and refused (a software adapter without the opt-in). */
  | { readonly ok: false; readonly reason: string; readonly adapter?: WebGpuAdapterInfo }

// The few WebGPU shapes used here; the package's own types are a global lib we do not load.
interface GpuAdapterLike {
  readonly info?: Partial<Record<"vendor" | "architecture" | "device" | "description", string>> & { readonly isFallbackAdapter?: boolean }
  readonly isFallbackAdapter?: boolean
  readonly limits: { readonly maxBufferSize: number; readonly maxStorageBufferBindingSize: number }
}
interface GpuLike {
  requestAdapter(options?: { powerPreference?: "high-performance" | "low-power" }): Promise<GpuAdapterLike | null>
}
interface DawnModule {
  create(flags: string[]): GpuLike
  readonly globals: object
}

/** Rejects with "<what> did not answer within <ms> ms" when `p` takes longer. */
export const withinDeadline = <A>(p: Promise<A>, ms: number, what: string): Promise<A> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer within ${ms} ms`)), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

const firstLine = (e: unknown): string => (e instanceof Error ? e.message : String(e)).split("\n")[0]!

let installed: GpuLike | undefined
/** The flags the installed instance was made with (dawnFlags at installWebGpu). */
let installedFlags: readonly string[] | undefined

/** The flags Dawn's instance in this process was made with; undefined before installWebGpu. */
export const installedDawnFlags = (): readonly string[] | undefined => installedFlags

/** Dawn's flag that leaves workgroup memory unfilled. */
export const DISABLE_WORKGROUP_INIT = "enable-dawn-features=disable_workgroup_init"

/**
 * The flags Dawn's instance is created with: its zero-filling of workgroup memory off
 * (GRADWIRE_WEBGPU_ZERO_WORKGROUP, core/settings.ts). A browser must zero a shader's workgroup
 * memory because any web page may ship a shader that reads it unwritten; the shaders here are
 * tfjs's and gradwire's, whose workgroup tiles are written before a barrier and then read. The
 * filling costs every dispatch: on the software adapter about half of each step (the webgpu
 * tests' CNN and pipeline runs 79 -> 44 s).
 */
export const dawnFlags = (zeroWorkgroup = webgpuZeroWorkgroup.read()): string[] => (zeroWorkgroup ? [] : [DISABLE_WORKGROUP_INIT])

/**
 * Dawn's GPU as navigator.gpu, with WebGPU's globals (GPUBufferUsage, GPUMapMode, ...), once per
 * process. Dawn keeps the process alive while navigator.gpu holds it: the processes that load it
 * (workers, the probe) end with process.exit.
 */
export const installWebGpu = async (): Promise<GpuLike> => {
  if (installed) return installed
  const dawn = (await import("webgpu" as string)) as DawnModule
  Object.assign(globalThis, dawn.globals)
  const flags = dawnFlags()
  const gpu = dawn.create(flags)
  const g = globalThis as { navigator?: object }
  if (g.navigator === undefined) g.navigator = {}
  Object.defineProperty(g.navigator, "gpu", { value: gpu, configurable: true, writable: true })
  installed = gpu
  installedFlags = flags
  return gpu
}

// The CPU rasterizers Vulkan drivers and Dawn offer in place of a GPU.
const SOFTWARE_RENDERERS = /swiftshader|llvmpipe|lavapipe|softpipe|microsoft basic render/i

/** Whether an adapter is a software rasterizer rather than a GPU. Pure. */
export const isSoftwareAdapter = (a: Pick<WebGpuAdapterInfo, "vendor" | "architecture" | "device" | "description">, fallback = false): boolean =>
  fallback || SOFTWARE_RENDERERS.test([a.vendor, a.architecture, a.device, a.description].join(" "))

const describeAdapter = (a: GpuAdapterLike): WebGpuAdapterInfo => {
  const info = {
    vendor: a.info?.vendor ?? "",
    architecture: a.info?.architecture ?? "",
    device: a.info?.device ?? "",
    description: a.info?.description ?? ""
  }
  const software = isSoftwareAdapter(info, a.info?.isFallbackAdapter === true || a.isFallbackAdapter === true)
  return {
    ...info,
    maxBufferSize: a.limits.maxBufferSize,
    maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
    ...(software ? { software } : {})
  }
}

/** The adapter's name for messages: "SwiftShader driver 5.0.0", else vendor and architecture. */
export const adapterName = (a: WebGpuAdapterInfo): string =>
  a.description || [a.vendor, a.architecture].filter(Boolean).join(" ") || "an unnamed adapter"

/** Why a software adapter is refused, and how to accept it for tests. */
export const softwareRefused = (a: WebGpuAdapterInfo): string =>
  `the only WebGPU adapter is ${adapterName(a)}, a software rasterizer, not a GPU ` +
  "(set GRADWIRE_WEBGPU_SOFTWARE=1 on the node to run the webgpu path on it for testing)"

/** Reason text of the "no adapter" answer; the probe adds what Dawn printed about why. */
export const NO_ADAPTER = "no WebGPU adapter (Dawn found no GPU with a driver it can use)"

/**
 * Loads Dawn and asks it for the high-performance adapter, tfjs's choice too. Never throws: a
 * package that does not load, no adapter, and a request past `timeoutMs` each come back as a reason.
 */
export const requestWebGpuAdapter = async (timeoutMs = 10_000, allowSoftware = webgpuSoftware.read()): Promise<WebGpuAdapterResult> => {
  let gpu: GpuLike
  try {
    gpu = await installWebGpu()
  } catch (e) {
    return { ok: false, reason: `the webgpu package does not load: ${firstLine(e)}` }
  }
  try {
    const adapter = await withinDeadline(gpu.requestAdapter({ powerPreference: "high-performance" }), timeoutMs, "Dawn's requestAdapter")
    if (adapter === null) return { ok: false, reason: NO_ADAPTER }
    const info = describeAdapter(adapter)
    if (info.software && !allowSoftware) return { ok: false, reason: softwareRefused(info), adapter: info }
    return { ok: true, adapter: info }
  } catch (e) {
    return { ok: false, reason: firstLine(e) }
  }
}
