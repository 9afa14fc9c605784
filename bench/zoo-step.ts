// One training step of a zoo model in plain tfjs (no gradwire worker around it): the zoo loop's own
// model, batches (zooBatcher, rows in order, wrapping round) and loss (zooLoss, or tfjs's
// softmaxCrossEntropy for bench/cross-entropy.ts), tfjs's Adam, the loss read back each step. For
// the benchmarks that time tfjs itself (zoo-plain.ts, webgpu-recording.ts).
import type { Tf } from "../core/tf.ts"
import { loadZooData } from "../examples/zoo/data.ts"
import { buildZooModel, readsTokens, TASK_OF, type ZooModel } from "../examples/zoo/models.ts"
import { zooBatcher, zooLoss } from "../examples/zoo/train.ts"

/** The zoo's loss (gradwire's crossEntropy), or tfjs's softmaxCrossEntropy on one-hot labels: the same values. */
export type ZooLossKind = "gradwire" | "tfjs"
type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar

export const plainZooStep = async (tf: Tf, model: ZooModel, batch: number): Promise<{ step: (kind?: ZooLossKind) => Promise<void>; dispose: () => void }> => {
  const data = await loadZooData(TASK_OF[model])
  const net = buildZooModel(tf, model, data.text)
  const classes = data.text?.tags ?? 10
  const losses: Record<ZooLossKind, (y: Tensor, logits: Tensor) => Scalar> = {
    gradwire: zooLoss(tf, classes),
    tfjs: (y, logits) => tf.losses.softmaxCrossEntropy(tf.oneHot(tf.reshape(y, [-1]).toInt() as import("@tensorflow/tfjs").Tensor1D, classes), tf.reshape(logits, [-1, classes])) as Scalar
  }
  const batchOf = zooBatcher(tf, data.train, batch, readsTokens(model))
  const adam = tf.train.adam(0.003)
  const rows = Int32Array.from({ length: data.train.size }, (_, i) => i)
  let at = 0
  const step = async (kind: ZooLossKind = "gradwire"): Promise<void> => {
    const loss = losses[kind]
    if (at + batch > rows.length) at = 0
    const [x, y] = batchOf(rows, at)
    at += batch
    const cost = adam.minimize(() => loss(y, net.apply(x, { training: true }) as import("@tensorflow/tfjs").Tensor), true)!
    await cost.data()
    tf.dispose([x, y, cost])
  }
  return {
    step,
    dispose: () => {
      adam.dispose()
      net.dispose()
    }
  }
}
