// tfjs models to and from checkpoint files: model.json (topology + weights manifest, the format
// tf.loadLayersModel reads) and weights.bin. A restore into an existing model sets its weights
// by name, so a worker can rebuild its model in code and load the trained values.
import type { Tf } from "./engine.ts"
import { ConfigError } from "./errors.ts"

type LayersModel = import("@tensorflow/tfjs").LayersModel

export const MODEL_JSON = "model.json"
export const WEIGHTS_BIN = "weights.bin"

/** Serialises a LayersModel (topology and weights) into checkpoint files. */
export const modelToFiles = async (tf: Tf, model: LayersModel): Promise<Record<string, Uint8Array>> => {
  let files: Record<string, Uint8Array> = {}
  await model.save(
    tf.io.withSaveHandler(async (artifacts) => {
      const weightData = artifacts.weightData === undefined ? new ArrayBuffer(0) : tf.io.concatenateArrayBuffers(
        Array.isArray(artifacts.weightData) ? artifacts.weightData : [artifacts.weightData]
      )
      const json = {
        modelTopology: artifacts.modelTopology,
        format: artifacts.format,
        generatedBy: artifacts.generatedBy,
        convertedBy: artifacts.convertedBy,
        weightsManifest: [{ paths: [`./${WEIGHTS_BIN}`], weights: artifacts.weightSpecs ?? [] }]
      }
      files = {
        [MODEL_JSON]: new TextEncoder().encode(JSON.stringify(json)),
        [WEIGHTS_BIN]: new Uint8Array(weightData)
      }
      return { modelArtifactsInfo: { dateSaved: new Date(), modelTopologyType: "JSON", weightDataBytes: weightData.byteLength } }
    })
  )
  return files
}

const parseModelJson = (files: Record<string, Uint8Array>) => {
  const json = files[MODEL_JSON]
  const bin = files[WEIGHTS_BIN]
  if (!json || !bin) {
    throw new ConfigError({
      field: "checkpoint",
      reason: `a model checkpoint needs ${MODEL_JSON} and ${WEIGHTS_BIN}; found ${Object.keys(files).join(", ") || "no files"}`
    })
  }
  const parsed = JSON.parse(new TextDecoder().decode(json)) as {
    modelTopology: object
    weightsManifest: Array<{ weights: import("@tensorflow/tfjs").io.WeightsManifestEntry[] }>
  }
  // weights.bin may sit at any offset in a larger buffer; tfjs wants an ArrayBuffer of its own.
  const weightData = bin.byteOffset === 0 && bin.byteLength === bin.buffer.byteLength
    ? (bin.buffer as ArrayBuffer)
    : bin.slice().buffer
  return { topology: parsed.modelTopology, specs: parsed.weightsManifest.flatMap((m) => m.weights), weightData }
}

/** Rebuilds a LayersModel from checkpoint files. */
export const modelFromFiles = (tf: Tf, files: Record<string, Uint8Array>): Promise<LayersModel> => {
  const { topology, specs, weightData } = parseModelJson(files)
  return tf.loadLayersModel(tf.io.fromMemory({ modelTopology: topology, weightSpecs: specs, weightData }))
}

/** Loads checkpointed weights into an existing model whose variables have the same names and shapes. */
export const loadWeightsInto = (tf: Tf, model: LayersModel, files: Record<string, Uint8Array>): void => {
  const { specs, weightData } = parseModelJson(files)
  const named = tf.io.decodeWeights(weightData, specs)
  const values = model.weights.map((w) => {
    const t = named[w.originalName] ?? named[w.name]
    if (!t) {
      throw new ConfigError({
        field: "checkpoint",
        reason: `the checkpoint has no weight "${w.originalName}"; it holds ${Object.keys(named).slice(0, 8).join(", ")}…`
      })
    }
    if (t.shape.join("x") !== w.shape.join("x")) {
      throw new ConfigError({
        field: "checkpoint",
        reason: `weight "${w.originalName}" has shape [${t.shape}] in the checkpoint but [${w.shape}] in the model`
      })
    }
    return t
  })
  model.setWeights(values)
  for (const t of Object.values(named)) t.dispose()
}

export const OPTIMIZER_FILE = "optimizer.msgpack"

type Optimizer = import("@tensorflow/tfjs").Optimizer

/**
 * An optimizer's state (Adam's moments and step count, momentum's accumulators...) as one file,
 * so a resumed run continues the same optimisation instead of restarting its statistics.
 */
export const optimizerToFile = async (optimizer: Optimizer): Promise<Uint8Array> => {
  const { encodeMessage } = await import("./wire.ts")
  const weights = await optimizer.getWeights()
  const entries = await Promise.all(
    weights.map(async (w) => ({ name: w.name, shape: [...w.tensor.shape], dtype: w.tensor.dtype, data: await w.tensor.data() }))
  )
  // getWeights() makes a fresh step-count scalar ("iter") at every call; the rest are the
  // optimizer's own variables. Without this every checkpoint and state-parity check kept one.
  for (const w of weights) if (w.name === "iter" && !w.tensor.isDisposed) w.tensor.dispose()
  return encodeMessage({ optimizer: optimizer.getClassName(), weights: entries })
}

/** What optimizerToFile saved, checked to be the state of an optimizer of class `className`. */
export const readOptimizerFile = async (
  bytes: Uint8Array,
  className: string
): Promise<Array<{ name: string; shape: number[]; dtype: string; data: Float32Array | Int32Array }>> => {
  const { decodeMessage, packedArray } = await import("./wire.ts")
  const saved = decodeMessage(bytes) as {
    optimizer: string
    weights: Array<{ name: string; shape: number[]; dtype: string; data: Float32Array | Int32Array }>
  }
  if (saved.optimizer !== className) {
    throw new ConfigError({
      field: "checkpoint",
      reason: `the checkpoint holds ${saved.optimizer} state but the model is compiled with ${className}`
    })
  }
  return saved.weights.map((w) => {
    if (!Object.hasOwn(TENSOR_DTYPES, w.dtype)) {
      throw new ConfigError({
        field: "checkpoint",
        reason: `the optimizer state's "${w.name}" has dtype ${JSON.stringify(w.dtype)}, not one of ${Object.keys(TENSOR_DTYPES).join(", ")}: the file is not an optimizer state gradwire wrote`
      })
    }
    return { ...w, shape: packedArray(w.shape), dtype: TENSOR_DTYPES[w.dtype as keyof typeof TENSOR_DTYPES] }
  })
}

/**
 * tfjs's dtypes, each to itself as a literal. A string decoded from a file is a new string, not
 * V8's internalized copy of the literal: as an optimizer variable's dtype it reached every tfjs
 * function that compares dtypes at every step, and their code, optimized for literals, was
 * thrown away ("wrong instance type") in a worker that had just taken a peer's state, as it joined.
 */
const TENSOR_DTYPES = { float32: "float32", int32: "int32", bool: "bool", complex64: "complex64", string: "string" } as const

/** Restores what optimizerToFile saved into an optimizer of the same class over the same variables. */
export const loadOptimizerFrom = async (tf: Tf, optimizer: Optimizer, bytes: Uint8Array): Promise<void> => {
  const weights = await readOptimizerFile(bytes, optimizer.getClassName())
  const named = weights.map((w) => ({ name: w.name, tensor: tf.tensor(w.data, w.shape, w.dtype as "float32" | "int32") }))
  await optimizer.setWeights(named)
}
