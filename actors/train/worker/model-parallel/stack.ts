// A model described as a stack of layer factories instead of a built model, for models too large
// for one worker: no rank ever holds the whole model. A first pass makes each layer alone (one at a
// time: build, note its weights' names and shapes, time its forward + backward when the cut is
// by compute, free it); then each rank makes only its stage's layers, as a functional model of
// their own that the stage runs like any other. Factories are called in the same order on every
// rank and must make the same layers (seeded initializers, or weights any replica may start from:
// replicas of a stage start from replica 0's). A layer keeps the name it is given; an unnamed
// layer is named layer<i> by its position, the same on every rank and in every run.
import type { Tf } from "../../../../core/engine.ts"
import { ConfigError } from "../../../../core/errors.ts"
import { sampleInput, timeForwardBackward } from "./profile.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Layer = import("@tensorflow/tfjs").layers.Layer
type LayersModel = import("@tensorflow/tfjs").LayersModel
type SymbolicTensor = import("@tensorflow/tfjs").SymbolicTensor

/** A sequential model as factories, one per layer: `preparePipeline({ inputShape, layers }, { optimizer, loss, ... })`. */
export interface LayerStack {
  /** Per-sample shape of the model's input. */
  readonly inputShape: ReadonlyArray<number>
  /** Default "float32" ("int32" for an embedding's ids). */
  readonly inputDtype?: "float32" | "int32"
  /** Each makes a new, unbuilt layer; called once per layer to describe it, and again on the rank that keeps it. */
  readonly layers: ReadonlyArray<(tf: Tf) => Layer>
}

export const isLayerStack = (x: unknown): x is LayerStack =>
  typeof x === "object" && x !== null && Array.isArray((x as LayerStack).layers) && Array.isArray((x as LayerStack).inputShape)

export interface StackLayerInfo {
  readonly name: string
  readonly weights: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
  readonly trainableBytes: number
  readonly inputShape: ReadonlyArray<number>
  /** Forward + backward of a micro-batch, when timed. */
  readonly ms: number
}

// tfjs names an unnamed layer <class in snake case>_<Class><n>, n counting up per process
const AUTO_NAME = /^[a-z0-9_]+_[A-Z][A-Za-z0-9]*?\d+$/

const make = (tf: Tf, stack: LayerStack, i: number): Layer => {
  const l = stack.layers[i](tf)
  if (!l || typeof (l as Layer).apply !== "function") {
    throw new ConfigError({ field: `preparePipeline(model).layers[${i}]`, reason: "a layer factory must return a new tfjs layer, such as (tf) => tf.layers.dense({ units: 64 })" })
  }
  if (AUTO_NAME.test(l.name)) (l as unknown as { name: string }).name = `layer${i}`
  return l
}

const perSample = (shape: ReadonlyArray<number | null> | ReadonlyArray<number | null>[], i: number): number[] => {
  const s = (Array.isArray(shape[0]) ? shape[0] : shape) as ReadonlyArray<number | null>
  const rest = s.slice(1)
  if (rest.some((d) => d === null)) throw new ConfigError({ field: `preparePipeline(model).layers[${i}]`, reason: `its output shape [${s.join(", ")}] has unknown dimensions besides the batch` })
  return rest as number[]
}

/** Every layer, made and freed one at a time: names, weights, input shapes, and (when `timeRows`) times. */
export const describeStack = async (tf: Tf, stack: LayerStack, timeRows: number | undefined): Promise<StackLayerInfo[]> => {
  if (stack.layers.length === 0) throw new ConfigError({ field: "preparePipeline(model).layers", reason: "the stack has no layers" })
  const out: StackLayerInfo[] = []
  let shape: number[] = [...stack.inputShape]
  let dtype: string = stack.inputDtype ?? "float32"
  const names = new Set<string>()
  for (let i = 0; i < stack.layers.length; i++) {
    const l = make(tf, stack, i)
    if (names.has(l.name)) throw new ConfigError({ field: `preparePipeline(model).layers[${i}]`, reason: `two layers are named "${l.name}": names must be unique` })
    names.add(l.name)
    try {
      const input = tf.input({ shape, dtype: dtype as "float32" })
      const sym = l.apply(input) as SymbolicTensor
      let ms = 0
      if (timeRows !== undefined) {
        const x = sampleInput(tf, shape, timeRows, dtype)
        try {
          ms = await timeForwardBackward(tf, () => l.apply(x, { training: true }) as Tensor, x, l.trainableWeights.map((w) => w.read()))
        } finally {
          x.dispose()
        }
      }
      out.push({
        name: l.name,
        weights: l.weights.map((w) => ({ name: w.originalName, shape: w.shape.map((d) => d ?? 1) })),
        trainableBytes: l.trainableWeights.reduce((n, w) => n + w.shape.reduce((a: number, b) => a * (b ?? 1), 1) * 4, 0),
        inputShape: shape,
        ms
      })
      shape = perSample(sym.shape, i)
      dtype = sym.dtype
    } finally {
      for (const w of l.weights) w.dispose()
    }
  }
  return out
}

/** Layers [from, to) of the stack, made and built, as a functional model of their own. */
export const buildStackRange = (tf: Tf, stack: LayerStack, infos: ReadonlyArray<StackLayerInfo>, from: number, to: number): LayersModel => {
  const input = tf.input({ shape: [...infos[from].inputShape], dtype: from === 0 ? (stack.inputDtype ?? "float32") : "float32" })
  let h: SymbolicTensor = input
  for (let i = from; i < to; i++) {
    const l = make(tf, stack, i)
    ;(l as unknown as { name: string }).name = infos[i].name
    h = l.apply(h) as SymbolicTensor
  }
  return tf.model({ inputs: input, outputs: h })
}
