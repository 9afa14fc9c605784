// ZeRO stage 1 and 2, gradient accumulation and the learning-rate rules on the real digits data:
// p ranks as communicators in this process over one real nats-server, each with its own gradient
// reducer and DataParallelModel, trained step by step on unequal per-rank batches (weighted
// gradients). Stage 1 and 2 follow stage 0's trajectory within float tolerance for every
// optimizer at p = 1..4 (3: the flat vector does not divide evenly); sharded checkpoints restore at
// the same p and re-shard at another; accumulation equals the larger batch.
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Communicator } from "../collectives/communicator.ts"
import { GradientReducer } from "../collectives/gradient-reducer.ts"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { loadDigits, type ArrayDataset } from "../core/datasets.ts"
import { ConfigError } from "../core/errors.ts"
import { modelToFiles } from "../core/model-io.ts"
import { DataParallelModel, type GradientSync, type PrepareOptions } from "../actors/train/worker/data-parallel.ts"
import { reduceScatterOperation } from "../actors/train/worker/gradient-sync.ts"
import { shardFileName, shardLayout } from "../actors/train/common/optim/zero.ts"
import { lrRuleOf } from "../actors/train/common/optim/lr-rules.ts"
import { buildModel } from "../examples/digits/model.ts"
import type { ResolvedCompressionConfig } from "../collectives/compression/index.ts"

type Optimizer = import("@tensorflow/tfjs").Optimizer
type LayersModel = import("@tensorflow/tfjs").LayersModel

let server: NatsServerProcess
const conns: NatsConnection[] = []
let tf: Tf
let digits: ArrayDataset
let groups = 0

beforeAll(async () => {
  server = await launchNatsServer({ jetstream: false })
  for (let i = 0; i < 8; i++) conns.push(await connect({ servers: server.url, noEcho: true }))
  ;({ tf } = await loadEngine("auto"))
  digits = await loadDigits()
})

afterAll(async () => {
  await Promise.all(conns.map((c) => c.close()))
  await server?.stop()
})

const OPTIMIZERS: Record<string, (tf: Tf) => Optimizer> = {
  sgd: (tf) => tf.train.sgd(0.1),
  "momentum (nesterov)": (tf) => tf.train.momentum(0.05, 0.9, true),
  adam: (tf) => tf.train.adam(0.01),
  rmsprop: (tf) => tf.train.rmsprop(0.005, 0.9, 0.5),
  adagrad: (tf) => tf.train.adagrad(0.1)
}

interface Rank {
  readonly comm: Communicator
  readonly dp: DataParallelModel
  readonly model: LayersModel
}

/** p ranks over the real server, each with a digits MLP (rank r built from seed r + 1: rank 0's weights win). */
const makeGroup = async (
  p: number,
  stage: 0 | 1 | 2,
  optimizer: (tf: Tf) => Optimizer,
  prepare: PrepareOptions = {},
  compression: ResolvedCompressionConfig = "none",
  replica = false
): Promise<Rank[]> => {
  const group = `g${groups++}`
  return Promise.all(
    Array.from({ length: p }, async (_, rank) => {
      const comm = await Communicator.create({ nc: conns[2 * rank]!, controlNc: conns[2 * rank + 1]!, cluster: "t", job: "zero", group, rank, worldSize: p, timeoutMs: 20_000 })
      const reducer = new GradientReducer(comm, { algorithm: "ring", compression })
      const sync: GradientSync = {
        rank,
        worldSize: p,
        reduceGradients: (flat, layout, weight, step) => reducer.reduceGradients(flat, layout, weight, step),
        broadcast: (buf) => reducer.broadcast(buf),
        sum: (buf) => reducer.sum(buf),
        gradientBuffer: (n) => reducer.gradientBuffer(n),
        zeroStage: stage,
        ...(replica ? { zeroReplica: true } : {}),
        // (the worker's operation, without the group session around it)
        reduceScatter: (buffers, weight) => reduceScatterOperation(comm, buffers(), weight, "f32"),
        allGatherInto: async (segment, out) => {
          await comm.allGather(segment, { out })
          return true
        }
      }
      const model = buildModel(tf, "mlp", rank + 1)
      model.compile({ optimizer: optimizer(tf), loss: "categoricalCrossentropy" })
      const dp = await DataParallelModel.prepare(tf, model, sync, prepare)
      return { comm, dp, model }
    })
  )
}

const closeGroup = (ranks: ReadonlyArray<Rank>): Promise<unknown> => Promise.all(ranks.map((r) => r.comm.close()))

/**
 * Rows of `step` for `rank`: a global batch of `global` consecutive rows of the data set split in
 * unequal parts (rank r gets a share growing with r), so the weighted mean matters.
 */
const rowsFor = (step: number, rank: number, p: number, global = 60): [number, number] => {
  const weights = Array.from({ length: p }, (_, r) => r + 2)
  const total = weights.reduce((a, b) => a + b, 0)
  const cut = (r: number) => Math.round((weights.slice(0, r).reduce((a, b) => a + b, 0) / total) * global)
  const base = (step * global) % (digits.size - global)
  return [base + cut(rank), base + cut(rank + 1)]
}

const batchOf = (lo: number, hi: number) => {
  const x = tf.tensor2d(digits.x.subarray(lo * 64, hi * 64), [hi - lo, 64])
  const y = tf.tidy(() => tf.oneHot(tf.tensor1d(digits.y.subarray(lo, hi), "int32"), 10))
  return { x, y }
}

/** `steps` synchronous steps on every rank; steps are numbered from `from` (the rows they take). */
const train = async (ranks: ReadonlyArray<Rank>, steps: number, from = 0): Promise<void> => {
  const p = ranks.length
  for (let s = from; s < from + steps; s++) {
    await Promise.all(
      ranks.map(async (r, rank) => {
        const { x, y } = batchOf(...rowsFor(s, rank, p))
        await r.dp.trainStep(x, y)
        tf.dispose([x, y])
      })
    )
  }
}

const flatWeights = (m: LayersModel): Float32Array => {
  const parts = m.getWeights().map((w) => w.dataSync() as Float32Array)
  const out = new Float32Array(parts.reduce((a, b) => a + b.length, 0))
  let o = 0
  for (const part of parts) {
    out.set(part, o)
    o += part.length
  }
  return out
}

const maxDiff = (a: Float32Array, b: Float32Array): number => {
  expect(a.length).toBe(b.length)
  let d = 0
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!))
  return d
}

/** Two accumulated micro-batches and the step that exchanges and applies them, on every rank. */
const accumulateThree = (ranks: ReadonlyArray<Rank>): Promise<unknown> =>
  Promise.all(
    ranks.map(async (r, rank) => {
      for (const accumulate of [true, true, false]) {
        const { x, y } = batchOf(rank * 30, rank * 30 + 12)
        await r.dp.trainStep(x, y, { accumulate })
        tf.dispose([x, y])
      }
    })
  )

/** Trains a fresh group for `steps` steps and returns rank 0's weights (after checking every rank holds the same). */
const trajectory = async (p: number, stage: 0 | 1 | 2, opt: (tf: Tf) => Optimizer, steps: number): Promise<{ weights: Float32Array; stateBytes: number[] }> => {
  const ranks = await makeGroup(p, stage, opt)
  try {
    await train(ranks, steps)
    const weights = flatWeights(ranks[0]!.model)
    for (const r of ranks.slice(1)) expect(maxDiff(flatWeights(r.model), weights)).toBe(0)
    const stateBytes = await Promise.all(ranks.map(async (r) => (await r.dp.memoryStats()).optimizerState))
    return { weights, stateBytes }
  } finally {
    await closeGroup(ranks)
  }
}

describe("ZeRO stage 1 and 2", () => {
  for (const [name, opt] of Object.entries(OPTIMIZERS)) {
    it(`${name}: stages 1 and 2 follow stage 0 at p = 1..4, each rank holding 1/p of the optimizer state`, async () => {
      const STEPS = 8
      for (const p of [1, 2, 3, 4]) {
        const base = await trajectory(p, 0, opt, STEPS)
        const moved = maxDiff(base.weights, flatWeights(buildModel(tf, "mlp", 1)))
        expect(moved).toBeGreaterThan(1e-3)
        for (const stage of [1, 2] as const) {
          const z = await trajectory(p, stage, opt, STEPS)
          const d = maxDiff(z.weights, base.weights)
          expect(d, `p=${p} stage ${stage}: max |w - w_stage0| = ${d}`).toBeLessThan(2e-5 + moved * 1e-3)
          // Each rank's state is its segment's: 1/p of stage 0's, plus at most the padding.
          const whole = base.stateBytes[0]!
          const n = whole / 4
          const total = z.stateBytes.reduce((a, b) => a + b, 0)
          if (whole > 0) {
            expect(total).toBe(whole)
            for (const b of z.stateBytes) expect(b).toBeLessThanOrEqual(Math.ceil(n / p) * 4 * 2)
            for (const b of z.stateBytes) expect(b / whole).toBeLessThanOrEqual(1 / p + 0.01)
          }
        }
      }
    })
  }

  it("stage 1 works with the compressors (error feedback included): the same trajectory as stage 0 with the same codec", async () => {
    for (const compression of ["fp16", { type: "int8" }, { type: "topk", ratio: 0.1 }] as const) {
      const run = async (stage: 0 | 1) => {
        const ranks = await makeGroup(3, stage, OPTIMIZERS.adam!, {}, compression as ResolvedCompressionConfig)
        try {
          await train(ranks, 6)
          return flatWeights(ranks[0]!.model)
        } finally {
          await closeGroup(ranks)
        }
      }
      const [w0, w1] = [await run(0), await run(1)]
      const d = maxDiff(w0, w1)
      expect(d, `${JSON.stringify(compression)}: max diff ${d}`).toBeLessThan(2e-5)
      expect(maxDiff(w0, flatWeights(buildModel(tf, "mlp", 1)))).toBeGreaterThan(1e-3)
    }
  })

  it("decoupled weight decay gives the same trajectory at every stage, and no step leaks a tensor", async () => {
    const run = async (stage: 0 | 1 | 2) => {
      const ranks = await makeGroup(2, stage, OPTIMIZERS.adam!, { weightDecay: 0.5 })
      try {
        await train(ranks, 2)
        const before = tf.memory().numTensors
        await train(ranks, 4, 2)
        // Accumulated micro-batches too.
        await accumulateThree(ranks)
        expect(tf.memory().numTensors).toBe(before)
        return flatWeights(ranks[0]!.model)
      } finally {
        await closeGroup(ranks)
      }
    }
    const w0 = await run(0)
    for (const stage of [1, 2] as const) expect(maxDiff(await run(stage), w0)).toBeLessThan(2e-5)
    // The decay did something: the same steps without it end elsewhere.
    const ranks = await makeGroup(2, 0, OPTIMIZERS.adam!)
    try {
      await train(ranks, 6)
      await accumulateThree(ranks)
      expect(maxDiff(flatWeights(ranks[0]!.model), w0)).toBeGreaterThan(1e-3)
    } finally {
      await closeGroup(ranks)
    }
  })

  it("clips as stage 0 does: clipNorm at stages 1 (the whole gradient on every rank) and 2 (the group's norm from every rank's segment), clipValue at both", async () => {
    const run = async (stage: 0 | 1 | 2, prepare: PrepareOptions, replica = false, p = 3) => {
      const ranks = await makeGroup(p, stage, OPTIMIZERS.adam!, prepare, "none", replica)
      try {
        await train(ranks, 5)
        const w = flatWeights(ranks[0]!.model)
        for (const r of ranks.slice(1)) expect(maxDiff(flatWeights(r.model), w)).toBe(0)
        if (replica) {
          // each rank's replica of its predecessor's shard (parameters and optimizer state) is
          // that shard bit for bit: clipped alike
          const files = ranks.map((r) => r.dp.peerFiles()!)
          for (let r = 0; r < ranks.length; r++) {
            const own = shardFileName(r, ranks.length)
            const keeper = (r + 1) % ranks.length
            expect(Buffer.from(files[keeper]![own]!).equals(Buffer.from(files[r]![own]!)), `shard ${r} and its replica on rank ${keeper}, ${JSON.stringify(prepare)}`).toBe(true)
          }
        }
        return w
      } finally {
        await closeGroup(ranks)
      }
    }
    const free = await run(0, {})
    for (const clip of [{ clipNorm: 0.05 }, { clipValue: 0.002 }, { clipValue: 0.002, clipNorm: 0.05 }] as const) {
      const base = await run(0, clip)
      // the clipping bites: the same steps without it end elsewhere
      expect(maxDiff(base, free), JSON.stringify(clip)).toBeGreaterThan(1e-3)
      for (const [stage, replica] of [[1, false], [2, false], [2, true]] as const) {
        const d = maxDiff(await run(stage, clip, replica), base)
        expect(d, `stage ${stage}${replica ? " with replicas" : ""} ${JSON.stringify(clip)}: max diff ${d}`).toBeLessThan(2e-5)
      }
      // a group of one and of two at stage 2 (the norm's sum over one rank, and over a pair)
      for (const p of [1, 2]) {
        const d = maxDiff(await run(2, clip, p > 1, p), await run(0, clip, false, p))
        expect(d, `stage 2 at p = ${p} ${JSON.stringify(clip)}: max diff ${d}`).toBeLessThan(2e-5)
      }
    }
  })

  it("shift by d (a ZeRO-2 replica d ranks away): each rank's data to rank + d, rank - d's back, bit for bit; a bad distance refused", async () => {
    const p = 4
    const group = `g${groups++}`
    const comms = await Promise.all(
      Array.from({ length: p }, (_, rank) => Communicator.create({ nc: conns[2 * rank]!, controlNc: conns[2 * rank + 1]!, cluster: "t", job: "zero", group, rank, worldSize: p, timeoutMs: 20_000 }))
    )
    try {
      // (long enough for several chunks; each rank's values tell it apart)
      const data = comms.map((_, r) => Float32Array.from({ length: 70_000 }, (_, i) => r * 1e6 + i + 0.25))
      const got = await Promise.all(comms.map((c, r) => c.shift(data[r]!, { by: 2 })))
      got.forEach((g, r) => expect(Buffer.from(g.buffer).equals(Buffer.from(data[(r + p - 2) % p]!.buffer)), `rank ${r}`).toBe(true))
      const one = await Promise.all(comms.map((c, r) => c.shift(data[r]!)))
      one.forEach((g, r) => expect(g[0]).toBe(data[(r + p - 1) % p]![0]))
      await expect(comms[0]!.shift(data[0]!, { by: 4 })).rejects.toThrow(/by must be an integer in \[1, 3\], got 4/)
    } finally {
      await Promise.all(comms.map((c) => c.close()))
    }
  })

  it("keeps the shard layout: equal segments over the padded vector, real elements in order, none twice", () => {
    for (const [n, p] of [[4810, 3], [10, 4], [3, 4], [7, 1], [0, 2]] as const) {
      const covered: number[] = []
      for (let r = 0; r < p; r++) {
        const l = shardLayout(n, p, r)
        expect(l.shardSize).toBe(Math.ceil(n / p))
        expect(l.end - l.start).toBeLessThanOrEqual(l.shardSize)
        for (let i = l.start; i < l.end; i++) covered.push(i)
      }
      expect(covered).toEqual(Array.from({ length: n }, (_, i) => i))
    }
  })
})

/** A checkpoint as the trainer would assemble it: rank 0's model and dp files, every rank's shard. */
const checkpointOf = async (ranks: ReadonlyArray<Rank>): Promise<Record<string, Uint8Array>> => {
  const files: Record<string, Uint8Array> = { ...(await modelToFiles(tf, ranks[0]!.model)), ...(await ranks[0]!.dp.optimizerFiles()) }
  for (const r of ranks) Object.assign(files, r.dp.shardFiles())
  return files
}

/** Sets a model's weights from a flat vector, in order (models built in one process have different weight names). */
const setFlat = (m: LayersModel, flat: Float32Array): void => {
  let o = 0
  const ts = m.getWeights().map((w) => {
    const t = tf.tensor(flat.subarray(o, o + w.size), w.shape)
    o += w.size
    return t
  })
  m.setWeights(ts)
  tf.dispose(ts)
}

/** What restoreModel does (weights, then the optimizer state), with the weights from a flat vector. */
const restore = async (ranks: ReadonlyArray<Rank>, weights: Float32Array, files: Record<string, Uint8Array>): Promise<void> => {
  for (const r of ranks) {
    setFlat(r.model, weights)
    await r.dp.restoreOptimizer(files)
  }
}

/**
 * 10 uninterrupted steps of a fresh group, checkpointed after 5: the checkpoint's files, the
 * weights saved with it and the weights after the 10 steps.
 */
const referenceRun = async (p: number, stage: 0 | 1 | 2, opt: (tf: Tf) => Optimizer): Promise<{ files: Record<string, Uint8Array>; saved: Float32Array; expected: Float32Array }> => {
  const ref = await makeGroup(p, stage, opt)
  try {
    await train(ref, 5)
    const files = await checkpointOf(ref)
    const saved = flatWeights(ref[0]!.model)
    await train(ref, 5, 5)
    return { files, saved, expected: flatWeights(ref[0]!.model) }
  } finally {
    await closeGroup(ref)
  }
}

describe("sharded checkpoints", () => {
  it("save one file per shard, restore at the same p and re-shard at another, continuing the same trajectory", async () => {
    const adam = OPTIMIZERS.adam!
    // The reference: 10 uninterrupted steps at p = 3.
    const { files, saved, expected } = await referenceRun(3, 2, adam)
    expect(Object.keys(files).filter((f) => f.startsWith("optimizer.shard-")).sort()).toEqual([0, 1, 2].map((r) => `optimizer.shard-${r}-of-3.msgpack`))
    expect(Object.keys(files)).not.toContain("optimizer.bin")
    // Restored at the same size, at other sizes, and at the other stage: the same last 5 steps
    // (same global batches, split another way) land on the same weights.
    for (const [p, stage] of [[3, 2], [2, 2], [4, 1], [1, 1], [2, 0]] as const) {
      const ranks = await makeGroup(p, stage, adam)
      try {
        await restore(ranks, saved, files)
        await train(ranks, 5, 5)
        const d = maxDiff(flatWeights(ranks[0]!.model), expected)
        expect(d, `restored at p=${p} stage ${stage}: max diff ${d}`).toBeLessThan(1e-4)
        // The restored counter goes on (5 updates before the checkpoint).
        const counter = JSON.parse(new TextDecoder().decode((await ranks[0]!.dp.optimizerFiles())["data-parallel.json"]!)) as { step: number }
        expect(counter.step).toBe(10)
      } finally {
        await closeGroup(ranks)
      }
    }
    // Without the restored optimizer state the last steps go elsewhere: the shards carried it.
    const fresh = await makeGroup(2, 2, adam)
    try {
      await restore(fresh, saved, {})
      await train(fresh, 5, 5)
      expect(maxDiff(flatWeights(fresh[0]!.model), expected)).toBeGreaterThan(1e-3)
    } finally {
      await closeGroup(fresh)
    }
  })

  it("converts a stage-0 checkpoint (the optimizer's whole state) into shards at stage 1 and 2", async () => {
    for (const name of ["adam", "rmsprop", "adagrad"]) {
      const opt = OPTIMIZERS[name]!
      const { files, saved, expected } = await referenceRun(2, 0, opt)
      expect(Object.keys(files)).toContain("optimizer.msgpack")
      for (const [p, stage] of [[3, 2], [1, 1]] as const) {
        const ranks = await makeGroup(p, stage, opt)
        try {
          await restore(ranks, saved, files)
          await train(ranks, 5, 5)
          const d = maxDiff(flatWeights(ranks[0]!.model), expected)
          expect(d, `${name}: stage 0 -> p=${p} stage ${stage}: max diff ${d}`).toBeLessThan(1e-4)
        } finally {
          await closeGroup(ranks)
        }
      }
    }
  })

  it("refuses an incomplete set of shards and another optimizer's, at any stage, saying what to do", async () => {
    const ranks = await makeGroup(2, 1, OPTIMIZERS.adam!)
    let files: Record<string, Uint8Array>
    try {
      await train(ranks, 2)
      files = await checkpointOf(ranks)
    } finally {
      await closeGroup(ranks)
    }
    const missing = { ...files }
    delete missing["optimizer.shard-1-of-2.msgpack"]
    const check = async (stage: 0 | 1 | 2, opt: (tf: Tf) => Optimizer, f: Record<string, Uint8Array>, text: RegExp) => {
      const g = await makeGroup(1, stage, opt)
      try {
        const err = await g[0]!.dp.restoreOptimizer(f).then(() => undefined, (e: unknown) => e)
        expect(err).toBeInstanceOf(ConfigError)
        expect(String((err as ConfigError).message)).toMatch(text)
      } finally {
        await closeGroup(g)
      }
    }
    await check(1, OPTIMIZERS.adam!, missing, /shard-1-of-2\.msgpack is missing/)
    await check(2, OPTIMIZERS["momentum (nesterov)"]!, files, /"adam" optimizer/)
    await check(0, OPTIMIZERS.adam!, missing, /shard-1-of-2\.msgpack is missing/)
    await check(0, OPTIMIZERS.sgd!, files, /"adam" optimizer/)
  })
})

describe("gradient accumulation", () => {
  it("k micro-batches with one exchange equal the k-times larger batch, at stage 0 and 2", async () => {
    for (const stage of [0, 2] as const) {
      const big = await makeGroup(2, stage, OPTIMIZERS.adam!)
      const acc = await makeGroup(2, stage, OPTIMIZERS.adam!)
      try {
        const shard = (rank: number) => ({ dataset: digits, rows: (epoch: number) => Int32Array.from({ length: 200 }, (_, i) => (rank * 200 + i * 7 + epoch) % digits.size) })
        const [rBig] = await Promise.all(big.map((r, rank) => r.dp.fit(shard(rank), { epochs: 1, batchSize: 32 })))
        const [rAcc] = await Promise.all(acc.map((r, rank) => r.dp.fit(shard(rank), { epochs: 1, batchSize: 8, accumulationSteps: 4 })))
        // ceil(200 / 32) = 7 updates either way (the last one of 8 rows: one micro-batch).
        expect(rAcc![0]!.steps).toBe(7)
        expect(rBig![0]!.steps).toBe(7)
        const d = maxDiff(flatWeights(acc[0]!.model), flatWeights(big[0]!.model))
        expect(d, `stage ${stage}: max diff ${d}`).toBeLessThan(2e-5)
        expect(rAcc![0]!.loss).toBeCloseTo(rBig![0]!.loss, 4)
        expect(maxDiff(flatWeights(acc[0]!.model), flatWeights(buildModel(tf, "mlp", 1)))).toBeGreaterThan(1e-3)
      } finally {
        await Promise.all([closeGroup(big), closeGroup(acc)])
      }
    }
  })

  it("trainStep({ accumulate: true }) exchanges nothing until the step that applies the sum", async () => {
    const ranks = await makeGroup(2, 0, OPTIMIZERS.sgd!)
    const big = await makeGroup(2, 0, OPTIMIZERS.sgd!)
    try {
      const before = flatWeights(ranks[0]!.model)
      await Promise.all(
        ranks.map(async (r, rank) => {
          for (let j = 0; j < 2; j++) {
            const { x, y } = batchOf(rank * 100 + j * 10, rank * 100 + j * 10 + 10)
            await r.dp.trainStep(x, y, { accumulate: true })
            tf.dispose([x, y])
          }
        })
      )
      // Accumulating changed nothing yet, and no rank waited for the other (no collective ran).
      expect(maxDiff(flatWeights(ranks[0]!.model), before)).toBe(0)
      await Promise.all(
        ranks.map(async (r, rank) => {
          const { x, y } = batchOf(rank * 100 + 20, rank * 100 + 25)
          await r.dp.trainStep(x, y)
          tf.dispose([x, y])
        })
      )
      await Promise.all(
        big.map(async (r, rank) => {
          const { x, y } = batchOf(rank * 100, rank * 100 + 25)
          await r.dp.trainStep(x, y)
          tf.dispose([x, y])
        })
      )
      expect(maxDiff(flatWeights(ranks[0]!.model), flatWeights(big[0]!.model))).toBeLessThan(1e-6)
      expect(maxDiff(flatWeights(ranks[0]!.model), before)).toBeGreaterThan(1e-4)
    } finally {
      await Promise.all([closeGroup(ranks), closeGroup(big)])
    }
  })
})

describe("learning-rate rules", () => {
  it("scale by the global batch (linear, sqrt) with a linear warmup, and refuse bad options", () => {
    const lin = lrRuleOf({ lrScaling: "linear", referenceBatchSize: 32 })!
    expect(lin.factor(0, 128)).toBe(4)
    expect(lrRuleOf({ lrScaling: "sqrt", referenceBatchSize: 32 })!.factor(5, 128)).toBe(2)
    const warm = lrRuleOf({ lrScaling: "linear", referenceBatchSize: 32, warmupSteps: 4 })!
    expect([0, 1, 2, 3, 4, 10].map((t) => warm.factor(t, 64))).toEqual([0.5, 1, 1.5, 2, 2, 2])
    expect(lrRuleOf({ warmupSteps: 2 })!.factor(0, 999)).toBe(0.5)
    expect(lrRuleOf({})).toBeUndefined()
    expect(() => lrRuleOf({ lrScaling: "linear" })).toThrow(/referenceBatchSize/)
    expect(() => lrRuleOf({ lrScaling: "cubic" as "linear", referenceBatchSize: 1 })).toThrow(ConfigError)
    expect(() => lrRuleOf({ warmupSteps: 1.5 })).toThrow(/warmupSteps/)
  })

  it("sets the optimizer's rate from the global batch of dp.fit, warms it up, reports it, and steps like SGD at the scaled rate", async () => {
    // 2 ranks x batch 16 x 2 micro-batches = a global batch of 64 against a reference of 32: twice the base 0.05.
    const shard = (rank: number) => ({ dataset: digits, rows: () => Int32Array.from({ length: 96 }, (_, i) => rank * 96 + i) })
    const ruled = await makeGroup(2, 1, (tf) => tf.train.sgd(0.05), { lrScaling: "linear", referenceBatchSize: 32 })
    const plain = await makeGroup(2, 1, (tf) => tf.train.sgd(0.1))
    const warm = await makeGroup(2, 0, (tf) => tf.train.sgd(0.05), { lrScaling: "linear", referenceBatchSize: 32, warmupSteps: 3 })
    try {
      for (const g of [ruled, plain]) await Promise.all(g.map((r, rank) => r.dp.fit(shard(rank), { epochs: 1, batchSize: 16, accumulationSteps: 2 })))
      expect(ruled[0]!.dp.learningRate).toBeCloseTo(0.1, 9)
      expect(ruled[0]!.dp.batchingMetrics().lr).toBeCloseTo(0.1, 9)
      expect(maxDiff(flatWeights(ruled[0]!.model), flatWeights(plain[0]!.model))).toBeLessThan(1e-6)
      expect(maxDiff(flatWeights(ruled[0]!.model), flatWeights(buildModel(tf, "mlp", 1)))).toBeGreaterThan(1e-3)
      const seen: number[] = []
      await Promise.all(
        warm.map((r, rank) => r.dp.fit(shard(rank), { epochs: 1, batchSize: 16, accumulationSteps: 2, ...(rank === 0 ? { onStep: () => void seen.push(r.dp.learningRate!) } : {}) }))
      )
      // Three updates of warmup to 0.1, then 0.1; the rule follows the batch: a batch of 8 x 1 at p = 2 is 16 = half the reference.
      expect(seen.map((v) => Number(v.toFixed(6)))).toEqual([0.033333, 0.066667, 0.1])
      await Promise.all(warm.map((r, rank) => r.dp.fit(shard(rank), { epochs: 1, batchSize: 8 })))
      expect(warm[0]!.dp.learningRate).toBeCloseTo(0.025, 9)
    } finally {
      await Promise.all([closeGroup(ruled), closeGroup(plain), closeGroup(warm)])
    }
  })
})
