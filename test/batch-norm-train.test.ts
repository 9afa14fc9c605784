// core/kernels/batch-norm-train.ts: batch normalization while training as one kernel and its
// gradient as one more, in place of tfjs-layers' moments and batchNorm, on wasm and cpu (webgpu:
// test/webgpu-layer-coverage checks its gradients against wasm's). Checked against tfjs-layers' own
// layer on the same weights and inputs: the loss, the scale's, offset's and input's gradients and
// the moving mean and variance after the step; the batch statistics' own gradients (a loss that
// uses them) against tf.moments; a layer without offset or scale, which tfjs-layers' own cannot
// train, against the formula; and that inference stays tfjs-layers' own.
import { beforeAll, describe, expect, it } from "vitest"
import { kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { BATCH_NORM_TRAIN, BATCH_NORM_TRAIN_GRAD, batchNormTrain, batchNormTrainForward, MOVING_AVERAGE, withTfjsBatchNorm } from "../core/kernels/batch-norm-train.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable
let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})


/** A fresh layer (the same initial weights each time), an input with a large mean, and a loss weighting each output. */
const setup = (shape: number[], options: { center?: boolean; scale?: boolean; axis?: number } = {}) => {
  const layer = tf.layers.batchNormalization({
    momentum: 0.9,
    ...options,
    betaInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: 1 }),
    gammaInitializer: tf.initializers.randomUniform({ minval: 0.5, maxval: 1.5, seed: 2 })
  })
  const n = shape.reduce((a, b) => a * b, 1)
  const x = tf.tensor(seeded(n, 3, 2, 5), shape)
  const w = tf.tensor(seeded(n, 4), shape)
  tf.dispose(layer.apply(x, { training: false }) as Tensor)
  const vars = layer.trainableWeights.map((v) => (v as unknown as { val: Variable }).val)
  const loss = (a: Tensor, f: (a: Tensor) => Tensor): Tensor => f(a).mul(w).sum()
  const train = (t: Tensor): Tensor => layer.apply(t, { training: true }) as Tensor
  const run = (f: (a: Tensor) => Tensor = train): Tensor[] => {
    const { value, grads } = vars.length > 0 ? tf.variableGrads(() => loss(x, f) as import("@tensorflow/tfjs").Scalar, vars) : { value: loss(x, f), grads: {} as Record<string, Tensor> }
    return [value, ...vars.map((v) => grads[v.name]!), tf.grad((a: Tensor) => loss(a, f))(x)]
  }
  /** The moving mean and variance. */
  const moving = (): Tensor[] => layer.getWeights().slice(-2)
  return { layer, run, moving, dispose: () => tf.dispose([x, w]) }
}

describe("batch normalization while training as one kernel", () => {
  for (const backend of ["wasm", "cpu"]) {
    // 8 and 12 channels: wasm's SIMD kernels on the heap (four channels at a time); 6 and 7: its JavaScript loops.
    for (const shape of [[4, 5, 5, 6], [9, 7], [4, 5, 5, 8], [33, 12]]) {
      it(`${backend}, input ${shape}: the loss, every gradient and the moving statistics as tfjs-layers' own layer gives them`, async () => {
        await tf.setBackend(backend)
        const ours = setup(shape)
        const theirs = setup(shape)
        const a = ours.run()
        const b = withTfjsBatchNorm(tf, () => theirs.run())
        expect(a.length).toBe(4)
        expect(await worst(a, b)).toBeLessThan(1e-4)
        // Two training calls each (the weights' pass and the input's): the moving averages moved twice, alike.
        expect(await worst(ours.moving(), theirs.moving())).toBeLessThan(1e-5)
        const names = await kernelsOf(tf, () => ours.run())
        const tfjsNames = await kernelsOf(tf, () => withTfjsBatchNorm(tf, () => theirs.run()))
        expect(names).toContain(BATCH_NORM_TRAIN)
        expect(names).toContain(BATCH_NORM_TRAIN_GRAD)
        expect(names).toContain(MOVING_AVERAGE)
        expect(tfjsNames).not.toContain(BATCH_NORM_TRAIN)
        expect(names.length).toBeLessThan(tfjsNames.length * 0.8)
        tf.dispose([...a, ...b])
        ours.dispose()
        theirs.dispose()
        await tf.setBackend("wasm")
      })
    }

    it(`${backend}: the batch statistics' own gradients (a loss that uses the mean and variance) as tf.moments gives them`, async () => {
      await tf.setBackend(backend)
      const x = tf.tensor(seeded(6 * 4, 7, 2, 3), [6, 4])
      const g = tf.tensor(seeded(4, 8, 0.5, 1), [4])
      const b = tf.tensor(seeded(4, 9), [4])
      const [wy, wm, wv] = [tf.tensor(seeded(24, 10), [6, 4]), tf.tensor(seeded(4, 11), [4]), tf.tensor(seeded(4, 12), [4])]
      const lossOf = (f: (a: Tensor, gg: Tensor, bb: Tensor) => Tensor[]) => (a: Tensor, gg: Tensor, bb: Tensor) => {
        const [y, mean, variance] = f(a, gg, bb)
        return tf.addN([y!.mul(wy).sum(), mean!.mul(wm).sum(), variance!.mul(wv).sum()])
      }
      const ours = (a: Tensor, gg: Tensor, bb: Tensor): Tensor[] => batchNormTrain(tf, a, gg, bb, 1e-3)
      const formula = (a: Tensor, gg: Tensor, bb: Tensor): Tensor[] => {
        const { mean, variance } = tf.moments(a, 0)
        return [tf.add(tf.mul(tf.div(tf.sub(a, mean), tf.sqrt(tf.add(variance, 1e-3))), gg), bb), mean, variance]
      }
      const a = [...ours(x, g, b), ...tf.grads(lossOf(ours))([x, g, b])]
      const c = [...formula(x, g, b), ...tf.grads(lossOf(formula))([x, g, b])]
      expect(await worst(a, c)).toBeLessThan(1e-4)
      tf.dispose([x, g, b, wy, wm, wv, ...a, ...c])
      await tf.setBackend("wasm")
    })

    for (const options of [{ center: false }, { scale: false }]) {
      it(`${backend}, ${JSON.stringify(options)}: trains (tfjs-layers' own cannot), as the formula gives it`, async () => {
        await tf.setBackend(backend)
        const { layer, run, dispose } = setup([5, 3, 4], options)
        const l = layer as unknown as { gamma: { read(): Tensor } | null; beta: { read(): Tensor } | null; epsilon: number }
        const formula = (a: Tensor): Tensor => {
          const { mean, variance } = tf.moments(a, [0, 1])
          let y = tf.div(tf.sub(a, mean), tf.sqrt(tf.add(variance, l.epsilon)))
          if (options.scale !== false) y = tf.mul(y, l.gamma!.read())
          if (options.center !== false) y = tf.add(y, l.beta!.read())
          return y
        }
        const ours = run()
        const theirs = run(formula)
        expect(await worst(ours, theirs)).toBeLessThan(1e-4)
        expect(() => withTfjsBatchNorm(tf, () => run())).toThrow()
        tf.dispose([...ours, ...theirs])
        dispose()
        await tf.setBackend("wasm")
      })
    }
  }

  it("keeps y's precision where the mean is large next to the spread (values 1000 ± 1): within float32 rounding of the float64 formula, where the mean rounded to float32 alone would be 5e-5 off", () => {
    const M = 4096
    const C = 4
    const x = Float32Array.from(seeded(M * C, 7), (v) => 1000 + v)
    const y = new Float32Array(M * C)
    const mean = new Float32Array(C)
    const variance = new Float32Array(C)
    batchNormTrainForward(x, new Float32Array(C).fill(1), new Float32Array(C), C, 1e-3, y, mean, variance)
    let off = 0
    for (let c = 0; c < C; c++) {
      let mu = 0
      for (let i = 0; i < M; i++) mu += x[i * C + c]!
      mu /= M
      let v = 0
      for (let i = 0; i < M; i++) v += (x[i * C + c]! - mu) ** 2
      const scale = 1 / Math.sqrt(v / M + 1e-3)
      for (let i = 0; i < M; i++) off = Math.max(off, Math.abs(y[i * C + c]! - (x[i * C + c]! - mu) * scale))
    }
    expect(off).toBeLessThan(1e-6)
  })

  it("leaves inference to tfjs-layers (the moving statistics, no batch ones)", async () => {
    const inference = setup([3, 4, 5, 2])
    const x = tf.ones([3, 4, 5, 2])
    expect(await kernelsOf(tf, () => [inference.layer.apply(x, { training: false }) as Tensor])).not.toContain(BATCH_NORM_TRAIN)
    x.dispose()
    inference.dispose()
  })
})
