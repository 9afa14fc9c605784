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

/** The nodes' GPUs as a placement sees them (for the software adapter's note). */
interface NodeGpus {
  readonly nodeId: string
  readonly gpus: ReadonlyArray<{ readonly index: number; readonly name: string; readonly software?: boolean }>
}

/** "0-2,5" for ranks [0, 1, 2, 5]. */
const rankRanges = (ranks: readonly number[]): string => {
  const out: string[] = []
  for (let i = 0; i < ranks.length; ) {
    let j = i
    while (j + 1 < ranks.length && ranks[j + 1] === ranks[j]! + 1) j++
    out.push(i === j ? `${ranks[i]}` : `${ranks[i]}-${ranks[j]}`)
    i = j + 1
  }
  return out.join(",")
}

/**
 * One line for the start of a run: which backend each rank runs, where, and why (asked by name, or
 * "auto"'s order), with a note when a GPU is a software adapter. Pure.
 */
export const describeBackends = (
  ranks: ReadonlyArray<{ readonly rank: number; readonly nodeId: string; readonly backend: string; readonly gpuIndices: readonly number[]; readonly resources?: Readonly<Record<string, number>> }>,
  asked: string,
  useGpu: boolean | "auto",
  nodes: ReadonlyArray<NodeGpus> = []
): string => {
  const groups = new Map<string, number[]>()
  for (const r of ranks) {
    const key = `${r.backend} on ${r.nodeId}`
    groups.set(key, [...(groups.get(key) ?? []), r.rank])
  }
  const where = [...groups].map(([k, rs]) => `${k} (rank${rs.length === 1 ? "" : "s"} ${rankRanges(rs.sort((a, b) => a - b))})`).join(", ")
  const why =
    asked === "auto"
      ? `backend "auto": each node's fastest that loads there, ${
          useGpu === "auto"
            ? "tensorflow-gpu, then webgpu where a GPU is free (useGpu \"auto\"), else tensorflow, then wasm, then cpu"
            : useGpu
              ? "tensorflow-gpu, then webgpu"
              : "tensorflow, then wasm, then cpu"
        }`
      : `backend "${asked}"`
  const software = ranks.some((r) => nodes.find((n) => n.nodeId === r.nodeId)?.gpus.some((g) => g.software && r.gpuIndices.includes(g.index)))
  // wasm and cpu compute on one thread: cores reserved past one sit idle (libtensorflow's threads use them).
  const idle = Math.max(0, ...ranks.filter((r) => r.backend === "wasm" || r.backend === "cpu").map((r) => r.resources?.CPU ?? 1))
  return (
    `workers: ${where} (${why})` +
    (software ? "; their GPU is a software adapter (GRADWIRE_WEBGPU_SOFTWARE=1): this tests the GPU code path, not its speed" : "") +
    (idle > 1
      ? `; a wasm or cpu worker computes on one core, so resourcesPerWorker CPU ${idle} reserves ${idle} cores for each and it uses one: for more cores, run more workers of one CPU each`
      : "")
  )
}
