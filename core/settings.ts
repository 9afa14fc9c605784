// Every environment variable gradwire reads, in one place, each with its default and what it does.
// The rest of the code reads them only through here (test/settings.test.ts fails on a
// `process.env.X` anywhere else), and docs/environment.md's table of environment variables is
// checked against this list by the same test, so the two cannot drift apart.
//
// Each setting is read when its caller needs it, not once at import: a process started with a
// different environment (a worker, a test's child, an A/B run) sees its own.
//
// Any client of the bus may set a GRADWIRE_* variable for the processes a node agent spawns
// (actors/node/env-policy.ts allows the prefix), so no GRADWIRE_ variable may name code, a library
// or a binary to load: such a setting gets a name outside the prefix.
import * as os from "node:os"
import * as path from "node:path"

export interface Setting<T> {
  /** The variable's name. */
  readonly name: string
  /** What applies when it is unset, as docs/environment.md shows it. */
  readonly default: string
  /** One line: what it does. */
  readonly description: string
  /** True for variables that are not gradwire's own (CI, PATH): listed, but under their usual meaning. */
  readonly standard?: boolean
  /** The value now. */
  read(): T
}

const raw = (name: string): string | undefined => process.env[name]

/** "0" switches off; anything else (or unset) leaves on. */
const onUnlessZero = (name: string): boolean => raw(name) !== "0"

export const LOG_LEVELS = ["debug", "info", "warn", "error", "silent"] as const
export type LogLevel = (typeof LOG_LEVELS)[number]

/** Log level of the actor runtime, node agents and workers. An unknown value means info. */
export const logLevel: Setting<LogLevel> = {
  name: "GRADWIRE_LOG",
  default: "info",
  description: `log level of the actor runtime, node agents and workers: ${LOG_LEVELS.join(", ")}`,
  read: () => {
    const v = (raw("GRADWIRE_LOG") ?? "info").toLowerCase()
    return (LOG_LEVELS as readonly string[]).includes(v) ? (v as LogLevel) : "info"
  }
}

/** The gradwire cluster name the CLI uses without --cluster (undefined: unset). */
export const clusterName: Setting<string | undefined> = {
  name: "GRADWIRE_CLUSTER",
  default: "default",
  description: "cluster name of `gradwire start/status` when --cluster is not given",
  read: () => raw("GRADWIRE_CLUSTER")
}

/** NATS address(es) the CLI joins without --address (undefined: unset). */
export const clusterAddress: Setting<string | undefined> = {
  name: "GRADWIRE_ADDRESS",
  default: "none (status: the local agent's, else nats://127.0.0.1:4222)",
  description: "NATS server(s) `gradwire start/status` join when --address is not given",
  read: () => raw("GRADWIRE_ADDRESS")
}

/** Where a node agent keeps its state, log and the head's JetStream data. */
export const stateDir: Setting<string> = {
  name: "GRADWIRE_STATE_DIR",
  default: "~/.gradwire",
  description: "where a node agent keeps agent.json, agent.log and the head's JetStream data (CLI: --state-dir)",
  read: () => raw("GRADWIRE_STATE_DIR") || path.join(os.homedir(), ".gradwire")
}

/** The token the dashboard requires (undefined: unset, then one is made up when a token is required). */
export const dashboardToken: Setting<string | undefined> = {
  name: "GRADWIRE_DASHBOARD_TOKEN",
  default: "unset (a random one, printed, when a token is required)",
  description: "the token `gradwire dashboard` and `runConfig.dashboard` require (with it: always), e.g. to keep a Prometheus scrape config valid across restarts",
  read: () => raw("GRADWIRE_DASHBOARD_TOKEN") || undefined
}

/** Whether gradwire's WebAssembly SIMD kernels (the data path's, and the wasm backend's on its heap) may be used. */
export const simd: Setting<boolean> = {
  name: "GRADWIRE_SIMD",
  default: "1",
  description: "0 runs the data path's scalar loops instead of its WebAssembly SIMD kernels (same bits), and the wasm backend's kernels without gradwire's SIMD kernels on its heap (matmuls, convolutions and their gradients (depthwise too, Winograd's for 3x3 at stride 1), max-pool, ReLU and clip gradients, normalization, the LSTM and GRU cells, transposes, Adam)",
  read: () => onUnlessZero("GRADWIRE_SIMD")
}

/** Whether the wasm heap's kernels may sum with relaxed SIMD's fused multiply-add (core/kernels/heap-simd.ts). */
export const fma: Setting<boolean> = {
  name: "GRADWIRE_FMA",
  default: "1",
  description: "0 keeps the wasm heap kernels' multiplies and adds apart (two roundings, the same bits on every CPU) instead of relaxed SIMD's fused multiply-add in the products, convolutions, layer normalization and the LSTM and GRU cells (one rounding where the CPU has an FMA; zoo steps 1.01-1.20x faster)",
  read: () => onUnlessZero("GRADWIRE_FMA")
}

/** Whether 3x3 convolutions at stride 1 on wasm run as Winograd's F(4x4, 3x3) (core/kernels/conv2d.ts). */
export const winograd: Setting<boolean> = {
  name: "GRADWIRE_WINOGRAD",
  default: "1",
  description: "0 runs 3x3 convolutions at stride 1 on wasm (and their gradients) by the direct kernels instead of Winograd's F(4x4, 3x3), which does a quarter of the multiply-adds (1.3-4.9x faster) and differs from them by float32 rounding of its transforms (about 2e-6 of the outputs' scale)",
  read: () => onUnlessZero("GRADWIRE_WINOGRAD")
}

/** Whether plain TCP NATS connections read into pooled buffers (core/nats-internals/read.ts). */
export const natsReadPool: Setting<boolean> = {
  name: "GRADWIRE_NATS_READ_POOL",
  default: "1",
  description: "0 lets NATS sockets read into a fresh buffer per read (Node's own reads) instead of pooled ones",
  read: () => onUnlessZero("GRADWIRE_NATS_READ_POOL")
}

/** The address a worker's direct collective links listen on and advertise (undefined: where it reaches the bus from). */
export const directHost: Setting<string | undefined> = {
  name: "GRADWIRE_DIRECT_HOST",
  default: "the local address of the worker's NATS connection",
  description: "address a worker's direct links (collectiveConfig.transport) listen on and peers dial, e.g. on a machine with several networks",
  read: () => raw("GRADWIRE_DIRECT_HOST") || undefined
}

/** The nats-server binary to run (undefined: look on PATH). */
export const natsServerBin: Setting<string | undefined> = {
  name: "NATS_SERVER_BIN",
  default: "nats-server on PATH",
  description: "the nats-server binary of the embedded cluster and `gradwire start --head`; no fallback when set",
  read: () => raw("NATS_SERVER_BIN") || undefined
}

/** Whether this runs under CI (set, and not "false" or "0"). */
export const ci: Setting<boolean> = {
  name: "CI",
  default: "unset",
  description: "set (not false or 0): live progress prints plain lines instead of a bar, as when not on a TTY",
  standard: true,
  read: () => {
    const v = raw("CI")
    return !!v && v !== "false" && v !== "0"
  }
}

/** The directories of PATH. */
export const searchPath: Setting<string[]> = {
  name: "PATH",
  default: "the system's",
  description: "searched for nats-server (then /usr/sbin, /usr/local/bin, /opt/homebrew/bin, /usr/bin) when NATS_SERVER_BIN is unset, and by a node agent for util-linux's chrt (a lowered process starts on SCHED_IDLE through it)",
  standard: true,
  read: () => (raw("PATH") ?? "").split(path.delimiter).filter(Boolean)
}

/** The Vulkan loader's driver list (which GPUs Dawn sees): "" when unset. */
export const vulkanIcdFilenames: Setting<string> = {
  name: "VK_ICD_FILENAMES",
  default: "unset",
  description: "the Vulkan loader's driver manifests (which GPUs the webgpu backend sees); part of the key of a node agent's cached backend probe",
  standard: true,
  read: () => raw("VK_ICD_FILENAMES") ?? ""
}

/** The newer name of VK_ICD_FILENAMES. */
export const vulkanDriverFiles: Setting<string> = {
  name: "VK_DRIVER_FILES",
  default: "unset",
  description: "the same, under the Vulkan loader's newer name",
  standard: true,
  read: () => raw("VK_DRIVER_FILES") ?? ""
}

/**
 * Whether a node's probe and the webgpu engine accept a software WebGPU adapter (SwiftShader,
 * lavapipe): "1" for CI and tests of the GPU code path on a machine without a GPU. Off by default.
 */
export const webgpuSoftware: Setting<boolean> = {
  name: "GRADWIRE_WEBGPU_SOFTWARE",
  default: "0",
  description:
    "1: the webgpu backend accepts a software adapter (SwiftShader) and an agent without a GPU advertises it as one software GPU, " +
    "so useGpu webgpu workers run the GPU code path in CI (slowly; never chosen for speed)",
  read: () => raw("GRADWIRE_WEBGPU_SOFTWARE") === "1"
}

/**
 * Dawn's zero-filling of each compute shader's workgroup memory (core/webgpu.ts): WebGPU requires
 * it of a browser, whose shaders come from any web page; gradwire runs only tfjs's and its own,
 * which write their workgroup tiles before they read them. Off unless "1".
 */
export const webgpuZeroWorkgroup: Setting<boolean> = {
  name: "GRADWIRE_WEBGPU_ZERO_WORKGROUP",
  default: "0",
  description:
    "1: Dawn zero-fills every compute shader's workgroup memory before it runs, as WebGPU requires of a browser; 0: it does not " +
    "(tfjs's shaders and gradwire's write their workgroup tiles before reading them; on the software adapter the filling took about half of every step)",
  read: () => raw("GRADWIRE_WEBGPU_ZERO_WORKGROUP") === "1"
}

/**
 * Which program computes a convolution's filter gradient on webgpu (core/kernels/conv-grads-webgpu.ts):
 * gradwire's, summing over the batch in parallel, unless "tfjs" (tfjs's own, one thread per filter
 * weight), for A/B runs and for telling a numerical difference apart.
 */
export const webgpuConvFilter: Setting<"gradwire" | "tfjs"> = {
  name: "GRADWIRE_WEBGPU_CONV_FILTER",
  default: "gradwire",
  description:
    "tfjs: a convolution's filter gradient on webgpu runs tfjs's own program (one GPU thread per filter weight, looping over the whole batch) " +
    "instead of gradwire's, which sums over the batch in parallel; for A/B runs",
  read: () => (raw("GRADWIRE_WEBGPU_CONV_FILTER") === "tfjs" ? "tfjs" : "gradwire")
}

/** Strategy auto's moves at its decision rounds, given instead of its cost model's (actors/train/worker/strategies/auto.ts). */
export const autoPlan: Setting<string[]> = {
  name: "GRADWIRE_AUTO_PLAN",
  default: "unset (the cost model's choice)",
  description:
    "strategy `auto`'s choice at its decision rounds, one name per round, comma-separated (e.g. local-sgd,allreduce), instead of its cost model's (which it still explains beside it); after the list, its own: to reproduce a run's moves, or to time one strategy against another in the same job. Read in the worker processes (set it alike on every node); a name `auto` cannot move to fails the run with a ConfigError",
  read: () =>
    (raw("GRADWIRE_AUTO_PLAN") ?? "")
      .split(",")
      .map((x) => x.trim())
      .filter((x) => x.length > 0)
}

/** Warm actor processes a node agent keeps (actors/node/agent.ts warmHosts). */
export const warmHosts: Setting<number> = {
  name: "GRADWIRE_WARM_HOSTS",
  default: "1",
  description:
    "actor processes a node agent (the embedded cluster's, `gradwire start`'s) keeps started with tfjs loaded, so a replacement worker starts warm; 0: every process starts cold (`gradwire start --warm-hosts N` overrides)",
  read: () => {
    const n = Number(raw("GRADWIRE_WARM_HOSTS") ?? "1")
    return Number.isInteger(n) && n >= 0 ? n : 1
  }
}

/**
 * How much lower (nice steps) a standby worker's process runs until it is let into its group
 * (actors/train/driver/worker-group.ts); read by the driver, which passes it to the standby's
 * process as GRADWIRE_START_NICE.
 */
export const standbyNice: Setting<number> = {
  name: "GRADWIRE_STANDBY_NICE",
  default: "19",
  description:
    "nice steps a standby worker (a replacement started while its group runs short-handed, or a spare) runs lower while it loads its engine and imports the loop (3 s at most), and so does a node agent's warm process on a node whose cores its processes reserve (kept there once a standby has started on it), so that on cores the running workers share they take what the workers leave idle; raised back as the standby joins, or as a spawn takes the warm process; after a standby that did not start in time lowered (cores other work keeps busy), the job's later standbys start unlowered. Only where it can be raised back (root, CAP_SYS_NICE or RLIMIT_NICE; Linux); 0: not lowered",
  read: () => {
    const n = Number(raw("GRADWIRE_STANDBY_NICE") ?? "19")
    return Number.isFinite(n) && n >= 0 ? Math.min(19, Math.round(n)) : 19
  }
}

/** Whether a lowered process (standbyNice) also runs on Linux's SCHED_IDLE policy (core/priority.ts). */
export const standbySchedIdle: Setting<boolean> = {
  name: "GRADWIRE_STANDBY_SCHED_IDLE",
  default: "1",
  description:
    "whether a process lowered by GRADWIRE_STANDBY_NICE also runs on Linux's SCHED_IDLE scheduling policy while lowered (set with util-linux's chrt; the nice value alone without it): a nice-19 process still runs out its time slice when a worker wakes on its core, a SCHED_IDLE one gives way at once; read from the lowered process's environment (a worker inherits its node agent's), where the agent that starts it already reads it to start it on SCHED_IDLE; 0: the nice value alone",
  read: () => raw("GRADWIRE_STANDBY_SCHED_IDLE") !== "0"
}

/** How long at most a standby worker warms its training paths before it says it is ready (actors/train/worker/warm-up.ts). */
export const standbyWarmUpMs: Setting<number> = {
  name: "GRADWIRE_STANDBY_WARM_UP_MS",
  default: "10000",
  description:
    "milliseconds at most a standby worker (a replacement, or a spare) on the wasm or cpu backend trains a small model of its own after it loaded its engine and before it says it is ready, stopping sooner once it has made GRADWIRE_STANDBY_WARM_UP_STEPS steps: a fresh process runs a training step's code slowly until V8 has optimized it (GRADWIRE_TURBOFAN_AFTER calls), and a group steps at its slowest member's pace; on an idle core 600 steps take under a second, where the running workers keep the cores busy the lowered standby gets little of them and takes longer; read in the worker's process; 0: no warm-up",
  read: () => {
    const n = Number(raw("GRADWIRE_STANDBY_WARM_UP_MS") ?? "10000")
    return Number.isFinite(n) && n >= 0 ? Math.min(60_000, Math.round(n)) : 10_000
  }
}

/** The training steps after which a standby worker's warm-up stops, its time not yet out (standbyWarmUpMs). */
export const standbyWarmUpSteps: Setting<number> = {
  name: "GRADWIRE_STANDBY_WARM_UP_STEPS",
  default: "600",
  description:
    "training steps after which a standby worker's warm-up (GRADWIRE_STANDBY_WARM_UP_MS) stops and it says it is ready: a step's own functions run once a step and V8 optimizes them after GRADWIRE_TURBOFAN_AFTER calls (500), so 600 leaves them optimized or compiling; read in the worker's process; at most 100000",
  read: () => {
    const n = Number(raw("GRADWIRE_STANDBY_WARM_UP_STEPS") ?? "600")
    return Number.isInteger(n) && n > 0 ? Math.min(100_000, n) : 600
  }
}

/** Invocations after which V8 optimizes a function in a worker joining a running group, or a replacement parameter server (core/tier-up.ts). */
export const turbofanAfter: Setting<number> = {
  name: "GRADWIRE_TURBOFAN_AFTER",
  default: "500",
  description:
    "invocations after which V8 optimizes a function with TurboFan in a worker that joins a running group (a standby or a replacement) and in a parameter server that takes a lost one's place (V8's --invocation-count-for-turbofan, 3000 of its own), from when its loop is imported (a server: from its start): a training step's own functions run once a step, so at V8's count a replacement reaches full speed only after some 3000 steps (20-40 s of a small model's) and holds its warm peers to its pace meanwhile; a group that starts together keeps V8's count; read in the worker's or server's process; 0: V8's own",
  read: () => {
    const n = Number(raw("GRADWIRE_TURBOFAN_AFTER") ?? "500")
    return Number.isInteger(n) && n >= 0 ? Math.min(1_000_000, n) : 500
  }
}

/** Set by the driver for a standby worker's process (standbyNice): what its host lowers itself by at start. */
export const startNice: Setting<number> = {
  name: "GRADWIRE_START_NICE",
  default: "0",
  description:
    "set by the driver in a standby worker's environment (from GRADWIRE_STANDBY_NICE): the nice steps its process runs lower until it joins a group; not meant to be set by hand",
  read: () => {
    const n = Number(raw("GRADWIRE_START_NICE") ?? "0")
    return Number.isFinite(n) && n > 0 ? Math.min(19, Math.round(n)) : 0
  }
}

/**
 * Where the processes gradwire starts keep compiled code and stripped TypeScript across starts
 * (bin/fast-start.js reads it there: it runs before any TypeScript could; this entry documents it).
 * Outside the GRADWIRE_ prefix: it says where code is loaded from.
 */
export const cacheDir: Setting<string | undefined> = {
  name: "GW_CACHE_DIR",
  default: "$XDG_CACHE_HOME/gradwire, else ~/.cache/gradwire",
  description:
    "where started processes (workers, servers, agents, the CLI) keep compiled code, and in a checkout the stripped TypeScript, across starts; made with mode 0700, not used when another user could write to it; off: no cache",
  read: () => raw("GW_CACHE_DIR") || undefined
}

/** The base of the default cache directory (XDG Base Directory). */
export const xdgCacheHome: Setting<string | undefined> = {
  name: "XDG_CACHE_HOME",
  default: "~/.cache",
  description: "the base of the default GW_CACHE_DIR",
  standard: true,
  read: () => raw("XDG_CACHE_HOME") || undefined
}

/** Node's own options variable: the TypeScript flags in it reach the processes an agent starts. */
export const nodeOptions: Setting<string[]> = {
  name: "NODE_OPTIONS",
  default: "unset",
  description:
    "Node's options; with --experimental-transform-types (or --no-experimental-strip-types) in it, or on node's command line, the processes a node agent starts (workers, warm processes) get the same flag",
  standard: true,
  read: () => (raw("NODE_OPTIONS") ?? "").split(/\s+/).filter((a) => a.length > 0)
}

/** Every variable gradwire reads, in docs/environment.md's order. */
export const SETTINGS: ReadonlyArray<Setting<unknown>> = [
  logLevel,
  clusterName,
  clusterAddress,
  stateDir,
  dashboardToken,
  simd,
  fma,
  winograd,
  natsReadPool,
  directHost,
  webgpuSoftware,
  webgpuZeroWorkgroup,
  webgpuConvFilter,
  autoPlan,
  warmHosts,
  standbyNice,
  standbySchedIdle,
  standbyWarmUpMs,
  standbyWarmUpSteps,
  turbofanAfter,
  startNice,
  cacheDir,
  natsServerBin,
  ci,
  searchPath,
  vulkanIcdFilenames,
  vulkanDriverFiles,
  xdgCacheHome,
  nodeOptions
]

/** Variables gradwire sets for the worker processes it starts (a training loop may read them). */
export const WORKER_ENVIRONMENT: ReadonlyArray<{ readonly name: string; readonly description: string }> = [
  { name: "GRADWIRE_RANK", description: "the worker's rank in the group (also ctx.worldRank)" },
  { name: "GRADWIRE_WORLD_SIZE", description: "the number of workers (also ctx.worldSize)" },
  { name: "CUDA_VISIBLE_DEVICES", description: "the GPUs placed for the worker (\"\" for a CPU worker)" },
  { name: "TF_FORCE_GPU_ALLOW_GROWTH", description: "\"true\" for a worker that shares its GPU (resourcesPerWorker.GPU < 1): tfjs-node-gpu then takes GPU memory as it needs it, not all at start" }
]
