// A hand-written training loop (dp.trainStep on batches it cuts itself, no dp.fit()) over the
// digits dataset: it resumes from the latest checkpoint, reports and checkpoints after every epoch,
// and with `kill` rank `kill.rank` of the first generation dies by kill -9 after step `kill.step`
// of epoch `kill.epoch`. With `holdFile`, a group smaller than the number written in that file
// slows each step while the file exists (hold.ts), as in chaos-loop.ts: the run cannot end before a
// short group grows back. With `corrupt`, rank `corrupt.rank` adds 0.001 to its first weight before
// the report of epoch `corrupt.epoch` (the state-parity check must notice and repair it). Recovery
// from surviving peers replays this loop on a replacement (test/peer-recovery.test.ts,
// test/elastic.test.ts). With `pidDir` every rank first writes its pid to
// <pidDir>/<attempt>-<rank>.pid, as chaos-loop.ts does, and with `positions` too it records where
// it got after each step it trained (positions.ts), for the chaos benchmark. With `busyMs`, every
// rank (or `busyRank`) holds its event loop that long in one synchronous stretch after epoch 0's
// report (as an evaluation whose awaits resolve at once does): its beats must come from its beat
// thread for it to count as alive; with `busyYields` it works as long with turns of its event loop
// (an evaluation that awaits between batches). With `extraStep`, rank `extraStep.rank` takes one
// step more than the others at the end of epoch `extraStep.epoch` (uneven shards cut without care):
// the ranks' collectives then mismatch. With `returnEarly`, one rank's loop ends epochs before the
// others'. With `globalStep`, each report says dp.globalStep; with `stepsFile` too, every process
// appends its group's size to that file for each step it trains (a group step is p such steps at
// size p), and each report also says the group steps the file holds (all processes', to the step).
// With `lagRank`, one rank waits before each of its steps (as chaos-loop.ts's).
import { appendFileSync, existsSync, readFileSync, writeFileSync } from "node:fs"
import * as path from "node:path"
import type { TrainContext } from "../../index.ts"
import { buildModel, weightsHashAsync } from "../../examples/digits/model.ts"
import { PositionFile } from "./positions.ts"
import { holdStep } from "./hold.ts"

export interface StepLoopConfig {
  readonly epochs: number
  readonly batchSize?: number
  /**
   * `killedFile`: the dying rank writes it first, and the others of the first generation wait for
   * it (up to 60 s) before their steps of the epoch after `epoch`: ranks that are not in lockstep
   * (asynchronous parameter servers) cannot run on to the end before the death on a loaded machine.
   */
  readonly kill?: { readonly rank: number; readonly epoch: number; readonly step: number; readonly killedFile?: string }
  readonly holdFile?: string
  readonly corrupt?: { readonly rank: number; readonly epoch: number }
  readonly pidDir?: string
  /** Needs pidDir (the position files go there). */
  readonly positions?: boolean
  /** After epoch 0's report, hold the event loop this long (a busy wait). */
  readonly busyMs?: number
  /** With busyMs: only this rank holds its loop (the others wait for it in their next collective). */
  readonly busyRank?: number
  /** With busyMs: work in 20 ms stretches with a turn of the event loop between them (an evaluation that awaits between its batches). */
  readonly busyYields?: boolean
  /** This rank takes one more step (its epoch's first batch again) at the end of this epoch. */
  readonly extraStep?: { readonly rank: number; readonly epoch: number }
  /** Rank `rank`'s loop returns after `epochs` epochs (a loop whose length depends on the rank). */
  readonly returnEarly?: { readonly rank: number; readonly epochs: number }
  /** Each report also says dp.globalStep (`global_step`). */
  readonly globalStep?: boolean
  /** With globalStep: the file every process appends its group's size to for each step it trains; each report also says the group steps made (`group_steps_made`, 1/p for each size p in it). */
  readonly stepsFile?: string
  /** Rank `rank` waits `ms` before each of its steps (a straggler). */
  readonly lagRank?: { readonly rank: number; readonly ms: number }
}

/** The group steps a stepsFile holds: 1/p for each group size p in it (one character a step). */
const groupStepsIn = (file: string): number => {
  if (!existsSync(file)) return 0
  let made = 0
  for (const c of readFileSync(file, "latin1")) made += 1 / Number(c)
  return made
}

export async function stepLoop(config: StepLoopConfig, ctx: TrainContext): Promise<void> {
  if (config.pidDir !== undefined) writeFileSync(path.join(config.pidDir, `${ctx.attempt}-${ctx.worldRank}.pid`), String(process.pid))
  const positions = config.positions && config.pidDir !== undefined ? new PositionFile(config.pidDir) : undefined
  const tf = ctx.tf
  const batchSize = config.batchSize ?? 32
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  const model = buildModel(tf, "mlp")
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  let start = 0
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) {
    await ctx.restoreModel(dp, checkpoint)
    start = Number(checkpoint.metadata?.epoch ?? -1) + 1
  }
  const xTest = tf.tensor2d(test.x, [test.size, 64])
  const yTest = tf.oneHot(tf.tensor1d(test.y, "int32"), 10)
  const { x: X, y: Y } = train.dataset
  const dies = config.kill !== undefined && ctx.worldRank === config.kill.rank && ctx.attempt === 0
  const epochs = config.returnEarly?.rank === ctx.worldRank ? config.returnEarly.epochs : config.epochs
  for (let epoch = start; epoch < epochs; epoch++) {
    const killed = config.kill?.killedFile
    if (killed !== undefined && !dies && ctx.attempt === 0 && epoch === config.kill!.epoch + 1) {
      for (const until = Date.now() + 60_000; !existsSync(killed) && Date.now() < until; ) await new Promise((resolve) => setTimeout(resolve, 50))
    }
    const rows = train.rows(epoch)
    let lossSum = 0
    let samples = 0
    const stepsPerEpoch = Math.ceil(rows.length / batchSize)
    for (let at = 0, step = 0; at < rows.length; at += batchSize, step++) {
      const batch = Array.from(rows.subarray(at, at + batchSize))
      const xs = new Float32Array(batch.length * 64)
      batch.forEach((r, i) => xs.set(X.subarray(r * 64, r * 64 + 64), i * 64))
      const x = tf.tensor2d(xs, [batch.length, 64])
      const y = tf.oneHot(tf.tensor1d(Int32Array.from(batch, (r) => Y[r]!), "int32"), 10)
      await holdStep(config.holdFile, ctx.worldSize)
      const size = ctx.worldSize
      if (config.lagRank?.rank === ctx.worldRank) await new Promise((resolve) => setTimeout(resolve, config.lagRank!.ms))
      const r = await dp.trainStep(x, y)
      tf.dispose([x, y])
      // A replayed step (a replacement catching up with the survivors) has no samples.
      if (r.samples > 0) {
        if (config.stepsFile !== undefined) appendFileSync(config.stepsFile, String(size))
        lossSum += r.loss * r.samples
        samples += r.samples
        positions?.step(ctx.attempt, ctx.worldRank, epoch, step, stepsPerEpoch)
      }
      if (dies && epoch === config.kill!.epoch && step === config.kill!.step) {
        if (config.kill!.killedFile !== undefined) writeFileSync(config.kill!.killedFile, String(process.pid))
        process.kill(process.pid, "SIGKILL")
      }
    }
    if (config.extraStep?.rank === ctx.worldRank && config.extraStep.epoch === epoch) {
      const batch = Array.from(rows.subarray(0, batchSize))
      const x = tf.tensor2d(Float32Array.from(batch.flatMap((r) => Array.from(X.subarray(r * 64, r * 64 + 64)))), [batch.length, 64])
      const y = tf.oneHot(tf.tensor1d(Int32Array.from(batch, (r) => Y[r]!), "int32"), 10)
      await dp.trainStep(x, y)
      tf.dispose([x, y])
    }
    if (config.corrupt && config.corrupt.rank === ctx.worldRank && config.corrupt.epoch === epoch) {
      const [w0, ...rest] = model.getWeights()
      const bumped = tf.add(w0!, 0.001)
      model.setWeights([bumped, ...rest])
      bumped.dispose()
    }
    const val = await dp.evaluateAsync(xTest, yTest)
    const metrics = {
      epoch,
      loss: lossSum / Math.max(1, samples),
      val_accuracy: val.accuracy ?? 0,
      weights: await weightsHashAsync(model.getWeights()),
      ...(config.globalStep ? { global_step: dp.globalStep } : {}),
      ...(config.globalStep && config.stepsFile !== undefined ? { group_steps_made: groupStepsIn(config.stepsFile) } : {})
    }
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report(metrics, ckpt ? { checkpoint: ckpt } : {})
    if (config.busyMs !== undefined && epoch === 0 && (config.busyRank === undefined || config.busyRank === ctx.worldRank)) {
      const until = Date.now() + config.busyMs
      let turn = Date.now() + 20
      while (Date.now() < until) {
        // held (for 20 ms at a time with busyYields)
        if (config.busyYields && Date.now() >= turn) {
          await new Promise((resolve) => setImmediate(resolve))
          turn = Date.now() + 20
        }
      }
    }
  }
  tf.dispose([xTest, yTest])
  positions?.close()
}
