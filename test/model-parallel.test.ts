// Pipeline and tensor parallelism, the parts that need no network: the cut into stages (balanced
// by compute, memory, worker speed; checked against brute force), the schedules (GPipe, 1F1B: op
// order, in-flight micro-batches, the bubble), the grid, and the training math with every rank of
// a grid in this process (local-fabric channels and groups): gradients and trajectories of
// pipelined, tensor-parallel and data x pipeline x tensor-parallel models against the same model
// trained whole on one worker, and checkpoints restored at the same layout and merged into one
// model. The NATS path runs in test/model-parallel-trainer.test.ts.
import { beforeAll, describe, expect, it } from "vitest"
import fc from "fast-check"
import { loadEngine, type Tf } from "../core/engine.ts"
import { ConfigError } from "../core/errors.ts"
import { partitionUnits, stageSpeeds, type UnitCost } from "../actors/train/worker/model-parallel/partition.ts"
import { bubbleFraction, microBatchSizes, peakInFlight, simulate, stageOps } from "../actors/train/worker/model-parallel/schedule.ts"
import { gridShape, placeOf, rankAt, replicaGroup, tensorGroup } from "../actors/train/worker/model-parallel/grid.ts"
import { modelGraph, unitCount } from "../actors/train/worker/model-parallel/graph.ts"
import { preparePipelineModel, type PipelineOptions } from "../actors/train/worker/model-parallel/prepare.ts"
import type { PipelineModel } from "../actors/train/worker/model-parallel/pipeline-model.ts"
import { isPipelineCheckpoint, loadPipelineCheckpointInto, mergePipelineCheckpoint } from "../actors/train/worker/model-parallel/checkpoint.ts"
import { modelFromFiles } from "../core/model-io.ts"
import { describeStack, type LayerStack } from "../actors/train/worker/model-parallel/stack.ts"
import { localFabric } from "./support/model-parallel-local.ts"
import { CLASSES, IN, batchOf, seededMlp } from "./support/pipeline-loop.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel

describe("cutting a model into stages", () => {
  const units = (ms: number[], bytes?: number[]): UnitCost[] => ms.map((c, i) => ({ computeMs: c, paramBytes: bytes?.[i] ?? 0 }))

  it("minimises the slowest stage, and matches brute force on random costs", () => {
    expect(partitionUnits({ costs: units([1, 1, 1, 1, 1]), stages: 2 }).bounds.map(Number)).toSatisfy((b: number[]) => b[1] === 2 || b[1] === 3)
    expect(partitionUnits({ costs: units([5, 1, 1, 1, 1, 1]), stages: 2 }).bounds).toEqual([0, 1, 6])
    expect(partitionUnits({ costs: units([1, 2, 3, 4, 10]), stages: 3 }).bounds).toEqual([0, 3, 4, 5])
    const brute = (c: number[], s: number): number => {
      let best = Infinity
      const rec = (start: number, left: number, worst: number): void => {
        if (left === 1) {
          best = Math.min(best, Math.max(worst, c.slice(start).reduce((a, b) => a + b, 0)))
          return
        }
        for (let end = start + 1; end <= c.length - (left - 1); end++) rec(end, left - 1, Math.max(worst, c.slice(start, end).reduce((a, b) => a + b, 0)))
      }
      rec(0, s, 0)
      return best
    }
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 50 }), { minLength: 1, maxLength: 9 }), fc.integer({ min: 1, max: 4 }), (c, s) => {
        fc.pre(c.length >= s)
        const p = partitionUnits({ costs: units(c), stages: s })
        expect(Math.max(...p.stageMs)).toBe(brute(c, s))
        expect(p.bounds[0]).toBe(0)
        expect(p.bounds[s]).toBe(c.length)
        for (let i = 0; i < s; i++) expect(p.bounds[i + 1]).toBeGreaterThan(p.bounds[i])
      }),
      { numRuns: 150 }
    )
  })

  it("gives a faster worker more layers (HetPipe), and reads speeds off each rank's measured time", () => {
    const p = partitionUnits({ costs: units([1, 1, 1, 1, 1, 1]), stages: 2, speeds: [2, 1] })
    expect(p.bounds).toEqual([0, 4, 6])
    expect(p.stageMs).toEqual([2, 2])
    // ranks 0,1 are stage 0's replicas, 2,3 stage 1's; rank 1 is slow: stage 0 runs at its pace
    expect(stageSpeeds([10, 30, 10, 10], 2, (r) => (r < 2 ? 0 : 1))).toEqual([1 / 3, 1])
  })

  it("breaks ties by parameter memory, balances by memory when asked, and respects a memory limit", () => {
    const c = units([1, 1, 1, 1], [400, 0, 0, 0])
    // compute ties between [1,3] and [2,2]-like cuts: the one whose largest stage holds least wins
    expect(partitionUnits({ costs: units([1, 1, 2], [0, 100, 0]), stages: 2 }).bounds).toEqual([0, 2, 3])
    expect(partitionUnits({ costs: c, stages: 2, balance: "memory" }).bounds).toEqual([0, 1, 4])
    const mem = units([1, 1, 1, 1], [100, 100, 100, 100])
    expect(partitionUnits({ costs: mem, stages: 2, memoryLimitBytes: 800, bytesPerParamByte: 2 }).bounds).toEqual([0, 2, 4])
    expect(() => partitionUnits({ costs: mem, stages: 2, memoryLimitBytes: 300, bytesPerParamByte: 2 })).toThrow(ConfigError)
    expect(partitionUnits({ costs: mem, stages: 3, balance: [1, 2, 1] }).bounds).toEqual([0, 1, 3, 4])
    expect(() => partitionUnits({ costs: mem, stages: 3, balance: [1, 1, 1] })).toThrow(/add up to the model's 4/)
    expect(() => partitionUnits({ costs: mem, stages: 5 })).toThrow(/fewer than 5 stages/)
  })
})

describe("pipeline schedules", () => {
  it("GPipe runs every forward, then every backward; 1F1B warms up, alternates, drains", () => {
    const s = (ops: ReturnType<typeof stageOps>) => ops.map((o) => `${o.kind}${o.micro}`).join(" ")
    expect(s(stageOps("gpipe", 0, 3, 3))).toBe("F0 F1 F2 B0 B1 B2")
    expect(s(stageOps("1f1b", 0, 3, 4))).toBe("F0 F1 F2 B0 F3 B1 B2 B3")
    expect(s(stageOps("1f1b", 1, 3, 4))).toBe("F0 F1 B0 F2 B1 F3 B2 B3")
    expect(s(stageOps("1f1b", 2, 3, 4))).toBe("F0 B0 F1 B1 F2 B2 F3 B3")
    expect(s(stageOps("1f1b", 0, 4, 2))).toBe("F0 F1 B0 B1")
  })

  it("holds m micro-batches per stage with GPipe and at most S - s with 1F1B", () => {
    for (let S = 1; S <= 5; S++) {
      for (let m = 1; m <= 9; m++) {
        for (let st = 0; st < S; st++) {
          expect(peakInFlight(stageOps("gpipe", st, S, m))).toBe(m)
          expect(peakInFlight(stageOps("1f1b", st, S, m))).toBe(Math.min(S - st, m))
        }
      }
    }
  })

  it("idles (S-1)/(m+S-1) of the time with equal stages, for both schedules", () => {
    for (const schedule of ["gpipe", "1f1b"] as const) {
      for (let S = 1; S <= 4; S++) {
        for (const m of [1, 2, 3, 4, 8]) {
          for (const backward of [1, 2]) {
            const r = simulate(schedule, S, m, { forward: 1, backward })
            expect(r.makespan).toBeCloseTo((m + S - 1) * (1 + backward), 9)
            expect(r.meanBubble).toBeCloseTo(bubbleFraction(S, m), 9)
          }
        }
      }
    }
    // an unbalanced stage makes every stage wait for it
    expect(simulate("1f1b", 2, 4, { forward: [1, 2], backward: [2, 4] }).bubble[0]).toBeGreaterThan(bubbleFraction(2, 4))
  })

  it("cuts a batch into micro-batches that need not divide it", () => {
    expect(microBatchSizes(10, 4)).toEqual([3, 3, 2, 2])
    expect(microBatchSizes(3, 5)).toEqual([1, 1, 1])
    expect(microBatchSizes(8, 1)).toEqual([8])
  })
})

describe("the data x pipeline x tensor grid", () => {
  it("numbers ranks tensor rank first, then stage, then replica", () => {
    const g = gridShape(12, 3, 2)
    expect(g).toEqual({ replicas: 2, stages: 3, tp: 2 })
    for (let r = 0; r < 12; r++) {
      const p = placeOf(r, g)
      expect(rankAt(g, p.replica, p.stage, p.tpRank)).toBe(r)
    }
    expect(replicaGroup(placeOf(3, g))).toEqual([3, 9])
    expect(tensorGroup(placeOf(3, g))).toEqual([2, 3])
    expect(() => gridShape(6, 4, 1)).toThrow(/must divide the number of workers/)
  })
})

// ------------------------------------------------------------------------------------------------
// training math, in one process

let tf: Tf
beforeAll(async () => {
  tf = (await loadEngine("auto")).tf
})

/** The seeded MLP of the integration loop (test/support/pipeline-loop.ts), built here on this process's engine. */
const mlp = (optimizer: "sgd" | "adam", widths?: number[]): LayersModel => seededMlp(tf, optimizer, widths)

/** A functional model with a residual branch: cut points only outside it. */
const residual = (): LayersModel => {
  const init = (seed: number) => ({ kernelInitializer: tf.initializers.glorotUniform({ seed }), biasInitializer: tf.initializers.randomNormal({ seed: seed + 50, stddev: 0.1 }) })
  const input = tf.input({ shape: [IN] })
  const a = tf.layers.dense({ units: 8, activation: "relu", name: "r0", ...init(1) }).apply(input) as never
  const b = tf.layers.dense({ units: 8, activation: "tanh", name: "r1", ...init(2) }).apply(a) as never
  const s = tf.layers.add({ name: "radd" }).apply([a, b]) as never
  const c = tf.layers.dense({ units: 8, activation: "relu", name: "r2", ...init(3) }).apply(s) as never
  const out = tf.layers.dense({ units: CLASSES, activation: "softmax", name: "rout", ...init(4) }).apply(c) as never
  const m = tf.model({ inputs: input, outputs: out })
  m.compile({ optimizer: tf.train.sgd(0.3), loss: "categoricalCrossentropy" })
  return m
}

const batch = (rows: number, seed: number): { x: Tensor; y: Tensor } => batchOf(tf, rows, seed)

/** One optimizer step of the whole model on the whole batch, as a single worker takes it; returns the loss. */
const referenceStep = (model: LayersModel, x: Tensor, y: Tensor): number => {
  const opt = (model as unknown as { optimizer: import("@tensorflow/tfjs").Optimizer }).optimizer
  const vars = model.trainableWeights.map((w) => w.read() as import("@tensorflow/tfjs").Variable)
  const { value, grads } = opt.computeGradients(() => tf.metrics.categoricalCrossentropy(y, model.apply(x, { training: true }) as Tensor).mean() as never, vars)
  opt.applyGradients(grads)
  const v = value.dataSync()[0]
  tf.dispose([value, ...Object.values(grads)])
  return v
}

/** Largest difference between a rank's variables (slices included) and the reference model's. */
const maxDiff = (pp: PipelineModel, ref: LayersModel): number => {
  const named = new Map(ref.weights.map((w) => [w.originalName, w.read()]))
  let worst = 0
  for (const [i, v] of pp.variables.entries()) {
    const part = pp.stage.parts[i]
    let r = named.get(part.name)!
    if (part.slice) {
      const n = r.shape[part.slice.axis] as number
      const c = n / part.slice.parts
      const begin = r.shape.map((_, k) => (k === part.slice!.axis ? part.slice!.index * c : 0))
      const sizes = r.shape.map((d, k) => (k === part.slice!.axis ? c : (d as number)))
      r = tf.slice(r, begin, sizes)
    }
    const d = tf.tidy(() => tf.max(tf.abs(tf.sub(v, r))).dataSync()[0])
    if (part.slice) r.dispose()
    worst = Math.max(worst, d)
  }
  return worst
}

interface GridRun {
  readonly pps: PipelineModel[]
  readonly models: LayersModel[]
  readonly losses: number[][]
}

/** Every rank of a grid of `world` ranks, in this process: prepare, then `steps` steps on each replica's batches. */
const runGrid = async (build: () => LayersModel, world: number, opts: PipelineOptions, data: Array<Array<{ x: Tensor; y: Tensor }>>): Promise<GridRun> => {
  const fabric = localFabric(world)
  const models = Array.from({ length: world }, build)
  const pps = await Promise.all(models.map((m, rank) => preparePipelineModel(tf, m, opts, { rank, worldSize: world, world: fabric.world(rank), links: fabric.links })))
  const losses: number[][] = pps.map(() => [])
  for (let s = 0; s < data[0].length; s++) {
    const rs = await Promise.all(pps.map((pp) => pp.trainStep(data[pp.place.replica][s].x, data[pp.place.replica][s].y)))
    rs.forEach((r, i) => losses[i].push(r.loss))
  }
  return { pps, models, losses }
}

/** The reference run: one model, each step on every replica's batch at once. */
const runReference = (build: () => LayersModel, data: Array<Array<{ x: Tensor; y: Tensor }>>): { ref: LayersModel; losses: number[] } => {
  const ref = build()
  const losses: number[] = []
  for (let s = 0; s < data[0].length; s++) {
    const x = tf.concat(data.map((d) => d[s].x))
    const y = tf.concat(data.map((d) => d[s].y))
    losses.push(referenceStep(ref, x, y))
    tf.dispose([x, y])
  }
  return { ref, losses }
}

const TOL = 2e-5

describe("pipelined training equals single-worker training", () => {
  const cases: Array<{ name: string; stages: number; schedule: "gpipe" | "1f1b"; micro: number; rows: number; balance?: number[] }> = [
    { name: "2 stages, GPipe, 3 micro-batches of a batch of 10", stages: 2, schedule: "gpipe", micro: 3, rows: 10 },
    { name: "3 stages (1, 3, 1 layers), 1F1B, 4 micro-batches of 10", stages: 3, schedule: "1f1b", micro: 4, rows: 10, balance: [1, 3, 1] },
    { name: "4 stages, 1F1B, 3 micro-batches of 7", stages: 4, schedule: "1f1b", micro: 3, rows: 7 },
    { name: "4 stages (2, 1, 1, 1 layers), GPipe, 6 micro-batches of 11", stages: 4, schedule: "gpipe", micro: 6, rows: 11, balance: [2, 1, 1, 1] }
  ]
  for (const c of cases) {
    it(c.name, async () => {
      const data = [Array.from({ length: 4 }, (_, s) => batch(c.rows, 100 + s))]
      const run = await runGrid(() => mlp("sgd"), c.stages, { stages: c.stages, schedule: c.schedule, microBatches: c.micro, balance: c.balance ?? "uniform" }, data)
      const { ref, losses } = runReference(() => mlp("sgd"), data)
      if (c.balance) expect(run.pps[0].layout.bounds).toEqual([0, ...c.balance.map((_, i) => c.balance!.slice(0, i + 1).reduce((a, b) => a + b, 0))])
      for (const [r, pp] of run.pps.entries()) {
        expect(maxDiff(pp, ref), `rank ${r}`).toBeLessThan(TOL)
        // every stage returns the batch's loss (it comes back up the pipeline)
        for (const [s, l] of run.losses[r].entries()) expect(l).toBeCloseTo(losses[s], 5)
      }
      // each stage holds at most what its schedule says
      for (const pp of run.pps) expect(pp.memoryStats().peakInFlight).toBe(c.schedule === "gpipe" ? c.micro : Math.min(c.stages - pp.place.stage, c.micro))
    })
  }

  it("with Adam, a functional model with a residual branch, and a stage of a parameter-free layer", async () => {
    const g = modelGraph(residual())
    // r0 | r1 + add | r2 | rout: no cut inside the residual branch
    expect(unitCount(g)).toBe(4)
    const data = [Array.from({ length: 3 }, (_, s) => batch(9, 200 + s))]
    const run = await runGrid(residual, 3, { stages: 3, schedule: "1f1b", microBatches: 4, balance: [1, 2, 1] }, data)
    const { ref, losses } = runReference(residual, data)
    for (const pp of run.pps) expect(maxDiff(pp, ref)).toBeLessThan(TOL)
    expect(run.losses[0][2]).toBeCloseTo(losses[2], 5)
    const adam = await runGrid(() => mlp("adam"), 2, { stages: 2, microBatches: 3, balance: "memory" }, [Array.from({ length: 3 }, (_, s) => batch(8, 300 + s))])
    const refAdam = runReference(() => mlp("adam"), [Array.from({ length: 3 }, (_, s) => batch(8, 300 + s))])
    for (const pp of adam.pps) expect(maxDiff(pp, refAdam.ref)).toBeLessThan(1e-4)
  })
})

describe("tensor-parallel dense pairs equal the plain dense layers", () => {
  it("tp 2 and 4: forward, input gradient and weight gradients, over several steps", async () => {
    for (const tp of [2, 4]) {
      const data = [Array.from({ length: 3 }, (_, s) => batch(6, 400 + s))]
      const run = await runGrid(() => mlp("sgd", [8, 12, 8, 4]), tp, { tensorParallel: tp }, data)
      const { ref, losses } = runReference(() => mlp("sgd", [8, 12, 8, 4]), data)
      // d0|d1 and d2|d3 are split; the softmax layer stays whole on every rank
      expect(run.pps[0].stage.parts.filter((p) => p.slice).length).toBe(6)
      expect(run.pps[1].variables[0].shape).toEqual([IN, 8 / tp])
      for (const pp of run.pps) expect(maxDiff(pp, ref)).toBeLessThan(TOL)
      expect(run.losses[tp - 1][2]).toBeCloseTo(losses[2], 5)
    }
  })

  it("a 2 (replicas) x 2 (stages) x 2 (tensor) grid trains as one worker on the replicas' batches together", async () => {
    const data = [0, 1].map((d) => Array.from({ length: 3 }, (_, s) => batch(7, 500 + 10 * d + s)))
    const run = await runGrid(() => mlp("sgd"), 8, { stages: 2, tensorParallel: 2, microBatches: 3, balance: [2, 3] }, data)
    const { ref, losses } = runReference(() => mlp("sgd"), data)
    for (const pp of run.pps) expect(maxDiff(pp, ref)).toBeLessThan(TOL)
    // each replica's loss is its own batch's; their mean is the global batch's (equal batches)
    expect((run.losses[0][1] + run.losses[4][1]) / 2).toBeCloseTo(losses[1], 5)
  })
})

describe("a stack of layer factories: no rank holds the whole model", () => {
  const widths = [8, 12, 8, 6]
  const factories = (): LayerStack => ({
    inputShape: [IN],
    layers: [
      ...widths.map((units, i) => (t: Tf) =>
        t.layers.dense({
          units,
          activation: i % 2 === 0 ? "relu" : "tanh",
          name: `d${i}`,
          kernelInitializer: t.initializers.glorotUniform({ seed: 11 + i }),
          biasInitializer: t.initializers.randomNormal({ seed: 31 + i, stddev: 0.1 })
        })
      ),
      (t: Tf) => t.layers.dense({ units: CLASSES, activation: "softmax", name: "out", kernelInitializer: t.initializers.glorotUniform({ seed: 7 }) })
    ]
  })

  it("describes every layer one at a time and frees it", async () => {
    const before = tf.memory().numTensors
    const infos = await describeStack(tf, factories(), 4)
    expect(tf.memory().numTensors).toBe(before)
    expect(infos.map((l) => l.name)).toEqual(["d0", "d1", "d2", "d3", "out"])
    expect(infos[1].weights).toEqual([{ name: "d1/kernel", shape: [8, 12] }, { name: "d1/bias", shape: [12] }])
    expect(infos[4].inputShape).toEqual([6])
    expect(infos.every((l) => l.ms > 0)).toBe(true)
    // unnamed layers are named by position, the same in every process
    const unnamed = await describeStack(tf, { inputShape: [3], layers: [(t: Tf) => t.layers.dense({ units: 2 }), (t: Tf) => t.layers.dense({ units: 1 })] }, undefined)
    expect(unnamed.map((l) => l.weights[0].name)).toEqual(["layer0/kernel", "layer1/kernel"])
  })

  it("trains each stage from its own layers as the whole model trains (cut by measured compute; with tensor parallelism)", async () => {
    const data = [Array.from({ length: 3 }, (_, s) => batch(9, 900 + s))]
    const { ref, losses } = runReference(() => mlp("sgd"), data)
    for (const [world, opts] of [[3, { stages: 3, microBatches: 4 }], [4, { stages: 2, tensorParallel: 2, microBatches: 2, balance: [2, 3] }]] as const) {
      const fabric = localFabric(world)
      const pps = await Promise.all(
        Array.from({ length: world }, (_, rank) =>
          preparePipelineModel(tf, factories(), { ...opts, optimizer: tf.train.sgd(0.3), loss: "categoricalCrossentropy" }, { rank, worldSize: world, world: fabric.world(rank), links: fabric.links })
        )
      )
      // a stage's variables are its layers' only
      const held = pps.map((pp) => pp.stage.parts.map((p) => p.name.split("/")[0]))
      expect(new Set(held.flat()).size).toBe(5)
      expect(held[0]).not.toContain("out")
      let last: number[] = []
      for (const d of data[0]) last = (await Promise.all(pps.map((pp) => pp.trainStep(d.x, d.y)))).map((r) => r.loss)
      for (const pp of pps) expect(maxDiff(pp, ref)).toBeLessThan(TOL)
      expect(last[0]).toBeCloseTo(losses[2], 5)
      // the checkpoint has no topology (nothing built the whole model) but loads into one built in code
      const files: Record<string, Uint8Array> = {}
      for (const pp of pps) Object.assign(files, await pp.shardFiles())
      expect(() => mergePipelineCheckpoint(files)).toThrow(/build the model in code/)
      const whole = mlp("sgd")
      loadPipelineCheckpointInto(tf, whole, files)
      for (const pp of pps) expect(maxDiff(pp, whole)).toBe(0)
    }
  })

  it("pp.fit refuses dp.fit's options (classWeight, accumulationSteps, globalBatchSize) instead of ignoring them", async () => {
    const fabric = localFabric(1)
    const pp = await preparePipelineModel(tf, factories(), { stages: 1, optimizer: tf.train.sgd(0.3), loss: "categoricalCrossentropy" }, { rank: 0, worldSize: 1, world: fabric.world(0), links: fabric.links })
    const ds = { x: new Float32Array(8 * 4), y: new Int32Array(8), size: 8, featureShape: [4], numClasses: 3 }
    for (const extra of [{ classWeight: { 0: 2 } }, { accumulationSteps: 2 }, { globalBatchSize: 8 }]) {
      await expect(pp.fit(ds, { epochs: 1, batchSize: 4, ...extra } as never)).rejects.toThrow(new RegExp(`pipeline\\.fit\\.${Object.keys(extra)[0]}.*is dp\\.fit's`))
    }
  })
})

describe("checkpoints of a stage-sharded model", () => {
  it("restore at the same layout, merge into one model, and refuse another layout", async () => {
    const opts: PipelineOptions = { stages: 2, tensorParallel: 2, microBatches: 2, balance: [3, 2] }
    const data = [Array.from({ length: 2 }, (_, s) => batch(6, 600 + s))]
    const run = await runGrid(() => mlp("adam"), 4, opts, data)
    const files: Record<string, Uint8Array> = {}
    for (const pp of run.pps) Object.assign(files, await pp.shardFiles())
    expect(isPipelineCheckpoint(files)).toBe(true)
    expect(Object.keys(files).filter((f) => f.endsWith(".msgpack")).length).toBe(4)

    // same layout: a fresh grid takes the weights and Adam's state, and the next step matches the first grid's
    const again = await runGrid(() => mlp("adam"), 4, opts, [[]])
    await Promise.all(again.pps.map((pp) => pp.restore(files)))
    for (const [r, pp] of again.pps.entries()) {
      for (const [i, v] of pp.variables.entries()) expect(tf.tidy(() => tf.max(tf.abs(tf.sub(v, run.pps[r].variables[i]))).dataSync()[0])).toBe(0)
    }
    // merged: the tfjs files of one model, and a model built in code, hold the pipelined weights
    const merged = await modelFromFiles(tf, mergePipelineCheckpoint(files))
    const whole = mlp("adam")
    loadPipelineCheckpointInto(tf, whole, files)
    for (const pp of run.pps) expect(maxDiff(pp, whole)).toBe(0)
    const xs = batch(5, 800).x
    const p1 = merged.predict(xs) as Tensor
    const p2 = whole.predict(xs) as Tensor
    expect(tf.tidy(() => tf.max(tf.abs(tf.sub(p1, p2))).dataSync()[0])).toBe(0)
    // the restored grid's pipelined forward agrees with the merged model
    const yy = tf.oneHot(tf.argMax(p1, -1), CLASSES)
    const mergedLoss = tf.tidy(() => tf.metrics.categoricalCrossentropy(yy, p1).mean().dataSync()[0])
    const ev = await Promise.all(again.pps.map((pp) => pp.evaluate(xs, yy, { batchSize: 2 })))
    for (const e of ev) {
      expect(e.accuracy).toBe(1)
      expect(e.loss).toBeCloseTo(mergedLoss, 5)
    }

    // and the next step of the restored grid is the first grid's next step (tfjs's Adam rebuilds its
    // bias corrections from the step count it loads, a power instead of a product: ~1 ulp)
    const next = batch(6, 700)
    const [a, b] = await Promise.all([Promise.all(run.pps.map((pp) => pp.trainStep(next.x, next.y))), Promise.all(again.pps.map((pp) => pp.trainStep(next.x, next.y)))])
    expect(b[0].loss).toBe(a[0].loss)
    for (const [r, pp] of again.pps.entries()) {
      for (const [i, v] of pp.variables.entries()) expect(tf.tidy(() => tf.max(tf.abs(tf.sub(v, run.pps[r].variables[i]))).dataSync()[0])).toBeLessThan(1e-6)
    }

    // another layout: a clear error saying what to do
    const other = await runGrid(() => mlp("adam"), 4, { ...opts, balance: [2, 3] }, [[]])
    await expect(other.pps[0].restore(files)).rejects.toThrow(/restore with the same stages/)
    const partial = { ...files }
    delete partial["pipeline/stage-1-of-2.tp-1-of-2.msgpack"]
    expect(() => mergePipelineCheckpoint(partial)).toThrow(/every rank must call ctx.checkpointFromModel/)
  })
})
