// The model zoo: the models people train, each as a tfjs LayersModel built from tfjs-layers (and,
// for attention, a small custom layer of matmul and softmax). bench/torch_zoo.py builds the same
// models in PyTorch for the speed comparison (same layers, shapes and initial scale).
//
//   mlp          digits 64 -> 64 -> 10                               (4,810 parameters)
//   cnn          digits 8x8x1: conv 3x3x8, max-pool 2, conv 3x3x16, dense 10
//   lenet        LeNet-5 at 28x28x1 (the digits resized): conv 5x5x6, pool, conv 5x5x16, pool, 120, 84, 10
//   resnet       digits 8x8x1: conv 3x3x16 + batch norm, two residual blocks (conv-BN-relu-conv-BN + skip), GAP, 10
//   resnet28     a residual CNN of a CIFAR ResNet's widths at 28x28x1 (the digits resized): conv 3x3x32
//                stride 2 + BN, two residual blocks of 32 channels at 14x14, conv 3x3x64 stride 2 + BN,
//                two blocks of 64 at 7x7, GAP, 10
//   resnet18     ResNet-18 as for CIFAR at 32x32x1 (the digits resized): conv 3x3x64 + BN, four stages of
//                two basic blocks, 64, 128, 256 and 512 channels at 32, 16, 8 and 4 pixels (a stage's first
//                block at stride 2 with a 1x1 stride-2 shortcut + BN), GAP, 10: 11.2 M parameters
//   mobilenet    MobileNet-style at 28x28x1 (the digits resized): conv 3x3x16 stride 2 + BN + ReLU6, three
//                depthwise-separable blocks (depthwise 3x3 + BN + ReLU6, pointwise 1x1 + BN + ReLU6) to 32,
//                64 (stride 2) and 64 channels, GAP, 10
//   embedding    digits as 64 pixel tokens (0..16): embedding(17, 8), conv1d 9x32, global max pool, 10
//   transformer  Brown corpus part-of-speech tagging, 32 tokens: embedding + positions, 2 pre-norm
//                blocks of 2-head self-attention and a 64-unit feed-forward, per-token tag logits
//   lstm         the same tagging task: embedding, LSTM(64) over the sequence, per-token tag logits
//   gru          the same with GRU(64) (tfjs-layers' GRU: the reset gate before the recurrent product)
import type { Tf } from "../../index.ts"

type LayersModel = import("@tensorflow/tfjs").LayersModel
type Tensor = import("@tensorflow/tfjs").Tensor
type SymbolicTensor = import("@tensorflow/tfjs").SymbolicTensor
type LayerVariable = import("@tensorflow/tfjs").LayerVariable

export const ZOO_MODELS = ["mlp", "cnn", "lenet", "resnet", "resnet28", "resnet18", "mobilenet", "embedding", "transformer", "lstm", "gru"] as const
export type ZooModel = (typeof ZOO_MODELS)[number]
/** The models `bench -- train` and its kin run unless told: all but resnet18, whose steps take about a second each on one core (name it with --models). */
export const DEFAULT_ZOO_MODELS: readonly ZooModel[] = ZOO_MODELS.filter((m) => m !== "resnet18")

/** What a model reads and predicts. */
export type ZooTask = "digits" | "digits28" | "digits32" | "tokens" | "pos"
export const TASK_OF: Record<ZooModel, ZooTask> = {
  mlp: "digits",
  cnn: "digits",
  lenet: "digits28",
  resnet: "digits",
  resnet28: "digits28",
  resnet18: "digits32",
  mobilenet: "digits28",
  embedding: "tokens",
  transformer: "pos",
  lstm: "pos",
  gru: "pos"
}

/** Whether the model reads token ids (int32 input) rather than pixel values. */
export const readsTokens = (model: ZooModel): boolean => TASK_OF[model] === "pos" || TASK_OF[model] === "tokens"

/** Sizes of the tagging task the text models are built for. */
export interface TextShape {
  readonly vocab: number
  readonly tags: number
  readonly seqLen: number
}

let registered = false

/**
 * Registers the transformer's custom layers with tfjs's serialization (once per process), so a
 * model holding them can be saved, checkpointed and loaded like any other.
 */
const registerLayers = (tf: Tf): { SelfAttention: new (a: { heads: number; name?: string }) => import("@tensorflow/tfjs").layers.Layer; Positions: new (a: { name?: string }) => import("@tensorflow/tfjs").layers.Layer } => {
  /** Multi-head self-attention from matmul and softmax: softmax(Q Kᵀ / √d_h) V, heads concatenated, then Wₒ. */
  class SelfAttention extends tf.layers.Layer {
    static className = "ZooSelfAttention"
    readonly heads: number
    wq!: LayerVariable
    wk!: LayerVariable
    wv!: LayerVariable
    wo!: LayerVariable
    constructor(args: { heads: number; name?: string }) {
      super(args)
      this.heads = args.heads
    }
    override build(inputShape: import("@tensorflow/tfjs").Shape | import("@tensorflow/tfjs").Shape[]): void {
      const s = (Array.isArray(inputShape[0]) ? inputShape[0] : inputShape) as number[]
      const d = s[s.length - 1]
      const init = () => tf.initializers.glorotUniform({})
      this.wq = this.addWeight("wq", [d, d], "float32", init())
      this.wk = this.addWeight("wk", [d, d], "float32", init())
      this.wv = this.addWeight("wv", [d, d], "float32", init())
      this.wo = this.addWeight("wo", [d, d], "float32", init())
      this.built = true
    }
    override call(inputs: Tensor | Tensor[]): Tensor {
      return tf.tidy(() => {
        const x = Array.isArray(inputs) ? inputs[0] : inputs
        const [b, t, d] = x.shape as [number, number, number]
        const h = this.heads
        const dh = d / h
        const flat = x.reshape([b * t, d])
        const split = (w: LayerVariable) => tf.matMul(flat, w.read()).reshape([b, t, h, dh]).transpose([0, 2, 1, 3])
        const q = split(this.wq)
        const k = split(this.wk)
        const v = split(this.wv)
        const att = tf.softmax(tf.matMul(q, k, false, true).mul(1 / Math.sqrt(dh)))
        const out = tf.matMul(att, v).transpose([0, 2, 1, 3]).reshape([b * t, d])
        return tf.matMul(out, this.wo.read()).reshape([b, t, d])
      })
    }
    override computeOutputShape(s: import("@tensorflow/tfjs").Shape | import("@tensorflow/tfjs").Shape[]) {
      return s
    }
    override getConfig() {
      return { ...super.getConfig(), heads: this.heads }
    }
  }
  /** A learned vector per position, added to the token embeddings. */
  class Positions extends tf.layers.Layer {
    static className = "ZooPositions"
    pos!: LayerVariable
    override build(inputShape: import("@tensorflow/tfjs").Shape | import("@tensorflow/tfjs").Shape[]): void {
      const s = (Array.isArray(inputShape[0]) ? inputShape[0] : inputShape) as number[]
      this.pos = this.addWeight("positions", [s[1], s[2]], "float32", tf.initializers.randomNormal({ stddev: 0.02 }))
      this.built = true
    }
    override call(inputs: Tensor | Tensor[]): Tensor {
      const x = Array.isArray(inputs) ? inputs[0] : inputs
      return tf.tidy(() => x.add(this.pos.read()))
    }
    override computeOutputShape(s: import("@tensorflow/tfjs").Shape | import("@tensorflow/tfjs").Shape[]) {
      return s
    }
  }
  if (!registered) {
    tf.serialization.registerClass(SelfAttention as never)
    tf.serialization.registerClass(Positions as never)
    registered = true
  }
  return { SelfAttention, Positions }
}

/** A zoo model, built the same way on every rank (rank 0's weights are broadcast by prepareModel anyway). */
export const buildZooModel = (tf: Tf, name: ZooModel, text?: TextShape): LayersModel => {
  const L = tf.layers
  const ap = (layer: import("@tensorflow/tfjs").layers.Layer, x: SymbolicTensor | SymbolicTensor[]) => layer.apply(x) as SymbolicTensor
  switch (name) {
    case "mlp": {
      const m = tf.sequential()
      m.add(L.dense({ units: 64, activation: "relu", inputShape: [64] }))
      m.add(L.dense({ units: 10 }))
      return m
    }
    case "cnn": {
      const m = tf.sequential()
      m.add(L.reshape({ targetShape: [8, 8, 1], inputShape: [64] }))
      m.add(L.conv2d({ filters: 8, kernelSize: 3, padding: "same", activation: "relu" }))
      m.add(L.maxPooling2d({ poolSize: 2 }))
      m.add(L.conv2d({ filters: 16, kernelSize: 3, padding: "same", activation: "relu" }))
      m.add(L.flatten())
      m.add(L.dense({ units: 10 }))
      return m
    }
    case "lenet": {
      const m = tf.sequential()
      m.add(L.reshape({ targetShape: [28, 28, 1], inputShape: [784] }))
      m.add(L.conv2d({ filters: 6, kernelSize: 5, padding: "same", activation: "relu" }))
      m.add(L.maxPooling2d({ poolSize: 2 }))
      m.add(L.conv2d({ filters: 16, kernelSize: 5, activation: "relu" }))
      m.add(L.maxPooling2d({ poolSize: 2 }))
      m.add(L.flatten())
      m.add(L.dense({ units: 120, activation: "relu" }))
      m.add(L.dense({ units: 84, activation: "relu" }))
      m.add(L.dense({ units: 10 }))
      return m
    }
    case "mobilenet": {
      // torch's BatchNorm momentum, as the residual CNN's; ReLU6 is a ReLU layer with maxValue 6 (tfjs's clipByValue).
      const bn = () => L.batchNormalization({ momentum: 0.9 })
      const relu6 = () => L.reLU({ maxValue: 6 })
      const x = tf.input({ shape: [784] })
      let h = ap(L.reshape({ targetShape: [28, 28, 1] }), x)
      h = ap(relu6(), ap(bn(), ap(L.conv2d({ filters: 16, kernelSize: 3, strides: 2, padding: "same", useBias: false }), h)))
      for (const [filters, strides] of [[32, 1], [64, 2], [64, 1]] as const) {
        h = ap(relu6(), ap(bn(), ap(L.depthwiseConv2d({ kernelSize: 3, strides, padding: "same", useBias: false }), h)))
        h = ap(relu6(), ap(bn(), ap(L.conv2d({ filters, kernelSize: 1, useBias: false }), h)))
      }
      h = ap(L.globalAveragePooling2d({}), h)
      return tf.model({ inputs: x, outputs: ap(L.dense({ units: 10 }), h) })
    }
    case "resnet28": {
      const bn = () => L.batchNormalization({ momentum: 0.9 })
      const relu = (t: SymbolicTensor): SymbolicTensor => ap(L.activation({ activation: "relu" }), t)
      const conv = (filters: number, strides = 1) => L.conv2d({ filters, kernelSize: 3, strides, padding: "same", useBias: false })
      const block = (t: SymbolicTensor, filters: number): SymbolicTensor => {
        const r = ap(bn(), ap(conv(filters), relu(ap(bn(), ap(conv(filters), t)))))
        return relu(ap(L.add(), [t, r]))
      }
      const x = tf.input({ shape: [784] })
      let h = ap(L.reshape({ targetShape: [28, 28, 1] }), x)
      h = relu(ap(bn(), ap(conv(32, 2), h)))
      h = block(block(h, 32), 32)
      h = relu(ap(bn(), ap(conv(64, 2), h)))
      h = block(block(h, 64), 64)
      h = ap(L.globalAveragePooling2d({}), h)
      return tf.model({ inputs: x, outputs: ap(L.dense({ units: 10 }), h) })
    }
    case "resnet18": {
      const bn = () => L.batchNormalization({ momentum: 0.9 })
      const relu = (t: SymbolicTensor): SymbolicTensor => ap(L.activation({ activation: "relu" }), t)
      const conv = (filters: number, kernelSize: number, strides: number) => L.conv2d({ filters, kernelSize, strides, padding: "same", useBias: false })
      const block = (t: SymbolicTensor, filters: number, strides: number): SymbolicTensor => {
        const r = ap(bn(), ap(conv(filters, 3, 1), relu(ap(bn(), ap(conv(filters, 3, strides), t)))))
        const shortcut = strides === 1 && t.shape[3] === filters ? t : ap(bn(), ap(conv(filters, 1, strides), t))
        return relu(ap(L.add(), [shortcut, r]))
      }
      const x = tf.input({ shape: [1024] })
      let h = ap(L.reshape({ targetShape: [32, 32, 1] }), x)
      h = relu(ap(bn(), ap(conv(64, 3, 1), h)))
      for (const [filters, strides] of [[64, 1], [64, 1], [128, 2], [128, 1], [256, 2], [256, 1], [512, 2], [512, 1]] as const) h = block(h, filters, strides)
      h = ap(L.globalAveragePooling2d({}), h)
      return tf.model({ inputs: x, outputs: ap(L.dense({ units: 10 }), h) })
    }
    case "resnet": {
      // Moving statistics with torch's momentum (0.1 of the new batch; tfjs's default 0.99 keeps the
      // initial ones for hundreds of steps, so held-out accuracy lags far behind training).
      const bn = () => L.batchNormalization({ momentum: 0.9 })
      const x = tf.input({ shape: [64] })
      let h = ap(L.reshape({ targetShape: [8, 8, 1] }), x)
      h = ap(L.conv2d({ filters: 16, kernelSize: 3, padding: "same", useBias: false }), h)
      h = ap(L.activation({ activation: "relu" }), ap(bn(), h))
      for (let b = 0; b < 2; b++) {
        let r = ap(L.conv2d({ filters: 16, kernelSize: 3, padding: "same", useBias: false }), h)
        r = ap(L.activation({ activation: "relu" }), ap(bn(), r))
        r = ap(L.conv2d({ filters: 16, kernelSize: 3, padding: "same", useBias: false }), r)
        r = ap(bn(), r)
        h = ap(L.activation({ activation: "relu" }), ap(L.add(), [h, r]))
      }
      h = ap(L.globalAveragePooling2d({}), h)
      return tf.model({ inputs: x, outputs: ap(L.dense({ units: 10 }), h) })
    }
    case "embedding": {
      const m = tf.sequential()
      // N(0, 1) as torch.nn.Embedding (tfjs's default, uniform ±0.05, leaves a model this small stuck for epochs).
      m.add(L.embedding({ inputDim: 17, outputDim: 8, inputLength: 64, inputShape: [64], embeddingsInitializer: tf.initializers.randomNormal({ stddev: 1 }) }))
      m.add(L.conv1d({ filters: 32, kernelSize: 9, activation: "relu" }))
      m.add(L.globalMaxPooling1d({}))
      m.add(L.dense({ units: 10 }))
      return m
    }
    case "transformer": {
      if (!text) throw new RangeError("the transformer needs the tagging task's sizes (vocab, tags, seqLen)")
      const { SelfAttention, Positions } = registerLayers(tf)
      const d = 32
      const x = tf.input({ shape: [text.seqLen], dtype: "int32" })
      let h = ap(new Positions({}), ap(L.embedding({ inputDim: text.vocab, outputDim: d }), x))
      for (let b = 0; b < 2; b++) {
        const a = ap(new SelfAttention({ heads: 2 }), ap(L.layerNormalization({}), h))
        h = ap(L.add(), [h, a])
        const f = ap(L.dense({ units: d }), ap(L.dense({ units: 64, activation: "relu" }), ap(L.layerNormalization({}), h)))
        h = ap(L.add(), [h, f])
      }
      return tf.model({ inputs: x, outputs: ap(L.dense({ units: text.tags }), ap(L.layerNormalization({}), h)) })
    }
    case "lstm": {
      if (!text) throw new RangeError("the LSTM needs the tagging task's sizes (vocab, tags, seqLen)")
      const m = tf.sequential()
      // Seeded (tfjs's default initializers, with seeds): 300 steps from an unseeded start ended
      // anywhere from 0.23 to 0.42 accuracy over CI runs; every run now starts the same.
      m.add(L.embedding({ inputDim: text.vocab, outputDim: 32, inputLength: text.seqLen, inputShape: [text.seqLen], embeddingsInitializer: tf.initializers.randomUniform({ minval: -0.05, maxval: 0.05, seed: 41 }) }))
      m.add(L.lstm({ units: 64, returnSequences: true, kernelInitializer: tf.initializers.glorotUniform({ seed: 42 }), recurrentInitializer: tf.initializers.orthogonal({ seed: 43 }) }))
      m.add(L.dense({ units: text.tags, kernelInitializer: tf.initializers.glorotUniform({ seed: 44 }) }))
      return m
    }
    case "gru": {
      if (!text) throw new RangeError("the GRU needs the tagging task's sizes (vocab, tags, seqLen)")
      const m = tf.sequential()
      m.add(L.embedding({ inputDim: text.vocab, outputDim: 32, inputLength: text.seqLen, inputShape: [text.seqLen], embeddingsInitializer: tf.initializers.randomUniform({ minval: -0.05, maxval: 0.05, seed: 51 }) }))
      m.add(L.gru({ units: 64, returnSequences: true, kernelInitializer: tf.initializers.glorotUniform({ seed: 52 }), recurrentInitializer: tf.initializers.orthogonal({ seed: 53 }) }))
      m.add(L.dense({ units: text.tags, kernelInitializer: tf.initializers.glorotUniform({ seed: 54 }) }))
      return m
    }
  }
}
