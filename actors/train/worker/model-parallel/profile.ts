// Measuring what each partition unit costs on this worker: its forward + backward on one
// micro-batch of random input, median of a few runs after a warm-up (the first call of a kernel
// compiles or allocates). Every rank measures the whole model; the ranks' numbers are summed over
// the group so every rank cuts the model the same way, and each rank's total says how fast its
// worker is (for mixed hardware).
import type { Tf } from "../../../../core/engine.ts"
import { runLayers, type ModelGraph } from "./graph.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.floor(s.length / 2)]
}

/** Median ms of forward + backward of `f` (from `input`, over `vars`) after one warm-up run. */
export const timeForwardBackward = async (tf: Tf, f: () => Tensor, input: Tensor, vars: ReadonlyArray<Tensor>, reps = 3): Promise<number> => {
  const probe = tf.tidy(f)
  const dy = tf.onesLike(probe)
  probe.dispose()
  const xs = input.dtype === "float32" ? [input, ...vars] : [...vars]
  // (reading one value waits for the work on backends that run asynchronously; read
  // asynchronously: webgpu in Node has no synchronous read-back)
  const once = async (): Promise<number> => {
    const t0 = performance.now()
    if (xs.length > 0) {
      const { value, grads } = tf.engine().gradients(f, xs, dy, true)
      await value.data()
      tf.dispose([value, ...grads.filter((g): g is Tensor => g !== null)])
    } else {
      const out = tf.tidy(f)
      await out.data()
      out.dispose()
    }
    return performance.now() - t0
  }
  try {
    await once()
    const times: number[] = []
    for (let i = 0; i < reps; i++) times.push(await once())
    return median(times)
  } finally {
    dy.dispose()
  }
}

/** A random micro-batch of per-sample `shape`. */
export const sampleInput = (tf: Tf, shape: ReadonlyArray<number>, rows: number, dtype: string): Tensor =>
  dtype === "int32" ? tf.zeros([rows, ...shape], "int32") : tf.randomNormal([rows, ...shape], 0, 1, "float32", 1)

/** ms per unit (forward + backward of `microBatch` rows). */
export const profileUnits = async (tf: Tf, graph: ModelGraph, microBatch: number, reps = 3): Promise<number[]> => {
  let x: Tensor = sampleInput(tf, graph.boundaries[0].shape, microBatch, graph.inputDtype)
  const out: number[] = []
  try {
    for (let u = 0; u + 1 < graph.unitStart.length; u++) {
      const a = graph.unitStart[u]
      const b = graph.unitStart[u + 1]
      const from = graph.boundaries[u].id
      const to = graph.boundaries[u + 1].id
      const input = x
      const f = (): Tensor => runLayers(graph.layers, a, b, from, to, input, true)
      const vars: Tensor[] = graph.layers.slice(a, b).flatMap((l) => l.layer.trainableWeights.map((w) => w.read()))
      out.push(await timeForwardBackward(tf, f, input, vars, reps))
      x = tf.tidy(f)
      input.dispose()
    }
  } finally {
    x.dispose()
  }
  return out
}
