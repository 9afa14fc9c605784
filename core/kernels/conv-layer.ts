// A convolution layer whose input needs no gradient computes none. tfjs-layers' Conv2D with a
// linear activation (a ResNet's stem, every convolution followed by batch norm) runs tfjs-core's
// fused conv2d, whose gradient is one custom function returning the input's and the filter's
// gradients together: the input's is computed even where nothing uses it, as for a model's first
// layer, whose input is the data (PyTorch skips it: the data does not require a gradient). The
// residual CNN's stem spent a whole convolution a step on it (0.26 ms of about 9 on wasm).
//
// While a gradient is being recorded, Conv2D.call is replaced for channels-last 2-D convolutions
// with a linear activation whose input depends on no trainable variable (nothing on the tape
// leads from one to it): the layer runs tfjs-core's plain conv2d (and the bias as an add), whose
// registered gradient gives each input's gradient on its own, so tfjs computes the input's only
// where a gradient is asked of it (tf.grad of the input still gets it). Other layers, and every
// layer outside a recorded gradient (inference, the fused kernel's single pass), keep
// tfjs-layers' own call. Installed once the engine's backend is up (`../engine.ts`).
import type { Tf } from "../tf.ts"
import { oneInput, patchLayerCall, withTfjsCalls } from "./fused-layers.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Tensor4D = import("@tensorflow/tfjs").Tensor4D

/** What the replaced call reads of a tfjs-layers Conv2D. */
interface Conv2DLike {
  readonly rank: number
  readonly dataFormat: string
  readonly padding: string
  readonly strides: number[]
  readonly dilationRate: number | number[]
  readonly activation: { getClassName(): string }
  readonly kernel: { read(): Tensor }
  readonly bias: { read(): Tensor } | null
}

/** The engine's state, as far as the check reads it. */
interface TapeState {
  readonly gradientDepth: number
  readonly activeTape?: ReadonlyArray<{ readonly inputs: Record<string, Tensor | undefined>; readonly outputs: ReadonlyArray<Tensor | undefined> }>
}

/**
 * Whether `x` depends on a trainable variable through the tape being recorded: it is one, or an
 * operation recorded on the tape made it from one. A tensor no recorded operation made (the data,
 * a constant) does not.
 */
export const dependsOnTrainable = (tf: Tf, x: Tensor): boolean => {
  const tape = (tf.engine().state as unknown as TapeState).activeTape ?? []
  const producer = new Map<number, number>() // tensor id -> index of the tape node that made it
  let scanned = tape.length // tape[scanned..] are in `producer`; scanned from the end, where a layer's input was made
  const find = (id: number): number | undefined => {
    while (!producer.has(id) && scanned > 0) {
      scanned--
      for (const out of tape[scanned]!.outputs) if (out && !producer.has(out.id)) producer.set(out.id, scanned)
    }
    return producer.get(id)
  }
  const seen = new Set<number>()
  const todo: Tensor[] = [x]
  while (todo.length > 0) {
    const t = todo.pop()!
    if (seen.has(t.id)) continue
    seen.add(t.id)
    if (t instanceof tf.Variable && t.trainable) return true
    const node = find(t.id)
    if (node === undefined) continue
    for (const input of Object.values(tape[node]!.inputs)) if (input) todo.push(input)
  }
  return false
}

let installed = false

/** Makes tfjs-layers' Conv2D skip its input's gradient where nothing needs it (above). Returns whether the class was found. */
export const installConvLayer = (tf: Tf): boolean => {
  if (installed) return true
  installed = patchLayerCall<Conv2DLike>(tf, "Conv2D", (own) =>
    function (inputs, kwargs) {
      const x = oneInput(inputs)
      const fits =
        x !== undefined &&
        (tf.engine().state as unknown as TapeState).gradientDepth > 0 &&
        this.rank === 2 &&
        x.rank === 4 &&
        x.dtype === "float32" &&
        this.dataFormat === "channelsLast" &&
        (this.padding === "same" || this.padding === "valid") &&
        this.activation.getClassName() === "linear" &&
        !dependsOnTrainable(tf, x)
      if (!fits) return own.call(this, inputs, kwargs)
      return tf.tidy(() => {
        const y = tf.conv2d(x as Tensor4D, this.kernel.read() as Tensor4D, this.strides as [number, number], this.padding as "same" | "valid", "NHWC", this.dilationRate as [number, number])
        return this.bias ? tf.add(y, this.bias.read()) : y
      })
    }
  )
  return installed
}

/** Runs `f` with tfjs-layers' own Conv2D.call (for tests and benchmarks that compare the two). */
export const withTfjsConvLayer = <T>(tf: Tf, f: () => T): T => withTfjsCalls(tf, ["Conv2D"], f)
