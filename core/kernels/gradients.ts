// Gradients tfjs-core 4.22 does not define (or defines far too slowly, or wrongly), on every backend: without them a model using
// thresholdedReLU (Greater), masking (Any) or conv3dTranspose (Conv3DBackpropInputV2) cannot take a
// single step. Comparisons and boolean reductions are not differentiable: their inputs get zero
// gradients, as TensorFlow's NotDifferentiable gives. Registered only where tfjs has none.
import type { Tf } from "../tf.ts"

type T = import("@tensorflow/tfjs").Tensor

const NOT_DIFFERENTIABLE: Record<string, readonly string[]> = {
  Greater: ["a", "b"],
  GreaterEqual: ["a", "b"],
  Less: ["a", "b"],
  LessEqual: ["a", "b"],
  Equal: ["a", "b"],
  NotEqual: ["a", "b"],
  LogicalAnd: ["a", "b"],
  LogicalOr: ["a", "b"],
  LogicalXor: ["a", "b"],
  LogicalNot: ["x"],
  Any: ["x"],
  All: ["x"],
  IsNan: ["x"],
  IsInf: ["x"],
  IsFinite: ["x"]
}

let done: string[] | undefined

/** Registers the missing gradients; returns the kernel names it registered them for. */
export const registerMissingGradients = (tf: Tf): string[] => {
  if (done) return done
  const added: string[] = []
  for (const [kernelName, names] of Object.entries(NOT_DIFFERENTIABLE)) {
    if (tf.getGradient(kernelName)) continue
    tf.registerGradient({
      kernelName,
      inputsToSave: [...names],
      gradFunc: (_dy, saved) => Object.fromEntries(names.map((n, i) => [n, () => tf.zeros((saved[i] as T).shape, "float32")]))
    })
    added.push(kernelName)
  }
  if (!tf.getGradient("Conv3DBackpropInputV2")) {
    // The transposed 3-D convolution: its gradients are the forward convolution (for dy) and the
    // filter gradient with the roles of x and dy swapped, as tfjs does for the 2-D one.
    tf.registerGradient({
      kernelName: "Conv3DBackpropInputV2",
      inputsToSave: ["dy", "filter"],
      gradFunc: (ddx, saved, attrs) => {
        const [dy, filter] = saved as T[]
        const { strides, pad } = attrs as { strides: [number, number, number]; pad: "valid" | "same" }
        return {
          dy: () => tf.conv3d(ddx as import("@tensorflow/tfjs").Tensor5D, filter as import("@tensorflow/tfjs").Tensor5D, strides, pad),
          filter: () =>
            tf.engine().runKernel("Conv3DBackpropFilterV2", { x: ddx as T, dy }, { strides, pad, filterShape: filter.shape }) as T
        }
      }
    })
    added.push("Conv3DBackpropInputV2")
  }
  // tfjs's own Tile gradient slices the upstream gradient once per tile and adds the slices: a
  // [32, 32, 32] gradient of layerNormalization's tiled statistics took 10,240 slices and adds
  // per step (97% of a small transformer's step on wasm). The same sum as one reshape and one sum.
  tf.registerGradient({
    kernelName: "Tile",
    inputsToSave: ["x"],
    gradFunc: (dy, saved, attrs) => {
      const [x] = saved as T[]
      const reps = (attrs as { reps: number[] }).reps
      return {
        x: () => {
          const split: number[] = []
          const axes: number[] = []
          x.shape.forEach((d, i) => {
            split.push(reps[i] ?? 1, d)
            if ((reps[i] ?? 1) > 1) axes.push(2 * i)
          })
          const g = dy as T
          return axes.length === 0 ? g.reshape(x.shape) : g.reshape(split).sum(axes).reshape(x.shape)
        }
      }
    }
  })
  added.push("Tile (replaced: one reshape and sum)")
  // tfjs's own Unpack gradient stacks the upstream gradients as a list, but the engine hands a
  // kernel with one output a lone tensor: unstacking one slice (an RNN over one time step whose
  // inputs depend on weights, an embedding's say) failed every step ("Argument tensors passed to
  // stack must be a Tensor[]"). The same stack, of a list either way.
  tf.registerGradient({
    kernelName: "Unpack",
    gradFunc: (dy, _saved, attrs) => {
      const axis = (attrs as { axis: number }).axis
      return { value: () => tf.stack(Array.isArray(dy) ? dy : [dy], axis) }
    }
  })
  added.push("Unpack (replaced: one slice's gradient stacked too)")
  done = added
  return added
}

/** A replacement gradient: tfjs's map of input gradients, or undefined to leave the call to the gradient it wraps. */
export type GradientOver = (dy: T, saved: T[], attrs: Record<string, unknown>) => Record<string, () => T> | undefined

/**
 * Wraps the gradient registered for `kernelName` (tfjs-core's own, or an earlier wrap), once per
 * process and `marker`: `over` may give the gradient; where it gives undefined, the wrapped one
 * runs. False where there is no gradient to wrap.
 */
export const wrapGradient = (tf: Tf, kernelName: string, marker: symbol, over: GradientOver): boolean => {
  const own = tf.getGradient(kernelName) as (ReturnType<Tf["getGradient"]> & { [marker]?: true }) | undefined
  if (!own) return false
  if (own[marker]) return true
  const gradFunc = (dy: T, saved: T[], attrs: Record<string, unknown>) => over(dy, saved, attrs) ?? own.gradFunc(dy, saved, attrs as never)
  tf.registerGradient({ ...own, gradFunc: gradFunc as never, [marker]: true } as never)
  return true
}
