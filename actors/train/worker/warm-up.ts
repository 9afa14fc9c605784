// A standby worker's warm-up (worker-run.ts prepare): training steps of a small model of its own,
// through the paths a prepared model's steps take (a batch gathered from an in-memory shard and
// made tensors, the forward and backward pass under the optimizer's computeGradients, gradwire's
// fused Adam on wasm, the loss read back; every few steps an evaluation pass), before the standby
// says it is ready. A fresh process runs those paths slowly for its first seconds (V8 compiles and
// optimises them as they get hot, the wasm code tiers up), and a group steps at its slowest
// member's pace: a cold replacement held its warm peers back for 10-30 s after each fault
// (docs/benchmarks.md). The warm-up makes that wait happen while the group runs short-handed.
//
// It leaves nothing behind: its layers and variables are named under its own prefix (so a model the
// loop builds later gets the same layer and weight names as in a fresh process), every tensor and
// variable it made is disposed, and the numbers tfjs gave its optimizer's unnamed variables are
// given back. Its data are made up and its initial weights seeded, so no
// unseeded random generator (Math.random, which tfjs's unseeded initializers draw on) is used.
import { batchTensors, fitBatch, type ShardSource } from "./batches.ts"
import { fusedAdamStep } from "../../../core/kernels/fused-adam.ts"
import type { Tf } from "../../../core/engine.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar

/** Layer, weight and model names of the warm-up's model start with this. */
export const WARM_UP_PREFIX = "gradwire_warm_up"

const DEFAULT_FEATURES = 32
const DEFAULT_HIDDEN = 64
const CLASSES = 10
const ROWS = 256
const BATCH = 32
/** An evaluation pass every this many steps, as a loop's per-epoch evaluation. */
const EVALUATE_EVERY = 8
/** The event loop gets a turn at least this often (the actor answers asks meanwhile). */
const TURN_EVERY_MS = 20

export interface WarmUpOptions {
  /** Stop after this long (wall clock). */
  readonly maxMs: number
  /** Stop after this many training steps. */
  readonly maxSteps: number
  /** Input features and hidden units of its model (32 and 64): another size runs the same code (bench/warm-up-steps.ts). */
  readonly features?: number
  readonly hidden?: number
}

export interface WarmUpResult {
  readonly steps: number
  readonly ms: number
}

/** Runs the warm-up on `tf`'s active backend until either bound; resolves with what it did. */
export const warmUpTraining = async (tf: Tf, options: WarmUpOptions): Promise<WarmUpResult> => {
  const t0 = performance.now()
  if (!(options.maxMs > 0) || !(options.maxSteps > 0)) return { steps: 0, ms: 0 }
  const features = options.features ?? DEFAULT_FEATURES
  const hidden = options.hidden ?? DEFAULT_HIDDEN
  const t = tf as unknown as typeof import("@tensorflow/tfjs")
  // tfjs's engine: its registered variables, and (on its class) the counter that numbers variables made without a name.
  const engine = tf.engine() as unknown as { registeredVariables: Record<string, unknown>; constructor: { nextVariableId?: number } }
  const firstVariableId = engine.constructor.nextVariableId ?? 0
  const x = new Float32Array(ROWS * features)
  for (let i = 0; i < x.length; i++) x[i] = Math.sin(i * 0.37) * 0.5
  const y = new Int32Array(ROWS)
  for (let i = 0; i < ROWS; i++) y[i] = (i * 7) % CLASSES
  const source: ShardSource = { dataset: { x, y, size: ROWS, featureShape: [features], numClasses: CLASSES }, rows: () => [] }
  const model = t.sequential({
    name: WARM_UP_PREFIX,
    layers: [
      t.layers.dense({ name: `${WARM_UP_PREFIX}_hidden`, units: hidden, activation: "relu", inputShape: [features], kernelInitializer: t.initializers.glorotUniform({ seed: 1 }) }),
      t.layers.dense({ name: `${WARM_UP_PREFIX}_output`, units: CLASSES, activation: "softmax", kernelInitializer: t.initializers.glorotUniform({ seed: 2 }) })
    ]
  })
  const optimizer = t.train.adam(0.001)
  const vars = model.trainableWeights.map((w) => (w as unknown as { read(): import("@tensorflow/tfjs").Variable }).read())
  const rows = new Array<number>(BATCH)
  let steps = 0
  let lastTurn = performance.now()
  try {
    while (steps < options.maxSteps && performance.now() - t0 < options.maxMs) {
      for (let i = 0; i < BATCH; i++) rows[i] = (steps * BATCH + i) % ROWS
      const b = await fitBatch(source, rows)
      const { x: xs, y: ys, yLoss } = batchTensors(tf, b, true, (labels) => t.oneHot(labels as import("@tensorflow/tfjs").Tensor1D, CLASSES))
      let pred: Tensor | undefined
      const { value, grads } = optimizer.computeGradients(() => {
        const out = model.apply(xs, { training: true }) as Tensor
        pred = t.keep(out)
        return t.metrics.categoricalCrossentropy(yLoss, out).mean() as Scalar
      }, vars)
      const correct = t.tidy(() => pred!.argMax(-1).equal(ys).sum())
      pred!.dispose()
      if (!fusedAdamStep(tf, optimizer, grads)) optimizer.applyGradients(grads as Record<string, import("@tensorflow/tfjs").Variable>)
      await Promise.all([value.data(), correct.data()])
      t.dispose([value, correct, xs, ys, yLoss, ...Object.values(grads)])
      steps++
      if (steps % EVALUATE_EVERY === 0) {
        const loss = t.tidy(() => t.metrics.categoricalCrossentropy(t.oneHot(t.tensor1d(y.subarray(0, BATCH), "int32"), CLASSES), model.apply(t.tensor2d(x.subarray(0, BATCH * features), [BATCH, features]), { training: false }) as Tensor).mean())
        await loss.data()
        loss.dispose()
      }
      if (performance.now() - lastTurn >= TURN_EVERY_MS) {
        await new Promise<void>((resolve) => setImmediate(resolve))
        lastTurn = performance.now()
      }
    }
  } finally {
    optimizer.dispose()
    model.dispose()
    // Adam's slots are variables without a name, numbered by tfjs's engine: the numbers the
    // warm-up took are given back, so that a loop's own unnamed variables get the numbers they get
    // in its peers' processes. (Only when none of those numbers is still in use.)
    const counter = engine.constructor
    if (typeof counter.nextVariableId === "number" && counter.nextVariableId > firstVariableId) {
      const taken = Object.keys(engine.registeredVariables).some((name) => /^\d+$/.test(name) && Number(name) >= firstVariableId)
      if (!taken) counter.nextVariableId = firstVariableId
    }
  }
  return { steps, ms: performance.now() - t0 }
}
