// Child of test/fused-adam-webgpu.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): tfjs's Adam (applyGradients) and the fused webgpu update
// (core/kernels/fused-adam-webgpu.ts) from the same weights and gradients, over several steps, and
// the cases where the fused update must decline. Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { fusedAdamStepWebGpu } from "../../core/kernels/fused-adam-webgpu.ts"

const { tf } = await loadEngine("webgpu")
// One larger than a workgroup of 256 and one of several workgroups, besides the small ones.
const SHAPES = [[17, 9], [9], [3, 3, 2, 5], [1], [300, 70]]
let made = 0
const variables = (seed: number): TfType.Variable[] =>
  SHAPES.map((s, i) => tf.tidy(() => tf.variable(tf.randomNormal(s, 0, 1, "float32", seed + i), true, `fused_adam_gpu_${made++}`)))
const read = (ts: ReadonlyArray<TfType.Tensor>) => Promise.all(ts.map(async (t) => Array.from((await t.data()) as Float32Array)))

/** Largest |a - b| / max(1, |a|) over all elements. */
const worst = (a: number[][], b: number[][]): number => {
  let w = 0
  a.forEach((xs, i) => xs.forEach((x, k) => (w = Math.max(w, Math.abs(x - b[i]![k]!) / Math.max(1, Math.abs(x))))))
  return w
}

/** The optimizer state tfjs keeps private. */
interface AdamState {
  accBeta1: TfType.Variable
  accBeta2: TfType.Variable
  accumulatedFirstMoment: { variable: TfType.Variable }[]
  accumulatedSecondMoment: { variable: TfType.Variable }[]
  iterations: number
}
const a = variables(1)
const b = variables(1)
const oa = tf.train.adam(0.01, 0.8, 0.95, 1e-6)
const ob = tf.train.adam(0.01, 0.8, 0.95, 1e-6)
const sa = oa as unknown as AdamState
const sb = ob as unknown as AdamState
let fused = 0
const steps = 6
for (let step = 0; step < steps; step++) {
  const gs = SHAPES.map((s, i) => tf.randomNormal(s, 0, 1, "float32", 100 + 10 * step + i))
  oa.applyGradients(Object.fromEntries(a.map((v, i) => [v.name, gs[i]!])) as Record<string, TfType.Variable>)
  if (fusedAdamStepWebGpu(tf, ob, Object.fromEntries(b.map((v, i) => [v.name, gs[i]!])))) fused++
  tf.dispose(gs)
  // A read between steps caches the values on the CPU: the next fused step must not leave them stale.
  if (step === 2) await read(b)
}
const weights = worst(await read(a), await read(b))
const moments = worst(
  await read([...sa.accumulatedFirstMoment, ...sa.accumulatedSecondMoment].map((s) => s.variable)),
  await read([...sb.accumulatedFirstMoment, ...sb.accumulatedSecondMoment].map((s) => s.variable))
)
const acc = worst(await read([sa.accBeta1, sa.accBeta2]), await read([sb.accBeta1, sb.accBeta2]))
const iterations = [sa.iterations, sb.iterations]
// Declines: another optimizer; a weight whose buffer another tensor shares (a clone).
const g = { [b[0]!.name]: tf.onesLike(b[0]!) }
const sgd = fusedAdamStepWebGpu(tf, tf.train.sgd(0.1), g)
const clone = b[0]!.clone()
const shared = fusedAdamStepWebGpu(tf, tf.train.adam(0.1), g)
clone.dispose()
const alone = fusedAdamStepWebGpu(tf, tf.train.adam(0.1), g)
console.log(JSON.stringify({ backend: tf.getBackend(), fused, steps, weights, moments, acc, iterations, sgd, shared, alone }))
process.exit(0)
