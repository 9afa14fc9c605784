// The training loop of the `strategy` benchmark (bench/strategy.ts): the digits model trained
// with Adam under whatever collectiveConfig.strategy the Trainer runs (all-reduce, or parameter
// servers in sync / async / SSP mode, with or without backup workers), one rank made a straggler
// by real extra compute. Every rank reports once, at the end: its per-step timestamps (wall-clock
// ms, comparable across the processes of this machine), the ms in dp.trainStep and in the extra
// compute, which of its gradients were applied, its staleness, the CPU time its process used, and
// the held-out accuracy of the final model.
//
// The straggler: the slowed rank does `slowFactor - 1` extra forward/backward passes of the model
// on a batch of the same size before each step, results discarded, so its compute per step is
// slowFactor times the others' (the same kernels, nothing simulated). A sleep would leave the CPU
// free to the other ranks; on a machine with fewer cores than workers that hides the real cost of
// a slow device, which competes for the cores like any other process (see the report's CPU use).
//
// How work is split (`split`):
//   "equal"  dp.fit(): every rank does floor(shard / batch) steps on its own shard per epoch, and
//            every epoch ends with the metrics all-reduce (a barrier). What a loop written like
//            examples/digits/train.ts gets: async or backup workers cannot let the fast ranks do
//            the straggler's share, they only stop waiting inside an epoch.
//   "shared" dp.trainStep() in a loop, each rank cycling through its shard, until the gradients
//            applied by the whole group reach epochs * floor(train / batch) (the same number as
//            "equal" applies): fast ranks take over the straggler's share when the strategy lets
//            them run ahead. The group's progress is the parameter servers' version (updates
//            applied), which each push's answer carries; this loop reads it by wrapping
//            PsClient.prototype.onParams for its length (restored in `finally`; the wrapper only
//            notes the version). With the all-reduce every rank does the same steps.
//
// Final accuracy: with parameter servers, after every rank has stopped pushing (dp.finish(), then
// a barrier) rank 0 pulls the servers' parameters into its model and evaluates that: the model the
// job trained, not whichever copy a rank last received.
import type { TrainContext } from "../../index.ts"
import { gatherRows } from "../../core/datasets.ts"
import { PsClient } from "../../actors/train/ps-client.ts"
import type { PsParams } from "../../actors/train/train-protocol.ts"
import { buildModel, type ModelKind } from "../../examples/digits/model.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar

export interface StrategyLoopConfig {
  /** Passes over the training data, counted in gradients applied (see `split`). Default 5. */
  readonly epochs?: number
  /** Per-rank batch. Default 32. */
  readonly batchSize?: number
  /** Adam's learning rate. Default 0.01. */
  readonly learningRate?: number
  readonly model?: ModelKind
  /** Default "shared". */
  readonly split?: "equal" | "shared"
  /** The straggler's rank and its compute factor (1: none). */
  readonly slowRank?: number
  readonly slowFactor?: number
  /** Gradients applied per server update, to turn the servers' version into gradients: 1 (async, ssp), N - b (sync). */
  readonly gradientsPerUpdate?: number
}

/** What every rank reports (once, at the end). */
export interface StrategyRankReport {
  readonly rank: number
  readonly backend: string
  readonly parameters: number
  /** Wall-clock ms (performance.timeOrigin + now) when each step returned, and when the first began. */
  readonly stamps: number[]
  readonly start: number
  /** Per step: 1 when its gradient went into an update, 0 when a server dropped it. */
  readonly applied: number[]
  /** Per step: ms in dp.trainStep (forward/backward, exchange, apply) and in the straggler's extra compute. */
  readonly stepMs: number[]
  readonly burnMs: number[]
  /** CPU ms (user + system) this process used from the first step to the last. */
  readonly cpuMs: number
  readonly staleness: number
  readonly stalenessMax: number
  readonly dropped: number
  /** The group's gradients applied when this rank stopped ("shared", parameter servers). */
  readonly groupGradients: number
  /** Held-out accuracy of the final model (rank 0; NaN elsewhere). */
  readonly valAccuracy: number
  readonly valLoss: number
  readonly leakedTensors: number
}

export async function strategyLoop(config: StrategyLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const epochs = config.epochs ?? 5
  const batch = config.batchSize ?? 32
  const split = config.split ?? "shared"
  const slow = ctx.worldRank === (config.slowRank ?? -1) ? Math.max(1, config.slowFactor ?? 1) : 1
  const extraPasses = Math.round(slow - 1)
  const perUpdate = config.gradientsPerUpdate ?? 1

  // The servers' newest version as this rank has seen it (every push's answer carries it).
  const versions: number[] = []
  const proto = PsClient.prototype as unknown as { onParams: (m: PsParams) => void }
  const original = proto.onParams
  let client: PsClient | undefined
  proto.onParams = function (this: PsClient, m: PsParams) {
    client = this
    if (m.error === undefined) versions[m.server] = Math.max(versions[m.server] ?? 0, m.version)
    return original.call(this, m)
  }
  const groupGradients = (): number => (versions.length === 0 ? 0 : Math.min(...versions) * perUpdate)

  const owned: Tensor[] = []
  const model = buildModel(tf, config.model ?? "mlp")
  const optimizer = tf.train.adam(config.learningRate ?? 0.01)
  try {
    model.compile({ optimizer, loss: "categoricalCrossentropy" })
    const dp = await ctx.prepareModel(model)
    const ps = dp.batchingMetrics()["ps/dropped"] !== undefined
    const shard = await ctx.getDatasetShard("train")
    const train = shard.dataset
    const test = await ctx.getDataset("test")
    const stepsPerEpoch = Math.floor(shard.size / batch)
    // What the group applies in all: the same under both splits and every strategy.
    const target = epochs * stepsPerEpoch * ctx.worldSize

    // The straggler's extra compute: forward/backward passes on a fixed batch, gradients discarded.
    const vars = model.trainableWeights.map((w) => w.read() as import("@tensorflow/tfjs").Variable)
    const burnRows = Array.from(shard.rows(0).subarray(0, batch))
    const burnBatch = gatherRows(train, burnRows)
    const burnX = tf.tensor(burnBatch.x, [batch, ...train.featureShape])
    const burnY = tf.oneHot(tf.tensor1d(burnBatch.y, "int32"), train.numClasses)
    owned.push(burnX, burnY)
    const burn = (): number => {
      const t0 = performance.now()
      for (let i = 0; i < extraPasses; i++) {
        const { value, grads } = tf.variableGrads(() => tf.metrics.categoricalCrossentropy(burnY, model.apply(burnX, { training: true }) as Tensor).mean() as Scalar, vars)
        // Read back like trainStep does, so the work is really done.
        void value.dataSync()
        tf.dispose([value, ...Object.values(grads)])
      }
      return performance.now() - t0
    }

    const now = (): number => performance.timeOrigin + performance.now()
    const stamps: number[] = []
    const applied: number[] = []
    const stepMs: number[] = []
    const burnMs: number[] = []
    let droppedSoFar = 0
    const record = (ms: number): void => {
      stamps.push(now())
      stepMs.push(ms)
      const d = ps ? Number(dp.batchingMetrics()["ps/dropped"]) : 0
      applied.push(d > droppedSoFar ? 0 : 1)
      droppedSoFar = d
    }
    // Warm the kernels up (both passes' shapes) before the clock starts.
    burn()
    const tensorsBefore = tf.memory().numTensors
    const cpu0 = process.cpuUsage()
    const start = now()

    if (split === "equal") {
      let t0 = performance.now()
      await dp.fit(shard, {
        epochs,
        batchSize: batch,
        onStep: () => {
          record(performance.now() - t0)
          burnMs.push(burn())
          t0 = performance.now()
        }
      })
    } else {
      let pass = 0
      let rows = shard.rows(pass)
      let pos = 0
      const done = (): boolean => (ps ? groupGradients() >= target : stamps.length >= epochs * stepsPerEpoch)
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
          burnMs.push(burn())
          const t0 = performance.now()
          await dp.trainStep(x, y)
          record(performance.now() - t0)
        } finally {
          tf.dispose([x, labels, y])
        }
      }
    }
    const cpu = process.cpuUsage(cpu0)
    const leaked = tf.memory().numTensors - tensorsBefore
    const seen = groupGradients()
    // Nobody waits for this rank any more; once every rank is here the servers hold the final model.
    await dp.finish()
    await ctx.communicator.barrier()
    let val = { loss: Number.NaN, accuracy: Number.NaN as number | undefined }
    if (ctx.worldRank === 0) {
      if (ps && client) {
        const flat = await client.pull(dp.parameterCount)
        for (const [i, s] of dp.layout.entries()) {
          const t = tf.tensor(flat.subarray(s.offset, s.offset + s.size), s.shape as number[], "float32")
          vars[i]!.assign(t)
          t.dispose()
        }
      }
      const xTest = tf.tensor(test.x, [test.size, ...test.featureShape])
      const yTest = tf.oneHot(tf.tensor1d(test.y, "int32"), test.numClasses)
      val = dp.evaluate(xTest, yTest)
      tf.dispose([xTest, yTest])
    }
    const m = dp.batchingMetrics()
    const report: StrategyRankReport = {
      rank: ctx.worldRank,
      backend: ctx.backend,
      parameters: dp.parameterCount,
      stamps,
      start,
      applied,
      stepMs,
      burnMs,
      cpuMs: (cpu.user + cpu.system) / 1000,
      staleness: Number(m["ps/staleness"] ?? 0),
      stalenessMax: Number(m["ps/staleness_max"] ?? 0),
      dropped: Number(m["ps/dropped"] ?? 0),
      groupGradients: seen,
      valAccuracy: val.accuracy ?? Number.NaN,
      valLoss: val.loss,
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
