// What Winograd's F(4x4, 3x3) saves on 3x3 convolutions at stride 1 on wasm (core/kernels/conv2d.ts,
// useWinograd): the forward convolution (with bias and ReLU), its input gradient and its filter
// gradient, each against what runs without it (gradwire's direct SIMD kernels up to 64 input
// channels, XNNPACK's convolution above; the filter gradient's SIMD kernels), alternated in rounds
// in one process so that drift hits both alike (medians of µs per call), and the largest
// difference between the two relative to the largest output; then the zoo's residual CNN's plain
// training step both ways. Then the tiles at a side's end (useWinogradEdgeTiles): sides that are not
// multiples of 4 ending in tiles of 2 or 3 outputs against tiles of 4 past the image, the same
// passes on such sizes (and 28 x 28, a multiple, as the control) and resnet28's plain step at batch
// 32 and 128, alternated likewise.
//
//   node bench/winograd.ts [--rounds 6] [--calls 100] [--only edge]
import { optionReader } from "./args.ts"
import { loadEngine } from "../index.ts"
import { useWinograd, useWinogradEdgeTiles, winogradStats } from "../core/kernels/conv2d.ts"
import { median } from "../scheduler/cost-model.ts"
import { plainZooStep } from "./zoo-step.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
const option = optionReader(process.argv.slice(2))
const rounds = Number(option("--rounds", "6"))
const calls = Number(option("--calls", "100"))
const edgeOnly = option("--only", "") === "edge"
const { tf, backend } = await loadEngine("wasm")
console.log(`backend ${backend}; ${rounds} rounds of ${calls} calls each way, alternated; µs per call (median)`)
if (!edgeOnly) console.log("\nshape                      pass     direct µs   winograd µs   speed-up   max |diff| / max |y|")

const shapes: Array<[number, number, number, number, number]> = [
  [32, 8, 8, 16, 16],
  [32, 7, 7, 16, 16],
  [32, 8, 8, 16, 32],
  [32, 14, 14, 32, 32],
  [8, 16, 16, 64, 64],
  [32, 8, 8, 128, 128],
  [8, 8, 8, 256, 256]
]
/** The forward (bias, ReLU), input-gradient and filter-gradient passes of a 3x3 convolution at stride 1, "same". */
const convPasses = (N: number, H: number, W: number, C: number, O: number): { passes: Record<string, () => Tensor>; dispose: () => void } => {
  const x = tf.randomNormal([N, H, W, C])
  const w = tf.randomNormal([3, 3, C, O]).mul(Math.sqrt(2 / (9 * C)))
  const b = tf.randomNormal([O])
  const dy = tf.randomNormal([N, H, W, O])
  const conv = { strides: 1, pad: "same", dataFormat: "NHWC", dimRoundingMode: undefined }
  return {
    passes: {
      forward: () => tf.fused.conv2d({ x: x as never, filter: w as never, strides: 1, pad: "same", bias: b as never, activation: "relu" }) as unknown as Tensor,
      input: () => tf.engine().runKernel("Conv2DBackpropInput", { dy, filter: w }, { ...conv, inputShape: x.shape } as never) as Tensor,
      filter: () => tf.engine().runKernel("Conv2DBackpropFilter", { x, dy }, { ...conv, filterShape: w.shape } as never) as Tensor
    },
    dispose: () => tf.dispose([x, w, b, dy])
  }
}

/** Medians of µs per call of `run` with `set(false)` and `set(true)`, alternated over the rounds. */
const alternated = (run: () => Tensor, set: (on: boolean) => void): [number, number] => {
  const timed = (on: boolean): number => {
    set(on)
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
  set(true)
  return [median(a), median(z)]
}

/** The largest difference between `run`'s results with `set(false)` and `set(true)`, relative to the largest of the first, and whether the second ran as Winograd. */
const difference = (run: () => Tensor, set: (on: boolean) => void): { relative: number; ran: boolean } => {
  const values = (on: boolean): Float32Array => {
    set(on)
    const t = run()
    const v = t.dataSync() as Float32Array
    t.dispose()
    return v
  }
  const before = winogradStats.calls + winogradStats.filterGrads
  const on = values(true)
  const ran = winogradStats.calls + winogradStats.filterGrads > before
  const off = values(false)
  set(true)
  let diff = 0
  let top = 0
  off.forEach((v, i) => ((diff = Math.max(diff, Math.abs(v - on[i]!))), (top = Math.max(top, Math.abs(v)))))
  return { relative: diff / top, ran }
}

for (const [N, H, W, C, O] of edgeOnly ? [] : shapes) {
  const { passes, dispose: free } = convPasses(N, H, W, C, O)
  for (const [pass, run] of Object.entries(passes)) {
    const { relative, ran } = difference(run, useWinograd)
    const [da, dz] = alternated(run, useWinograd)
    const label = `[${N}, ${H}, ${W}, ${C}] -> ${O}`
    console.log(`${label.padEnd(26)} ${pass.padEnd(8)} ${da.toFixed(0).padStart(9)} ${dz.toFixed(0).padStart(13)} ${(da / dz).toFixed(2).padStart(9)}x   ${ran ? relative.toExponential(1) : "(not run as Winograd)"}`)
  }
  free()
}

/** Medians of ms per plain training step of a zoo model with `set(false)` and `set(true)`, alternated over the rounds. */
const alternatedSteps = async (model: "resnet" | "resnet28", batch: number, set: (on: boolean) => void): Promise<[number, number]> => {
  const zoo = await plainZooStep(tf, model, batch)
  const timed = async (on: boolean): Promise<number> => {
    set(on)
    for (let s = 0; s < 3; s++) await zoo.step()
    const count = Math.max(5, Math.round(640 / batch))
    const t0 = performance.now()
    for (let s = 0; s < count; s++) await zoo.step()
    return (performance.now() - t0) / count
  }
  const a: number[] = []
  const z: number[] = []
  for (let r = 0; r < rounds; r++) {
    if (r % 2) a.push(await timed(false)), z.push(await timed(true))
    else z.push(await timed(true)), a.push(await timed(false))
  }
  set(true)
  zoo.dispose()
  return [median(a), median(z)]
}

if (!edgeOnly) {
  const [a, z] = await alternatedSteps("resnet", 32, useWinograd)
  console.log(`\nthe zoo's resnet, plain tfjs step at batch 32: direct ${a.toFixed(2)} ms, winograd ${z.toFixed(2)} ms, ${(a / z).toFixed(2)}x`)
}

console.log("\nedge tiles: sides not a multiple of 4 end in tiles of 2 or 3 outputs, against 4x4 tiles only\nshape                      pass     4x4 only µs   edge tiles µs   speed-up   max |diff| / max |y|")
for (const [N, H, W, C, O] of [[32, 14, 14, 32, 32], [32, 7, 7, 64, 64], [8, 13, 13, 64, 64], [8, 28, 28, 32, 32]] as const) {
  const { passes, dispose: free } = convPasses(N, H, W, C, O)
  for (const [pass, run] of Object.entries(passes)) {
    const { relative } = difference(run, useWinogradEdgeTiles)
    const [da, dz] = alternated(run, useWinogradEdgeTiles)
    const label = `[${N}, ${H}, ${W}, ${C}] -> ${O}`
    console.log(`${label.padEnd(26)} ${pass.padEnd(8)} ${da.toFixed(0).padStart(11)} ${dz.toFixed(0).padStart(15)} ${(da / dz).toFixed(2).padStart(9)}x   ${relative.toExponential(1)}`)
  }
  free()
}
for (const batch of [32, 128]) {
  const [a, z] = await alternatedSteps("resnet28", batch, useWinogradEdgeTiles)
  console.log(`resnet28, plain tfjs step at batch ${batch}: 4x4 tiles only ${a.toFixed(2)} ms, edge tiles ${z.toFixed(2)} ms, ${(a / z).toFixed(2)}x`)
}
