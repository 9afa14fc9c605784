// What two wasm kernel changes save, each against what ran before, alternated in one process so
// drift hits both alike (medians of ms per call):
// - matrix products while training: BatchMatMul (gradwire's SIMD kernel for up to 64 rows at any
//   size, b packed in blocks of 16 columns up to 256 rows; core/kernels/matmul.ts) against the
//   backend's XNNPACK product (tf.fused.matMul, which gradwire leaves to XNNPACK), each call with a
//   new b, as a training step's weights are (XNNPACK packs a new b again on every call); the copy
//   that makes the new b is in both;
// - the conv2d filter gradient over the batch in cache-sized chunks against one call of the same
//   SIMD kernel over the whole batch (core/kernels/conv-grads.ts, useFilterGradChunks).
//
//   node bench/wasm-products.ts [--rounds 8]
import { optionReader } from "./args.ts"
import { loadEngine } from "../index.ts"
import { useFilterGradChunks } from "../core/kernels/conv-grads.ts"
import { median } from "../scheduler/cost-model.ts"

const option = optionReader(process.argv.slice(2))
const rounds = Number(option("--rounds", "8"))
const { tf, backend } = await loadEngine("wasm")
type Tensor = import("@tensorflow/tfjs").Tensor

/** Medians of ms per call of each of `calls`, alternated call by call over `rounds` rounds of `reps`. */
const alternate = (calls: ReadonlyArray<() => void>, reps: number): number[] => {
  for (let i = 0; i < 2; i++) for (const f of calls) f()
  const times = calls.map(() => [] as number[])
  for (let r = 0; r < rounds; r++)
    calls.forEach((f, i) => {
      const t0 = performance.now()
      for (let j = 0; j < reps; j++) f()
      times[i]!.push((performance.now() - t0) / reps)
    })
  return times.map(median)
}

console.log(`backend ${backend}, ${rounds} rounds, alternated`)
console.log("\nproduct a·b, a new b every call     XNNPACK ms   gradwire ms   speed-up")
for (const [m, k, n] of [[32, 1024, 128], [32, 784, 1024], [32, 1024, 1024], [32, 3136, 128], [32, 256, 256], [64, 512, 512], [128, 1024, 128], [256, 512, 512]] as const) {
  const a = tf.randomNormal([m, k])
  let b = tf.randomNormal([k, n])
  const fresh = (): void => {
    const next = tf.add(b, 0)
    b.dispose()
    b = next
  }
  const [xnn, simd] = alternate(
    [
      () => {
        fresh()
        tf.dispose(tf.fused.matMul({ a: a as never, b: b as never }))
      },
      () => {
        fresh()
        tf.dispose(tf.matMul(a as never, b as never))
      }
    ],
    m * k * n > 3e7 ? 2 : 6
  )
  console.log(`[${m}, ${k}]·[${k}, ${n}]`.padEnd(36), xnn!.toFixed(3).padEnd(12), simd!.toFixed(3).padEnd(13), `${(xnn! / simd!).toFixed(2)}x`)
  tf.dispose([a, b])
}

console.log("\nconv2d filter gradient (batch, image, filter)   one call ms   in chunks ms   speed-up")
for (const [x, f, strides] of [
  [[32, 8, 8, 32], [3, 3, 32, 64], 1],
  [[32, 8, 8, 64], [3, 3, 64, 64], 1],
  [[32, 16, 16, 32], [3, 3, 32, 32], 1],
  [[8, 32, 32, 64], [3, 3, 64, 64], 1],
  [[16, 64, 64, 3], [7, 7, 3, 32], 2],
  [[32, 14, 14, 16], [3, 3, 16, 16], 1],
  [[32, 14, 14, 6], [5, 5, 6, 16], 1]
] as Array<[number[], number[], number]>) {
  const xs = tf.randomNormal(x)
  const dy = tf.randomNormal((tf.conv2d(xs as never, tf.zeros(f) as never, strides, "same") as unknown as Tensor).shape)
  const grad = (chunks: boolean) => (): void => {
    useFilterGradChunks(chunks)
    tf.dispose(tf.engine().runKernel("Conv2DBackpropFilter", { x: xs, dy }, { strides, pad: "same", dataFormat: "NHWC", dimRoundingMode: undefined, filterShape: f } as never) as Tensor)
  }
  const [whole, chunked] = alternate([grad(false), grad(true)], x[0]! * x[1]! * x[2]! * x[3]! * f[3]! > 2e7 ? 2 : 8)
  useFilterGradChunks(true)
  console.log(`[${x.join(", ")}] ${f[0]}x${f[1]}/${strides} -> ${f[3]}`.padEnd(48), whole!.toFixed(3).padEnd(13), chunked!.toFixed(3).padEnd(14), `${(whole! / chunked!).toFixed(2)}x`)
  tf.dispose([xs, dy])
}
process.exit(0)
