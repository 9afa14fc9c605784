// Optimizer state across a change of zeroStage: a tfjs optimizer's weights (stage 0) to the whole
// flat state (stage 1/2) and back. For each kind, three variables of different shapes; a tfjs
// optimizer or a flat one stepped 4 times, its state converted, then both stepped 3 more times with
// the same gradients must give the same parameters (within float32 rounding). Also: a variable tfjs
// never updated gets the slot's initial value; entries are matched by name when their names are
// the layout's, else by position; what cannot be this optimizer's state is a ConfigError.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadEngine } from "../core/engine.ts"
import { ConfigError } from "../core/errors.ts"
import { seededRng, type Rng } from "../core/random.ts"
import { maxRelDiff, randomGrads, randomValues } from "./support/optim-values.ts"
import { createFlatOptimizer, flatOptimizerSpecOf, type FlatOptimizerKind } from "../actors/train/common/optim/flat-optimizers.ts"
import {
  flatStateFromTfjs,
  readTfjsOptimizerWeights,
  tfjsWeightsFromFlat,
  writeTfjsOptimizerWeights,
  type FlatSlot,
  type TfjsOptimizerWeightOut
} from "../actors/train/common/optim/tfjs-state.ts"

const { tf } = await loadEngine("auto")

type TfOptimizer = import("@tensorflow/tfjs").Optimizer
type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable

const CASES: ReadonlyArray<{ readonly name: string; readonly kind: FlatOptimizerKind; readonly initial: number; readonly make: () => TfOptimizer }> = [
  { name: "sgd", kind: "sgd", initial: 0, make: () => tf.train.sgd(0.1) },
  { name: "momentum (nesterov)", kind: "momentum", initial: 0, make: () => tf.train.momentum(0.05, 0.9, true) },
  { name: "adam", kind: "adam", initial: 0, make: () => tf.train.adam(0.02, 0.8, 0.95) },
  { name: "adamax (with decay)", kind: "adamax", initial: 0, make: () => tf.train.adamax(0.02, 0.85, 0.99, undefined, 0.3) },
  { name: "rmsprop (centered, momentum)", kind: "rmsprop", initial: 0, make: () => tf.train.rmsprop(0.01, 0.9, 0.5, 1e-6, true) },
  { name: "adagrad", kind: "adagrad", initial: 0.3, make: () => tf.train.adagrad(0.2, 0.3) },
  { name: "adadelta", kind: "adadelta", initial: 0, make: () => tf.train.adadelta(1, 0.9) }
]

const SHAPES: ReadonlyArray<readonly number[]> = [[6, 5], [7], [2, 3, 4]]
const TOTAL = 30 + 7 + 24
const BEFORE = 4
const AFTER = 3

let unique = 0

const maxAbsDiff = (a: Float32Array, b: Float32Array): number => {
  let worst = 0
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!))
  return worst
}

/** Three variables of SHAPES holding `init` (the flat vector), named uniquely, and their layout. */
const makeVars = (init: Float32Array, prefix = `tfs${++unique}`): { vars: Variable[]; layout: FlatSlot[] } => {
  const vars: Variable[] = []
  const layout: FlatSlot[] = []
  let offset = 0
  SHAPES.forEach((shape, i) => {
    const size = shape.reduce((a, b) => a * b, 1)
    vars.push(tf.tidy(() => tf.variable(tf.tensor(init.slice(offset, offset + size), [...shape]), true, `${prefix}/w${i}`)))
    layout.push({ name: `${prefix}/w${i}`, offset, size, shape })
    offset += size
  })
  return { vars, layout }
}

const readVars = (vars: readonly Variable[]): Float32Array => {
  const out = new Float32Array(vars.reduce((n, v) => n + v.size, 0))
  let o = 0
  for (const v of vars) {
    out.set(v.dataSync() as Float32Array, o)
    o += v.size
  }
  return out
}

/** One applyGradients of the flat gradient g to `vars` (in the order given: indexes into layout order). */
const applyTfjs = (opt: TfOptimizer, vars: readonly Variable[], g: Float32Array, order: readonly number[] = [0, 1, 2]): void => {
  const offsets = [0, 30, 37]
  const map: Record<string, Tensor> = {}
  for (const i of order) map[vars[i]!.name] = tf.tensor(g.slice(offsets[i], offsets[i]! + vars[i]!.size), vars[i]!.shape)
  opt.applyGradients(map)
  tf.dispose(Object.values(map))
}

/** What `await optimizer.getWeights()` holds, read with dataSync (Adamax: tfjs has no getWeights, read from its fields). */
const tfjsWeights = async (opt: TfOptimizer): Promise<Array<{ name: string; values: Float32Array | Int32Array }>> => {
  if (opt.getClassName() === "Adamax") return readTfjsOptimizerWeights(opt)
  const weights = await opt.getWeights()
  const out = weights.map((w) => ({ name: w.name, values: w.tensor.dataSync() as Float32Array | Int32Array }))
  for (const w of weights) if (w.name === "iter") w.tensor.dispose()
  return out
}

/** optimizer.setWeights of converted weights (Adamax: tfjs has no setWeights, set in its fields). */
const setTfjsWeights = async (opt: TfOptimizer, weights: TfjsOptimizerWeightOut[]): Promise<void> => {
  if (opt.getClassName() === "Adamax") return writeTfjsOptimizerWeights(tf, opt, weights)
  const named = weights.map((w) => ({ name: w.name, tensor: tf.tensor(w.values, w.shape) }))
  await opt.setWeights(named)
  tf.dispose(named.map((w) => w.tensor))
}

/** The tensors one tfjs optimizer leaves after dispose() (tfjs 4.22: Momentum's dispose() does not dispose SGD's learning-rate scalar). */
const tfjsLeak = (kind: FlatOptimizerKind): number => (kind === "momentum" ? 1 : 0)

describe("tfjs optimizer state <-> flat optimizer state", () => {
  for (const c of CASES) {
    it(`${c.name}: tfjs -> flat, then ${AFTER} more steps of both agree`, async () => {
      const tensorsBefore = tf.memory().numTensors
      const rng = seededRng(11 + c.name.length)
      const grads = Array.from({ length: BEFORE + AFTER }, () => randomGrads(rng, TOTAL))
      const { vars, layout } = makeVars(randomValues(rng, TOTAL))
      const opt = c.make()
      for (let s = 0; s < BEFORE; s++) applyTfjs(opt, vars, grads[s]!)
      const weights = await tfjsWeights(opt)
      const spec = flatOptimizerSpecOf(opt)
      const state = flatStateFromTfjs(spec, layout, TOTAL, weights)

      expect(state.kind).toBe(c.kind)
      expect(state.scalars["step"]).toBe(BEFORE)
      // Each slot's range of a variable is tfjs's `${variable}/${slot}`.
      for (const [slot, values] of Object.entries(state.slots)) {
        expect(values.length).toBe(TOTAL)
        for (const s of layout) {
          const w = weights.find((x) => x.name === `${s.name}/${slot}`)!
          expect(Array.from(values.subarray(s.offset, s.offset + s.size)), `${slot} of ${s.name}`).toEqual(Array.from(w.values))
        }
      }
      if (c.kind === "adam") {
        expect(state.scalars["accBeta1"]).toBeCloseTo(0.8 ** (BEFORE + 1), 6)
        expect(state.scalars["accBeta2"]).toBeCloseTo(0.95 ** (BEFORE + 1), 6)
      }

      const flat = createFlatOptimizer(spec, TOTAL)
      flat.load(state)
      const params = readVars(vars)
      const start = params.slice()
      for (let s = BEFORE; s < BEFORE + AFTER; s++) {
        applyTfjs(opt, vars, grads[s]!)
        flat.step(params, grads[s]!)
      }
      const expected = readVars(vars)
      expect(maxAbsDiff(expected, start)).toBeGreaterThan(1e-3)
      expect(maxRelDiff(params, expected)).toBeLessThanOrEqual(1e-5)
      expect(flat.state().scalars["step"]).toBe(BEFORE + AFTER)

      tf.dispose(vars)
      opt.dispose()
      expect(tf.memory().numTensors - tensorsBefore).toBe(tfjsLeak(c.kind))
    })

    it(`${c.name}: flat -> tfjs, then ${AFTER} more steps of both agree`, async () => {
      const tensorsBefore = tf.memory().numTensors
      const rng = seededRng(23 + c.name.length)
      const grads = Array.from({ length: BEFORE + AFTER }, () => randomGrads(rng, TOTAL))
      const probe = c.make()
      const spec = flatOptimizerSpecOf(probe)
      probe.dispose()
      const flat = createFlatOptimizer(spec, TOTAL)
      const params = randomValues(rng, TOTAL)
      for (let s = 0; s < BEFORE; s++) flat.step(params, grads[s]!)

      // A fresh tfjs optimizer over variables holding the flat parameters.
      const { vars, layout } = makeVars(params)
      const weights = tfjsWeightsFromFlat(spec, layout, flat.state())
      const groups = Object.keys(flat.state().slots).length
      expect(weights.length).toBe(1 + groups * layout.length)
      expect(weights[0]).toEqual({ name: "iter", values: new Float32Array([BEFORE]), shape: [] })
      for (const w of weights.slice(1)) expect(w.values.length).toBe(w.shape.reduce((a, b) => a * b, 1))
      const opt = c.make()
      await setTfjsWeights(opt, weights)
      expect(opt.iterations).toBe(BEFORE)
      if (c.kind === "adam" || c.kind === "adamax") {
        const accBeta1 = (opt as unknown as { accBeta1: Variable }).accBeta1.dataSync()[0]!
        expect(accBeta1).toBeCloseTo(flat.state().scalars["accBeta1"]!, 7)
      }

      const start = params.slice()
      for (let s = BEFORE; s < BEFORE + AFTER; s++) {
        applyTfjs(opt, vars, grads[s]!)
        flat.step(params, grads[s]!)
      }
      const got = readVars(vars)
      expect(maxAbsDiff(got, start)).toBeGreaterThan(1e-3)
      expect(maxRelDiff(got, params)).toBeLessThanOrEqual(1e-5)

      // Round trip: reading the tfjs optimizer back gives the flat optimizer's state.
      const back = flatStateFromTfjs(spec, layout, TOTAL, await tfjsWeights(opt))
      expect(back.scalars["step"]).toBe(BEFORE + AFTER)
      for (const [slot, values] of Object.entries(flat.state().slots)) expect(maxRelDiff(back.slots[slot]!, values), slot).toBeLessThanOrEqual(1e-5)

      tf.dispose(vars)
      opt.dispose()
      expect(tf.memory().numTensors - tensorsBefore).toBe(2 * tfjsLeak(c.kind)) // the probe and opt
    })

    it(`${c.name}: a variable tfjs never updated gets the initial slot value (${c.initial})`, async () => {
      const tensorsBefore = tf.memory().numTensors
      const rng = seededRng(37 + c.name.length)
      const grads = Array.from({ length: BEFORE + AFTER }, () => randomGrads(rng, TOTAL))
      const { vars, layout } = makeVars(randomValues(rng, TOTAL))
      const opt = c.make()
      // Only the first two variables are in the gradients: tfjs makes no slot for the third.
      for (let s = 0; s < BEFORE; s++) applyTfjs(opt, vars, grads[s]!, [0, 1])
      const weights = await tfjsWeights(opt)
      const spec = flatOptimizerSpecOf(opt)
      const state = flatStateFromTfjs(spec, layout, TOTAL, weights)
      const third = layout[2]!
      for (const [slot, values] of Object.entries(state.slots)) {
        expect(new Set(values.subarray(third.offset, third.offset + third.size)), slot).toEqual(new Set([Math.fround(c.initial)]))
        // ...and the updated ones moved away from it.
        expect(values.subarray(0, third.offset).some((x) => x !== Math.fround(c.initial)), slot).toBe(true)
      }
      // tfjs makes the third slot when it first sees the variable, with the same initial value.
      const flat = createFlatOptimizer(spec, TOTAL)
      flat.load(state)
      const params = readVars(vars)
      for (let s = BEFORE; s < BEFORE + AFTER; s++) {
        applyTfjs(opt, vars, grads[s]!)
        flat.step(params, grads[s]!)
      }
      expect(maxRelDiff(params, readVars(vars))).toBeLessThanOrEqual(1e-5)

      tf.dispose(vars)
      opt.dispose()
      expect(tf.memory().numTensors - tensorsBefore).toBe(tfjsLeak(c.kind))
    })
  }
})

describe("how tfjs entries are matched to variables", () => {
  let tensorsAtStart = 0
  beforeAll(() => {
    tensorsAtStart = tf.memory().numTensors
  })
  afterAll(() => {
    expect(tf.memory().numTensors).toBe(tensorsAtStart)
  })

  const adamAfter = async (order: readonly number[]) => {
    const rng = seededRng(5)
    const grads = Array.from({ length: BEFORE + AFTER }, () => randomGrads(rng, TOTAL))
    const { vars, layout } = makeVars(randomValues(rng, TOTAL))
    const opt = tf.train.adam(0.02, 0.8, 0.95)
    for (let s = 0; s < BEFORE; s++) applyTfjs(opt, vars, grads[s]!, order)
    return { grads, vars, layout, opt, weights: await tfjsWeights(opt), spec: flatOptimizerSpecOf(opt) }
  }

  it("by name: tfjs saw the variables in another order (its slots are positional, named after the variable)", async () => {
    const { grads, vars, layout, opt, weights, spec } = await adamAfter([2, 0, 1])
    expect(weights.map((w) => w.name)).toEqual(["iter", ...[2, 0, 1].map((i) => `${layout[i]!.name}/m`), ...[2, 0, 1].map((i) => `${layout[i]!.name}/v`)])
    const flat = createFlatOptimizer(spec, TOTAL)
    flat.load(flatStateFromTfjs(spec, layout, TOTAL, weights))
    const params = readVars(vars)
    for (let s = BEFORE; s < BEFORE + AFTER; s++) {
      applyTfjs(opt, vars, grads[s]!, [2, 0, 1])
      flat.step(params, grads[s]!)
    }
    expect(maxRelDiff(params, readVars(vars))).toBeLessThanOrEqual(1e-5)
    tf.dispose(vars)
    opt.dispose()
  })

  it("by position: names from another process (other layer numbers) are read in layout order", async () => {
    const { grads, vars, layout, opt, weights, spec } = await adamAfter([0, 1, 2])
    const renamed = weights.map((w) => ({ ...w, name: w.name.replace(/^tfs\d+\//, "dense_Dense9/") }))
    const flat = createFlatOptimizer(spec, TOTAL)
    flat.load(flatStateFromTfjs(spec, layout, TOTAL, renamed))
    const params = readVars(vars)
    for (let s = BEFORE; s < BEFORE + AFTER; s++) {
      applyTfjs(opt, vars, grads[s]!)
      flat.step(params, grads[s]!)
    }
    expect(maxRelDiff(params, readVars(vars))).toBeLessThanOrEqual(1e-5)
    // The same names in another order cannot be read by position: the sizes say so.
    const other = await adamAfter([2, 1, 0])
    const reversed = other.weights.map((w) => ({ ...w, name: w.name.replace(/^tfs\d+\//, "dense_Dense9/") }))
    expect(() => flatStateFromTfjs(spec, layout, TOTAL, reversed)).toThrow(/holds 24 values; variable ".*w0" .*position 0.* has 30/)
    tf.dispose([...vars, ...other.vars])
    opt.dispose()
    other.opt.dispose()
  })

  it("what cannot be this optimizer's state over these variables is a ConfigError", async () => {
    const rng = seededRng(3)
    const { vars, layout } = makeVars(randomValues(rng, TOTAL))
    const plain = tf.train.rmsprop(0.01, 0.9, 0.5)
    applyTfjs(plain, vars, randomGrads(rng, TOTAL))
    const weights = await tfjsWeights(plain)
    const centeredOpt = tf.train.rmsprop(0.01, 0.9, 0.5, undefined, true)
    const centered = flatOptimizerSpecOf(centeredOpt)
    centeredOpt.dispose()
    const plainSpec = flatOptimizerSpecOf(plain)
    // A plain RMSProp state is no centered one (3 variables x 2 slots read as 2 x 3).
    expect(() => flatStateFromTfjs(centered, layout, TOTAL, weights)).toThrow(ConfigError)
    expect(() => flatStateFromTfjs(centered, layout, TOTAL, weights)).toThrow(/"mg" slot|should be a "momentum" slot/)
    // No step count first.
    expect(() => flatStateFromTfjs(plainSpec, layout, TOTAL, weights.slice(1))).toThrow(/start with its step count "iter"/)
    // More variables' slots than the model has.
    expect(() => flatStateFromTfjs(plainSpec, layout.slice(0, 2), 37, weights)).toThrow(/holds 3 variables' slots; the model has 2/)
    // Another kind.
    expect(() => flatStateFromTfjs({ kind: "adagrad", learningRate: 0.1 }, layout, TOTAL, weights)).toThrow(ConfigError)
    // flat -> tfjs: the state must be this kind's, with its slots.
    const state = flatStateFromTfjs(plainSpec, layout, TOTAL, weights)
    expect(() => tfjsWeightsFromFlat(centered, layout, state)).toThrow(/holds \[rms, momentum, mg\]; the state has \[rms, momentum\]/)
    expect(() => tfjsWeightsFromFlat({ kind: "adam", learningRate: 0.1 }, layout, state)).toThrow(ConfigError)
    // A layout beyond the slots.
    expect(() => tfjsWeightsFromFlat(plainSpec, [...layout, { name: "extra", offset: TOTAL, size: 3 }], state)).toThrow(/not within the 61 elements/)
    tf.dispose(vars)
    plain.dispose()
  })

  it("sgd has only the step count; a layout without shapes gives 1-D slots", () => {
    const w = tfjsWeightsFromFlat({ kind: "sgd", learningRate: 0.1 }, [{ name: "a", offset: 0, size: 4 }], { kind: "sgd", slots: {}, scalars: { step: 9 } })
    expect(w).toEqual([{ name: "iter", values: new Float32Array([9]), shape: [] }])
    const m = tfjsWeightsFromFlat({ kind: "momentum", learningRate: 0.1, momentum: 0.9 }, [{ name: "a", offset: 0, size: 4 }], {
      kind: "momentum",
      slots: { momentum: new Float32Array([1, 2, 3, 4]) },
      scalars: { step: 2 }
    })
    expect(m[1]).toEqual({ name: "a/momentum", values: new Float32Array([1, 2, 3, 4]), shape: [4] })
    expect(flatStateFromTfjs({ kind: "sgd", learningRate: 0.1 }, [{ name: "a", offset: 0, size: 4 }], 4, [{ name: "iter", values: new Int32Array([9]) }])).toEqual({
      kind: "sgd",
      slots: {},
      scalars: { step: 9 }
    })
  })

  it("writeTfjsOptimizerWeights disposes the slots a used optimizer held (tfjs's setWeights leaves them)", async () => {
    const rng = seededRng(8)
    const { vars, layout } = makeVars(randomValues(rng, TOTAL))
    for (const make of [() => tf.train.adam(0.01), () => tf.train.adamax(0.01)]) {
      const opt = make()
      applyTfjs(opt, vars, randomGrads(rng, TOTAL))
      const spec = flatOptimizerSpecOf(opt)
      const flat = createFlatOptimizer(spec, TOTAL)
      flat.step(readVars(vars), randomGrads(rng, TOTAL))
      flat.step(readVars(vars), randomGrads(rng, TOTAL))
      const before = tf.memory().numTensors
      await writeTfjsOptimizerWeights(tf, opt, tfjsWeightsFromFlat(spec, layout, flat.state()))
      expect(tf.memory().numTensors, spec.kind).toBe(before)
      expect(opt.iterations).toBe(2)
      const back = flatStateFromTfjs(spec, layout, TOTAL, await readTfjsOptimizerWeights(opt))
      expect(tf.memory().numTensors, spec.kind).toBe(before)
      expect(Array.from(back.slots["m"]!)).toEqual(Array.from(flat.state().slots["m"]!))
      opt.dispose()
    }
    tf.dispose(vars)
  })
})
