// core/kernels/layer-norm.ts: layer normalization over the last axis as one kernel and its gradient
// as one more, in place of tfjs-layers' moments, tiles and batchNorm, on wasm and cpu (webgpu:
// test/webgpu-layer-coverage checks its gradients against wasm's). Checked against tfjs-layers' own
// layer on the same weights and inputs (the output's loss and every gradient: the scale's, the
// offset's and the input's); a layer without offset or scale, which tfjs-layers' own cannot train
// (tfjs's batchNorm gradient fails on the missing input), against the formula in tfjs ops; and the
// layers it leaves to tfjs-layers (another axis).
import { beforeAll, describe, expect, it } from "vitest"
import { kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { LAYER_NORM, LAYER_NORM_GRAD, withTfjsLayerNorm } from "../core/kernels/layer-norm.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable
let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})


/** A layer, an input (rows with a large mean, so that the variance is a difference of large numbers) and a loss weighting each output. */
const setup = (shape: number[], options: { center?: boolean; scale?: boolean; axis?: number }) => {
  const layer = tf.layers.layerNormalization({
    ...options,
    betaInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: 1 }),
    gammaInitializer: tf.initializers.randomUniform({ minval: 0.5, maxval: 1.5, seed: 2 })
  })
  const n = shape.reduce((a, b) => a * b, 1)
  const x = tf.tensor(seeded(n, 3, 2, 5), shape)
  const w = tf.tensor(seeded(n, 4), shape)
  tf.dispose(layer.apply(x) as Tensor)
  const vars = layer.trainableWeights.map((v) => (v as unknown as { val: Variable }).val)
  const loss = (a: Tensor, f: (a: Tensor) => Tensor = (t) => layer.apply(t) as Tensor): Tensor => f(a).mul(w).sum()
  const run = (f?: (a: Tensor) => Tensor): Tensor[] => {
    // A layer with neither offset nor scale has no weights: the loss and the input's gradient alone.
    const { value, grads } = vars.length > 0 ? tf.variableGrads(() => loss(x, f) as import("@tensorflow/tfjs").Scalar, vars) : { value: loss(x, f), grads: {} as Record<string, Tensor> }
    return [value, ...vars.map((v) => grads[v.name]!), tf.grad((a: Tensor) => loss(a, f))(x)]
  }
  return { layer, x, w, vars, run, dispose: () => tf.dispose([x, w]) }
}

describe("layer normalization as one kernel", () => {
  // First in this file: no layer made before it.
  it("installing the LSTM and layer-norm kernels takes none of tfjs-layers' automatic layer names", () => {
    expect(tf.getKernel(LAYER_NORM, "wasm")).toBeDefined()
    expect(tf.layers.layerNormalization({}).name).toBe("layer_normalization_LayerNormalization1")
    expect(tf.layers.lstmCell({ units: 1 }).name).toBe("lstm_cell_LSTMCell1")
    expect(tf.layers.lstm({ units: 1 }).name).toBe("lstm_LSTM1")
  })

  for (const backend of ["wasm", "cpu"]) {
    // Rows of 16 and 32: wasm's SIMD kernels on the heap (four values at a time); 9 and 33: its JavaScript loops.
    for (const shape of [[4, 6, 9], [5, 33], [4, 6, 16], [7, 32]]) {
      it(`${backend}, input ${shape}: the loss and the scale's, offset's and input's gradients as tfjs-layers' own layer gives them, in a third of the kernels`, async () => {
        await tf.setBackend(backend)
        const { run, vars, dispose } = setup(shape, {})
        expect(vars.length).toBe(2)
        const ours = run()
        const theirs = withTfjsLayerNorm(tf, () => run())
        expect(await worst(ours, theirs)).toBeLessThan(1e-4)
        const names = await kernelsOf(tf, () => run())
        const tfjsNames = await kernelsOf(tf, () => withTfjsLayerNorm(tf, () => run()))
        expect(names).toContain(LAYER_NORM)
        expect(names).toContain(LAYER_NORM_GRAD)
        expect(tfjsNames).not.toContain(LAYER_NORM)
        expect(names.length).toBeLessThan(tfjsNames.length / 3)
        tf.dispose([...ours, ...theirs])
        dispose()
        await tf.setBackend("wasm")
      })
    }

    for (const options of [{ center: false }, { scale: false }, { center: false, scale: false }]) {
      it(`${backend}, ${JSON.stringify(options)}: trains (tfjs-layers' own cannot), as the formula in tfjs ops gives it`, async () => {
        await tf.setBackend(backend)
        const { layer, run, dispose } = setup([3, 4, 8], options)
        const l = layer as unknown as { gamma: { read(): Tensor } | null; beta: { read(): Tensor } | null; epsilon: number }
        const formula = (a: Tensor): Tensor => {
          const { mean, variance } = tf.moments(a, -1, true)
          let y = tf.div(tf.sub(a, mean), tf.sqrt(tf.add(variance, l.epsilon)))
          if (options.scale !== false) y = tf.mul(y, l.gamma!.read())
          if (options.center !== false) y = tf.add(y, l.beta!.read())
          return y
        }
        const ours = run()
        const theirs = run(formula)
        expect(await worst(ours, theirs)).toBeLessThan(1e-4)
        expect(() => withTfjsLayerNorm(tf, () => run())).toThrow()
        tf.dispose([...ours, ...theirs])
        dispose()
        await tf.setBackend("wasm")
      })
    }
  }

  it("leaves a layer normalizing over another axis to tfjs-layers", async () => {
    const { run, dispose } = setup([3, 4, 5], { axis: 1 })
    expect(await kernelsOf(tf, () => run())).not.toContain(LAYER_NORM)
    dispose()
  })
})
