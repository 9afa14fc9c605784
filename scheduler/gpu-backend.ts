// Which tfjs backend a GPU worker runs on a node: 'tensorflow-gpu' (libtensorflow with CUDA, from
// @tensorflow/tfjs-node-gpu) where it loads, else 'webgpu' (Dawn through the webgpu package) where
// the node's probe found an adapter and tfjs ran on it. Pure: placement asks it per node, and a
// node that loads neither takes no GPU worker.
import type { TfjsBackend } from "./resources.ts"

/** The GPU backends, best first. */
export const GPU_BACKENDS = ["tensorflow-gpu", "webgpu"] as const satisfies readonly TfjsBackend[]
export type GpuBackend = (typeof GPU_BACKENDS)[number]

export const isGpuBackend = (b: string): b is GpuBackend => (GPU_BACKENDS as readonly string[]).includes(b)

/**
 * The backend a GPU worker gets on a node that loads `backends`: the one asked for if it loads
 * there, or with "auto" the best that does; undefined when none does.
 */
export const gpuBackendFor = (backends: readonly string[], want: GpuBackend | "auto"): GpuBackend | undefined =>
  (want === "auto" ? GPU_BACKENDS : [want]).find((b) => backends.includes(b))
