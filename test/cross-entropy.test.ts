// core/kernels/cross-entropy.ts: softmax cross-entropy on logits and class ids as one kernel and its
// gradient as one more (PyTorch's F.cross_entropy), on wasm, cpu and webgpu (the software adapter, in
// a child: support/webgpu-cross-entropy-child.ts), against tfjs's softmaxCrossEntropy on one-hot
// labels: the loss and the logits' gradient, for rows of 10 and 40 classes, logits about 80, one row,
// and 70,000 rows; the kernels it runs; and the typed errors for mismatched input.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { kernelsOf, worst } from "./support/kernel-compare.ts"
import { cases, lossAndGrad, tfjsLossAndGrad } from "./support/cross-entropy-cases.ts"
import { runWebGpuChild } from "./support/webgpu-child.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { CROSS_ENTROPY, CROSS_ENTROPY_GRAD, crossEntropy } from "../core/kernels/cross-entropy.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-cross-entropy-child.ts", import.meta.url))
const DEADLINE_MS = 3 * 60_000
let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

describe("softmax cross-entropy on class ids as one kernel", () => {
  for (const backend of ["wasm", "cpu"]) {
    for (const c of cases) {
      it(`${backend}, ${c.name}: the loss and the logits' gradient as tfjs's softmaxCrossEntropy on one-hot labels gives them`, async () => {
        await tf.setBackend(backend)
        const ours = lossAndGrad(tf, crossEntropy, c)
        const theirs = tfjsLossAndGrad(tf, c)
        expect(await worst(ours, theirs)).toBeLessThan(2e-5)
        tf.dispose([...ours, ...theirs])
        await tf.setBackend("wasm")
      })
    }
    it(`${backend}: one kernel forward and one backward, where tfjs's took a dozen and more`, async () => {
      await tf.setBackend(backend)
      const ours = await kernelsOf(tf, () => lossAndGrad(tf, crossEntropy, cases[0]!))
      const theirs = await kernelsOf(tf, () => tfjsLossAndGrad(tf, cases[0]!))
      expect(ours.filter((k) => k === CROSS_ENTROPY)).toHaveLength(1)
      expect(ours.filter((k) => k === CROSS_ENTROPY_GRAD)).toHaveLength(1)
      expect(theirs).not.toContain(CROSS_ENTROPY)
      expect(ours.length).toBeLessThan(theirs.length / 2)
      await tf.setBackend("wasm")
    })
  }

  it("takes logits of any rank with one id per row, float ids too, and says what is wrong otherwise", async () => {
    const z = tf.tensor3d(Float32Array.from({ length: 2 * 3 * 4 }, (_, i) => Math.sin(i)), [2, 3, 4])
    const y = tf.tensor2d([0, 3, 1, 2, 2, 0], [2, 3], "int32")
    const flat = crossEntropy(tf, tf.reshape(z, [6, 4]), tf.reshape(y, [6]))
    expect(Math.abs((await crossEntropy(tf, z, y).data())[0]! - (await flat.data())[0]!)).toBeLessThan(1e-7)
    expect(Math.abs((await crossEntropy(tf, z, tf.cast(y, "float32")).data())[0]! - (await flat.data())[0]!)).toBeLessThan(1e-7)
    expect(() => crossEntropy(tf, z, tf.tensor1d([0, 1], "int32"))).toThrow(/6 rows of logits .* but 2 labels/)
    expect(() => crossEntropy(tf, tf.cast(z, "int32"), y)).toThrow(/logits must be float32/)
  })

  it("webgpu (software adapter): the same loss and gradient, in two programs where tfjs's took more than a dozen", async () => {
    const r = await runWebGpuChild<{ backend: string; worst: Record<string, number>; programs: number; tfjsPrograms: number }>(CHILD, DEADLINE_MS)
    expect(r.backend).toBe("webgpu")
    expect(Object.keys(r.worst)).toHaveLength(cases.length)
    for (const [name, w] of Object.entries(r.worst)) expect(w, name).toBeLessThan(1e-4)
    expect(r.programs).toBeLessThanOrEqual(3)
    expect(r.tfjsPrograms).toBeGreaterThan(12)
  }, DEADLINE_MS + 30_000)
})
