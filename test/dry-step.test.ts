// prepareModel's dry step (core/kernels/dry-step.ts) on the wasm backend: a kernel no backend has
// is a typed UnsupportedKernel naming the kernel, the layer and what was tried, before training;
// a model that can train passes and keeps its weights and batch-norm statistics exactly.
import { beforeAll, describe, expect, it } from "vitest"
import { loadEngine, type Tf } from "../core/engine.ts"
import { UnsupportedKernel } from "../core/errors.ts"
import { dryStep, missingKernelOf } from "../core/kernels/dry-step.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
  // A forward kernel with no gradient, on wasm only: what a custom op without registerGradient is.
  tf.registerKernel({
    kernelName: "GradwireTestNoGradient",
    backendName: "wasm",
    kernelFunc: ({ inputs, backend }) => {
      const x = inputs.x as unknown as { dataId: object; shape: number[]; dtype: "float32" }
      ;(backend as unknown as { incRef(d: object): void }).incRef(x.dataId)
      return { dataId: x.dataId, shape: x.shape, dtype: x.dtype }
    }
  })
})

/** A custom layer that runs one kernel by name on its input. */
const kernelLayer = (kernel: string, name: string) => {
  class KernelLayer extends tf.layers.Layer {
    static className = `KernelLayer_${kernel}`
    override call(inputs: Tensor | Tensor[]): Tensor {
      const x = Array.isArray(inputs) ? inputs[0] : inputs
      return tf.engine().runKernel(kernel, { x }, {}) as Tensor
    }
  }
  return new KernelLayer({ name })
}

const modelWith = (middle: import("@tensorflow/tfjs").layers.Layer) => {
  const m = tf.sequential()
  m.add(tf.layers.dense({ units: 4, inputShape: [3], name: "before" }))
  m.add(middle)
  m.add(tf.layers.dense({ units: 2, name: "after" }))
  return m
}

/** The UnsupportedKernel the dry step of `model` throws (the test fails if it throws anything else, or nothing). */
const refusal = (model: import("@tensorflow/tfjs").LayersModel): UnsupportedKernel => {
  let err: unknown
  try {
    dryStep(tf, model, "wasm")
  } catch (e) {
    err = e
  }
  expect(err).toBeInstanceOf(UnsupportedKernel)
  return err as UnsupportedKernel
}

describe("prepareModel's dry step", () => {
  it("names a forward kernel no backend has, and the layer that needs it", () => {
    const u = refusal(modelWith(kernelLayer("GradwireTestNoSuchKernel", "mystery")))
    expect(u.kernel).toBe("GradwireTestNoSuchKernel")
    expect(u.layer).toBe("mystery")
    expect(u.tried).toContain("the cpu-backend fallback")
    expect(u.message).toMatch(/layer "mystery" needs kernel GradwireTestNoSuchKernel/)
  })

  it("names a kernel without a gradient, found in the backward pass, and its layer", () => {
    const u = refusal(modelWith(kernelLayer("GradwireTestNoGradient", "opaque")))
    expect(u.kernel).toBe("GradwireTestNoGradient")
    expect(u.layer).toBe("opaque")
    expect(u.reason).toMatch(/no gradient/)
  })

  it("passes a CNN with batch norm and leaves every weight and statistic as it was", () => {
    const m = tf.sequential()
    m.add(tf.layers.conv2d({ filters: 4, kernelSize: 3, inputShape: [8, 8, 1] }))
    m.add(tf.layers.batchNormalization({}))
    m.add(tf.layers.flatten())
    m.add(tf.layers.dense({ units: 3 }))
    const before = m.weights.map((w) => Array.from(w.read().dataSync()))
    const tensorsBefore = tf.memory().numTensors
    dryStep(tf, m, "wasm")
    expect(m.weights.map((w) => Array.from(w.read().dataSync()))).toEqual(before)
    // Nothing leaked but the cloned statistics written back in place of the old ones.
    expect(tf.memory().numTensors).toBeLessThanOrEqual(tensorsBefore + m.weights.filter((w) => !w.trainable).length)
  })

  it("reads tfjs's two missing-kernel messages", () => {
    expect(missingKernelOf(new Error("Kernel 'Foo' not registered for backend 'wasm'"))).toEqual({ kernel: "Foo", gradient: false })
    expect(missingKernelOf(new Error("Cannot compute gradient: gradient function not found for Bar."))).toEqual({ kernel: "Bar", gradient: true })
    expect(missingKernelOf(new Error("shapes do not match"))).toBeUndefined()
  })
})
