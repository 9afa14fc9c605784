// The flat (ZeRO-1/2) optimizers against tfjs's own: for every kind and a few hyper-parameter
// variants, steps of random gradients through optimizer.applyGradients and through the flat
// optimizer built from flatOptimizerSpecOf(that optimizer) must give the same parameters within
// float32 rounding. Then what sharding relies on: slices step like the whole, state() / load() /
// sliceState() continue a run exactly, decoupled weight decay, learning-rate changes, and the
// errors for what it cannot follow.
import { describe, expect, it } from "vitest"
import { loadEngine } from "../core/engine.ts"
import { ConfigError } from "../core/errors.ts"
import { seededRng, type Rng } from "../core/random.ts"
import { maxRelDiff, randomGrads, randomValues } from "./support/optim-values.ts"
import {
  createFlatOptimizer,
  flatOptimizerSlots,
  flatOptimizerSpecOf,
  type FlatOptimizer,
  type FlatOptimizerKind,
  type FlatOptimizerSpec,
  type FlatOptimizerState
} from "../actors/train/common/optim/flat-optimizers.ts"

const { tf } = await loadEngine("auto")

type TfOptimizer = import("@tensorflow/tfjs").Optimizer
type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable

const maxAbsDiff = (a: Float32Array, b: Float32Array): number => {
  let worst = 0
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]))
  return worst
}

const setTfLearningRate = (o: TfOptimizer, lr: number): void => {
  const x = o as unknown as { learningRate: number; setLearningRate?: (lr: number) => void }
  if (typeof x.setLearningRate === "function") x.setLearningRate(lr)
  else x.learningRate = lr
}

const CASES: ReadonlyArray<{ readonly name: string; readonly kind: FlatOptimizerKind; readonly make: () => TfOptimizer }> = [
  { name: "sgd", kind: "sgd", make: () => tf.train.sgd(0.1) },
  { name: "momentum", kind: "momentum", make: () => tf.train.momentum(0.05, 0.9) },
  { name: "momentum nesterov", kind: "momentum", make: () => tf.train.momentum(0.05, 0.8, true) },
  { name: "adam defaults", kind: "adam", make: () => tf.train.adam(0.01) },
  { name: "adam betas 0.8/0.95, eps 1e-6", kind: "adam", make: () => tf.train.adam(0.02, 0.8, 0.95, 1e-6) },
  { name: "adamax", kind: "adamax", make: () => tf.train.adamax(0.01) },
  { name: "adamax with decay", kind: "adamax", make: () => tf.train.adamax(0.02, 0.85, 0.99, undefined, 0.3) },
  { name: "rmsprop", kind: "rmsprop", make: () => tf.train.rmsprop(0.01) },
  { name: "rmsprop momentum", kind: "rmsprop", make: () => tf.train.rmsprop(0.01, 0.8, 0.7) },
  { name: "rmsprop centered", kind: "rmsprop", make: () => tf.train.rmsprop(0.01, 0.9, 0.5, 1e-6, true) },
  { name: "adagrad", kind: "adagrad", make: () => tf.train.adagrad(0.1) },
  { name: "adagrad initial accumulator 0.5", kind: "adagrad", make: () => tf.train.adagrad(0.2, 0.5) },
  { name: "adadelta", kind: "adadelta", make: () => tf.train.adadelta(1, 0.9) },
  { name: "adadelta defaults", kind: "adadelta", make: () => tf.train.adadelta(0.5) }
]

const STEPS = 6

/** STEPS steps of tfjs's optimizer on variables of `shapes` (one flat vector of initial values). */
const runTfjs = (make: () => TfOptimizer, shapes: ReadonlyArray<readonly number[]>, init: Float32Array, grads: readonly Float32Array[], lrAt?: (step: number) => number): Float32Array => {
  const optimizer = make()
  const vars: Variable[] = []
  let off = 0
  for (const shape of shapes) {
    const size = shape.reduce((a, b) => a * b, 1)
    vars.push(tf.variable(tf.tensor(init.slice(off, off + size), [...shape])))
    off += size
  }
  for (let s = 0; s < grads.length; s++) {
    if (lrAt) setTfLearningRate(optimizer, lrAt(s))
    const map: Record<string, Tensor> = {}
    let o = 0
    for (const v of vars) {
      map[v.name] = tf.tensor(grads[s].slice(o, o + v.size), v.shape)
      o += v.size
    }
    optimizer.applyGradients(map)
    tf.dispose(Object.values(map))
  }
  const out = new Float32Array(init.length)
  let o = 0
  for (const v of vars) {
    out.set(v.dataSync() as Float32Array, o)
    o += v.size
  }
  tf.dispose(vars)
  optimizer.dispose()
  return out
}

const runFlat = (opt: FlatOptimizer, init: Float32Array, grads: readonly Float32Array[], lrAt?: (step: number) => number): Float32Array => {
  const p = init.slice()
  for (let s = 0; s < grads.length; s++) {
    if (lrAt) opt.learningRate = lrAt(s)
    opt.step(p, grads[s])
  }
  return p
}

describe("flat optimizers follow tfjs's optimizers", () => {
  const N = 1000
  for (const c of CASES) {
    it(`${c.name}: ${STEPS} steps match applyGradients`, () => {
      const rng = seededRng(7 + c.name.length)
      const init = randomValues(rng, N)
      const grads = Array.from({ length: STEPS }, () => randomGrads(rng, N))
      const expected = runTfjs(c.make, [[25, 40]], init, grads)
      // A second instance for the spec, so nothing is shared with the one that ran.
      const probe = c.make()
      const spec = flatOptimizerSpecOf(probe)
      probe.dispose()
      expect(spec.kind).toBe(c.kind)
      const flat = createFlatOptimizer(spec, N)
      const got = runFlat(flat, init, grads)
      // The run moved the parameters far more than the tolerance (else the comparison says nothing);
      // the differences seen are ~1e-7 (float32 rounding), the bound 2e-6.
      expect(maxAbsDiff(expected, init)).toBeGreaterThan(1e-3)
      expect(maxRelDiff(got, expected)).toBeLessThanOrEqual(2e-6)
      expect(flat.state().scalars["step"]).toBe(STEPS)
    })
  }

  for (const c of CASES.filter((x) => ["adam defaults", "adamax with decay", "rmsprop centered", "adadelta", "momentum nesterov"].includes(x.name))) {
    it(`${c.name}: several variables in one tfjs optimizer are one flat vector`, () => {
      const rng = seededRng(99)
      const shapes = [[10, 30], [30], [7, 7, 4]]
      const n = 300 + 30 + 196
      const init = randomValues(rng, n)
      const grads = Array.from({ length: STEPS }, () => randomGrads(rng, n))
      const expected = runTfjs(c.make, shapes, init, grads)
      const probe = c.make()
      const got = runFlat(createFlatOptimizer(flatOptimizerSpecOf(probe), n), init, grads)
      probe.dispose()
      expect(maxRelDiff(got, expected)).toBeLessThanOrEqual(2e-6)
    })
  }

  it("learning-rate changes between steps take effect as they do in tfjs", () => {
    const lrAt = (s: number): number => [0.1, 0.01, 0.05, 0.2, 0.001, 0.03][s]
    for (const c of CASES.filter((x) => ["sgd", "momentum nesterov", "adam defaults", "adamax with decay", "rmsprop momentum", "adagrad", "adadelta"].includes(x.name))) {
      const rng = seededRng(5)
      const init = randomValues(rng, 200)
      const grads = Array.from({ length: STEPS }, () => randomGrads(rng, 200))
      const expected = runTfjs(c.make, [[200]], init, grads, lrAt)
      const probe = c.make()
      const spec = flatOptimizerSpecOf(probe)
      probe.dispose()
      const got = runFlat(createFlatOptimizer(spec, 200), init, grads, lrAt)
      expect(maxRelDiff(got, expected), c.name).toBeLessThanOrEqual(2e-6)
      // ... and differ from a run at the constant initial rate.
      const constant = runFlat(createFlatOptimizer(spec, 200), init, grads)
      expect(maxAbsDiff(got, constant), c.name).toBeGreaterThan(1e-4)
    }
  })

  it("the learning-rate setter takes a new rate for the next step exactly (sgd: p - lr g)", () => {
    const opt = createFlatOptimizer({ kind: "sgd", learningRate: 0.5 }, 3)
    const p = new Float32Array([1, 2, 3])
    opt.step(p, new Float32Array([1, 1, 1]))
    expect(Array.from(p)).toEqual([0.5, 1.5, 2.5])
    opt.learningRate = 0.25
    expect(opt.learningRate).toBe(0.25)
    opt.step(p, new Float32Array([2, 2, 2]))
    expect(Array.from(p)).toEqual([0, 1, 2])
    expect(() => {
      opt.learningRate = Number.NaN
    }).toThrow(ConfigError)
  })
})

describe("flat optimizer specs", () => {
  it("reads the values tfjs actually uses: null epsilon -> backend epsilon, adagrad's hidden epsilon, defaults", () => {
    expect(flatOptimizerSpecOf(tf.train.adam())).toEqual({ kind: "adam", learningRate: 0.001, beta1: 0.9, beta2: 0.999, epsilon: tf.backend().epsilon() })
    expect(flatOptimizerSpecOf(tf.train.adagrad(0.1))).toEqual({ kind: "adagrad", learningRate: 0.1, initialAccumulatorValue: 0.1, epsilon: 1e-7 })
    expect(flatOptimizerSpecOf(tf.train.rmsprop(0.01, 0.8, 0.5, 1e-5, true))).toEqual({
      kind: "rmsprop",
      learningRate: 0.01,
      decay: 0.8,
      momentum: 0.5,
      epsilon: 1e-5,
      centered: true
    })
    expect(flatOptimizerSpecOf(tf.train.momentum(0.1, 0.9))).toEqual({ kind: "momentum", learningRate: 0.1, momentum: 0.9, useNesterov: false })
    expect(flatOptimizerSpecOf(tf.train.adamax(0.002))).toMatchObject({ kind: "adamax", decay: 0, epsilon: 1e-7 })
    expect(flatOptimizerSpecOf(tf.train.adadelta())).toEqual({ kind: "adadelta", learningRate: 0.001, rho: 0.95, epsilon: 1e-7 })
    expect(tf.backend().epsilon()).toBe(1e-7)
  })

  it("an optimizer class it cannot follow is a ConfigError naming the class", () => {
    const lamb = { getClassName: () => "Lamb", getConfig: () => ({ learningRate: 0.1 }) }
    expect(() => flatOptimizerSpecOf(lamb)).toThrow(ConfigError)
    expect(() => flatOptimizerSpecOf(lamb)).toThrow(/"Lamb"/)
    // A name only inherited from Object.prototype is no class either.
    expect(() => flatOptimizerSpecOf({ getClassName: () => "toString", getConfig: () => ({}) })).toThrow(ConfigError)
  })

  it("createFlatOptimizer completes a spec with tf.train's defaults and rejects bad or unknown fields", () => {
    expect(createFlatOptimizer({ kind: "adam", learningRate: 0.01 }, 4).spec).toEqual({ kind: "adam", learningRate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-7 })
    expect(() => createFlatOptimizer({ kind: "adam", learningRate: 0.01, beta_1: 0.8 }, 4)).toThrow(/beta_1/)
    expect(() => createFlatOptimizer({ kind: "adam", learningRate: Number.NaN }, 4)).toThrow(ConfigError)
    expect(() => createFlatOptimizer({ kind: "momentum", learningRate: 0.1 }, 4)).toThrow(/momentum/)
    expect(() => createFlatOptimizer({ kind: "rmsprop", learningRate: 0.1, centered: "yes" }, 4)).toThrow(/centered/)
    expect(() => createFlatOptimizer({ kind: "lamb" as FlatOptimizerKind, learningRate: 0.1 }, 4)).toThrow(ConfigError)
    expect(() => createFlatOptimizer({ kind: "sgd", learningRate: 0.1 }, -1)).toThrow(ConfigError)
    expect(() => createFlatOptimizer({ kind: "sgd", learningRate: 0.1 }, 2.5)).toThrow(ConfigError)
  })

  it("slots and scalars per kind, and the state bytes they take", () => {
    expect(flatOptimizerSlots("adam")).toEqual({ slots: ["m", "v"], scalars: ["step", "accBeta1", "accBeta2"] })
    expect(flatOptimizerSlots("sgd").slots).toEqual([])
    expect(flatOptimizerSlots("rmsprop").slots).toEqual(["rms", "momentum", "mg"])
    expect(flatOptimizerSlots("rmsprop", { kind: "rmsprop", learningRate: 0.1, centered: false }).slots).toEqual(["rms", "momentum"])
    const n = 1234
    const bytes: Record<FlatOptimizerKind, number> = { sgd: 0, momentum: 1, adam: 2, adamax: 2, rmsprop: 2, adagrad: 1, adadelta: 2 }
    for (const [kind, slots] of Object.entries(bytes) as [FlatOptimizerKind, number][]) {
      const spec: FlatOptimizerSpec = kind === "momentum" ? { kind, learningRate: 0.1, momentum: 0.9 } : { kind, learningRate: 0.1 }
      const opt = createFlatOptimizer(spec, n)
      expect(opt.length).toBe(n)
      expect(opt.stateBytes(), kind).toBe(slots * n * 4)
      expect(Object.keys(opt.state().slots), kind).toEqual(flatOptimizerSlots(kind, opt.spec).slots)
      expect(Object.keys(opt.state().scalars), kind).toEqual(flatOptimizerSlots(kind).scalars)
    }
    expect(createFlatOptimizer({ kind: "rmsprop", learningRate: 0.1, centered: true }, n).stateBytes()).toBe(3 * n * 4)
  })
})

/** Deep copy of a state (state() hands out the optimizer's own arrays). */
const copyState = (s: FlatOptimizerState): FlatOptimizerState => ({
  kind: s.kind,
  slots: Object.fromEntries(Object.entries(s.slots).map(([k, v]) => [k, v.slice()])),
  scalars: { ...s.scalars }
})

const SHARD_SPECS: readonly FlatOptimizerSpec[] = [
  { kind: "sgd", learningRate: 0.1 },
  { kind: "momentum", learningRate: 0.05, momentum: 0.9, useNesterov: true },
  { kind: "adam", learningRate: 0.01, beta1: 0.8, beta2: 0.95 },
  { kind: "adamax", learningRate: 0.01, decay: 0.2 },
  { kind: "rmsprop", learningRate: 0.01, momentum: 0.5, centered: true },
  { kind: "adagrad", learningRate: 0.1, initialAccumulatorValue: 0.3 },
  { kind: "adadelta", learningRate: 1, rho: 0.9 }
]

describe("flat optimizers for shards", () => {
  const N = 1001
  const K = 377

  for (const spec of SHARD_SPECS) {
    it(`${spec.kind}: two slices with two optimizers step exactly like one over the whole`, () => {
      const rng = seededRng(3)
      const init = randomValues(rng, N)
      const whole = createFlatOptimizer(spec, N)
      const left = createFlatOptimizer(spec, K)
      const right = createFlatOptimizer(spec, N - K)
      const a = init.slice()
      const b = init.slice()
      for (let s = 0; s < STEPS; s++) {
        const g = randomGrads(rng, N)
        whole.step(a, g, s % 2 === 0 ? 0.1 : undefined)
        left.step(b.subarray(0, K), g.subarray(0, K), s % 2 === 0 ? 0.1 : undefined)
        right.step(b.subarray(K), g.subarray(K), s % 2 === 0 ? 0.1 : undefined)
      }
      expect(maxAbsDiff(a, init)).toBeGreaterThan(1e-3)
      expect(b).toEqual(a)
      // The slices' state is the whole's, cut.
      for (const [name, slot] of Object.entries(whole.state().slots)) {
        expect(left.state().slots[name], name).toEqual(slot.slice(0, K))
        expect(right.state().slots[name], name).toEqual(slot.slice(K))
      }
      expect(left.state().scalars).toEqual(whole.state().scalars)
    })

    it(`${spec.kind}: state() / load() and sliceState() re-sharding continue a run exactly`, () => {
      const rng = seededRng(11)
      const init = randomValues(rng, N)
      const grads = Array.from({ length: 2 * STEPS }, () => randomGrads(rng, N))
      const a = createFlatOptimizer(spec, N)
      const p = init.slice()
      for (let s = 0; s < STEPS; s++) a.step(p, grads[s])
      const saved = copyState(a.state())
      const pSaved = p.slice()
      // Re-shard at K: each new shard loads its cut of the state.
      const left = createFlatOptimizer(spec, K)
      const right = createFlatOptimizer(spec, N - K)
      left.load(a.sliceState(0, K))
      right.load(a.sliceState(K, N))
      const q = p.slice()
      for (let s = STEPS; s < 2 * STEPS; s++) {
        a.step(p, grads[s])
        left.step(q.subarray(0, K), grads[s].subarray(0, K))
        right.step(q.subarray(K), grads[s].subarray(K))
      }
      expect(q).toEqual(p)
      // A fresh optimizer loaded with the saved state continues identically too.
      const b = createFlatOptimizer(spec, N)
      b.load(saved)
      const r = pSaved
      for (let s = STEPS; s < 2 * STEPS; s++) b.step(r, grads[s])
      expect(r).toEqual(p)
      expect(b.state().scalars).toEqual(a.state().scalars)
      expect(b.state().scalars["step"]).toBe(2 * STEPS)
    })
  }

  it("a fresh optimizer does not continue a run (so the round-trip test above tests the state)", () => {
    // Not sgd (no state), nor adadelta: from zero state tfjs's adadelta keeps accum_var equal to
    // accum_grad, so its update is g and its state never matters (see the next test).
    for (const spec of SHARD_SPECS.filter((s) => s.kind !== "sgd" && s.kind !== "adadelta")) {
      const rng = seededRng(12)
      const init = randomValues(rng, 100)
      const grads = Array.from({ length: 4 }, () => randomGrads(rng, 100))
      const a = createFlatOptimizer(spec, 100)
      const p = init.slice()
      for (let s = 0; s < 2; s++) a.step(p, grads[s])
      const fresh = createFlatOptimizer(spec, 100)
      const q = p.slice()
      for (let s = 2; s < 4; s++) {
        a.step(p, grads[s])
        fresh.step(q, grads[s])
      }
      expect(maxAbsDiff(p, q), spec.kind).toBeGreaterThan(1e-6)
    }
  })

  it("adadelta: the update divides by the accumulated gradient from before the step, as tfjs does", () => {
    const opt = createFlatOptimizer({ kind: "adadelta", learningRate: 0.5, rho: 0.9, epsilon: 1e-6 }, 2)
    // From zero state the two accumulators stay equal and the update is exactly -lr g.
    const p = new Float32Array([1, 1])
    opt.step(p, new Float32Array([0.4, -2]))
    opt.step(p, new Float32Array([1, 3]))
    expect(Array.from(p)).toEqual([1 - 0.5 * 0.4 - 0.5 * 1, 1 + 0.5 * 2 - 0.5 * 3].map(Math.fround))
    expect(opt.state().slots["accum_var"]).toEqual(opt.state().slots["accum_grad"])
    // With accumulators that differ, the state shows.
    opt.load({ kind: "adadelta", slots: { accum_grad: new Float32Array([4, 1]), accum_var: new Float32Array([1, 4]) }, scalars: { step: 2 } })
    const q = new Float32Array([0, 0])
    opt.step(q, new Float32Array([1, 1]))
    const upd = [Math.sqrt(1 + 1e-6) / Math.sqrt(4 + 1e-6), Math.sqrt(4 + 1e-6) / Math.sqrt(1 + 1e-6)]
    expect(q[0]).toBeCloseTo(-0.5 * upd[0], 6)
    expect(q[1]).toBeCloseTo(-0.5 * upd[1], 6)
    expect(opt.state().slots["accum_grad"][0]).toBeCloseTo(0.9 * 4 + 0.1, 6)
    expect(opt.state().slots["accum_var"][0]).toBeCloseTo(0.9 * 1 + 0.1 * upd[0] * upd[0], 6)
  })

  it("state() gives the optimizer's own slot arrays; load() copies into them", () => {
    const opt = createFlatOptimizer({ kind: "adam", learningRate: 0.1 }, 8)
    const m = opt.state().slots["m"]
    opt.step(new Float32Array(8), new Float32Array(8).fill(1))
    expect(m[0]).toBeCloseTo(0.1, 6)
    expect(opt.state().scalars).toEqual({ step: 1, accBeta1: Math.fround(Math.fround(0.9) * Math.fround(0.9)), accBeta2: Math.fround(Math.fround(0.999) * Math.fround(0.999)) })
    const other = copyState(opt.state())
    other.slots["m"].fill(5)
    opt.load(other)
    expect(opt.state().slots["m"]).toBe(m)
    expect(m[3]).toBe(5)
    other.slots["m"].fill(6)
    expect(m[3]).toBe(5)
  })

  it("load() refuses a state of another kind, slot set or length, saying what differs", () => {
    const opt = createFlatOptimizer({ kind: "adam", learningRate: 0.1 }, 8)
    const good = copyState(opt.state())
    expect(() => opt.load({ ...good, kind: "adamax" })).toThrow(/adamax.*adam/)
    expect(() => opt.load({ ...good, slots: { m: good.slots["m"] } })).toThrow(/missing v/)
    expect(() => opt.load({ ...good, slots: { ...good.slots, extra: new Float32Array(8) } })).toThrow(/extra extra/)
    expect(() => opt.load({ ...good, slots: { ...good.slots, v: new Float32Array(7) } })).toThrow(/8 elements/)
    expect(() => opt.load({ ...good, scalars: { step: 1 } })).toThrow(/accBeta1/)
    for (const bad of [{ ...good, kind: "adamax" as const }, { ...good, slots: { m: good.slots["m"] } }]) {
      expect(() => opt.load(bad)).toThrow(ConfigError)
    }
    const rms = createFlatOptimizer({ kind: "rmsprop", learningRate: 0.1, centered: true }, 8)
    expect(() => createFlatOptimizer({ kind: "rmsprop", learningRate: 0.1 }, 8).load(rms.state())).toThrow(/not centered.*extra mg/)
    expect(() => opt.sliceState(3, 9)).toThrow(RangeError)
    expect(opt.sliceState(2, 5).slots["v"].length).toBe(3)
  })

  it("step() refuses arrays shorter than the slice, and a bad weight decay", () => {
    const opt = createFlatOptimizer({ kind: "sgd", learningRate: 0.1 }, 8)
    expect(() => opt.step(new Float32Array(7), new Float32Array(8))).toThrow(RangeError)
    expect(() => opt.step(new Float32Array(8), new Float32Array(7))).toThrow(RangeError)
    expect(() => opt.step(new Float32Array(8), new Float32Array(8), -1)).toThrow(ConfigError)
    // Longer arrays are fine: only [0, length) is touched.
    const p = new Float32Array(10).fill(1)
    opt.step(p, new Float32Array(10).fill(1))
    expect(p[7]).toBeCloseTo(0.9, 6)
    expect(p[8]).toBe(1)
  })
})

describe("decoupled weight decay", () => {
  it("sgd: p <- p (1 - lr wd) - lr g", () => {
    const opt = createFlatOptimizer({ kind: "sgd", learningRate: 0.1 }, 3)
    const p = new Float32Array([1, -2, 4])
    opt.step(p, new Float32Array([0.5, 0.5, 0]), 0.01)
    const keep = 1 - 0.1 * 0.01
    expect(Array.from(p)).toEqual([1 * keep - 0.05, -2 * keep - 0.05, 4 * keep].map(Math.fround))
  })

  for (const spec of SHARD_SPECS) {
    it(`${spec.kind}: the same as decaying the parameters first, then stepping without decay`, () => {
      const rng = seededRng(21)
      const n = 500
      const init = randomValues(rng, n)
      const fused = createFlatOptimizer(spec, n)
      const manual = createFlatOptimizer(spec, n)
      const plain = createFlatOptimizer(spec, n)
      const a = init.slice()
      const b = init.slice()
      const c = init.slice()
      const wd = 0.5
      for (let s = 0; s < STEPS; s++) {
        const g = randomGrads(rng, n)
        fused.learningRate = manual.learningRate = plain.learningRate = spec.learningRate * (1 + s / 10)
        fused.step(a, g, wd)
        const keep = 1 - manual.learningRate * wd
        for (let i = 0; i < n; i++) b[i] *= keep
        manual.step(b, g)
        plain.step(c, g)
      }
      expect(maxRelDiff(a, b)).toBeLessThanOrEqual(2e-6)
      expect(maxAbsDiff(a, c)).toBeGreaterThan(1e-3)
    })
  }
})
