// What Winograd's F(4x4, 3x3) saves on 3x3 convolutions at stride 1 on wasm (core/kernels/conv2d.ts,
// useWinograd): the forward convolution (with bias and ReLU), its input gradient and its filter
// gradient, each against what runs without it (gradwire's direct SIMD kernels up to 64 input
// channels, XNNPACK's convolution above; the filter gradient's SIMD kernels), alternated in rounds
// in one process so that drift hits both alike (medians of µs per call), and the largest
// difference between the two relative to the largest output; then the zoo's residual CNN's plain
// training step both ways.
//
//   node bench/winograd.ts [--rounds 6] [--calls 100]
import { optionReader } from "./args.ts"
import { loadEngine } from "../index.ts"
import { useWinograd, winogradStats } from "../core/kernels/conv2d.ts"
import { median } from "../scheduler/cost-model.ts"
import { plainZooStep } from "./zoo-step.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
const option = optionReader(process.argv.slice(2))
const rounds = Number(option("--rounds", "6"))
const calls = Number(option("--calls", "100"))
const { tf, backend } = await loadEngine("wasm")
console.log(`backend ${backend}; ${rounds} rounds of ${calls} calls each way, alternated; µs per call (median)`)
console.log("\nshape                      pass     direct µs   winograd µs   speed-up   max |diff| / max |y|")

const shapes: Array<[number, number, number, number, number]> = [
  [32, 8, 8, 16, 16],
  [32, 7, 7, 16, 16],
  [32, 8, 8, 16, 32],
  [32, 14, 14, 32, 32],
  [8, 16, 16, 64, 64],
  [32, 8, 8, 128, 128],
  [8, 8, 8, 256, 256]
]
for (const [N, H, W, C, O] of shapes) {
  const x = tf.randomNormal([N, H, W, C])
  const w = tf.randomNormal([3, 3, C, O]).mul(Math.sqrt(2 / (9 * C)))
  const b = tf.randomNormal([O])
  const dy = tf.randomNormal([N, H, W, O])
  const conv = { strides: 1, pad: "same", dataFormat: "NHWC", dimRoundingMode: undefined }
  const passes: Record<string, () => Tensor> = {
    forward: () => tf.fused.conv2d({ x: x as never, filter: w as never, strides: 1, pad: "same", bias: b as never, activation: "relu" }) as unknown as Tensor,
    input: () => tf.engine().runKernel("Conv2DBackpropInput", { dy, filter: w }, { ...conv, inputShape: x.shape } as never) as Tensor,
    filter: () => tf.engine().runKernel("Conv2DBackpropFilter", { x, dy }, { ...conv, filterShape: w.shape } as never) as Tensor
  }
  for (const [pass, run] of Object.entries(passes)) {
    const values = (on: boolean): Float32Array => {
      useWinograd(on)
      const t = run()
      const v = t.dataSync() as Float32Array
      t.dispose()
      return v
    }
    const before = winogradStats.calls + winogradStats.filterGrads
    const fast = values(true)
    const ran = winogradStats.calls + winogradStats.filterGrads - before
    const direct = values(false)
    let diff = 0
    let top = 0
    direct.forEach((v, i) => ((diff = Math.max(diff, Math.abs(v - fast[i]!))), (top = Math.max(top, Math.abs(v)))))
    const timed = (on: boolean): number => {
      useWinograd(on)
      for (let i = 0; i < 5; i++) run().dispose()
      const t0 = performance.now()
      for (let i = 0; i < calls; i++) run().dispose()
      return ((performance.now() - t0) / calls) * 1000
    }
    const a: number[] = []
    const z: number[] = []
    for (let r = 0; r < rounds; r++) {
      if (r % 2) a.push(timed(false)), z.push(timed(true))
      else z.push(timed(true)), a.push(timed(false))
    }
    const [da, dz] = [median(a), median(z)]
    const label = `[${N}, ${H}, ${W}, ${C}] -> ${O}`
    console.log(`${label.padEnd(26)} ${pass.padEnd(8)} ${da.toFixed(0).padStart(9)} ${dz.toFixed(0).padStart(13)} ${(da / dz).toFixed(2).padStart(9)}x   ${ran ? (diff / top).toExponential(1) : "(not run as Winograd)"}`)
  }
  tf.dispose([x, w, b, dy])
}

const { step, dispose } = await plainZooStep(tf, "resnet", 32)
const timedStep = async (on: boolean): Promise<number> => {
  useWinograd(on)
  for (let s = 0; s < 3; s++) await step()
  const t0 = performance.now()
  for (let s = 0; s < 20; s++) await step()
  return (performance.now() - t0) / 20
}
const a: number[] = []
const z: number[] = []
for (let r = 0; r < 2 * rounds; r++) {
  if (r % 2) a.push(await timedStep(false)), z.push(await timedStep(true))
  else z.push(await timedStep(true)), a.push(await timedStep(false))
}
console.log(`\nthe zoo's resnet, plain tfjs step at batch 32: direct ${median(a).toFixed(2)} ms, winograd ${median(z).toFixed(2)} ms, ${(median(a) / median(z)).toFixed(2)}x`)
useWinograd(true)
dispose()
