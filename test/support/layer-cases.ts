// The layer cases of the coverage tests (wasm-layer-coverage, webgpu-layer-coverage): one small
// model per name tf.layers exports, with trainable weights on both sides of the layer so the
// gradient flows through the layer's own backward kernels, and a seeded batch for it.
import type * as TfType from "@tensorflow/tfjs"
import type { Tf } from "../../core/engine.ts"

type SymbolicTensor = TfType.SymbolicTensor
type Build = (tf: Tf, x: SymbolicTensor) => SymbolicTensor
export interface Case {
  /** Input shape without the batch, and "int" for token ids in [0, 10). */
  readonly input: number[]
  readonly int?: boolean
  /** Units of a dense layer between the input and the layer (the last axis), so the gradient passes through the layer. */
  readonly pre?: number
  readonly build: Build
  /** The layer draws random numbers when training: gradients are compared in inference mode. */
  readonly random?: boolean
  /**
   * Compare with central finite differences on wasm instead of the cpu backend, whose kernel for
   * this layer's gradient is itself wrong (tfjs-backend-cpu 4.22's ResizeNearestNeighborGrad and
   * MaxPool3DGrad).
   */
  readonly numeric?: boolean
  /**
   * Applied to the batch eagerly, before a model of dense layers: tfjs-layers 4.22 cannot place the
   * layer inside a model (resizing passes its input list to the op; randomWidth's symbolic output
   * loses the batch axis), so it runs as the input pipeline it is meant for.
   */
  readonly eager?: (tf: Tf, x: TfType.Tensor) => TfType.Tensor
}

/** |backend - reference| <= TOL * (1 + |reference|) per gradient element. */
export const TOL = 1e-3

/** Every name tf.layers exports: a case, or why it needs none of its own. */
export const cases = (tf: Tf): Record<string, Case | string> => {
  const L = tf.layers
  const img = (build: Build, pre = 3): Case => ({ input: [6, 6, 2], pre, build })
  const seq = (build: Build, pre = 4): Case => ({ input: [5, 3], pre, build })
  // Recurrent layers over 3 time steps (backpropagation through time still spans several): every
  // step is a chain of small kernels, seconds each case on webgpu's software adapter.
  const rec = (build: Build): Case => ({ input: [3, 3], pre: 4, build })
  const vol = (build: Build): Case => ({ input: [4, 4, 4, 2], pre: 2, build })
  const vec = (build: Build, pre = 4): Case => ({ input: [5], pre, build })
  // Preprocessing layers sit on the model's input: no weights before them, so no gradient through them.
  const prep = (build: Build): Case => ({ input: [6, 6, 2], build })
  const two = (merge: (a: SymbolicTensor[]) => SymbolicTensor): Build => (_tf, x) => merge([L.dense({ units: 4 }).apply(x) as SymbolicTensor, L.dense({ units: 4 }).apply(x) as SymbolicTensor])
  const ap = (layer: TfType.layers.Layer): Build => (_tf, x) => layer.apply(x) as SymbolicTensor
  return {
    Layer: "the base class every layer extends, not a layer",
    RNN: "the class behind rnn(), covered by rnn",
    RNNCell: "the base class of the cells, covered by the cells below",
    input: "makes a model's input, no computation",
    inputLayer: "makes a model's input, no computation",
    activation: vec(ap(L.activation({ activation: "tanh" }))),
    add: vec(two((a) => L.add().apply(a) as SymbolicTensor)),
    alphaDropout: { ...vec(ap(L.alphaDropout({ rate: 0.3 }))), random: true },
    average: vec(two((a) => L.average().apply(a) as SymbolicTensor)),
    averagePooling1d: seq(ap(L.averagePooling1d({ poolSize: 2 }))),
    averagePooling2d: img(ap(L.averagePooling2d({ poolSize: 2 }))),
    averagePooling3d: vol(ap(L.averagePooling3d({ poolSize: 2 }))),
    avgPool1d: seq(ap(L.avgPool1d({ poolSize: 2, strides: 1 }))),
    avgPool2d: img(ap(L.avgPool2d({ poolSize: 3, strides: 2, padding: "same" }))),
    avgPool3d: vol(ap(L.avgPool3d({ poolSize: 2, strides: 1 }))),
    avgPooling1d: seq(ap(L.avgPooling1d({ poolSize: 3, padding: "same" }))),
    avgPooling2d: img(ap(L.avgPooling2d({ poolSize: 2 }))),
    avgPooling3d: vol(ap(L.avgPooling3d({ poolSize: 2 }))),
    batchNormalization: img(ap(L.batchNormalization({}))),
    bidirectional: rec(ap(L.bidirectional({ layer: L.lstm({ units: 3, returnSequences: true }) as TfType.RNN }))),
    categoryEncoding: { input: [4], int: true, build: ap(L.categoryEncoding({ numTokens: 10, outputMode: "multiHot" })) },
    centerCrop: prep(ap(L.centerCrop({ height: 4, width: 4 }))),
    concatenate: vec(two((a) => L.concatenate().apply(a) as SymbolicTensor)),
    conv1d: seq(ap(L.conv1d({ filters: 3, kernelSize: 2, strides: 2, padding: "same" }))),
    conv2d: img(ap(L.conv2d({ filters: 4, kernelSize: 3, strides: 2 }))),
    conv2dTranspose: img(ap(L.conv2dTranspose({ filters: 3, kernelSize: 3, strides: 2, padding: "same" }))),
    conv3d: vol(ap(L.conv3d({ filters: 2, kernelSize: 2 }))),
    conv3dTranspose: vol(ap(L.conv3dTranspose({ filters: 2, kernelSize: 2, strides: 2 }))),
    convLstm2d: { input: [3, 5, 5, 2], pre: 2, build: ap(L.convLstm2d({ filters: 2, kernelSize: 3, padding: "same" })) },
    convLstm2dCell: "the cell inside convLstm2d (tf.layers.rnn cannot drive it: it takes 3-D input only), covered by convLstm2d",
    cropping2D: img(ap(L.cropping2D({ cropping: [1, 1] }))),
    dense: vec(ap(L.dense({ units: 3, activation: "relu" }))),
    depthwiseConv2d: img(ap(L.depthwiseConv2d({ kernelSize: 3, depthMultiplier: 2, strides: 2, padding: "same" }))),
    dot: vec(two((a) => L.dot({ axes: 1 }).apply(a) as SymbolicTensor)),
    dropout: { ...vec(ap(L.dropout({ rate: 0.3 }))), random: true },
    elu: vec(ap(L.elu({}))),
    embedding: { input: [4], int: true, build: ap(L.embedding({ inputDim: 10, outputDim: 3 })) },
    flatten: img(ap(L.flatten())),
    gaussianDropout: { ...vec(ap(L.gaussianDropout({ rate: 0.3 }))), random: true },
    gaussianNoise: { ...vec(ap(L.gaussianNoise({ stddev: 0.1 }))), random: true },
    globalAveragePooling1d: seq(ap(L.globalAveragePooling1d({}))),
    globalAveragePooling2d: img(ap(L.globalAveragePooling2d({}))),
    globalMaxPool1d: seq(ap(L.globalMaxPool1d({}))),
    globalMaxPool2d: img(ap(L.globalMaxPool2d({}))),
    globalMaxPooling1d: seq(ap(L.globalMaxPooling1d({}))),
    globalMaxPooling2d: img(ap(L.globalMaxPooling2d({}))),
    gru: rec(ap(L.gru({ units: 3, returnSequences: true }))),
    gruCell: rec(ap(L.rnn({ cell: L.gruCell({ units: 3 }) }))),
    layerNormalization: seq(ap(L.layerNormalization({}))),
    leakyReLU: vec(ap(L.leakyReLU({ alpha: 0.2 }))),
    lstm: rec(ap(L.lstm({ units: 3 }))),
    lstmCell: rec(ap(L.rnn({ cell: L.lstmCell({ units: 3 }) }))),
    masking: seq(ap(L.masking({ maskValue: 0 }))),
    maxPool1d: seq(ap(L.maxPool1d({ poolSize: 2 }))),
    maxPool2d: img(ap(L.maxPool2d({ poolSize: 2 }))),
    maxPooling1d: seq(ap(L.maxPooling1d({ poolSize: 2, strides: 1 }))),
    maxPooling2d: img(ap(L.maxPooling2d({ poolSize: 3, strides: 2, padding: "same" }))),
    maxPooling3d: { ...vol(ap(L.maxPooling3d({ poolSize: 2 }))), numeric: true },
    maximum: vec(two((a) => L.maximum().apply(a) as SymbolicTensor)),
    minimum: vec(two((a) => L.minimum().apply(a) as SymbolicTensor)),
    multiply: vec(two((a) => L.multiply().apply(a) as SymbolicTensor)),
    permute: img(ap(L.permute({ dims: [3, 1, 2] }))),
    prelu: vec(ap(L.prelu({}))),
    randomWidth: { input: [6, 6, 2], random: true, build: (_tf, x) => x, eager: (_tf, x) => L.randomWidth({ factor: 0.4, seed: 7 }).apply(x, { training: true }) as TfType.Tensor },
    reLU: vec(ap(L.reLU({}))),
    repeatVector: vec(ap(L.repeatVector({ n: 3 }))),
    rescaling: prep(ap(L.rescaling({ scale: 0.5, offset: 0.1 }))),
    reshape: img(ap(L.reshape({ targetShape: [36, 3] }))),
    resizing: { input: [6, 6, 2], build: (_tf, x) => x, eager: (_tf, x) => L.resizing({ height: 9, width: 4 }).apply(x) as TfType.Tensor },
    rnn: rec(ap(L.rnn({ cell: L.simpleRNNCell({ units: 3 }), returnSequences: true }))),
    separableConv2d: img(ap(L.separableConv2d({ filters: 4, kernelSize: 3, depthMultiplier: 2, padding: "same" }))),
    simpleRNN: rec(ap(L.simpleRNN({ units: 3 }))),
    simpleRNNCell: rec(ap(L.rnn({ cell: L.simpleRNNCell({ units: 3 }) }))),
    softmax: vec(ap(L.softmax({}))),
    spatialDropout1d: { ...seq(ap(L.spatialDropout1d({ rate: 0.3 }))), random: true },
    stackedRNNCells: rec(ap(L.rnn({ cell: L.stackedRNNCells({ cells: [L.simpleRNNCell({ units: 3 }), L.gruCell({ units: 2 })] }) as unknown as Parameters<typeof L.rnn>[0]["cell"] }))),
    thresholdedReLU: vec(ap(L.thresholdedReLU({ theta: 0.1 }))),
    timeDistributed: seq(ap(L.timeDistributed({ layer: L.dense({ units: 2 }) }))),
    upSampling2d: { ...img(ap(L.upSampling2d({ size: [2, 2] }))), numeric: true },
    zeroPadding2d: img(ap(L.zeroPadding2d({ padding: 1 })))
  }
}

/** A seeded batch of 4 for the case's input. */
export const batchFor = (tf: Tf, c: Case): TfType.Tensor => {
  const shape = [4, ...c.input]
  const n = shape.reduce((a, b) => a * b, 1)
  let s = 12345
  const next = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32)
  return c.int ? tf.tensor(Int32Array.from({ length: n }, () => Math.floor(next() * 10)), shape, "int32") : tf.tensor(Float32Array.from({ length: n }, () => next() * 2 - 1), shape)
}

export const modelFor = (tf: Tf, c: Case): TfType.LayersModel => {
  const x = tf.input({ shape: c.input, dtype: c.int ? "int32" : "float32" })
  const pre = c.pre ? (tf.layers.dense({ units: c.pre, kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }) }).apply(x) as SymbolicTensor) : x
  let y = c.build(tf, pre)
  if (y.shape.length > 2) y = tf.layers.flatten().apply(y) as SymbolicTensor
  const out = tf.layers.dense({ units: 3, kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }) }).apply(y) as SymbolicTensor
  return tf.model({ inputs: x, outputs: out })
}

export const lossOf = (model: TfType.LayersModel, x: TfType.Tensor, training: boolean): TfType.Scalar =>
  (model.apply(x, { training }) as TfType.Tensor).square().mean() as TfType.Scalar

/** Every trainable weight's gradient of the loss on the current backend (empty where a weight has none). */
export const gradientTensors = (tf: Tf, model: TfType.LayersModel, x: TfType.Tensor, training: boolean): TfType.Tensor[] => {
  const { grads } = tf.variableGrads(() => lossOf(model, x, training))
  return model.trainableWeights.map((w) => grads[w.originalName] ?? grads[w.name] ?? tf.zeros([0]))
}

/**
 * Central differences of the loss for up to 48 elements of each trainable weight (the rest NaN:
 * not compared), in float32 on the current backend, read asynchronously (as webgpu needs): a
 * reference that depends on no gradient kernel.
 */
export const numericGradients = async (tf: Tf, model: TfType.LayersModel, x: TfType.Tensor, training: boolean): Promise<Float32Array[]> => {
  const eps = 1e-2
  const out: Float32Array[] = []
  for (const w of model.trainableWeights) {
    const base = (await w.read().data()).slice() as Float32Array
    const g = new Float32Array(base.length).fill(NaN)
    const step = Math.max(1, Math.floor(base.length / 48))
    const at = async (i: number, d: number): Promise<number> => {
      const p = base.slice()
      p[i] += d
      w.write(tf.tensor(p, w.shape as number[]))
      const l = tf.tidy(() => lossOf(model, x, training))
      const v = (await l.data())[0]!
      l.dispose()
      return v
    }
    for (let i = 0; i < base.length; i += step) g[i] = ((await at(i, eps)) - (await at(i, -eps))) / (2 * eps)
    w.write(tf.tensor(base, w.shape as number[]))
    out.push(g)
  }
  return out
}

/** The case names, without a tfjs to build layers with (a proxy stands in). */
export const caseNames = (): string[] =>
  Object.keys(cases({ layers: new Proxy({}, { get: () => () => ({ apply: () => undefined }) }) } as unknown as Tf))
