// Checkpoints of a model cut into stages and tensor-parallel slices. Each rank of replica 0 writes
// one shard, `pipeline/stage-<s>-of-<S>.tp-<t>-of-<T>.msgpack`: its weights (named by the whole
// model's weight they are, or the slice of it) and its optimizer state; rank 0 adds
// `pipeline/layout.json`: the cut (stages, tensor ranks, unit bounds), the whole model's weight
// names and shapes in order, and its topology. A checkpoint restores at the same layout (each rank
// loads its shard), or merges into one model: the slices are put back together into the tfjs files
// a single model loads (model.json + weights.bin), for inference or export.
import { isTf, loadEngine, type Tf } from "../../../../core/engine.ts"
import { ConfigError } from "../../../../core/errors.ts"
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { MODEL_JSON, WEIGHTS_BIN, loadOptimizerFrom, modelFromFiles, optimizerToFile } from "../../../../core/model-io.ts"
import { decodeMessage, encodeMessage, packedArray } from "../../../../core/wire.ts"
import type { GridPlace } from "./grid.ts"
import type { WeightPart } from "./tensor-parallel.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable
type Optimizer = import("@tensorflow/tfjs").Optimizer
type LayersModel = import("@tensorflow/tfjs").LayersModel

export const LAYOUT_FILE = "pipeline/layout.json"

export interface PipelineLayout {
  readonly format: 1
  readonly stages: number
  readonly tp: number
  /** Stage s holds partition units [bounds[s], bounds[s+1]). */
  readonly bounds: ReadonlyArray<number>
  readonly units: number
  /** The whole model's weights (trainable and not), in the model's order. */
  readonly weights: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
  /** The model's topology (model.toJSON), when the model was built whole. */
  readonly topology?: unknown
}

/** A weight of the stage that is not trained (batch-norm statistics...): saved whole. */
export interface FrozenWeight {
  readonly name: string
  read(): Tensor
  write(t: Tensor): void
}

interface SavedWeight {
  readonly name: string
  readonly slice?: WeightPart["slice"]
  readonly shape: number[]
  readonly data: Float32Array
}

interface SavedShard {
  readonly stage: number
  readonly tpRank: number
  readonly bounds: number[]
  readonly weights: SavedWeight[]
  readonly frozen?: SavedWeight[]
  readonly optimizer: Uint8Array
  /** Optimizer steps the stage had taken (absent in checkpoints written before it was kept). */
  readonly step?: number
}

/** What every stage shard's file name starts with. */
export const PIPELINE_SHARD_PREFIX = "pipeline/stage-"

export const shardFileName = (stage: number, stages: number, tpRank: number, tp: number): string =>
  `${PIPELINE_SHARD_PREFIX}${stage}-of-${stages}.tp-${tpRank}-of-${tp}.msgpack`

/** The files of a checkpoint a rank at `place` restores from: the layout and its stage's shard. */
export const stageFilesOf = (place: GridPlace): string[] => [LAYOUT_FILE, shardFileName(place.stage, place.stages, place.tpRank, place.tp)]

/** The shards of a checkpoint at `place`'s layout that a rank there does not restore from: every other stage's and tensor rank's. */
export const otherStageFiles = (place: GridPlace): string[] => {
  const out: string[] = []
  for (let s = 0; s < place.stages; s++) {
    for (let t = 0; t < place.tp; t++) if (s !== place.stage || t !== place.tpRank) out.push(shardFileName(s, place.stages, t, place.tp))
  }
  return out
}

export const isPipelineCheckpoint = (files: Readonly<Record<string, unknown>>): boolean => LAYOUT_FILE in files

const FIELD = "checkpoint"

export const readLayout = (files: Readonly<Record<string, Uint8Array>>): PipelineLayout => {
  const bytes = files[LAYOUT_FILE]
  if (!bytes) throw new ConfigError({ field: FIELD, reason: `not a pipeline checkpoint: it has no ${LAYOUT_FILE} (files: ${Object.keys(files).slice(0, 8).join(", ") || "none"})` })
  return JSON.parse(new TextDecoder().decode(bytes)) as PipelineLayout
}

const describe = (l: Pick<PipelineLayout, "stages" | "tp" | "bounds">): string => `${l.stages} stage(s) at unit bounds [${l.bounds.join(", ")}], tensorParallel ${l.tp}`

/** This rank's shard (and on rank 0 the layout). */
export const stageShardFiles = async (
  layout: PipelineLayout,
  place: GridPlace,
  vars: ReadonlyArray<Variable>,
  parts: ReadonlyArray<WeightPart>,
  optimizer: Optimizer,
  frozen: ReadonlyArray<FrozenWeight> = [],
  step?: number
): Promise<Record<string, Uint8Array>> => {
  const weights: SavedWeight[] = await Promise.all(
    vars.map(async (v, i) => ({ name: parts[i].name, ...(parts[i].slice ? { slice: parts[i].slice } : {}), shape: [...v.shape], data: (await v.data()) as Float32Array }))
  )
  const still: SavedWeight[] = await Promise.all(frozen.map(async (w) => {
    const t = w.read()
    return { name: w.name, shape: [...t.shape], data: (await t.data()) as Float32Array }
  }))
  const shard: SavedShard = { stage: place.stage, tpRank: place.tpRank, bounds: [...layout.bounds], weights, ...(still.length ? { frozen: still } : {}), optimizer: await optimizerToFile(optimizer), ...(step !== undefined ? { step } : {}) }
  const files: Record<string, Uint8Array> = { [shardFileName(place.stage, place.stages, place.tpRank, place.tp)]: encodeMessage(shard) }
  if (place.rank === 0) files[LAYOUT_FILE] = new TextEncoder().encode(JSON.stringify(layout))
  return files
}

const readShard = (files: Readonly<Record<string, Uint8Array>>, layout: PipelineLayout, stage: number, tpRank: number): SavedShard => {
  const name = shardFileName(stage, layout.stages, tpRank, layout.tp)
  const bytes = files[name]
  if (!bytes) {
    throw new ConfigError({
      field: FIELD,
      reason:
        `the pipeline checkpoint lacks ${name}: every rank must call ctx.checkpointFromModel(pp) and pass the result to ` +
        "ctx.report(metrics, { checkpoint }) (each rank of replica 0 adds its stage's shard)"
    })
  }
  // Its weights' shapes as packed arrays, once for every reader (wire.ts packedArray: decoded ones are holey).
  const shard = decodeMessage(bytes) as SavedShard
  const packed = (ws: SavedWeight[]): SavedWeight[] => ws.map((w) => ({ ...w, shape: packedArray(w.shape) }))
  return { ...shard, weights: packed(shard.weights), ...(shard.frozen ? { frozen: packed(shard.frozen) } : {}) }
}

/** Loads this rank's stage from a checkpoint taken at the same layout; returns the optimizer steps it had taken, if saved. */
export const loadStageShard = async (
  tf: Tf,
  files: Readonly<Record<string, Uint8Array>>,
  layout: PipelineLayout,
  place: GridPlace,
  vars: ReadonlyArray<Variable>,
  parts: ReadonlyArray<WeightPart>,
  optimizer: Optimizer,
  frozen: ReadonlyArray<FrozenWeight> = []
): Promise<number | undefined> => {
  const saved = readLayout(files)
  if (saved.stages !== layout.stages || saved.tp !== layout.tp || saved.bounds.join() !== layout.bounds.join()) {
    throw new ConfigError({
      field: FIELD,
      reason:
        `the checkpoint was cut into ${describe(saved)}, this model into ${describe(layout)}: restore with the same stages, ` +
        "tensorParallel and balance (explicit counts reproduce a cut), or merge it into one model (loadPipelineCheckpoint) and start from that"
    })
  }
  const shard = readShard(files, layout, place.stage, place.tpRank)
  if (shard.weights.length !== vars.length) {
    throw new ConfigError({ field: FIELD, reason: `stage ${place.stage} (tensor rank ${place.tpRank}) saved ${shard.weights.length} weights, this stage has ${vars.length}` })
  }
  for (const [i, w] of shard.weights.entries()) {
    const v = vars[i]
    if (w.name !== parts[i].name || w.shape.join("x") !== v.shape.join("x")) {
      throw new ConfigError({ field: FIELD, reason: `weight ${i} of stage ${place.stage} is "${w.name}" [${w.shape}] in the checkpoint but "${parts[i].name}" [${v.shape}] here` })
    }
    const t = tf.tensor(w.data, w.shape)
    v.assign(t)
    t.dispose()
  }
  for (const f of frozen) {
    const w = shard.frozen?.find((s) => s.name === f.name)
    if (!w) throw new ConfigError({ field: FIELD, reason: `the checkpoint has no weight "${f.name}" for stage ${place.stage}` })
    const t = tf.tensor(w.data, w.shape)
    f.write(t)
    t.dispose()
  }
  await loadOptimizerFrom(tf, optimizer, shard.optimizer)
  return shard.step
}

/** Concatenates equal-shaped parts along `axis` (row-major). */
const concatAlong = (parts: ReadonlyArray<SavedWeight>, axis: number): { shape: number[]; data: Float32Array } => {
  const shape = [...parts[0].shape]
  const outer = shape.slice(0, axis).reduce((a, b) => a * b, 1)
  const inner = shape.slice(axis).reduce((a, b) => a * b, 1)
  const data = new Float32Array(outer * inner * parts.length)
  for (let o = 0; o < outer; o++) {
    for (const [k, p] of parts.entries()) data.set(p.data.subarray(o * inner, (o + 1) * inner), (o * parts.length + k) * inner)
  }
  shape[axis] *= parts.length
  return { shape, data }
}

/** Every weight of the whole model, put back together from the shards, by name. */
export const mergedWeights = (files: Readonly<Record<string, Uint8Array>>): { layout: PipelineLayout; weights: Map<string, { shape: number[]; data: Float32Array }> } => {
  const layout = readLayout(files)
  const pieces = new Map<string, SavedWeight[]>()
  for (let s = 0; s < layout.stages; s++) {
    for (let t = 0; t < layout.tp; t++) {
      const shard = readShard(files, layout, s, t)
      for (const w of [...shard.weights, ...(shard.frozen ?? [])]) {
        // a replicated weight is held by every tensor rank: one copy is enough
        if (!w.slice && t > 0) continue
        const list = pieces.get(w.name) ?? []
        list.push(w)
        pieces.set(w.name, list)
      }
    }
  }
  const weights = new Map<string, { shape: number[]; data: Float32Array }>()
  for (const [name, list] of pieces) {
    const sl = list[0].slice
    if (!sl) {
      weights.set(name, { shape: list[0].shape, data: list[0].data })
      continue
    }
    const ordered = [...list].sort((a, b) => a.slice!.index - b.slice!.index)
    if (ordered.length !== sl.parts || ordered.some((p, i) => p.slice!.index !== i)) {
      throw new ConfigError({ field: FIELD, reason: `weight "${name}" has ${ordered.length} of its ${sl.parts} slices in the checkpoint` })
    }
    weights.set(name, concatAlong(ordered, sl.axis))
  }
  for (const w of layout.weights) {
    const got = weights.get(w.name)
    if (!got) throw new ConfigError({ field: FIELD, reason: `the pipeline checkpoint has no value for weight "${w.name}"` })
    if (got.shape.join("x") !== w.shape.join("x")) throw new ConfigError({ field: FIELD, reason: `weight "${w.name}" merges to [${got.shape}], the model has [${w.shape}]` })
  }
  return { layout, weights }
}

/**
 * A pipeline checkpoint as the files of one tfjs model (model.json + weights.bin, the format
 * tf.loadLayersModel and modelFromFiles read). Needs the topology (a model built whole).
 */
export const mergePipelineCheckpoint = (files: Readonly<Record<string, Uint8Array>>): Record<string, Uint8Array> => {
  const { layout, weights } = mergedWeights(files)
  if (layout.topology === undefined) {
    throw new ConfigError({ field: FIELD, reason: "this pipeline checkpoint has no model topology (the model was built per stage): build the model in code and load it with ctx.restoreModel(model, checkpoint) or loadPipelineCheckpointInto" })
  }
  const total = layout.weights.reduce((n, w) => n + w.shape.reduce((a, b) => a * b, 1), 0)
  const data = new Float32Array(total)
  let o = 0
  for (const w of layout.weights) {
    const v = weights.get(w.name)!
    data.set(v.data, o)
    o += v.data.length
  }
  const json = {
    modelTopology: layout.topology,
    format: "layers-model",
    generatedBy: "gradwire pipeline checkpoint",
    convertedBy: null,
    weightsManifest: [{ paths: [`./${WEIGHTS_BIN}`], weights: layout.weights.map((w) => ({ name: w.name, shape: [...w.shape], dtype: "float32" })) }]
  }
  return { [MODEL_JSON]: new TextEncoder().encode(JSON.stringify(json)), [WEIGHTS_BIN]: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) }
}

/** Loads a pipeline checkpoint's weights, merged, into a whole model built in code with the same layers. */
export const loadPipelineCheckpointInto = (tf: Tf, model: LayersModel, files: Readonly<Record<string, Uint8Array>>): void => {
  const { weights } = mergedWeights(files)
  const values = model.weights.map((w) => {
    const v = weights.get(w.originalName) ?? weights.get(w.name)
    if (!v) throw new ConfigError({ field: FIELD, reason: `the pipeline checkpoint has no weight "${w.originalName}"; it holds ${[...weights.keys()].slice(0, 8).join(", ")}…` })
    if (v.shape.join("x") !== w.shape.join("x")) throw new ConfigError({ field: FIELD, reason: `weight "${w.originalName}" is [${v.shape}] in the checkpoint, [${w.shape}] in the model` })
    return tf.tensor(v.data, v.shape)
  })
  model.setWeights(values)
  tf.dispose(values)
}

/** Every file under a checkpoint directory, by its path relative to it ("pipeline/layout.json"...). */
const readCheckpointDir = async (dir: string): Promise<Record<string, Uint8Array>> => {
  const out: Record<string, Uint8Array> = {}
  const walk = async (rel: string): Promise<void> => {
    for (const e of await fs.readdir(path.join(dir, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name
      if (e.isDirectory()) await walk(r)
      else if (e.isFile()) out[r] = new Uint8Array(await fs.readFile(path.join(dir, r)))
    }
  }
  await walk("")
  return out
}

/** What loadCheckpointModel takes: result.checkpoint (or one of result.bestCheckpoints), its directory, or its files. */
export type CheckpointArg = string | { readonly path: string } | Readonly<Record<string, Uint8Array>>

/** `(tf, checkpoint)` or `(checkpoint)`: without tfjs given, gradwire's engine (loadEngine()). */
const tfAndCheckpoint = async (field: string, a: unknown, b: unknown, more: boolean): Promise<[Tf, unknown]> => {
  const tf = isTf(a) ? a : undefined
  if (!tf && more && b !== undefined) throw new ConfigError({ field, reason: "takes (tf, checkpoint) or (checkpoint): its first argument is not tfjs" })
  const checkpoint = tf ? b : a
  if (checkpoint === undefined || checkpoint === null) {
    throw new ConfigError({
      field,
      reason:
        `got ${String(checkpoint)} for the checkpoint: result.checkpoint is undefined when the run saved none (a loop saves one with ctx.report(metrics, { checkpoint })); ` +
        "loadResult(dir) lists a run's checkpoints from its directory (checkpoints.json, or object_checkpoints.json for a run with checkpointConfig.objectStore)"
    })
  }
  return [tf ?? (await loadEngine()).tf, checkpoint]
}

/**
 * A run's checkpoint as the tfjs model it holds, with its trained weights, for inference or export
 * (model.save) in the driver, as Ray's result.checkpoint: `checkpoint` is result.checkpoint (or one
 * of result.bestCheckpoints), its directory, or its files; a pipelined run's stage shards are merged
 * into one model. Plain tfjs has no file loader in Node (tf.loadLayersModel("file://...") needs
 * tfjs-node); this reads the directory itself. The public loadCheckpointModel (index.ts) fetches a
 * checkpoint kept in an object store first (driver/checkpoint-fetch.ts) and passes its files here.
 * `tf` may be left out: the model is then made on gradwire's engine (loadEngine(): tfjs with the
 * fastest backend that loads here).
 */
export async function loadCheckpointModel(checkpoint: CheckpointArg): Promise<LayersModel>
export async function loadCheckpointModel(tf: Tf, checkpoint: CheckpointArg): Promise<LayersModel>
export async function loadCheckpointModel(a: Tf | CheckpointArg, b?: CheckpointArg): Promise<LayersModel> {
  const [tf, checkpoint] = await tfAndCheckpoint("loadCheckpointModel", a, b, arguments.length > 1)
  const where = typeof checkpoint === "object" && checkpoint !== null && typeof (checkpoint as { path?: unknown }).path === "string" ? (checkpoint as { path: string }).path : checkpoint
  if (typeof where === "string" && where.startsWith("nats-obj://")) {
    throw new ConfigError({ field: "loadCheckpointModel", reason: `${where} is in an object store: load it with gradwire's loadCheckpointModel, which fetches it, or pass its files (fetchCheckpoint)` })
  }
  let files: Readonly<Record<string, Uint8Array>>
  if (typeof where === "string") {
    // a run directory (its config.json, its checkpoints in checkpoint_NNNNNN folders): say how to pick one
    const names = await fs.readdir(where).catch(() => [] as string[])
    if (names.includes("config.json") && !names.includes(MODEL_JSON)) {
      throw new ConfigError({
        field: "loadCheckpointModel",
        reason: `${where} is a run directory, not a checkpoint: load one of its checkpoints, (await loadResult(${JSON.stringify(where)})).checkpoint (its latest) or one of its bestCheckpoints`
      })
    }
    try {
      files = await readCheckpointDir(where)
    } catch (e) {
      throw new ConfigError({ field: "loadCheckpointModel", reason: `cannot read the checkpoint directory ${where}: ${e instanceof Error ? e.message : String(e)}` })
    }
  } else files = where as Readonly<Record<string, Uint8Array>>
  if (isPipelineCheckpoint(files)) return modelFromFiles(tf, mergePipelineCheckpoint(files))
  if (!(MODEL_JSON in files) || !(WEIGHTS_BIN in files)) {
    throw new ConfigError({
      field: "loadCheckpointModel",
      reason: `the checkpoint has no ${MODEL_JSON} and ${WEIGHTS_BIN} (its files: ${Object.keys(files).slice(0, 8).join(", ") || "none"}): it was not made by ctx.checkpointFromModel(model)`
    })
  }
  return modelFromFiles(tf, files)
}

/**
 * A pipelined run's checkpoint (a directory, as result.checkpoint.path, or its files) as one tfjs
 * model with the trained weights: for inference or export (model.save) in the driver. The public
 * one (index.ts) fetches a checkpoint kept in an object store first.
 */
export async function loadPipelineCheckpoint(checkpoint: string | Readonly<Record<string, Uint8Array>>): Promise<LayersModel>
export async function loadPipelineCheckpoint(tf: Tf, checkpoint: string | Readonly<Record<string, Uint8Array>>): Promise<LayersModel>
export async function loadPipelineCheckpoint(a: Tf | string | Readonly<Record<string, Uint8Array>>, b?: string | Readonly<Record<string, Uint8Array>>): Promise<LayersModel> {
  const [tf, given] = await tfAndCheckpoint(FIELD, a, b, arguments.length > 1)
  const checkpoint = given as string | Readonly<Record<string, Uint8Array>>
  if (typeof checkpoint === "string" && checkpoint.startsWith("nats-obj://")) {
    throw new ConfigError({ field: FIELD, reason: `${checkpoint} is in an object store: load it with gradwire's loadPipelineCheckpoint, which fetches it, or pass its files (fetchCheckpoint)` })
  }
  const files = typeof checkpoint === "string" ? await readCheckpointDir(checkpoint) : checkpoint
  return modelFromFiles(tf, mergePipelineCheckpoint(files))
}
