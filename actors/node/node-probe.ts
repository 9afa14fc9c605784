// What a node has: CPU cores, memory, GPUs (from nvidia-smi when present) and which tfjs backends
// load here, with the WebGPU adapter Dawn finds when the webgpu packages are installed. Backends
// are probed in child processes with a deadline, because a broken native module (tfjs-node built
// for another CUDA, a missing libtensorflow, dawn.node in a broken driver) can crash or hang the
// process that loads it, and the agent must survive that. Results are cached in the agent's state
// dir, keyed by everything that could change them (Node version, platform, installed tfjs
// packages, Vulkan drivers).
import { execFile, spawn } from "node:child_process"
import { createRequire } from "node:module"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { FAST_START_ARGS } from "../../core/fast-start.ts"
import { vulkanDriverFiles, vulkanIcdFilenames, webgpuSoftware } from "../../core/settings.ts"
import { NO_ADAPTER, WEBGPU_PACKAGES, adapterName, type WebGpuAdapterInfo } from "../../core/webgpu.ts"

export interface GpuInfo {
  readonly index: number
  readonly name: string
  readonly memoryMiB: number
  /** A software WebGPU adapter standing in for a GPU (GRADWIRE_WEBGPU_SOFTWARE=1): tests only. */
  readonly software?: boolean
}

export type BackendName = "tensorflow-gpu" | "webgpu" | "tensorflow" | "wasm" | "cpu"
export const ALL_BACKENDS: ReadonlyArray<BackendName> = ["tensorflow-gpu", "webgpu", "tensorflow", "wasm", "cpu"]

export interface BackendProbe {
  /** Backends that loaded, best first. */
  readonly backends: ReadonlyArray<BackendName>
  /** Why each other candidate did not (not installed, failed, timed out, no adapter). */
  readonly errors: Readonly<Record<string, string>>
  /** The WebGPU adapter Dawn found (also when tfjs then failed on it). */
  readonly webgpu?: WebGpuAdapterInfo
}

const require = createRequire(import.meta.url)

const resolvable = (pkg: string): string | undefined => {
  try {
    return require.resolve(`${pkg}/package.json`)
  } catch {
    try {
      return require.resolve(pkg)
    } catch {
      return undefined
    }
  }
}

const versionOf = (pkg: string): string => {
  const file = resolvable(pkg)
  if (!file || !file.endsWith("package.json")) return file ? "?" : "-"
  try {
    return (JSON.parse(fs.readFileSync(file, "utf8")) as { version?: string }).version ?? "?"
  } catch {
    return "?"
  }
}

/** Parses `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`. */
export const parseNvidiaSmi = (text: string): GpuInfo[] =>
  text
    .split("\n")
    .map((line) => line.trim())
    .filter(Boolean)
    .flatMap((line) => {
      const parts = line.split(",").map((p) => p.trim())
      if (parts.length < 3) return []
      const index = Number(parts[0])
      const memoryMiB = Number(parts[parts.length - 1].replace(/\s*MiB$/i, ""))
      const name = parts.slice(1, -1).join(", ")
      return Number.isInteger(index) && Number.isFinite(memoryMiB) ? [{ index, name, memoryMiB }] : []
    })

/** GPUs nvidia-smi reports; none when it is absent, fails or takes longer than `timeoutMs`. */
export const probeGpus = (timeoutMs = 5_000): Promise<GpuInfo[]> =>
  new Promise((resolve) => {
    execFile(
      "nvidia-smi",
      ["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
      { timeout: timeoutMs, windowsHide: true },
      (error, stdout) => resolve(error ? [] : parseNvidiaSmi(String(stdout)))
    )
  })

const PROBE_SCRIPT = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "./backend-probe.ts" : "./backend-probe.js", import.meta.url))

interface ChildProbe {
  /** Per backend: true, or why not. */
  readonly results: Map<BackendName, string | true>
  readonly adapter?: WebGpuAdapterInfo
  /** The child's last stderr (Dawn says there why it found no adapter). */
  readonly stderr: string
}

/** Runs the probe script for `backends` in one child; results per backend, missing ones as errors. */
const probeInChild = (backends: ReadonlyArray<BackendName>, timeoutMs: number, env: NodeJS.ProcessEnv): Promise<ChildProbe> =>
  new Promise((resolve) => {
    const results = new Map<BackendName, string | true>()
    let adapter: WebGpuAdapterInfo | undefined
    const child = spawn(process.execPath, [...FAST_START_ARGS, PROBE_SCRIPT, ...backends], { stdio: ["ignore", "pipe", "pipe"], env })
    let out = ""
    let err = ""
    child.stdout.setEncoding("utf8").on("data", (c: string) => (out += c))
    child.stderr.setEncoding("utf8").on("data", (c: string) => (err = (err + c).slice(-2_000)))
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
    child.on("error", (e) => {
      clearTimeout(timer)
      for (const b of backends) results.set(b, `probe could not start: ${e.message}`)
      resolve({ results, stderr: err })
    })
    child.on("exit", (code, signal) => {
      clearTimeout(timer)
      for (const line of out.split("\n")) {
        try {
          const r = JSON.parse(line) as { backend: BackendName; ok: boolean; error?: string; adapter?: WebGpuAdapterInfo }
          results.set(r.backend, r.ok ? true : (r.error ?? "failed"))
          if (r.adapter) adapter = r.adapter
        } catch {
          // not a result line
        }
      }
      for (const b of backends) {
        if (results.has(b)) continue
        const why = signal === "SIGKILL" ? `timed out after ${timeoutMs} ms` : signal ? `probe died of ${signal}` : `probe exited with code ${code}`
        const tail = err.trim().split("\n").slice(-3).join(" | ")
        results.set(b, tail ? `${why}: ${tail}` : why)
      }
      resolve({ results, stderr: err, ...(adapter ? { adapter } : {}) })
    })
  })

export interface WebGpuProbe {
  readonly ok: boolean
  /** Why not: not installed, no adapter (with what Dawn printed about why), failed, timed out. */
  readonly error?: string
  readonly adapter?: WebGpuAdapterInfo
}

/**
 * Whether the "webgpu" backend loads here, tried in a child of its own (dawn.node inside a broken
 * driver may crash or hang it). Spawns nothing when the webgpu packages are not installed.
 */
export const probeWebGpu = async (timeoutMs = 60_000): Promise<WebGpuProbe> => {
  const missing = WEBGPU_PACKAGES.filter((p) => !resolvable(p))
  if (missing.length > 0) return { ok: false, error: `${missing.join(" and ")} ${missing.length === 1 ? "is" : "are"} not installed` }
  const child = await probeInChild(["webgpu"], timeoutMs, process.env)
  const r = child.results.get("webgpu") ?? "failed"
  const adapter = child.adapter ? { adapter: child.adapter } : {}
  if (r === true) return { ok: true, ...adapter }
  // Dawn prints why it found nothing ("Warning: Couldn't load Vulkan: libvulkan.so.1: ...").
  const dawn = /^(?:Warning|Error): (.+)$/m.exec(child.stderr)?.[1]
  return { ok: false, error: r === NO_ADAPTER && dawn ? `${r}: ${dawn}` : r, ...adapter }
}

// Where Vulkan's loader finds drivers: installing one must not leave a stale "no adapter" cached.
const VULKAN_ICD_DIRS = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"]
const vulkanDrivers = (): string =>
  [
    ...VULKAN_ICD_DIRS.flatMap((d) => {
      try {
        return fs.readdirSync(d)
      } catch {
        return []
      }
    }),
    vulkanIcdFilenames.read(),
    vulkanDriverFiles.read()
  ].join(",")

export interface ProbeBackendsOptions {
  /** Where to cache the result (a file in the agent's state dir); no cache when undefined. */
  readonly cacheFile?: string
  /** Deadline per probe child. Default 60 s (loading tfjs on a busy 2-core machine is slow). */
  readonly timeoutMs?: number
  /** GPUs found, so tensorflow-gpu is only tried where there is a GPU. */
  readonly gpus: ReadonlyArray<GpuInfo>
}

export const cacheKey = (gpus: ReadonlyArray<GpuInfo>): string =>
  [
    process.version,
    os.platform(),
    os.arch(),
    ...["@tensorflow/tfjs", "@tensorflow/tfjs-backend-wasm", "@tensorflow/tfjs-node", "@tensorflow/tfjs-node-gpu", ...WEBGPU_PACKAGES].map((p) => `${p}@${versionOf(p)}`),
    `gpus=${gpus.length}`,
    `vulkan=${vulkanDrivers()}`,
    `software=${webgpuSoftware.read()}`
  ].join("|")

/** Which tfjs backends load on this node (cached). Never throws. */
export const probeBackends = async (options: ProbeBackendsOptions): Promise<BackendProbe> => {
  const key = cacheKey(options.gpus)
  if (options.cacheFile) {
    try {
      const cached = JSON.parse(fs.readFileSync(options.cacheFile, "utf8")) as { key: string } & BackendProbe
      if (cached.key === key) return { backends: cached.backends, errors: cached.errors, ...(cached.webgpu ? { webgpu: cached.webgpu } : {}) }
    } catch {
      // no cache yet, or unreadable: probe
    }
  }
  const timeoutMs = options.timeoutMs ?? 60_000
  const errors: Record<string, string> = {}
  const ok = new Set<BackendName>()
  const runs: Array<Promise<void>> = []
  let webgpu: WebGpuAdapterInfo | undefined
  const collect = ({ results }: ChildProbe): void => {
    for (const [b, r] of results) {
      if (r === true) ok.add(b)
      else errors[b] = r
    }
  }
  // Native backends each in their own child: one crashing must not hide the others.
  if (!resolvable("@tensorflow/tfjs-node-gpu")) errors["tensorflow-gpu"] = "@tensorflow/tfjs-node-gpu is not installed"
  else if (options.gpus.length === 0) errors["tensorflow-gpu"] = "no GPU found (nvidia-smi absent or lists none)"
  else runs.push(probeInChild(["tensorflow-gpu"], timeoutMs, process.env).then(collect))
  if (!resolvable("@tensorflow/tfjs-node")) errors.tensorflow = "@tensorflow/tfjs-node is not installed"
  // tfjs-node must not grab a GPU while probing.
  else runs.push(probeInChild(["tensorflow"], timeoutMs, { ...process.env, CUDA_VISIBLE_DEVICES: "" }).then(collect))
  runs.push(probeInChild(["wasm", "cpu"], timeoutMs, process.env).then(collect))
  runs.push(
    probeWebGpu(timeoutMs).then((w) => {
      if (w.ok) ok.add("webgpu")
      else errors.webgpu = w.error ?? "failed"
      webgpu = w.adapter
    })
  )
  await Promise.all(runs)
  const result: BackendProbe = { backends: ALL_BACKENDS.filter((b) => ok.has(b)), errors, ...(webgpu ? { webgpu } : {}) }
  if (options.cacheFile) {
    try {
      fs.mkdirSync(path.dirname(options.cacheFile), { recursive: true })
      const tmp = `${options.cacheFile}.${process.pid}.tmp`
      fs.writeFileSync(tmp, JSON.stringify({ key, ...result }))
      fs.renameSync(tmp, options.cacheFile)
    } catch {
      // caching is an optimisation
    }
  }
  return result
}

/**
 * A node's GPUs to hand out: nvidia-smi's, or, where it lists none and webgpu loaded on a software
 * adapter (possible only with GRADWIRE_WEBGPU_SOFTWARE=1), that adapter as `count` GPUs marked
 * software (it runs on the CPU, so it can be shared), so useGpu webgpu workers can run the GPU
 * code path in tests. Pure.
 */
export const softwareGpus = (
  gpus: ReadonlyArray<GpuInfo>,
  backends: ReadonlyArray<string>,
  webgpu: WebGpuAdapterInfo | undefined,
  count = 1
): GpuInfo[] =>
  gpus.length === 0 && webgpu?.software === true && backends.includes("webgpu")
    ? Array.from({ length: Math.max(1, count) }, (_, index) => ({ index, name: `${adapterName(webgpu)} (software)`, memoryMiB: 0, software: true }))
    : [...gpus]

export interface NodeHardware {
  readonly hostname: string
  readonly cpus: number
  readonly memoryBytes: number
  readonly gpus: ReadonlyArray<GpuInfo>
}

export const probeHardware = async (): Promise<NodeHardware> => ({
  hostname: os.hostname(),
  cpus: typeof os.availableParallelism === "function" ? os.availableParallelism() : os.cpus().length,
  memoryBytes: os.totalmem(),
  gpus: await probeGpus()
})
