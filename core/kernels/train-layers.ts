// Convolution layers while training as one kernel forward (the bias and ReLU in the same pass) whose
// gradient tfjs computes per input, only where it is used.
//
// tfjs-layers' Conv2D and Conv1D call tfjs-core's fused conv2d (a linear activation) or a plain
// conv2d, a bias add and the activation, each one kernel over the whole activation (ReLU: tfjs-core
// fuses none of it while a gradient is recorded). The fused one's gradient is one custom function
// returning the input's and the filter's gradients together, so the input's is computed also where
// nothing uses it: a model's first layer, whose input is the data (PyTorch skips it: the data does
// not require a gradient; a ResNet's stem spent a whole, strided, convolution a step on it).
//
// While a gradient is being recorded, Conv2D.call and Conv1D.call are replaced for channels-last
// convolutions without dilation, with a linear or ReLU activation, by `GradwireConv2DTrain`: the
// backend's own FusedConv2D kernel (gradwire's SIMD one on wasm) with the bias and the activation,
// and a registered gradient giving the input's, the filter's and the bias's gradients each on its
// own (the ReLU's mask once, by its registered gradient), so tfjs computes the input's only where a
// gradient is asked of it (tf.grad of the data still gets it). Other layers, and every layer outside
// a recorded gradient (inference runs tfjs-layers' own call), are unchanged. Dense layers keep
// tfjs-layers' own call: the same for them (the backend's _FusedMatMul) took the zoo transformer's
// plain step on wasm from 25.5 to 27.5 ms, XNNPACK's fused product being slower there than
// gradwire's SIMD matmul with a separate bias add and ReLU. Installed once the engine's backend is
// up (`../engine.ts`).
import type { Tf } from "../tf.ts"
import { oneInput, patchLayerCall, registerKernels, withTfjsCalls } from "./fused-layers.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernel's name in tfjs's registry (gradwire's own). */
export const CONV2D_TRAIN = "GradwireConv2DTrain"

/** What the replaced calls read of a tfjs-layers Conv1D or Conv2D. */
interface ConvLike {
  readonly rank: number
  readonly dataFormat: string
  readonly padding: string
  readonly strides: number[]
  readonly dilationRate: number | number[]
  readonly activation: { getClassName(): string }
  readonly kernel: { read(): Tensor }
  readonly bias: { read(): Tensor } | null
}

/** The backends whose FusedConv2D the kernel runs (looked up at each call: gradwire replaces wasm's). */
const BACKENDS = ["wasm", "cpu", "webgpu"]

type KernelFunc = (args: { inputs: Record<string, unknown>; backend: unknown; attrs: Record<string, unknown> }) => unknown

/** Attributes of the kernel, as FusedConv2D takes them. */
interface ConvAttrs {
  strides: [number, number]
  pad: "same" | "valid"
  dataFormat: "NHWC"
  dilations: [number, number]
  dimRoundingMode: undefined
  activation: "linear" | "relu"
}

let installed = false

/** Registers the kernel and its gradient and replaces Conv2D's and Conv1D's calls (above). Returns whether the classes were found. */
export const installTrainLayers = (tf: Tf): boolean => {
  if (installed) return true
  registerKernels(
    tf,
    CONV2D_TRAIN,
    Object.fromEntries(BACKENDS.map((b) => [b, (args: Parameters<KernelFunc>[0]) => (tf.getKernel("FusedConv2D", b)!.kernelFunc as unknown as KernelFunc)(args)]))
  )
  if (!tf.getGradient(CONV2D_TRAIN)) {
    tf.registerGradient({
      kernelName: CONV2D_TRAIN,
      inputsToSave: ["x", "filter"],
      outputsToSave: [true],
      gradFunc: ((dy: Tensor, saved: Tensor[], attrs: ConvAttrs) => {
        const [x, filter, y] = saved as [Tensor, Tensor, Tensor]
        // ReLU's mask from its output (y > 0 exactly where the pre-activation is), by Relu's registered gradient.
        const g = attrs.activation === "relu" ? (tf.getGradient("Relu")!.gradFunc(dy, [y], {}) as Record<string, () => Tensor>).x!() : dy
        const conv = { strides: attrs.strides, pad: attrs.pad, dataFormat: "NHWC", dimRoundingMode: undefined }
        return {
          x: () => tf.engine().runKernel("Conv2DBackpropInput", { dy: g, filter }, { ...conv, inputShape: x.shape } as never) as Tensor,
          filter: () => tf.engine().runKernel("Conv2DBackpropFilter", { x, dy: g }, { ...conv, filterShape: filter.shape } as never) as Tensor,
          bias: () => tf.sum(g, [0, 1, 2])
        }
      }) as never
    })
  }
  /** The convolution as the kernel, or undefined where it does not apply (then tfjs-layers' own call runs). */
  const train = (layer: ConvLike, x: Tensor | undefined, rank: 1 | 2): Tensor | undefined => {
    const dilations = typeof layer.dilationRate === "number" ? [layer.dilationRate] : layer.dilationRate
    const activation = layer.activation.getClassName()
    const fits =
      x !== undefined &&
      tf.engine().state.gradientDepth > 0 &&
      layer.rank === rank &&
      x.rank === rank + 2 &&
      x.dtype === "float32" &&
      layer.dataFormat === "channelsLast" &&
      (layer.padding === "same" || layer.padding === "valid") &&
      dilations.every((d) => d === 1) &&
      (activation === "linear" || activation === "relu") &&
      tf.getKernel(CONV2D_TRAIN, tf.getBackend()) !== undefined &&
      tf.getKernel("FusedConv2D", tf.getBackend()) !== undefined
    if (!fits) return undefined
    return tf.tidy(() => {
      // Conv1D as tfjs-core's conv1d runs it: a 2-D convolution of one row.
      const x4 = rank === 2 ? x : tf.expandDims(x, 1)
      const kernel = layer.kernel.read()
      const filter = rank === 2 ? kernel : tf.expandDims(kernel, 0)
      const attrs: ConvAttrs = {
        strides: rank === 2 ? (layer.strides as [number, number]) : [1, layer.strides[0]!],
        pad: layer.padding as "same" | "valid",
        dataFormat: "NHWC",
        dilations: [1, 1],
        dimRoundingMode: undefined,
        activation: activation as "linear" | "relu"
      }
      const inputs: Record<string, Tensor> = layer.bias ? { x: x4, filter, bias: layer.bias.read() } : { x: x4, filter }
      const y = tf.engine().runKernel(CONV2D_TRAIN, inputs, attrs as never) as Tensor
      return rank === 2 ? y : tf.squeeze(y, [1])
    })
  }
  const conv2d = patchLayerCall<ConvLike>(tf, "Conv2D", (own) =>
    function (inputs, kwargs) {
      return train(this, oneInput(inputs), 2) ?? own.call(this, inputs, kwargs)
    }
  )
  const conv1d = patchLayerCall<ConvLike>(tf, "Conv1D", (own) =>
    function (inputs, kwargs) {
      return train(this, oneInput(inputs), 1) ?? own.call(this, inputs, kwargs)
    }
  )
  installed = conv2d && conv1d
  return installed
}

/** Runs `f` with tfjs-layers' own Conv2D and Conv1D calls (for tests and benchmarks that compare the two). */
export const withTfjsTrainLayers = <T>(tf: Tf, f: () => T): T => withTfjsCalls(tf, ["Conv2D", "Conv1D"], f)
