// The cases test/cross-entropy.test.ts and its webgpu child (webgpu-cross-entropy-child.ts) share:
// logits and class ids, and the loss and the logits' gradient by gradwire's crossEntropy and by
// tfjs's softmaxCrossEntropy on one-hot labels, for a loss that weighs the mean by 1.7 (so the
// incoming gradient is not 1).
import type * as TfType from "@tensorflow/tfjs"
import type { Tf } from "../../core/engine.ts"
import { seeded } from "./kernel-compare.ts"

type Tensor = TfType.Tensor
export interface Case {
  name: string
  rows: number
  classes: number
  logits: Float32Array
  labels: Int32Array
}
const ids = (n: number, classes: number, seed: number): Int32Array => Int32Array.from(seeded(n, seed), (v) => Math.floor(((v + 1) / 2) * classes) % classes)
export const cases: Case[] = [
  { name: "32 rows of 10 classes", rows: 32, classes: 10, logits: seeded(320, 1, 3), labels: ids(32, 10, 2) },
  // The tagging task's shape: 8 sentences of 32 tokens, 40 tags; logits far from 0 (a stable softmax needs the row's maximum).
  { name: "256 tokens of 40 tags, logits about 80", rows: 256, classes: 40, logits: seeded(256 * 40, 3, 20, 80), labels: ids(256, 40, 4) },
  { name: "one row of 2 classes", rows: 1, classes: 2, logits: seeded(2, 5, 2), labels: Int32Array.from([1]) },
  { name: "70,000 rows of 3 classes (two levels of sums)", rows: 70_000, classes: 3, logits: seeded(210_000, 6, 4), labels: ids(70_000, 3, 7) }
]

type Loss = (tf: Tf, logits: Tensor, labels: Tensor) => TfType.Scalar
/** [loss, d loss / d logits] with gradwire's loss `f`. */
export const lossAndGrad = (tf: Tf, f: Loss, c: Case): Tensor[] => {
  const z = tf.tensor2d(c.logits, [c.rows, c.classes])
  const y = tf.tensor1d(c.labels, "int32")
  const { value, grad } = tf.valueAndGrad((logits: Tensor) => tf.mul(f(tf, logits, y), 1.7) as TfType.Scalar)(z)
  tf.dispose([z, y])
  return [value, grad]
}
/** The same with tfjs's softmaxCrossEntropy on one-hot labels. */
export const tfjsLossAndGrad = (tf: Tf, c: Case): Tensor[] =>
  lossAndGrad(tf, (t, z, y) => t.losses.softmaxCrossEntropy(t.oneHot(y as TfType.Tensor1D, c.classes), z) as TfType.Scalar, c)
