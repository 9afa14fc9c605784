// The zoo's benchmark loop in plain tfjs, no gradwire around it (bench/train.ts runs it as a child
// process for the p = 1 row): the same model, batches, loss and Adam on the same backend, with the
// kernels gradwire registers on wasm (they are tfjs's backend, not gradwire's overhead).
//
//   node bench/zoo-plain.ts MODEL BATCH WARMUP STEPS   -> prints {"samplesPerSec": ...}
import { loadEngine } from "../index.ts"
import { loadZooData } from "../examples/zoo/data.ts"
import { buildZooModel, TASK_OF, type ZooModel } from "../examples/zoo/models.ts"

const [model, batchArg, warmupArg, stepsArg] = process.argv.slice(2) as [ZooModel, string, string, string]
const batch = Number(batchArg)
const { tf } = await loadEngine("auto")
const data = await loadZooData(TASK_OF[model])
const net = buildZooModel(tf, model, data.text)
const classes = data.text?.tags ?? 10
const text = TASK_OF[model] === "pos" || TASK_OF[model] === "tokens"
const width = data.train.featureShape.reduce((a, b) => a * b, 1)
const perLabel = (data.train.labelShape ?? []).reduce((a, b) => a * b, 1)
const opt = tf.train.adam(0.003)
const xBuf = new Float32Array(batch * width)
const yBuf = new Int32Array(batch * perLabel)
let at = 0
const step = async (): Promise<void> => {
  if ((at + 1) * batch > data.train.size) at = 0
  for (let i = 0; i < batch; i++) {
    const r = at * batch + i
    xBuf.set(data.train.x.subarray(r * width, (r + 1) * width), i * width)
    for (let k = 0; k < perLabel; k++) yBuf[i * perLabel + k] = data.train.y[r * perLabel + k]!
  }
  at++
  const x = text ? tf.tensor(Int32Array.from(xBuf), [batch, ...data.train.featureShape], "int32") : tf.tensor(xBuf, [batch, ...data.train.featureShape])
  const y = tf.tensor(yBuf, perLabel > 1 ? [batch, perLabel] : [batch], "int32")
  const loss = opt.minimize(
    () => tf.losses.softmaxCrossEntropy(tf.oneHot(y.reshape([-1]).toInt(), classes), (net.apply(x, { training: true }) as import("@tensorflow/tfjs").Tensor).reshape([-1, classes])) as import("@tensorflow/tfjs").Scalar,
    true
  )!
  await loss.data()
  tf.dispose([x, y, loss])
}
for (let s = 0; s < Number(warmupArg); s++) await step()
const t0 = performance.now()
for (let s = 0; s < Number(stepsArg); s++) await step()
console.log(JSON.stringify({ samplesPerSec: (Number(stepsArg) * batch) / ((performance.now() - t0) / 1000) }))
process.exit(0)
