// The training loop of the `zero` benchmark (bench/zero.ts): a dense MLP (1024 -> 2048 -> 2048 ->
// 10 by default, 6.3M parameters) trained with Adam on seeded synthetic batches through
// dp.trainStep, under whatever collectiveConfig.zeroStage the Trainer runs. Every rank reports once,
// at the end: its ms per trainStep after the warm-up steps (median), dp.memoryStats(), the bytes
// its NATS connections sent and received per timed step, and the tensors the timed steps left
// behind (0 when nothing leaks). With `breakdown`, the pieces of a step are then timed one by one
// on the same group (forward/backward and gradient read-back, ring all-reduce, reduce-scatter,
// all-gather, per-variable assign, the flat JS Adam on a segment, tfjs Adam on the whole model).
//
// Bytes on the wire: the communicator keeps no byte counters, so the loop reads the NATS client's
// own ones (NatsConnection.stats(): outBytes/inBytes, payload plus headers) on every connection of
// this worker process that published during the window. It finds them by wrapping
// NatsConnectionImpl.prototype.publish for the length of the loop (restored in `finally`); the
// wrapper only notes the connection.
import { seededRng } from "../../core/random.ts"
import type { TrainContext } from "../../index.ts"
import { NatsConnectionImpl } from "@nats-io/nats-core/internal"
import { createFlatOptimizer, flatOptimizerSpecOf } from "../../actors/train/common/optim/flat-optimizers.ts"
import { median } from "../../scheduler/cost-model.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar
type Variable = import("@tensorflow/tfjs").Variable

export interface ZeroBenchConfig {
  /** trainStep calls in all, warm-up included. Default 12. */
  readonly steps?: number
  /** Steps left out of the timing. Default 3. */
  readonly warmup?: number
  /** Per-rank batch. Default 32. */
  readonly batch?: number
  readonly input?: number
  readonly hidden?: number
  readonly classes?: number
  /** Synthetic data and initializer seed. Default 7. */
  readonly seed?: number
  /** Time the pieces of a step after the timed steps. Default false. */
  readonly breakdown?: boolean
  /** Repetitions per piece (median). Default 5. */
  readonly breakdownReps?: number
  /** prepareModel's clipNorm (at stage 2, the group's norm summed from every rank's segment). Default none. */
  readonly clipNorm?: number
}

interface WireCounter {
  /** Starts a window: every known connection's counters become its baseline. */
  start(): void
  /** Bytes sent and received since start() over the connections seen. */
  read(): { sent: number; received: number }
  restore(): void
}

type Stats = { inBytes: number; outBytes: number }
type Conn = { stats(): Stats }

const wireCounter = (): WireCounter => {
  const proto = NatsConnectionImpl.prototype as unknown as { publish: (...args: unknown[]) => unknown }
  const original = proto.publish
  const base = new Map<Conn, Stats>()
  proto.publish = function (this: Conn, ...args: unknown[]) {
    // A connection first seen inside a window counts from just before this message.
    if (!base.has(this)) base.set(this, { ...this.stats() })
    return original.apply(this, args)
  }
  return {
    start() {
      for (const c of base.keys()) base.set(c, { ...c.stats() })
    },
    read() {
      let sent = 0
      let received = 0
      for (const [c, b] of base) {
        const s = c.stats()
        sent += s.outBytes - b.outBytes
        received += s.inBytes - b.inBytes
      }
      return { sent, received }
    },
    restore() {
      proto.publish = original
    }
  }
}

export async function zeroBenchLoop(config: ZeroBenchConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const steps = config.steps ?? 12
  const warmup = config.warmup ?? 3
  const batch = config.batch ?? 32
  const input = config.input ?? 1024
  const hidden = config.hidden ?? 2048
  const classes = config.classes ?? 10
  const seed = config.seed ?? 7
  if (!(steps > warmup)) throw new Error(`zeroBenchLoop: steps (${steps}) must be more than warmup (${warmup})`)
  const wire = wireCounter()
  const owned: Tensor[] = []
  let model: import("@tensorflow/tfjs").Sequential | undefined
  let optimizer: import("@tensorflow/tfjs").Optimizer | undefined
  try {
    const init = (s: number) => tf.initializers.glorotUniform({ seed: seed * 100 + s })
    model = tf.sequential()
    model.add(tf.layers.dense({ units: hidden, activation: "relu", inputShape: [input], kernelInitializer: init(1) }))
    model.add(tf.layers.dense({ units: hidden, activation: "relu", kernelInitializer: init(2) }))
    model.add(tf.layers.dense({ units: classes, activation: "softmax", kernelInitializer: init(3) }))
    optimizer = tf.train.adam(1e-3)
    model.compile({ optimizer, loss: "categoricalCrossentropy" })
    const dp = await ctx.prepareModel(model, config.clipNorm !== undefined ? { clipNorm: config.clipNorm } : {})

    // Two seeded batches per rank (different data on each rank), cycled.
    const next = seededRng(seed * 7919 + ctx.worldRank)
    const batches = Array.from({ length: 2 }, () => {
      const x = new Float32Array(batch * input)
      for (let i = 0; i < x.length; i++) x[i] = next() * 2 - 1
      const labels = Int32Array.from({ length: batch }, () => Math.floor(next() * classes))
      const xt = tf.tensor2d(x, [batch, input])
      const lt = tf.tensor1d(labels, "int32")
      const yt = dp.lossTargets(lt, classes)
      lt.dispose()
      owned.push(xt, yt)
      return { x: xt, y: yt }
    })

    const times: number[] = []
    const losses: number[] = []
    let tensorsBefore = 0
    for (let i = 0; i < steps; i++) {
      if (i === warmup) {
        tensorsBefore = tf.memory().numTensors
        wire.start()
      }
      const b = batches[i % batches.length]!
      const t0 = performance.now()
      const r = await dp.trainStep(b.x, b.y)
      const ms = performance.now() - t0
      losses.push(r.loss)
      if (i >= warmup) times.push(ms)
    }
    const timed = steps - warmup
    const bytes = wire.read()
    const leaked = tf.memory().numTensors - tensorsBefore
    const mem = await dp.memoryStats()

    const metrics: Record<string, unknown> = {
      rank: ctx.worldRank,
      world_size: ctx.worldSize,
      backend: ctx.backend,
      zero_stage: dp.zeroStage,
      parameters: dp.parameterCount,
      batch,
      timed_steps: timed,
      step_ms: median(times),
      step_ms_min: Math.min(...times),
      step_ms_max: Math.max(...times),
      step_ms_each: times.map((t) => t.toFixed(0)).join(" "),
      optimizer_state_bytes: mem.optimizerState,
      reduced_gradient_bytes: mem.reducedGradient,
      gradient_buffer_bytes: mem.gradientBuffers,
      parameter_buffer_bytes: mem.parameterBuffers,
      sent_bytes_per_step: bytes.sent / timed,
      received_bytes_per_step: bytes.received / timed,
      leaked_tensors: leaked,
      loss_first: losses[0],
      loss_last: losses.at(-1)
    }
    if (config.breakdown) Object.assign(metrics, await breakdown(ctx, dp, batches[0]!, batch, config.breakdownReps ?? 5))
    await ctx.report(metrics)
  } finally {
    wire.restore()
    tf.dispose(owned.filter((t) => !t.isDisposed))
    // compile() with an optimizer instance leaves it to its owner: Adam's moments (stage 0) go here.
    optimizer?.dispose()
    model?.dispose()
  }
}

/**
 * The pieces of a step, each timed alone (median of `reps`) on every rank in the same order (the
 * collectives need all of them). Run after the timed steps: it changes the weights (tfjs Adam).
 */
async function breakdown(
  ctx: TrainContext,
  dp: Awaited<ReturnType<TrainContext["prepareModel"]>>,
  b: { x: Tensor; y: Tensor },
  batch: number,
  reps: number
): Promise<Record<string, number>> {
  const tf = ctx.tf
  const comm = ctx.communicator
  const p = ctx.worldSize
  const N = dp.parameterCount
  const S = Math.ceil(N / p)
  const vars = dp.model.trainableWeights.map((w) => w.read() as Variable)
  const time = async (f: () => unknown): Promise<number> => {
    const ms: number[] = []
    for (let i = 0; i < reps + 1; i++) {
      await new Promise<void>((resolve) => setImmediate(resolve))
      await comm.barrier()
      const t0 = performance.now()
      await f()
      if (i > 0) ms.push(performance.now() - t0)
    }
    return median(ms)
  }
  const out: Record<string, number> = {}
  // Forward/backward and the gradient read into one flat array (what every stage does first, p > 1).
  let flat: Float32Array = new Float32Array(N)
  out.bd_forward_backward_read_ms = await time(async () => {
    const { value, grads } = tf.variableGrads(() => tf.metrics.categoricalCrossentropy(b.y, dp.model.apply(b.x, { training: true }) as Tensor).mean() as Scalar, vars)
    const flatT = tf.tidy(() => tf.concat(vars.map((v) => grads[v.name]!.reshape([-1]))))
    flat = (await flatT.data()) as Float32Array
    tf.dispose([value, flatT, ...Object.values(grads)])
  })
  const work = new Float32Array(S * p)
  out.bd_allreduce_ring_ms = await time(async () => {
    work.subarray(0, N).set(flat)
    await comm.allReduce(work.subarray(0, N), { op: "weightedMean", weight: batch, algorithm: "ring" })
  })
  out.bd_reduce_scatter_ms = await time(async () => {
    work.subarray(0, N).set(flat)
    work.fill(0, N)
    await comm.reduceScatter(work, { op: "weightedMean", weight: batch })
  })
  const segment = new Float32Array(S)
  const gathered = new Float32Array(S * p)
  out.bd_all_gather_ms = await time(() => comm.allGather(segment, { out: gathered }))
  // #applyShard's per-variable copy back into the model (the model's own values, so a no-op update).
  const current = tf.tidy(() => tf.concat(vars.map((v) => v.reshape([-1]))))
  const values = current.dataSync() as Float32Array
  current.dispose()
  let offset = 0
  const slots = vars.map((v) => {
    const s = { offset, size: v.size, shape: [...v.shape] }
    offset += v.size
    return s
  })
  out.bd_assign_ms = await time(() => {
    slots.forEach((s, i) => {
      const t = tf.tensor(values.subarray(s.offset, s.offset + s.size), s.shape, "float32")
      vars[i]!.assign(t)
      t.dispose()
    })
  })
  // The flat JS Adam on this rank's segment (stage 1/2's optimizer step).
  const flatAdam = createFlatOptimizer(flatOptimizerSpecOf(dp.optimizer as unknown as Parameters<typeof flatOptimizerSpecOf>[0]), S)
  const params = values.slice(0, Math.min(S, N))
  const segGrad = flat.slice(0, params.length)
  out.bd_flat_adam_segment_ms = await time(() => flatAdam.step(params, segGrad, 0))
  // Stage 0's apply: tensors from the flat reduced gradient, then tfjs Adam on the whole model.
  const adam: import("@tensorflow/tfjs").Optimizer = tf.train.adam(1e-3)
  out.bd_tfjs_adam_whole_ms = await time(() => {
    const named: Record<string, Tensor> = {}
    slots.forEach((s, i) => (named[vars[i]!.name] = tf.tensor(flat.subarray(s.offset, s.offset + s.size), s.shape, "float32")))
    adam.applyGradients(named)
    tf.dispose(Object.values(named))
  })
  adam.dispose()
  return out
}
