// Turning a compiled tfjs model into this rank's part of a model-parallel grid (ctx.preparePipeline):
// find the model's cut points, measure what its units cost (or take the balance asked for), cut it
// into stages the same way on every rank, connect this rank to its neighbours and groups, build its
// stage (layer blocks, and tensor-parallel dense pairs when tensorParallel > 1), start every
// replica of a stage from replica 0's weights, and free the weights of the layers other stages
// hold. From a built model every rank builds the whole model first (with the same code), then keeps
// its part; from a stack of layer factories (stack.ts) no rank ever holds more than its stage and
// one other layer.
import type { Tf } from "../../../../core/engine.ts"
import { ConfigError } from "../../../../core/errors.ts"
import { LayerBlock, type Block } from "./blocks.ts"
import type { FrozenWeight, PipelineLayout } from "./checkpoint.ts"
import { modelGraph, runLayers, layerParamBytes, unitCount } from "./graph.ts"
import { gridShape, placeOf, type GridPlace } from "./grid.ts"
import { swappableLinks, type StageLinks, type SumGroup } from "./links.ts"
import { resolveLoss, type LossFn, type LossName } from "./loss.ts"
import { partitionUnits, stageSpeeds, type BalanceBy, type Partition } from "./partition.ts"
import { PipelineModel, type PipelineModelOptions, type PipelineSession } from "./pipeline-model.ts"
import { profileUnits } from "./profile.ts"
import { scheduleNames, type ScheduleName } from "./schedule.ts"
import { buildStackRange, describeStack, isLayerStack, type LayerStack, type StackLayerInfo } from "./stack.ts"
import { TensorParallelDensePair, activationAfter, isTensorParallelPair, type WeightPart } from "./tensor-parallel.ts"
import type { LayersModel } from "@tensorflow/tfjs"

type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable
type Optimizer = import("@tensorflow/tfjs").Optimizer

export type { LayerStack } from "./stack.ts"

export interface PipelineOptions {
  /** Pipeline stages (consecutive groups of layers, one per worker). Default 1. */
  readonly stages?: number
  /** Micro-batches per batch (need not divide it). Default 2 x stages (1 with one stage). */
  readonly microBatches?: number
  /** "1f1b" (default: at most S - s micro-batches in flight per stage) or "gpipe" (all forwards, then all backwards). */
  readonly schedule?: ScheduleName
  /** Ranks each stage's dense pairs are split over (Megatron MLP). Default 1. */
  readonly tensorParallel?: number
  /** How to cut: "compute" (measured, default), "memory" (parameter bytes), "uniform" (units), or units per stage. */
  readonly balance?: BalanceBy
  /** Most bytes of weights, gradients and optimizer state a stage may hold (the cut respects it). */
  readonly memoryLimitBytes?: number
  /** Rows per micro-batch when measuring the units' compute. Default 16. */
  readonly profileBatchSize?: number
  /** Default: the model's compile() optimizer. */
  readonly optimizer?: Optimizer
  /** Default: the model's compile() loss. */
  readonly loss?: LossName | LossFn
}

export interface PrepareDeps {
  readonly rank: number
  readonly worldSize: number
  readonly seed?: number
  /** Every rank of the group (profiling, epoch metrics). */
  readonly world: SumGroup
  /** This rank's links to its neighbours and groups (every rank calls it at the same point). */
  readonly links: (place: GridPlace) => Promise<StageLinks>
  /** Recovery from surviving peers (a Trainer's worker): its group session; links are made again with `links` after a regroup. */
  readonly session?: PipelineSession
  /** A replacement joining survivors: the layout they run (their cut), at which it builds its stage instead of cutting again. */
  readonly joinLayout?: () => Promise<PipelineLayout | undefined>
  /** After each step the rank trained (PipelineModelOptions.progress). */
  readonly progress?: PipelineModelOptions["progress"]
}

/** Weights + gradients + optimizer state per weight byte, for the memory limit. */
const bytesPerParamByte = (optimizer: Optimizer): number => {
  switch (optimizer.getClassName()) {
    case "SGD":
      return 2
    case "Momentum":
    case "Adagrad":
      return 3
    case "RMSProp":
    case "Adam":
    case "Adamax":
    case "Adadelta":
      return 4
    default:
      return 4
  }
}

const FIELD = "preparePipeline"

/**
 * How the model is cut, the same on every rank: measured costs (`measure`, this rank's ms per unit)
 * are summed over the world, and each rank's total says how fast its worker is.
 */
const cut = async (
  paramBytes: ReadonlyArray<number>,
  measure: (() => Promise<number[]>) | undefined,
  opts: PipelineOptions,
  deps: PrepareDeps,
  stages: number,
  perByte: number,
  place: (r: number) => GridPlace
): Promise<Partition> => {
  const U = paramBytes.length
  const balance = opts.balance ?? "compute"
  let computeMs = new Array<number>(U).fill(1)
  let speeds: number[] | undefined
  if (measure) {
    const mine = await measure()
    const buf = new Float32Array(U + deps.worldSize)
    buf.set(mine)
    buf[U + deps.rank] = mine.reduce((a, b) => a + b, 0)
    await deps.world.sum(buf)
    computeMs = Array.from(buf.subarray(0, U), (v) => v / deps.worldSize)
    speeds = stageSpeeds(Array.from(buf.subarray(U)), stages, (r) => place(r).stage)
  }
  return partitionUnits({
    costs: computeMs.map((c, u) => ({ computeMs: c, paramBytes: paramBytes[u] })),
    stages,
    balance,
    ...(speeds ? { speeds } : {}),
    ...(opts.memoryLimitBytes !== undefined ? { memoryLimitBytes: opts.memoryLimitBytes } : {}),
    bytesPerParamByte: perByte
  })
}

/** What preparePipeline takes: a compiled model, or a stack of layer factories (stack.ts). */
export type PipelineSpec = LayersModel | LayerStack

/** This rank's part of the model (see the module comment). */
export const preparePipelineModel = async (tf: Tf, spec: PipelineSpec, opts: PipelineOptions, deps: PrepareDeps): Promise<PipelineModel> => {
  const stages = opts.stages ?? 1
  const tp = opts.tensorParallel ?? 1
  const grid = gridShape(deps.worldSize, stages, tp)
  const place = placeOf(deps.rank, grid)
  const schedule = opts.schedule ?? "1f1b"
  if (!scheduleNames.includes(schedule)) throw new ConfigError({ field: `${FIELD}.schedule`, reason: `must be ${scheduleNames.map((s) => `"${s}"`).join(" or ")}, got ${JSON.stringify(schedule)}` })
  const microBatches = opts.microBatches ?? (stages > 1 ? 2 * stages : 1)
  if (!Number.isInteger(microBatches) || microBatches < 1) throw new ConfigError({ field: `${FIELD}.microBatches`, reason: `must be an integer >= 1, got ${microBatches}` })
  const stack = isLayerStack(spec) ? spec : undefined
  const model = stack ? undefined : (spec as LayersModel)
  const optimizer = opts.optimizer ?? (model as unknown as { optimizer?: Optimizer } | undefined)?.optimizer
  if (!optimizer) throw new ConfigError({ field: `${FIELD}.optimizer`, reason: "no optimizer: compile the model (model.compile({ optimizer, loss })) or pass preparePipeline(model, { optimizer })" })
  const loss = resolveLoss(tf, opts.loss ?? (model as unknown as { loss?: unknown } | undefined)?.loss, `${FIELD}.loss`)
  const timed = (opts.balance ?? "compute") === "compute" && stages > 1
  const rows = opts.profileBatchSize ?? 16
  // the whole model's graph (a built model), or each layer described alone (a stack)
  const whole = model ? modelGraph(model) : undefined
  const infos: StackLayerInfo[] | undefined = stack ? await describeStack(tf, stack, timed ? rows : undefined) : undefined
  const paramBytes = whole
    ? Array.from({ length: unitCount(whole) }, (_, u) => {
        let b = 0
        for (let i = whole.unitStart[u]; i < whole.unitStart[u + 1]; i++) b += layerParamBytes(whole.layers[i].layer)
        return b
      })
    : infos!.map((l) => l.trainableBytes)
  const measure = timed ? (whole ? () => profileUnits(tf, whole, rows) : () => Promise.resolve(infos!.map((l) => l.ms))) : undefined
  // A replacement takes the survivors' cut: theirs was measured on the group they started with,
  // whose sums it cannot take part in now.
  const held = await deps.joinLayout?.()
  if (held && (held.stages !== stages || held.tp !== tp || held.units !== paramBytes.length)) {
    throw new ConfigError({
      field: FIELD,
      reason: `this replacement's model is cut into ${stages} stage(s) x tensorParallel ${tp} over ${paramBytes.length} units, the survivors' into ${held.stages} x ${held.tp} over ${held.units}: every rank must call preparePipeline with the same model and options`
    })
  }
  const bounds = held ? held.bounds : (await cut(paramBytes, measure, opts, deps, stages, bytesPerParamByte(optimizer), (r) => placeOf(r, grid))).bounds
  const layout: PipelineLayout = {
    format: 1,
    stages,
    tp,
    bounds: [...bounds],
    units: paramBytes.length,
    weights: model ? model.weights.map((w) => ({ name: w.originalName, shape: w.shape.map((d) => d ?? 1) })) : infos!.flatMap((l) => l.weights),
    ...(model ? { topology: model.toJSON(undefined, false) } : {})
  }
  // The graph this stage runs: the whole model's (its layers from the stage's first to its last), or
  // a model of only the stage's layers made from the stack.
  const graph = whole ?? modelGraph(buildStackRange(tf, stack!, infos!, bounds[place.stage], bounds[place.stage + 1]))
  const firstLayer = whole ? whole.unitStart[bounds[place.stage]] : 0
  const endLayer = whole ? whole.unitStart[bounds[place.stage + 1]] : graph.layers.length
  const swappable = swappableLinks(await deps.links(place))
  const links = swappable.links
  try {
    // tensor id at the start of each layer index that is a cut point
    const cutId = new Map<number, number>()
    for (let u = 0; u < graph.boundaries.length; u++) cutId.set(graph.unitStart[u] ?? graph.layers.length, graph.boundaries[u].id)
    const blocks: Block[] = []
    const parts: WeightPart[] = []
    const frozen: FrozenWeight[] = []
    const sliced = new Set<number>()
    let runFrom = firstLayer
    const flush = (to: number): void => {
      if (to <= runFrom) return
      const a = runFrom
      const fromId = cutId.get(a)!
      const toId = cutId.get(to)!
      const layers = graph.layers.slice(a, to).map((l) => l.layer)
      const vars = layers.flatMap((l) => l.trainableWeights.map((w) => w.read() as Variable))
      blocks.push(new LayerBlock(tf, (x: Tensor) => runLayers(graph.layers, a, to, fromId, toId, x, true), vars))
      for (const l of layers) {
        for (const w of l.trainableWeights) parts.push({ name: w.originalName })
        for (const w of l.nonTrainableWeights) frozen.push({ name: w.originalName, read: () => w.read(), write: (t) => w.write(t) })
      }
      runFrom = to
    }
    if (tp > 1) {
      for (let i = firstLayer; i + 1 < endLayer; i++) {
        const a = graph.layers[i]
        const b = graph.layers[i + 1]
        // a pair is a chain between two cut points: b takes exactly a's output
        const chain = cutId.has(i) && cutId.has(i + 2) && b.inputs.length === 1 && b.inputs[0] === a.output
        if (!chain || !isTensorParallelPair(a.layer, b.layer, tp)) continue
        flush(i)
        const pair = new TensorParallelDensePair(tf, a.layer, b.layer, links.tensor)
        blocks.push(pair)
        parts.push(...pair.parts)
        const act = activationAfter(b.layer)
        if (act) blocks.push(new LayerBlock(tf, act, []))
        sliced.add(i).add(i + 1)
        runFrom = i + 2
        i++
      }
    }
    flush(endLayer)
    if (tp > 1 && sliced.size === 0 && place.tpRank === 0 && place.replica === 0) {
      // A stage without a pair still trains (its tensor ranks compute it whole); say so once.
      console.warn(`gradwire: stage ${place.stage} has no dense pair to split over tensorParallel ${tp} (the first layer's units must divide by ${tp}); its ${tp} tensor ranks each compute it whole`)
    }
    const vars = blocks.flatMap((b) => [...b.variables])
    // Every replica of the stage starts from replica 0's weights (as prepareModel starts from rank 0's);
    // a replacement takes its stage's state where it joins the survivors.
    if (!held && links.replicas.size > 1 && vars.length > 0) {
      const flatT = tf.tidy(() => tf.concat(vars.map((v) => v.reshape([-1]))))
      const flat = (await flatT.data()) as Float32Array
      flatT.dispose()
      await links.replicas.broadcast(flat, 0)
      let o = 0
      for (const v of vars) {
        const t = tf.tensor(flat.subarray(o, o + v.size), v.shape)
        v.assign(t)
        t.dispose()
        o += v.size
      }
    }
    // Weights this rank does not train: the other stages' layers, and the whole tensors of the split pairs.
    for (const [i, l] of graph.layers.entries()) {
      if (i >= firstLayer && i < endLayer && !sliced.has(i)) continue
      for (const w of l.layer.weights) w.dispose()
    }
    return new PipelineModel(
      tf,
      place,
      {
        blocks,
        parts,
        frozen,
        inputShape: whole ? graph.boundaries[bounds[place.stage]].shape : graph.boundaries[0].shape,
        outputShape: whole ? graph.boundaries[bounds[place.stage + 1]].shape : graph.boundaries.at(-1)!.shape
      },
      links,
      {
        schedule,
        microBatches,
        loss,
        optimizer,
        layout,
        ...(deps.seed !== undefined ? { seed: deps.seed } : {}),
        ...(deps.session ? { recovery: { session: deps.session, relink: () => deps.links(place), swap: swappable.swap } } : {}),
        ...(deps.progress ? { progress: deps.progress } : {})
      }
    )
  } catch (e) {
    await links.close().catch(() => {})
    throw e
  }
}

