// core/kernels/lstm-cell.ts: an LSTM step's gates as one kernel and their gradient as one more, in
// place of tfjs-layers' LSTMCell composition, on wasm and cpu (webgpu: test/webgpu-layer-coverage
// checks its gradients against wasm's). Checked against tfjs-layers' own cell on the same weights
// and inputs: outputs and every weight's and the input's gradient, for both recurrent activations,
// with and without a bias, forwards and backwards in time; the gates alone against the same
// formulas written in tfjs ops, at hardSigmoid's clip bounds and where tanh saturates; and the
// cells it must leave to tfjs (dropout while training).
import { beforeAll, describe, expect, it } from "vitest"
import { kernelsOf, seeded, worst } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { LSTM_CELL, LSTM_CELL_GRAD, lstmGates, withTfjsLstmCell } from "../core/kernels/lstm-cell.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})




interface Case {
  recurrentActivation: "hardSigmoid" | "sigmoid"
  returnSequences: boolean
  useBias: boolean
  goBackwards: boolean
  /** Units: 7 takes wasm's JavaScript loops, 8 its SIMD kernels on the heap (four units at a time). */
  units: number
}
const CASES: Case[] = [
  { recurrentActivation: "hardSigmoid", returnSequences: true, useBias: true, goBackwards: false, units: 7 },
  { recurrentActivation: "sigmoid", returnSequences: false, useBias: false, goBackwards: false, units: 7 },
  { recurrentActivation: "hardSigmoid", returnSequences: true, useBias: true, goBackwards: true, units: 7 },
  { recurrentActivation: "hardSigmoid", returnSequences: true, useBias: true, goBackwards: false, units: 8 },
  { recurrentActivation: "sigmoid", returnSequences: true, useBias: true, goBackwards: true, units: 8 }
]

/** An LSTM layer's loss, and the gradients of its weights and of its input. */
const T = 6
const lossAndGrads = (c: Case, seed: number) => {
  const [B, D, H] = [3, 5, c.units]
  const layer = tf.layers.lstm({
    units: H,
    returnSequences: c.returnSequences,
    useBias: c.useBias,
    goBackwards: c.goBackwards,
    recurrentActivation: c.recurrentActivation,
    kernelInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed }),
    recurrentInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: seed + 1 }),
    biasInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: seed + 2 })
  })
  // Inputs large enough that some gates saturate (hardSigmoid's clip, tanh near ±1).
  const x = tf.tensor(seeded(B * T * D, seed + 3, 2.5), [B, T, D])
  const weights = tf.tensor(seeded((c.returnSequences ? T : 1) * H, seed + 4), c.returnSequences ? [1, T, H] : [1, H])
  // Built on its first call: its weights exist from here on.
  tf.dispose(layer.apply(x) as Tensor)
  const run = (): Tensor[] => {
    const f = (input: Tensor): Tensor => (layer.apply(input, { training: true }) as Tensor).mul(weights).sum()
    const { value, grads } = tf.variableGrads(() => f(x) as import("@tensorflow/tfjs").Scalar, layer.trainableWeights.map((w) => (w as unknown as { val: import("@tensorflow/tfjs").Variable }).val))
    const dx = tf.grad(f)(x)
    return [value, ...Object.values(grads), dx]
  }
  return { run, layer, dispose: () => tf.dispose([x, weights]) }
}

describe("an LSTM cell's gates as one kernel", () => {
  for (const backend of ["wasm", "cpu"]) {
    for (const c of CASES) {
      it(`${backend}, ${c.units} units, ${c.recurrentActivation}${c.useBias ? "" : ", no bias"}${c.returnSequences ? ", every step's output" : ", the last output"}${c.goBackwards ? ", backwards in time" : ""}: the loss and every gradient as tfjs-layers' own cell gives them`, async () => {
        await tf.setBackend(backend)
        const { run, layer, dispose } = lossAndGrads(c, 11)
        const fused = run()
        const own = withTfjsLstmCell(tf, run)
        // Weights, and the input.
        expect(fused.length).toBe(layer.trainableWeights.length + 2)
        expect(await worst(fused, own)).toBeLessThan(1e-4)
        const names = await kernelsOf(tf, run)
        const tfjsNames = await kernelsOf(tf, () => withTfjsLstmCell(tf, run))
        expect(names).toContain(LSTM_CELL)
        expect(names).toContain(LSTM_CELL_GRAD)
        expect(tfjsNames).not.toContain(LSTM_CELL)
        // The point of it: far fewer kernels per training step. And the layer projects every time
        // step's input in one matmul: per step one matmul forward (h·U) and two backward, where the
        // cell alone would take two and four (run() makes two passes: the weights' gradients, the input's).
        expect(names.length).toBeLessThan(tfjsNames.length * 0.4)
        const matmuls = names.filter((n) => n === "BatchMatMul" || n === "_FusedMatMul").length
        expect(matmuls).toBeLessThanOrEqual(2 * (3 * T + 4))
        tf.dispose([...fused, ...own])
        dispose()
        await tf.setBackend("wasm")
      })
    }

    it(`${backend}: the gates and their gradients match the formulas in tfjs ops at hardSigmoid's bounds and where tanh saturates`, async () => {
      await tf.setBackend(backend)
      const H = 6
      // Gate inputs at -2.5 and 2.5 exactly (the clip's bounds: tfjs's gradient counts them inside), just outside, 0, and far out.
      const row = [-2.5, 2.5, -2.5000002, 2.5000002, 0, 30]
      const zv = Float32Array.from({ length: 2 * 4 * H }, (_, k) => (k < 4 * H ? row[k % H]! : seeded(1, k)[0]! * 25))
      const z = tf.tensor(zv, [2, 4 * H])
      const c = tf.tensor(seeded(2 * H, 5, 3), [2, H])
      const dh = tf.tensor(seeded(2 * H, 6), [2, H])
      const dc = tf.tensor(seeded(2 * H, 7), [2, H])
      for (const recurrent of ["hardSigmoid", "sigmoid"] as const) {
        const act = (t: Tensor): Tensor => (recurrent === "hardSigmoid" ? tf.clipByValue(tf.add(0.5, tf.mul(0.2, t)), 0, 1) : tf.sigmoid(t))
        const reference = (zz: Tensor, cc: Tensor): Tensor[] => {
          const [zi, zf, zg, zo] = tf.split(zz, 4, 1) as [Tensor, Tensor, Tensor, Tensor]
          const cn = tf.add(tf.mul(act(zf), cc), tf.mul(act(zi), tf.tanh(zg)))
          return [tf.mul(act(zo), tf.tanh(cn)), cn]
        }
        const loss = (f: (zz: Tensor, cc: Tensor) => Tensor[]) => (zz: Tensor, cc: Tensor) => {
          const [h, cn] = f(zz, cc)
          return tf.add(tf.sum(tf.mul(h!, dh)), tf.sum(tf.mul(cn!, dc)))
        }
        const ours = [...lstmGates(tf, z, c, recurrent), ...tf.grads(loss((zz, cc) => lstmGates(tf, zz, cc, recurrent)))([z, c])]
        const theirs = [...reference(z, c), ...tf.grads(loss(reference))([z, c])]
        expect(await worst(ours, theirs)).toBeLessThan(1e-5)
        tf.dispose([...ours, ...theirs])
      }
      tf.dispose([z, c, dh, dc])
      await tf.setBackend("wasm")
    })
  }

  it("leaves a cell with dropout to tfjs-layers while training, and computes it at inference, where dropout does nothing", async () => {
    const layer = tf.layers.lstm({ units: 4, dropout: 0.3, recurrentDropout: 0.2, returnSequences: true, kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }) })
    const x = tf.tensor(seeded(2 * 3 * 5, 9), [2, 3, 5])
    const training = await kernelsOf(tf, () => [layer.apply(x, { training: true }) as Tensor])
    expect(training).not.toContain(LSTM_CELL)
    const inference = await kernelsOf(tf, () => [layer.apply(x, { training: false }) as Tensor])
    expect(inference).toContain(LSTM_CELL)
    const ours = layer.apply(x, { training: false }) as Tensor
    const theirs = withTfjsLstmCell(tf, () => layer.apply(x, { training: false }) as Tensor)
    expect(await worst([ours], [theirs])).toBeLessThan(1e-6)
    tf.dispose([x, ours, theirs])
  })

  it("a masked sequence (an embedding with maskZero) as tfjs-layers' own LSTM gives it", async () => {
    const emb = tf.layers.embedding({ inputDim: 9, outputDim: 4, maskZero: true, embeddingsInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: 3 }) })
    const lstm = tf.layers.lstm({ units: 5, returnSequences: true, kernelInitializer: tf.initializers.glorotUniform({ seed: 4 }), recurrentInitializer: tf.initializers.glorotUniform({ seed: 5 }) })
    const model = tf.sequential({ layers: [tf.layers.inputLayer({ inputShape: [6] }), emb, lstm] })
    // Trailing zeros: masked steps carry the state on unchanged.
    const ids = tf.tensor2d([[1, 4, 2, 0, 0, 0], [3, 3, 8, 7, 5, 0]], [2, 6], "int32")
    const run = (): Tensor[] => {
      const { value, grads } = tf.variableGrads(() => (model.apply(ids, { training: true }) as Tensor).square().sum() as import("@tensorflow/tfjs").Scalar, model.trainableWeights.map((w) => (w as unknown as { val: import("@tensorflow/tfjs").Variable }).val))
      return [value, ...Object.values(grads), model.apply(ids) as Tensor]
    }
    const ours = run()
    const theirs = withTfjsLstmCell(tf, run)
    expect(await worst(ours, theirs)).toBeLessThan(1e-4)
    tf.dispose([ids, ...ours, ...theirs])
    model.dispose()
  })

  for (const backend of ["wasm", "cpu"]) {
    it(`${backend}: an LSTM over one time step after an embedding trains (tfjs's own Unpack gradient threw on it), as the formula over two steps' first gives`, async () => {
      await tf.setBackend(backend)
      const make = (steps: number) => {
        const emb = tf.layers.embedding({ inputDim: 9, outputDim: 4, embeddingsInitializer: tf.initializers.randomUniform({ minval: -1, maxval: 1, seed: 3 }) })
        const lstm = tf.layers.lstm({ units: 5, returnSequences: true, kernelInitializer: tf.initializers.glorotUniform({ seed: 4 }), recurrentInitializer: tf.initializers.glorotUniform({ seed: 5 }) })
        return tf.sequential({ layers: [tf.layers.inputLayer({ inputShape: [steps] }), emb, lstm] })
      }
      // The first step of a sequence does not depend on the later ones: one step's loss and
      // gradients equal those of a two-step sequence's first output.
      const grads = (model: import("@tensorflow/tfjs").Sequential, ids: Tensor, first: boolean): Tensor[] => {
        const { value, grads } = tf.variableGrads(() => {
          const y = model.apply(ids, { training: true }) as Tensor
          return (first ? y.slice([0, 0, 0], [2, 1, 5]) : y).square().sum() as import("@tensorflow/tfjs").Scalar
        }, model.trainableWeights.map((w) => (w as unknown as { val: import("@tensorflow/tfjs").Variable }).val))
        return [value, ...Object.values(grads)]
      }
      const one = make(1)
      const two = make(2)
      const a = tf.tensor2d([[1], [3]], [2, 1], "int32")
      const b = tf.tensor2d([[1, 4], [3, 8]], [2, 2], "int32")
      const ours = grads(one, a, false)
      const reference = grads(two, b, true)
      expect(await worst(ours, reference)).toBeLessThan(1e-5)
      tf.dispose([a, b, ...ours, ...reference])
      one.dispose()
      two.dispose()
      await tf.setBackend("wasm")
    })
  }

  it("leaves a cell whose activation is not tanh to tfjs-layers", async () => {
    const layer = tf.layers.lstm({ units: 4, activation: "relu", kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }) })
    const x = tf.tensor(seeded(2 * 3 * 5, 9), [2, 3, 5])
    expect(await kernelsOf(tf, () => [layer.apply(x, { training: true }) as Tensor])).not.toContain(LSTM_CELL)
    x.dispose()
  })
})
