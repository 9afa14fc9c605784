// The worker loop of `npm run bench -- overlap` (bench/overlap.ts): does overlapping the gradient
// all-reduce with the backward pass pay on this backend? Per step, every rank runs the same
// variants in the same order, interleaved, on the same batch:
//
//   whole   forward + backward in one tfjs call (as dp.trainStep does), the gradients copied into
//           one flat buffer, then one all-reduce of it;
//   cut k   the backward split at the model's k-th cut point (graph.ts: where one tensor carries
//           everything forward): the front's forward without a tape, the back's forward and
//           backward (its weights' gradients and its input's), then the back's gradients go into
//           their own buffer: their reads are issued before the front's backward is recorded (its
//           forward again under the tape: tfjs keeps no tape across calls), their all-reduce starts
//           as soon as they are in, and the front's follows; the step ends when both are done;
//   compute the whole variant without its all-reduce;  reduce  the all-reduce alone.
//
// The split variant is what bucketed overlap would do with two buckets; whether its all-reduce
// actually progresses while the front's backward runs is what the timing shows: on a host backend
// (wasm, cpu) the kernels run on the thread that also runs the collectives, on a GPU backend they
// run on the device while that thread is free. The weights are not
// updated (every step is alike). Step 0 also checks that the split gradients equal the whole ones.
import type { TrainContext } from "../index.ts"
import { buildZooModel, type ZooModel } from "../examples/zoo/models.ts"
import { zooBatcher, zooLoss } from "../examples/zoo/train.ts"
import { modelGraph, runLayers, unitCount } from "../actors/train/worker/model-parallel/graph.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable

export interface OverlapConfig {
  readonly model: ZooModel
  /** Rows per rank per step. */
  readonly batch: number
  /** Timed steps of each variant (after `warmup` untimed ones). */
  readonly steps: number
  readonly warmup: number
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length === 0 ? Number.NaN : s[s.length >> 1]!
}

export async function overlapLoop(config: OverlapConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const comm = ctx.communicator
  const model = buildZooModel(tf, config.model)
  const graph = modelGraph(model)
  const units = unitCount(graph)
  const classes = model.outputs[0]!.shape.at(-1) as number
  const loss = zooLoss(tf, classes)
  const train = await ctx.getDatasetShard("train")
  const [x, y] = zooBatcher(tf, train.dataset, config.batch, false)(train.rows(0), 0)
  const varsOf = (from: number, to: number): Variable[] => {
    const out: Variable[] = []
    for (let i = from; i < to; i++) for (const w of graph.layers[i]!.layer.trainableWeights) out.push((w as unknown as { val: Variable }).val)
    return out
  }
  const all = varsOf(0, graph.layers.length)
  const size = (vs: ReadonlyArray<Variable>): number => vs.reduce((s, v) => s + v.size, 0)
  const total = size(all)
  const inId = graph.boundaries[0]!.id
  const outId = graph.boundaries[units]!.id
  // Copies gradients into `flat` (in `vars` order), as readGradients does, and frees them. The reads
  // are asynchronous (a GPU backend has no synchronous read in Node): issued at once, each resolves
  // when the engine has computed that tensor.
  const read = (grads: ReadonlyArray<Tensor>, flat: Float32Array): Promise<Float32Array> =>
    Promise.all(grads.map((g) => g.data() as Promise<Float32Array>)).then((values) => {
      let at = 0
      for (const v of values) {
        flat.set(v, at)
        at += v.length
      }
      tf.dispose(grads as Tensor[])
      return flat
    })
  const wholeFlat = new Float32Array(total)
  const wholeGrads = (): Promise<Float32Array> => {
    const { value, grads } = tf.engine().gradients(() => loss(y, model.apply(x, { training: true }) as Tensor), all)
    value.dispose()
    return read(grads, wholeFlat)
  }
  // Every cut with weights on both sides.
  const cuts: Array<{ k: number; front: Variable[]; back: Variable[]; frontFlat: Float32Array; backFlat: Float32Array; maxDiff: number }> = []
  for (let k = 1; k < units; k++) {
    const at = graph.unitStart[k]!
    const front = varsOf(0, at)
    const back = varsOf(at, graph.layers.length)
    if (front.length > 0 && back.length > 0) cuts.push({ k, front, back, frontFlat: new Float32Array(size(front)), backFlat: new Float32Array(size(back)), maxDiff: Number.NaN })
  }
  // The back part's gradients are read (on a GPU: as soon as its kernels are done) before the
  // front's backward is even recorded; its all-reduce starts when they are in, the front's after it.
  const splitStep = async (c: (typeof cuts)[number], check?: Float32Array): Promise<void> => {
    const at = graph.unitStart[c.k]!
    const cutId = graph.boundaries[c.k]!.id
    const h = tf.tidy(() => runLayers(graph.layers, 0, at, inId, cutId, x, true))
    const b = tf.engine().gradients(() => loss(y, runLayers(graph.layers, at, graph.layers.length, cutId, outId, h, true)), [h, ...c.back])
    b.value.dispose()
    const dh = b.grads[0]!
    const backRead = read(b.grads.slice(1), c.backFlat)
    const f = tf.engine().gradients(() => runLayers(graph.layers, 0, at, inId, cutId, x, true), c.front, dh)
    f.value.dispose()
    tf.dispose([dh, h])
    const frontRead = read(f.grads, c.frontFlat)
    await backRead
    const backDone = check ? undefined : comm.allReduce(c.backFlat)
    await frontRead
    if (check) {
      // The split gradients against the whole ones: the front's weights come first in `all`.
      let worst = 0
      for (let i = 0; i < total; i++) {
        const v = i < c.frontFlat.length ? c.frontFlat[i]! : c.backFlat[i - c.frontFlat.length]!
        worst = Math.max(worst, Math.abs(v - check[i]!))
      }
      c.maxDiff = worst
      return
    }
    await Promise.all([backDone, comm.allReduce(c.frontFlat)])
  }
  const variants: Array<{ name: string; run: () => Promise<unknown>; times: number[] }> = [
    { name: "whole", run: async () => comm.allReduce(await wholeGrads()), times: [] },
    { name: "compute", run: () => wholeGrads(), times: [] },
    { name: "reduce", run: () => comm.allReduce(wholeFlat), times: [] },
    ...cuts.map((c) => ({ name: `cut ${c.k}`, run: () => splitStep(c), times: [] as number[] }))
  ]
  // Step 0: the split gradients equal the whole ones (the same kernels on the same values).
  const reference = Float32Array.from(await wholeGrads())
  for (const c of cuts) await splitStep(c, reference)
  // Every variant starts on every rank together (a one-float all-reduce, not timed): its time is
  // its own, not the wait for a rank still finishing the variant before.
  const tick = new Float32Array(1)
  for (let s = 0; s < config.warmup + config.steps; s++) {
    for (const v of variants) {
      await comm.allReduce(tick)
      const t0 = performance.now()
      await v.run()
      if (s >= config.warmup) v.times.push(performance.now() - t0)
    }
  }
  tf.dispose([x, y])
  const ms = Object.fromEntries(variants.map((v) => [v.name, median(v.times)]))
  await ctx.report({
    parameters: total,
    units,
    ...Object.fromEntries(Object.entries(ms).map(([k, v]) => [`ms/${k}`, v])),
    ...Object.fromEntries(cuts.map((c) => [`back/cut ${c.k}`, size(c.back) / total])),
    ...Object.fromEntries(cuts.map((c) => [`diff/cut ${c.k}`, c.maxDiff]))
  })
}
