// Child of test/webgpu-dispatch.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): the same kernels recorded by tfjs's own recordAndSubmit and by
// gradwire's (core/kernels/webgpu-dispatch.ts, uniforms and bind groups reused), once with the
// default cache sizes and once with caches so small that they start over many times while commands
// that use the old uniform buffers are still unsubmitted. Compares every result bit for bit (the
// shaders and the uniforms' bytes are the same), captures WebGPU validation errors, and trains a
// small CNN both ways from the same weights. Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { installWebGpuDispatch, webGpuDispatchStats } from "../../core/kernels/webgpu-dispatch.ts"

type Tensor = TfType.Tensor
const { tf } = await loadEngine("webgpu")
interface ErrorScopes {
  pushErrorScope(f: string): void
  popErrorScope(): Promise<{ message: string } | null>
}
const backend = tf.backend() as unknown as { device: ErrorScopes; recordAndSubmit?: unknown; submitQueue?: unknown }
const installed = Object.hasOwn(backend, "recordAndSubmit") && Object.hasOwn(backend, "submitQueue")
const submitEvery = tf.env().get("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE")
const useTfjs = () => {
  delete backend.recordAndSubmit
  delete backend.submitQueue
}

const rand = (shape: number[], seed: number): Tensor => {
  const n = shape.reduce((a, b) => a * b, 1)
  return tf.tensor(Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 31 + i * 0.37) * 2), shape)
}
// Kernels with uniforms of every length (shapes of rank 1 to 6, programs' own values: pads, slice
// starts, clip bounds, pool and conv geometry), several shapes of each, each twice.
const work = async (): Promise<Float32Array[]> => {
  const out: Tensor[] = []
  for (const [b, hw, c] of [[2, 8, 3], [4, 6, 5], [1, 9, 8]] as const) {
    const x = rand([b, hw, hw, c], hw)
    const f = rand([3, 3, c, 4], c)
    for (let again = 0; again < 2; again++) {
      out.push(tf.conv2d(x as TfType.Tensor4D, f as TfType.Tensor4D, 1, "same"))
      out.push(tf.conv2d(x as TfType.Tensor4D, f as TfType.Tensor4D, 2, "valid"))
      out.push(tf.maxPool(x as TfType.Tensor4D, 2, 2, "valid"), tf.avgPool(x as TfType.Tensor4D, 3, 1, "same"))
      out.push(tf.pad(x, [[0, 0], [1, 2], [0, 1], [0, 0]], 0.5 + again))
      out.push(tf.slice(x, [0, 1, 1, 0], [b, hw - 2, hw - 1, c]))
      out.push(tf.clipByValue(x, -0.5 - again, 1.25), tf.sum(x, [1, 2]), tf.mean(x, 3), tf.max(x, 0))
      out.push(tf.transpose(x, [0, 3, 1, 2]), tf.matMul(x.reshape([b * hw, hw * c]), rand([hw * c, 7], 7)))
      out.push(tf.softmax(x.reshape([-1, c])), tf.concat([x, x.mul(2)], 3), tf.cumsum(x.reshape([-1, c]), 0))
      out.push(tf.add(x, rand([c], 3)), tf.mul(x, tf.scalar(3 + again)), tf.relu(tf.sub(x, 0.25)))
      out.push(tf.batchNorm(x, rand([c], 1), rand([c], 2).abs().add(0.5), rand([c], 4), rand([c], 5), 1e-3))
      out.push(tf.image.resizeBilinear(x as TfType.Tensor4D, [hw + 3, hw - 1]))
      out.push(rand([2, 3, 2, 2, 3], 9).add(rand([2, 3, 2, 2, 3], 10)).sum(4))
      const r6 = rand([2, 2, 2, 2, 3, 2], 11).mul(rand([2, 2, 2, 2, 3, 2], 12))
      out.push(r6.transpose([5, 4, 3, 2, 1, 0]), tf.slice(r6, [0, 1, 0, 1, 1, 0], [2, 1, 2, 1, 2, 2]), r6.sum(5))
      out.push(tf.gather(x, tf.tensor1d([1, 0, 1], "int32"), 0), tf.oneHot(tf.tensor1d([0, 2, 1], "int32"), c))
    }
  }
  const values = await Promise.all(out.map((t) => t.data() as Promise<Float32Array>))
  tf.dispose(out)
  return values.map((v) => Float32Array.from(v))
}
const sameBits = (a: Float32Array[], b: Float32Array[]): string[] => {
  const bad: string[] = []
  if (a.length !== b.length) return [`${a.length} results against ${b.length}`]
  a.forEach((x, i) => {
    const y = b[i]!
    const xi = new Int32Array(x.buffer), yi = new Int32Array(y.buffer)
    if (xi.length !== yi.length || xi.some((v, j) => v !== yi[j])) bad.push(`result ${i}`)
  })
  return bad
}
const captured = async <T>(f: () => Promise<T>): Promise<{ value: T; error: string | null }> => {
  backend.device.pushErrorScope("validation")
  const value = await f()
  const e = await backend.device.popErrorScope()
  return { value, error: e ? e.message : null }
}

// A small CNN trained from the same weights with each recording; `misses` gets the bind groups
// made per kernel recorded in each step.
const train = async (misses: number[] = []): Promise<Float32Array[]> => {
  const model = tf.sequential({
    layers: [
      tf.layers.conv2d({ inputShape: [8, 8, 2], filters: 4, kernelSize: 3, activation: "relu", kernelInitializer: "ones", biasInitializer: "zeros" }),
      tf.layers.batchNormalization(),
      tf.layers.flatten(),
      tf.layers.dense({ units: 3, kernelInitializer: "glorotUniform" })
    ]
  })
  model.setWeights(model.getWeights().map((w, i) => rand(w.shape, 100 + i).mul(0.2)))
  const opt = tf.train.adam(0.01)
  const x = rand([6, 8, 8, 2], 50)
  const y = tf.oneHot(tf.tensor1d([0, 1, 2, 0, 1, 2], "int32"), 3)
  for (let s = 0; s < 8; s++) {
    const before = { ...webGpuDispatchStats(tf)! }
    const cost = opt.minimize(() => tf.losses.softmaxCrossEntropy(y, model.apply(x, { training: true }) as Tensor), true)!
    await cost.data()
    cost.dispose()
    const after = { ...webGpuDispatchStats(tf)! }
    if (after.kernels !== undefined) misses.push((after.bindGroupsMade - before.bindGroupsMade) / (after.kernels - before.kernels))
  }
  const w = await Promise.all(model.getWeights().map((t) => t.data() as Promise<Float32Array>))
  tf.dispose([x, y]); model.dispose(); opt.dispose()
  return w.map((v) => Float32Array.from(v))
}

const ours1 = await captured(work)
const before = { ...webGpuDispatchStats(tf)! }
const ours2 = await captured(work)
const after = { ...webGpuDispatchStats(tf)! }
const misses: number[] = []
const oursTrained = await captured(() => train(misses))
useTfjs()
const reference = await work()
const tfjsTrained = await train()
// Caches that start over every few kernels: old uniform buffers retire while unsubmitted commands use them.
installWebGpuDispatch(tf, { uniforms: 5, bindGroups: 7 })
const small = await captured(async () => [...(await work()), ...(await work())])
const smallStats = webGpuDispatchStats(tf)!

console.log(
  JSON.stringify({
    backend: tf.getBackend(),
    installed,
    submitEvery,
    first: sameBits(ours1.value, reference),
    repeat: sameBits(ours2.value, reference),
    small: sameBits(small.value, [...reference, ...reference]),
    trained: sameBits(oursTrained.value, tfjsTrained),
    errors: [ours1.error, ours2.error, oursTrained.error, small.error].filter((e) => e !== null),
    repeatKernels: after.kernels - before.kernels,
    repeatUniformsMade: after.uniformsMade - before.uniformsMade,
    repeatBindGroupsMade: after.bindGroupsMade - before.bindGroupsMade,
    misses,
    smallRestarts: smallStats.restarts,
    smallKernels: smallStats.kernels
  })
)
process.exit(0)
