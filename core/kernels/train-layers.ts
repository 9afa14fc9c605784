// Convolution and dense layers while training as one kernel forward (the bias and ReLU in the same
// pass) whose gradient tfjs computes per input, only where it is used.
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
// a recorded gradient (inference runs tfjs-layers' own call), are unchanged.
//
// Dense likewise (`GradwireDenseTrain`): tfjs-layers' Dense runs, while a gradient is recorded, a
// matMul, an Add and the ReLU (tfjs-core fuses only a linear activation then), or for a linear one
// tfjs-core's fused matMul, a custom gradient that reshapes both operands to 3-D and clones what it
// keeps (three reshapes and three Identity kernels a call); an activation it cannot fuse (softmax)
// adds a separate bias add. The kernel is the backend's _FusedMatMul (gradwire's SIMD product, bias
// and ReLU on wasm) on rank-3 views of the 2-D operands, the gradient a product per input and the
// bias's sum: the digits MLP's two dense layers ran 23 kernels a step, now 8. Another activation
// (softmax, tanh, ...) is applied after the kernel by tfjs-layers' own activation; inputs of rank 3
// and more are reshaped to rows first. (Before gradwire's SIMD product, the backend's _FusedMatMul
// was XNNPACK's, which packs the weights on every call: that took the zoo transformer's plain step
// on wasm from 25.5 to 27.5 ms.) Installed once the engine's backend is up (`../engine.ts`).
import type { Tf } from "../tf.ts"
import { oneInput, patchLayerCall, registerKernels, withTfjsCalls } from "./fused-layers.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernel's name in tfjs's registry (gradwire's own). */
export const CONV2D_TRAIN = "GradwireConv2DTrain"
export const DENSE_TRAIN = "GradwireDenseTrain"

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
  installed = conv2d && conv1d && installDenseTrain(tf)
  return installed
}

/** What the replaced call reads of a tfjs-layers Dense. */
interface DenseLike {
  readonly activation: { getClassName(): string; apply(x: Tensor): Tensor }
  readonly kernel: { read(): Tensor }
  readonly bias: { read(): Tensor } | null
  invokeCallHook?(inputs: Tensor | Tensor[], kwargs: Record<string, unknown>): void
}

/** A kernel's input or output with another shape over the same buffer (as the backends' Reshape makes it, without a kernel call). */
type Info = { dataId: object; shape: number[]; dtype: string }
const view = (t: Info, shape: number[]): Info => ({ dataId: t.dataId, shape, dtype: t.dtype })

let denseInstalled = false

/** Registers GradwireDenseTrain and its gradient and replaces Dense's call (above). */
const installDenseTrain = (tf: Tf): boolean => {
  if (denseInstalled) return true
  registerKernels(
    tf,
    DENSE_TRAIN,
    Object.fromEntries(
      BACKENDS.map((b) => [
        b,
        (args: { inputs: Record<string, Info>; backend: unknown; attrs: Record<string, unknown> }) => {
          const { x, kernel, bias } = args.inputs as { x: Info; kernel: Info; bias?: Info }
          const [n, k] = x.shape as [number, number]
          const units = kernel.shape[1]!
          const inputs: Record<string, Info> = { a: view(x, [1, n, k]), b: view(kernel, [1, k, units]) }
          if (bias) inputs.bias = bias
          const attrs = { transposeA: false, transposeB: false, activation: args.attrs.activation, leakyreluAlpha: 0 }
          const out = (tf.getKernel("_FusedMatMul", b)!.kernelFunc as unknown as KernelFunc)({ inputs, backend: args.backend, attrs }) as Info
          return view(out, [n, units])
        }
      ])
    )
  )
  if (!tf.getGradient(DENSE_TRAIN)) {
    tf.registerGradient({
      kernelName: DENSE_TRAIN,
      inputsToSave: ["x", "kernel"],
      outputsToSave: [true],
      gradFunc: ((dy: Tensor, saved: Tensor[], attrs: { activation: "linear" | "relu" }) => {
        const [x, kernel, y] = saved as [Tensor, Tensor, Tensor]
        // ReLU's mask from its output (y > 0 exactly where the pre-activation is), by Relu's registered gradient.
        const g = attrs.activation === "relu" ? (tf.getGradient("Relu")!.gradFunc(dy, [y], {}) as Record<string, () => Tensor>).x!() : dy
        return {
          x: () => tf.engine().runKernel("BatchMatMul", { a: g, b: kernel }, { transposeA: false, transposeB: true }) as Tensor,
          kernel: () => tf.engine().runKernel("BatchMatMul", { a: x, b: g }, { transposeA: true, transposeB: false }) as Tensor,
          bias: () => tf.sum(g, 0)
        }
      }) as never
    })
  }
  /** The dense layer by the kernel, or undefined where it does not apply (then tfjs-layers' own call runs). */
  const train = (layer: DenseLike, x: Tensor | undefined): Tensor | undefined => {
    if (!denseEnabled || x === undefined || tf.engine().state.gradientDepth === 0 || x.dtype !== "float32" || x.rank < 2) return undefined
    const kernel = layer.kernel.read()
    const name = layer.activation.getClassName()
    const fused = name === "linear" || name === "relu" ? name : "linear"
    const backend = tf.getBackend()
    if (kernel.dtype !== "float32" || kernel.rank !== 2 || kernel.shape[0] !== x.shape[x.rank - 1] || tf.getKernel(DENSE_TRAIN, backend) === undefined || tf.getKernel("_FusedMatMul", backend) === undefined) return undefined
    return tf.tidy(() => {
      const k = kernel.shape[0]!
      const rows = x.rank === 2 ? x : tf.reshape(x, [-1, k])
      const inputs: Record<string, Tensor> = layer.bias ? { x: rows, kernel, bias: layer.bias.read() } : { x: rows, kernel }
      let y = tf.engine().runKernel(DENSE_TRAIN, inputs, { activation: fused } as never) as Tensor
      if (x.rank !== 2) y = tf.reshape(y, [...x.shape.slice(0, -1), kernel.shape[1]!])
      return fused === name ? y : layer.activation.apply(y)
    })
  }
  denseInstalled = patchLayerCall<DenseLike>(tf, "Dense", (own) =>
    function (inputs, kwargs) {
      const y = train(this, oneInput(inputs))
      if (!y) return own.call(this, inputs, kwargs)
      this.invokeCallHook?.(inputs, kwargs)
      return y
    }
  )
  return denseInstalled
}

let denseEnabled = true
/** Turns the dense layers' kernel off (tfjs-layers' own call) or back on, for tests and A/B runs. */
export const useDenseTrain = (on: boolean): void => void (denseEnabled = on)

/** Runs `f` with tfjs-layers' own Conv2D and Conv1D calls (for tests and benchmarks that compare the two); Dense keeps its kernel (useDenseTrain). */
export const withTfjsTrainLayers = <T>(tf: Tf, f: () => T): T => withTfjsCalls(tf, ["Conv2D", "Conv1D"], f)
