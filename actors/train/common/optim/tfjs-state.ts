// Converting optimizer state between a tfjs optimizer (zeroStage 0: optimizer.getWeights() /
// setWeights(), saved whole by core/model-io.ts) and the flat optimizers (zeroStage 1/2: one slot
// array per state kind over the flat parameter vector, saved in shards by zero.ts), so a run can
// resume at another stage in either direction.
//
// What tfjs-core 4.22 does (dist/optimizers/*_optimizer.js), which the conversion follows:
//   * getWeights() is [iter, ...group 1, ...group 2, ...]: "iter" first (a fresh int32 scalar of
//     optimizer.iterations, saveIterations()), then per state kind one entry per variable:
//       sgd       (nothing: just iter)
//       momentum  [`${v}/momentum`...]
//       adam      [`${v}/m`...], [`${v}/v`...]
//       adamax    [`${v}/m`...], [`${v}/v`...]   (but AdamaxOptimizer.getWeights()/setWeights() throw
//                                                 "not implemented"; see readTfjsOptimizerWeights)
//       rmsprop   [`${v}/rms`...], [`${v}/momentum`...], and [`${v}/mg`...] when centered
//       adagrad   [`${v}/accumulator`...]
//       adadelta  [`${v}/accum_grad`...], [`${v}/accum_var`...]
//     The entries are the slot variables themselves (same shape as their variable), not copies.
//   * The slots are kept BY POSITION: applyGradients(grads) uses slot i for the i-th entry of the
//     gradient map (Object.keys order), whatever its name; a slot is made (zeros, adagrad's
//     initialAccumulatorValue) the first time position i is seen, even with a null gradient, and is
//     named `${name of the variable at i then}/${suffix}`. The name is a label only: setWeights()
//     splits the list by count (length / number of kinds) and keeps the names without reading them.
//     gradwire's stage 0 applies gradients in layout order (model.trainableWeights: variableGrads
//     keeps varList's order, and the exchanged path builds the map from the layout), so slot i is
//     the state of layout[i].
//   * setWeights() sets iterations from iter and nothing else scalar: Adam's accBeta1/accBeta2
//     become pow(beta1, iter + 1) / pow(beta2, iter + 1) in float32 (the live optimizer's, made by
//     repeated float32 multiplication, can differ in the last bit; they are not saved).
//
// So, tfjs -> flat: entry j of each group is mapped to a layout variable BY NAME when every entry of
// every group is named `${layout variable}/${suffix}` (distinct variables, the same one at j in each
// group): the state is then each variable's own even when tfjs saw the variables in another order
// or skipped one. Otherwise (names from another process, where layers got other numbers) BY
// POSITION: entry j is layout[j]'s, as tfjs itself would use it. A variable with no entry (tfjs
// never saw its position) gets the slot's initial value, as tfjs would make it. Every entry must end
// with its group's suffix and hold exactly its variable's element count (ConfigError otherwise: a
// centered RMSProp state read as a plain one, another model...). step = iter; Adam's accBeta1/2 and
// Adamax's accBeta1 are derived from iter as tfjs's setWeights() does.
// flat -> tfjs: iter = step, then per group one entry per layout variable, in layout order, named
// `${variable}/${suffix}`, shaped as the variable (tfjs's update adds the slot to the gradient
// element-wise and assigns the result back, so the slot must have the variable's shape; iter is read
// as element 0 only, any shape or dtype). The flat state's accBeta scalars are not carried: tfjs
// derives them from iter on setWeights (for a flat state made by these optimizers they are the same
// powers up to float32 rounding).
import { ConfigError } from "../../../../core/errors.ts"
import type { Tf } from "../../../../core/engine.ts"
import { createFlatOptimizer, type FlatOptimizerKind, type FlatOptimizerSpec, type FlatOptimizerState } from "./flat-optimizers.ts"

/** One trainable variable's place in the flat vector (DataParallelModel.layout has this shape). */
export interface FlatSlot {
  readonly name: string
  readonly offset: number
  readonly size: number
  /** The variable's shape (DataParallelModel.layout has it): the shape tfjsWeightsFromFlat gives its slots. */
  readonly shape?: ReadonlyArray<number>
}

/** One tfjs optimizer weight, as read from getWeights() (values with dataSync()). */
export interface TfjsOptimizerWeight {
  readonly name: string
  readonly values: ArrayLike<number>
}

/** One tfjs optimizer weight to set, with the shape its tensor must have. */
export interface TfjsOptimizerWeightOut {
  name: string
  values: Float32Array
  /** [] for "iter"; the variable's shape for a slot (layout's shape, else [size]: right for 1-D variables only). */
  shape: number[]
}

/** The name tfjs gives the step count in getWeights() (first entry). */
export const TFJS_ITER = "iter"

/** Per kind, the groups of getWeights() after "iter", in tfjs's order (suffixes of `${variable}/${suffix}`). */
const tfjsGroups = (kind: FlatOptimizerKind, spec: FlatOptimizerSpec): readonly string[] => {
  switch (kind) {
    case "sgd":
      return []
    case "momentum":
      return ["momentum"]
    case "adam":
    case "adamax":
      return ["m", "v"]
    case "rmsprop":
      return spec["centered"] === true ? ["rms", "momentum", "mg"] : ["rms", "momentum"]
    case "adagrad":
      return ["accumulator"]
    case "adadelta":
      return ["accum_grad", "accum_var"]
  }
}

/** The spec checked and completed with tf.train's defaults (createFlatOptimizer's rules; ConfigError naming the field). */
const resolve = (spec: FlatOptimizerSpec): FlatOptimizerSpec => createFlatOptimizer(spec, 0).spec

/** What tfjs's setWeights() makes of Adam's/Adamax's accumulated beta powers: pow(beta, iter + 1) in float32. */
const accBetaAt = (beta: number, iter: number): number => Math.fround(Math.pow(Math.fround(beta), iter + 1))

const fail = (field: string, reason: string): never => {
  throw new ConfigError({ field, reason })
}

const checkLayout = (layout: ReadonlyArray<FlatSlot>, total: number, what: string): void => {
  if (!Number.isSafeInteger(total) || total < 0) fail("optimizerState", `the flat vector's length must be an integer >= 0, got ${String(total)}`)
  const seen = new Set<string>()
  for (const s of layout) {
    if (!Number.isSafeInteger(s.offset) || !Number.isSafeInteger(s.size) || s.offset < 0 || s.size < 0 || s.offset + s.size > total) {
      fail("optimizerState", `variable "${s.name}" at [${s.offset}, ${s.offset + s.size}) is not within the ${total} elements of ${what}`)
    }
    if (s.shape !== undefined && s.shape.reduce((a, b) => a * b, 1) !== s.size) {
      fail("optimizerState", `variable "${s.name}" has shape [${s.shape.join(", ")}] but ${s.size} elements`)
    }
    if (seen.has(s.name)) fail("optimizerState", `variable "${s.name}" is in the layout twice`)
    seen.add(s.name)
  }
}

/**
 * The whole flat optimizer state (slots of `total` elements) from a tfjs optimizer's weights
 * (what `await optimizer.getWeights()` returns: [{ name, tensor }], read with dataSync), for the variables of `layout`.
 * A variable the optimizer has no slot for yet (never updated) gets the slot's initial value (e.g. adagrad's initialAccumulatorValue, else 0).
 * Entries are matched to variables by name when all their names are `${layout variable}/${suffix}`,
 * else by position (see the top of this file). ConfigError when the weights cannot be this kind's
 * state over these variables.
 */
export function flatStateFromTfjs(
  spec: FlatOptimizerSpec,
  layout: ReadonlyArray<FlatSlot>,
  total: number,
  weights: ReadonlyArray<TfjsOptimizerWeight>
): FlatOptimizerState {
  const resolved = resolve(spec)
  const kind = resolved.kind
  checkLayout(layout, total, "the flat vector")
  const groups = tfjsGroups(kind, resolved)
  const field = "optimizerState.weights"
  const iterEntry = weights[0]
  if (iterEntry === undefined || iterEntry.name !== TFJS_ITER || iterEntry.values.length < 1) {
    fail(field, `a tfjs optimizer's weights start with its step count "${TFJS_ITER}"; got ${iterEntry === undefined ? "no weights" : `"${iterEntry.name}" first`}`)
  }
  const iter = Number(iterEntry!.values[0])
  if (!Number.isSafeInteger(iter) || iter < 0) fail(`${field}.iter`, `must be an integer >= 0, got ${String(iter)}`)
  const rest = weights.slice(1)
  const label = `tfjs ${kind}${kind === "rmsprop" ? (resolved["centered"] === true ? " (centered)" : " (not centered)") : ""}`
  if (groups.length === 0 ? rest.length !== 0 : rest.length % groups.length !== 0) {
    fail(
      field,
      `${label} saves ${groups.length === 0 ? "only iter" : `iter and ${groups.length} entries per variable (${groups.join(", ")})`}; ` +
        `got ${rest.length} entries after iter (${rest.slice(0, 4).map((w) => w.name).join(", ")}${rest.length > 4 ? ", ..." : ""})`
    )
  }
  const k = groups.length === 0 ? 0 : rest.length / groups.length
  if (k > layout.length) {
    fail(field, `the ${label} state holds ${k} variables' slots; the model has ${layout.length} trainable variables: build the same model to resume`)
  }
  // Each entry's variable name (its name less `/${suffix}`), checking the suffixes.
  const prefixes = groups.map((suffix, g) =>
    rest.slice(g * k, (g + 1) * k).map((w, j) => {
      const tail = `/${suffix}`
      if (typeof w.name !== "string" || !w.name.endsWith(tail)) {
        fail(field, `entry ${1 + g * k + j} ("${String(w.name)}") should be a "${suffix}" slot (named "<variable>${tail}"): this is not a ${label} state`)
      }
      return w.name.slice(0, -tail.length)
    })
  )
  const indexOf = new Map(layout.map((s, i) => [s.name, i]))
  const byName =
    k > 0 &&
    new Set(prefixes[0]).size === k &&
    prefixes[0]!.every((p, j) => indexOf.has(p) && prefixes.every((ps) => ps[j] === p))
  const target = (j: number): number => (byName ? indexOf.get(prefixes[0]![j]!)! : j)

  const slots: Record<string, Float32Array> = {}
  groups.forEach((suffix, g) => {
    const out = new Float32Array(total)
    if (kind === "adagrad") out.fill(resolved["initialAccumulatorValue"] as number)
    for (let j = 0; j < k; j++) {
      const w = rest[g * k + j]!
      const s = layout[target(j)]!
      if (w.values.length !== s.size) {
        fail(field, `"${w.name}" holds ${w.values.length} values; variable "${s.name}" it belongs to (${byName ? "by name" : `position ${j}`}) has ${s.size}`)
      }
      out.set(w.values, s.offset)
    }
    slots[suffix] = out
  })
  const scalars: Record<string, number> = { step: iter }
  if (kind === "adam") {
    scalars["accBeta1"] = accBetaAt(resolved["beta1"] as number, iter)
    scalars["accBeta2"] = accBetaAt(resolved["beta2"] as number, iter)
  } else if (kind === "adamax") {
    scalars["accBeta1"] = accBetaAt(resolved["beta1"] as number, iter)
  }
  return { kind, slots, scalars }
}

/**
 * The tfjs optimizer's weights (names and values, in the order its setWeights expects, "iter" included where it has one) from a whole flat state.
 * Each comes with the shape its tensor needs: [] for iter, the variable's for a slot (from
 * layout's shape, else [size]). setWeights(weights.map((w) => ({ name: w.name, tensor: tf.tensor(w.values, w.shape) }))).
 */
export function tfjsWeightsFromFlat(spec: FlatOptimizerSpec, layout: ReadonlyArray<FlatSlot>, state: FlatOptimizerState): TfjsOptimizerWeightOut[] {
  const resolved = resolve(spec)
  const kind = resolved.kind
  if (state === null || typeof state !== "object" || state.kind !== kind) {
    fail("optimizerState.kind", `the state is for ${String(state?.kind)}, the optimizer is ${kind}`)
  }
  const groups = tfjsGroups(kind, resolved)
  const have = Object.keys(state.slots ?? {})
  if (have.length !== groups.length || groups.some((g) => !have.includes(g))) {
    fail("optimizerState.slots", `a ${kind}${kind === "rmsprop" ? (resolved["centered"] === true ? " (centered)" : " (not centered)") : ""} optimizer holds [${groups.join(", ")}]; the state has [${have.join(", ")}]`)
  }
  const lengths = new Set(groups.map((g) => state.slots[g]!.length))
  if (lengths.size > 1) fail("optimizerState.slots", `the slots differ in length (${[...lengths].join(", ")}): not one whole flat state`)
  for (const g of groups) if (!(state.slots[g] instanceof Float32Array)) fail(`optimizerState.slots.${g}`, "must be a Float32Array")
  const n = groups.length === 0 ? layout.reduce((m, s) => Math.max(m, s.offset + s.size), 0) : state.slots[groups[0]!]!.length
  checkLayout(layout, n, "the state's slots")
  const step = state.scalars?.["step"]
  if (typeof step !== "number" || !Number.isSafeInteger(step) || step < 0) fail("optimizerState.scalars.step", `must be an integer >= 0, got ${String(step)}`)
  // tfjs saves iter as an int32 scalar and reads back element 0; float32 holds every count to 2^24 exactly.
  const out: TfjsOptimizerWeightOut[] = [{ name: TFJS_ITER, values: new Float32Array([step!]), shape: [] }]
  for (const suffix of groups) {
    const slot = state.slots[suffix]!
    for (const s of layout) {
      out.push({ name: `${s.name}/${suffix}`, values: slot.slice(s.offset, s.offset + s.size), shape: s.shape ? [...s.shape] : [s.size] })
    }
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// Reading and setting a tfjs optimizer's weights, Adamax included (tfjs-core 4.22's
// AdamaxOptimizer.getWeights()/setWeights() throw "not implemented": its state is read from and
// set into its fields, accumulatedFirstMoment / accumulatedWeightedInfNorm / iteration / accBeta1,
// in the layout the others use).

type TfOptimizer = import("@tensorflow/tfjs").Optimizer
type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable

interface AdamaxFields {
  beta1: number
  iterations_: number
  iteration: Variable
  accBeta1: Variable
  accumulatedFirstMoment: Array<{ originalName: string; variable: Variable }>
  accumulatedWeightedInfNorm: Array<{ originalName: string; variable: Variable }>
}

const adamaxFields = (optimizer: TfOptimizer): AdamaxFields => {
  const o = optimizer as unknown as Partial<AdamaxFields>
  if (!Array.isArray(o.accumulatedFirstMoment) || !Array.isArray(o.accumulatedWeightedInfNorm) || o.iteration == null || o.accBeta1 == null) {
    return fail("optimizer", "this tfjs Adamax optimizer does not have the fields of tfjs-core 4.22's (accumulatedFirstMoment, accumulatedWeightedInfNorm, iteration, accBeta1)")
  }
  return o as AdamaxFields
}

/**
 * A tfjs optimizer's weights as values ([{ name, values }], "iter" first: getWeights() read with
 * data(), asynchronously, as a GPU backend needs; for Adamax, whose getWeights() tfjs has not implemented, the same layout from its
 * fields). Creates no tensors that outlive the call.
 */
export async function readTfjsOptimizerWeights(optimizer: TfOptimizer): Promise<Array<{ name: string; values: Float32Array | Int32Array }>> {
  if (optimizer.getClassName() === "Adamax") {
    const o = adamaxFields(optimizer)
    const slots = [...o.accumulatedFirstMoment, ...o.accumulatedWeightedInfNorm]
    return [
      { name: TFJS_ITER, values: new Int32Array([optimizer.iterations]) },
      ...(await Promise.all(slots.map(async (s) => ({ name: s.originalName, values: (await s.variable.data()) as Float32Array }))))
    ]
  }
  const weights = await optimizer.getWeights()
  const out = await Promise.all(weights.map(async (w) => ({ name: w.name, values: (await w.tensor.data()) as Float32Array | Int32Array })))
  // "iter" is a fresh scalar per call; the rest are the optimizer's own slot variables (kept).
  for (const w of weights) if (w.name === TFJS_ITER) w.tensor.dispose()
  return out
}

/**
 * Sets a tfjs optimizer's state from weights (tfjsWeightsFromFlat's: name, values, shape) and
 * disposes the slot variables it held before (tfjs's setWeights() leaves them). Adamax, whose
 * setWeights() tfjs has not implemented, gets the same effect in its fields: the slots, the step
 * count, its decay's iteration and accBeta1 = beta1^(iter + 1), as Adam's setWeights() does.
 */
export async function writeTfjsOptimizerWeights(tf: Tf, optimizer: TfOptimizer, weights: ReadonlyArray<TfjsOptimizerWeightOut>): Promise<void> {
  if (weights[0]?.name !== TFJS_ITER) fail("optimizerState.weights", `must start with "${TFJS_ITER}"`)
  if (optimizer.getClassName() === "Adamax") {
    const o = adamaxFields(optimizer)
    const iter = Number(weights[0]!.values[0])
    const rest = weights.slice(1)
    if (rest.length % 2 !== 0) fail("optimizerState.weights", `Adamax takes iter and two entries per variable (m, v); got ${rest.length} after iter`)
    const k = rest.length / 2
    const make = (w: TfjsOptimizerWeightOut): { originalName: string; variable: Variable } => ({
      originalName: w.name,
      variable: tf.tidy(() => tf.tensor(w.values, w.shape, "float32").variable(false))
    })
    const old = [...o.accumulatedFirstMoment, ...o.accumulatedWeightedInfNorm].map((s) => s.variable)
    o.accumulatedFirstMoment = rest.slice(0, k).map(make)
    o.accumulatedWeightedInfNorm = rest.slice(k).map(make)
    tf.dispose(old)
    o.iterations_ = iter
    tf.tidy(() => {
      o.iteration.assign(tf.scalar(iter))
      o.accBeta1.assign(tf.scalar(accBetaAt(o.beta1, iter)))
    })
    return
  }
  const held = (await optimizer.getWeights()).map((w) => w.tensor)
  const tensors: Tensor[] = weights.map((w) =>
    w.name === TFJS_ITER ? tf.tensor(w.values, w.shape, "int32") : tf.tensor(w.values, w.shape, "float32")
  )
  try {
    await optimizer.setWeights(weights.map((w, i) => ({ name: w.name, tensor: tensors[i]! })))
  } finally {
    // setWeights() made variables of its own from the slots (sharing their data) and read iter.
    tf.dispose(tensors)
  }
  const now = await optimizer.getWeights()
  const kept = new Set(now.filter((w) => w.name !== TFJS_ITER).map((w) => w.tensor))
  for (const t of [...held, ...now.filter((w) => w.name === TFJS_ITER).map((w) => w.tensor)]) if (!kept.has(t) && !t.isDisposed) t.dispose()
}
