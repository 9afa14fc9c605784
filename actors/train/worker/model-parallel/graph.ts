// A tfjs model as a chain of partition units: the layers in topological order, and the points
// between them where exactly one tensor carries everything the rest of the model needs (every
// point of a sequential model; in a functional graph, not inside a residual branch). A pipeline
// stage is a run of units, so what travels between stages is always one tensor. A range of layers
// runs on a concrete tensor by replaying the graph's edges (symbolic tensor ids), so sequential and
// functional models run the same way.
import { ConfigError } from "../../../../core/errors.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Layer = import("@tensorflow/tfjs").layers.Layer
type LayersModel = import("@tensorflow/tfjs").LayersModel

interface SymbolicLike {
  readonly id: number
  readonly shape: ReadonlyArray<number | null>
  readonly dtype?: string
}

interface NodeLike {
  readonly inputTensors: ReadonlyArray<SymbolicLike>
  readonly outputTensors: ReadonlyArray<SymbolicLike>
}

export interface GraphLayer {
  readonly layer: Layer
  readonly inputs: ReadonlyArray<number>
  readonly output: number
}

/** A tensor that crosses a cut: its id in the graph and its per-sample shape. */
export interface Boundary {
  readonly id: number
  readonly shape: ReadonlyArray<number>
}

export interface ModelGraph {
  readonly layers: ReadonlyArray<GraphLayer>
  /** Unit u holds layers [unitStart[u], unitStart[u + 1]). */
  readonly unitStart: ReadonlyArray<number>
  /** boundaries[u]: the tensor entering unit u; boundaries[units]: the model's output. */
  readonly boundaries: ReadonlyArray<Boundary>
  readonly inputDtype: string
}

export const unitCount = (g: ModelGraph): number => g.unitStart.length - 1

const perSample = (shape: ReadonlyArray<number | null>, what: string): number[] => {
  const rest = shape.slice(1)
  if (rest.some((d) => d === null || d === undefined)) {
    throw new ConfigError({ field: "preparePipeline(model)", reason: `${what} has shape [${shape.join(", ")}]: a pipeline needs every dimension but the batch known` })
  }
  return rest as number[]
}

/** The model's layers and cut points (see the module comment). */
export const modelGraph = (model: LayersModel): ModelGraph => {
  const field = "preparePipeline(model)"
  if (model.inputs.length !== 1 || model.outputs.length !== 1) {
    throw new ConfigError({ field, reason: `a pipelined model has one input and one output; this one has ${model.inputs.length} and ${model.outputs.length}` })
  }
  const input = model.inputs[0] as unknown as SymbolicLike
  const output = model.outputs[0] as unknown as SymbolicLike
  const layers: GraphLayer[] = []
  const shapes = new Map<number, ReadonlyArray<number | null>>([[input.id, input.shape]])
  for (const layer of model.layers) {
    if (layer.getClassName() === "InputLayer") continue
    const nodes = (layer as unknown as { inboundNodes: NodeLike[] }).inboundNodes
    if (nodes.length !== 1) {
      throw new ConfigError({ field, reason: `layer "${layer.name}" is used ${nodes.length} times (a shared layer): a pipeline cuts models whose layers are each called once` })
    }
    const node = nodes[0]
    if (node.outputTensors.length !== 1) {
      throw new ConfigError({ field, reason: `layer "${layer.name}" has ${node.outputTensors.length} outputs: a pipeline needs layers with one output` })
    }
    const out = node.outputTensors[0]
    shapes.set(out.id, out.shape)
    layers.push({ layer, inputs: node.inputTensors.map((t) => t.id), output: out.id })
  }
  if (layers.length === 0) throw new ConfigError({ field, reason: "the model has no layers" })
  // A tensor is live across the cut after layer k when it was made at or before k and is used after k.
  const madeAt = new Map<number, number>([[input.id, -1]])
  const lastUse = new Map<number, number>()
  for (const [i, l] of layers.entries()) {
    madeAt.set(l.output, i)
    for (const id of l.inputs) {
      if (!madeAt.has(id)) throw new ConfigError({ field, reason: `layer "${l.layer.name}" takes a tensor from outside the model` })
      lastUse.set(id, i)
    }
  }
  lastUse.set(output.id, layers.length)
  const unitStart = [0]
  const boundaries: Boundary[] = [{ id: input.id, shape: perSample(input.shape, "the model's input") }]
  for (let k = 0; k < layers.length - 1; k++) {
    const live: number[] = []
    for (const [id, made] of madeAt) if (made <= k && (lastUse.get(id) ?? -2) > k) live.push(id)
    if (live.length === 1) {
      unitStart.push(k + 1)
      boundaries.push({ id: live[0], shape: perSample(shapes.get(live[0]) ?? [], `the output of layer "${layers[k].layer.name}"`) })
    }
  }
  unitStart.push(layers.length)
  boundaries.push({ id: output.id, shape: perSample(output.shape, "the model's output") })
  return { layers, unitStart, boundaries, inputDtype: input.dtype ?? "float32" }
}

/**
 * Runs layers [from, to) on `x`, the tensor entering at `fromId`, and returns the tensor leaving
 * at `toId` (call inside tf.tidy: the intermediate tensors are not disposed here).
 */
export const runLayers = (layers: ReadonlyArray<GraphLayer>, from: number, to: number, fromId: number, toId: number, x: Tensor, training: boolean): Tensor => {
  const values = new Map<number, Tensor>([[fromId, x]])
  for (let i = from; i < to; i++) {
    const l = layers[i]
    const ins = l.inputs.map((id) => {
      const v = values.get(id)
      if (!v) throw new ConfigError({ field: "preparePipeline(model)", reason: `layer "${l.layer.name}" needs a tensor from before its stage that was not passed on` })
      return v
    })
    values.set(l.output, l.layer.apply(ins.length === 1 ? ins[0] : ins, { training }) as Tensor)
  }
  const out = values.get(toId)
  if (!out) throw new ConfigError({ field: "preparePipeline(model)", reason: `layers ${from}..${to - 1} do not produce the tensor their stage passes on` })
  return out
}

/** Bytes of a layer's trainable weights (float32). */
export const layerParamBytes = (layer: Layer): number =>
  layer.trainableWeights.reduce((n, w) => n + w.shape.reduce((a: number, b) => a * (b ?? 1), 1) * 4, 0)
