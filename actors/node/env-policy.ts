// Which environment variables a spawn request may give the process it asks for. Any client of the
// bus can send a node agent a spawn request, so the request's `env` is held to the allow-list
// below: a variable such as NODE_OPTIONS ("--require /tmp/x.js"), LD_PRELOAD or a Vulkan driver
// manifest would make the child run code that --allow-module-root refuses (module-policy.ts). A
// request naming any other variable is refused whole (EnvNotAllowed), before anything starts.
// The agent's own environment, which its operator chose, still passes to every child.

/**
 * The variables a spawn request may set: exact names, and names ending in "*" that allow every
 * variable starting with what comes before it.
 */
export const SPAWN_ENV_ALLOWED: ReadonlyArray<string> = [
  // gradwire's own variables: the Trainer sets GRADWIRE_RANK and GRADWIRE_WORLD_SIZE for every
  // worker (core/settings.ts WORKER_ENVIRONMENT), and GRADWIRE_LOG, GRADWIRE_SIMD and the like are
  // per-process switches (core/settings.ts). None of them names code to load. The agent overrides
  // GRADWIRE_CLUSTER, _JOB, _ACTOR and _NODE_ID and drops GRADWIRE_ADDRESS (credentials go on stdin).
  "GRADWIRE_*",
  // The GPUs placed for a worker (the Trainer sets it per worker, "" for a CPU worker).
  "CUDA_VISIBLE_DEVICES",
  // How CUDA numbers the devices that CUDA_VISIBLE_DEVICES names.
  "CUDA_DEVICE_ORDER",
  // tfjs-node's TensorFlow: log level, thread pools, and GPU memory taken as needed rather than all
  // at once (several workers share one GPU).
  "TF_CPP_MIN_LOG_LEVEL",
  "TF_NUM_INTRAOP_THREADS",
  "TF_NUM_INTEROP_THREADS",
  "TF_FORCE_GPU_ALLOW_GROWTH",
  // OpenMP threads of the native kernels, to keep workers sharing a machine from oversubscribing it.
  "OMP_NUM_THREADS"
  // Deliberately not here: VK_ICD_FILENAMES and VK_DRIVER_FILES name driver manifests whose shared
  // libraries the child loads (LD_PRELOAD by another name); an operator sets them in the agent's
  // environment, which children inherit.
]

/** Whether a spawn request may set `name`. */
export const spawnEnvAllowed = (name: string): boolean =>
  SPAWN_ENV_ALLOWED.some((entry) => (entry.endsWith("*") ? name.startsWith(entry.slice(0, -1)) : name === entry))

/** The variables of a spawn request's env that are not allowed, sorted (empty: none). */
export const refusedSpawnEnv = (env: Readonly<Record<string, string>>): string[] => Object.keys(env).filter((k) => !spawnEnvAllowed(k)).sort()
