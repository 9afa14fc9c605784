// The training loop of the `strategy` benchmark (bench/strategy.ts): the digits MLP trained with
// Adam under whatever collectiveConfig.strategy the Trainer runs (all-reduce, parameter servers in
// sync / async / SSP mode, backup workers, "auto"), one rank made a straggler by real extra
// compute. Every rank reports once, at the end: its per-step timestamps (wall-clock ms, comparable
// across the processes of this machine), the ms of each dp.trainStep and of the extra compute in
// it, which of its gradients were applied, its staleness, the CPU time its process used, and (rank
// 0) the held-out accuracy of the final model.
//
// The straggler: the slowed rank does `slowFactor - 1` extra forward/backward passes of the model
// on a batch of the same size in every step, results discarded, so its compute per step is
// slowFactor times the others' (the same kernels; nothing simulated). They run inside the step's
// forward/backward phase (the optimizer's computeGradients is wrapped on that rank), so the
// worker's compute/communication split, and strategy "auto"'s measurements, see them as compute,
// as they would a slower device's. A sleep would leave the CPU to the other ranks; on a machine
// with fewer cores than workers that hides what a slow device's work costs the others.
//
// How the work is split (`split`):
//   "equal"  dp.fit(): every rank does ceil(shard / batch) steps of its own shard per epoch, and
//            every epoch ends with the metrics all-reduce (a barrier). What a loop written like
//            examples/digits/train.ts gets: async servers or backup workers cannot hand the
//            straggler's share to the fast ranks, they only stop waiting inside an epoch.
//   "shared" dp.trainStep() in a loop, each rank cycling through its own shard, until the group
//            has applied epochs * N * ceil(shard / batch) gradients (what "equal" applies without
//            drops): fast ranks take over the straggler's share when the strategy lets them run
//            ahead. The group's progress is the parameter servers' version (updates applied) that
//            every push's answer carries, read by wrapping PsClient.prototype.onParams for the
//            length of the loop (restored in `finally`; the wrapper only notes the version). With
//            the all-reduce every rank does the same steps. With strategy "auto", until
//            dp.globalStep (the group's progress in synchronous steps' worth of gradients, whatever
//            auto runs on) reaches epochs * ceil(shard / batch).
// A trainStep() outside dp.fit() has no steps-per-epoch, and the worker then sends a progress
// message to the driver after every step (worker.ts: `info.step + 1 < info.stepsPerEpoch` never
// holds); "shared" passes the progress hook an unbounded epoch, so both splits send one per 250 ms.
//
// Final accuracy: with parameter servers, once every rank has stopped pushing (dp.finish(), then a
// barrier), rank 0 pulls the servers' parameters into its model and evaluates those: the model the
// job trained, not whichever copy a rank received last.
import { writeFile } from "node:fs/promises"
import type { TrainContext } from "../../index.ts"
import { gatherRows } from "../../core/datasets.ts"
import { PsClient } from "../../actors/train/worker/ps-client.ts"
import type { PsParams } from "../../actors/train/common/train-protocol.ts"
import { buildModel } from "../../examples/digits/model.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar
type Variable = import("@tensorflow/tfjs").Variable

export interface StrategyLoopConfig {
  /** Passes over the training data (see `split` for how they are counted). Default 10. */
  readonly epochs?: number
  /** Per-rank batch. Default 32. */
  readonly batchSize?: number
  /** Adam's learning rate. Default 0.01. */
  readonly learningRate?: number
  /** Default "shared". */
  readonly split?: "equal" | "shared"
  /** The straggler's rank and its compute factor (1: none; rounded to whole extra passes). */
  readonly slowRank?: number
  readonly slowFactor?: number
  /**
   * A cgroup (v1 cpu controller) directory with a CPU quota: the slowed rank moves its own process
   * into it at the start, and then does no extra passes (slowFactor is ignored): a real CPU limit,
   * as a slower device's worker has, which leaves the rest of the cores to the others.
   */
  readonly cpuCgroup?: string
}

/** What every rank reports (once, at the end). */
export interface StrategyRankReport {
  readonly rank: number
  readonly backend: string
  readonly parameters: number
  /** dp.strategy at the end ("allreduce", "parameter-server", or auto's pick), and auto's switches. */
  readonly strategy: string
  readonly switches: number
  /** Wall-clock ms (performance.timeOrigin + now) when the first step began and when each step returned. */
  readonly start: number
  readonly stamps: number[]
  /** Per step: 1 when its gradient went into an update, 0 when a server dropped it. */
  readonly applied: number[]
  /** Per step: ms in dp.trainStep, and of it the straggler's extra compute. */
  readonly stepMs: number[]
  readonly extraMs: number[]
  /** CPU ms (user + system) this process used from the first step to the last. */
  readonly cpuMs: number
  /** Parameter servers: mean and largest staleness of this rank's gradients, and how many were dropped. */
  readonly staleness: number
  readonly stalenessMax: number
  readonly dropped: number
  /** Held-out accuracy and loss of the final model (rank 0; NaN elsewhere). */
  readonly valAccuracy: number
  readonly valLoss: number
  /** Held-out accuracy of this rank's own copy of the model when it stopped (before any pull). */
  readonly localAccuracy: number
  /** Per step: the loss of this rank's batch. */
  readonly losses: number[]
  /** Tensors alive at the end that were not after the first step (0 when nothing leaks). */
  readonly leakedTensors: number
}

export async function strategyLoop(config: StrategyLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const epochs = config.epochs ?? 10
  const batch = config.batchSize ?? 32
  const split = config.split ?? "shared"
  const slowed = ctx.worldRank === (config.slowRank ?? -1)
  if (slowed && config.cpuCgroup) await writeFile(`${config.cpuCgroup}/cgroup.procs`, String(process.pid))
  const factor = slowed && !config.cpuCgroup ? Math.max(1, config.slowFactor ?? 1) : 1
  const extraPasses = Math.round(factor - 1)

  // The servers' version as this rank last heard it (every push's answer carries it), per server.
  const versions: number[] = []
  const proto = PsClient.prototype as unknown as { onParams: (m: PsParams) => void }
  const original = proto.onParams
  let client: PsClient | undefined
  proto.onParams = function (this: PsClient, m: PsParams) {
    client = this
    if (m.error === undefined) versions[m.server] = Math.max(versions[m.server] ?? 0, m.version)
    return original.call(this, m)
  }

  const owned: Tensor[] = []
  const model = buildModel(tf, "mlp")
  const optimizer = tf.train.adam(config.learningRate ?? 0.01)
  try {
    model.compile({ optimizer, loss: "categoricalCrossentropy" })
    const vars = model.trainableWeights.map((w) => w.read() as Variable)
    const shard = await ctx.getDatasetShard("train")
    const train = shard.dataset
    const test = await ctx.getDataset("test")

    // The straggler's extra compute: forward/backward passes on a fixed batch, gradients discarded,
    // run where the step's own forward/backward runs.
    const burnBatch = gatherRows(train, Array.from(shard.rows(0).subarray(0, batch)))
    const burnX = tf.tensor(burnBatch.x, [batch, ...train.featureShape])
    const burnY = tf.oneHot(tf.tensor1d(burnBatch.y, "int32"), train.numClasses)
    owned.push(burnX, burnY)
    let extraThisStep = 0
    const burn = (): void => {
      const t0 = performance.now()
      for (let i = 0; i < extraPasses; i++) {
        const { value, grads } = tf.variableGrads(() => tf.metrics.categoricalCrossentropy(burnY, model.apply(burnX, { training: true }) as Tensor).mean() as Scalar, vars)
        void value.dataSync() // read back, as the step does: the work is really done
        tf.dispose([value, ...Object.values(grads)])
      }
      extraThisStep += performance.now() - t0
    }
    if (extraPasses > 0) {
      const o = optimizer as unknown as { computeGradients: (...a: unknown[]) => unknown }
      const compute = o.computeGradients.bind(optimizer)
      o.computeGradients = (...a: unknown[]) => {
        burn()
        return compute(...a)
      }
    }

    const dp = await ctx.prepareModel(model)
    const viaServers = (): boolean => dp.batchingMetrics()["ps/dropped"] !== undefined
    const auto = dp.batchingMetrics().strategy !== undefined
    const stepsPerEpoch = Math.ceil(shard.size / batch)
    // "shared": what the group applies in all, the same under every strategy.
    const target = epochs * stepsPerEpoch * ctx.worldSize
    // Gradients in one server update: N - b for sync steps, one for async and SSP.
    const perUpdate = (): number => (client && client.options.mode === "sync" ? ctx.worldSize - client.options.backupWorkers : 1)
    const groupGradients = (): number => (versions.length === 0 ? 0 : Math.min(...versions) * perUpdate())

    const now = (): number => performance.timeOrigin + performance.now()
    const stamps: number[] = []
    const applied: number[] = []
    const stepMs: number[] = []
    const extraMs: number[] = []
    const losses: number[] = []
    let droppedSoFar = 0
    let tensorsAfterFirst = -1
    let t0 = performance.now()
    const record = (loss: number): void => {
      losses.push(loss)
      stamps.push(now())
      stepMs.push(performance.now() - t0)
      extraMs.push(extraThisStep)
      extraThisStep = 0
      const d = Number(dp.batchingMetrics()["ps/dropped"] ?? droppedSoFar)
      applied.push(d > droppedSoFar ? 0 : 1)
      droppedSoFar = d
      if (tensorsAfterFirst < 0) tensorsAfterFirst = tf.memory().numTensors
    }

    const cpu0 = process.cpuUsage()
    const start = now()
    if (split === "equal") {
      await dp.fit(shard, {
        epochs,
        batchSize: batch,
        onStep: (r) => {
          record(r.loss)
          t0 = performance.now()
        }
      })
    } else {
      const progress = dp.onStep
      if (progress) dp.onStep = (info) => progress({ ...info, stepsPerEpoch: Number.POSITIVE_INFINITY })
      // The all-reduce: every rank the same steps. Parameter servers: until the group applied the
      // target's gradients. Auto: until the group step (the same measure, whatever it runs on).
      const done = (): boolean =>
        auto ? dp.globalStep >= epochs * stepsPerEpoch : !viaServers() ? stamps.length >= epochs * stepsPerEpoch : groupGradients() >= target
      let pass = 0
      let rows = shard.rows(pass)
      let pos = 0
      while (!done()) {
        if (pos + batch > rows.length) {
          rows = shard.rows(++pass)
          pos = 0
        }
        const b = gatherRows(train, rows.subarray(pos, pos + batch))
        pos += batch
        const x = tf.tensor(b.x, [batch, ...train.featureShape])
        const labels = tf.tensor1d(b.y, "int32")
        const y = dp.lossTargets(labels, train.numClasses)
        try {
          t0 = performance.now()
          record((await dp.trainStep(x, y)).loss)
        } finally {
          tf.dispose([x, labels, y])
        }
      }
    }
    const cpu = process.cpuUsage(cpu0)
    const leaked = tf.memory().numTensors - tensorsAfterFirst
    const xTest = tf.tensor(test.x, [test.size, ...test.featureShape])
    const yTest = tf.oneHot(tf.tensor1d(test.y, "int32"), test.numClasses)
    owned.push(xTest, yTest)
    const local = dp.evaluate(xTest, yTest)
    // Nobody waits for this rank any more; once every rank is past the barrier the servers hold the final model.
    await dp.finish()
    await ctx.communicator.barrier()
    let val: { loss: number; accuracy?: number } = { loss: Number.NaN, accuracy: Number.NaN }
    if (ctx.worldRank === 0) {
      if (viaServers()) {
        if (!client) throw new Error("strategyLoop: trained on the parameter servers but heard from none")
        const flat = await client.pull(dp.parameterCount)
        dp.layout.forEach((s, i) => {
          const t = tf.tensor(flat.subarray(s.offset, s.offset + s.size), s.shape as number[], "float32")
          vars[i]!.assign(t)
          t.dispose()
        })
      }
      val = dp.evaluate(xTest, yTest)
    }
    const m = dp.batchingMetrics()
    const report: StrategyRankReport = {
      rank: ctx.worldRank,
      backend: ctx.backend,
      parameters: dp.parameterCount,
      strategy: dp.strategy,
      switches: Number(m["strategy/switches"] ?? 0),
      start,
      stamps,
      applied,
      stepMs,
      extraMs,
      cpuMs: (cpu.user + cpu.system) / 1000,
      staleness: Number(m["ps/staleness"] ?? 0),
      stalenessMax: Number(m["ps/staleness_max"] ?? 0),
      dropped: droppedSoFar,
      valAccuracy: val.accuracy ?? Number.NaN,
      valLoss: val.loss,
      localAccuracy: local.accuracy ?? Number.NaN,
      losses,
      leakedTensors: leaked
    }
    await ctx.report({ ...report })
  } finally {
    proto.onParams = original
    tf.dispose(owned.filter((t) => !t.isDisposed))
    optimizer.dispose()
    model.dispose()
  }
}
