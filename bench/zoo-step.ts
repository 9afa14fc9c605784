// One training step of a zoo model in plain tfjs (no gradwire worker around it): the zoo loop's own
// model, batches (zooBatcher, rows in order, wrapping round) and loss (zooLoss), tfjs's Adam, the
// loss read back each step. For the benchmarks that time tfjs itself (zoo-plain.ts,
// webgpu-recording.ts).
import type { Tf } from "../core/tf.ts"
import { loadZooData } from "../examples/zoo/data.ts"
import { buildZooModel, readsTokens, TASK_OF, type ZooModel } from "../examples/zoo/models.ts"
import { zooBatcher, zooLoss } from "../examples/zoo/train.ts"

export const plainZooStep = async (tf: Tf, model: ZooModel, batch: number): Promise<{ step: () => Promise<void>; dispose: () => void }> => {
  const data = await loadZooData(TASK_OF[model])
  const net = buildZooModel(tf, model, data.text)
  const loss = zooLoss(tf, data.text?.tags ?? 10)
  const batchOf = zooBatcher(tf, data.train, batch, readsTokens(model))
  const adam = tf.train.adam(0.003)
  const rows = Int32Array.from({ length: data.train.size }, (_, i) => i)
  let at = 0
  const step = async (): Promise<void> => {
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
