// gradwire's wasm kernels (core/kernels/) against the cpu backend's, kernel by kernel, on seeded
// random inputs of awkward shapes (strides, padding, odd sizes, broadcasting): |wasm - cpu| <=
// 1e-4 * (1 + |cpu|) element-wise. And the cpu fallback: a kernel wasm has no implementation of
// runs through the cpu backend, gives the cpu backend's answer, and is recorded.
import { beforeAll, describe, expect, it } from "vitest"
import { execFileSync, spawnSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import { loadEngine, type Tf } from "../core/engine.ts"
import { fallbackKernelsUsed } from "../core/kernels/fallback.ts"
import { useHeapKernels } from "../core/kernels/heap-simd.ts"
import { simdDepthwiseStats, useFilterGradChunks } from "../core/kernels/conv-grads.ts"
import { describeKernels, registerWasmKernels } from "../core/kernels/register.ts"
import { asReducedBlock } from "../core/kernels/reduce.ts"
import { padImage, patchStats, pointwiseStats, setPatchChunkBytes, simdConvStats, useWinograd, useWinogradEdgeTiles, winogradPlan, winogradStats, winogradStatus } from "../core/kernels/conv2d.ts"
import { fusedMatMulStats, setConflicting, simdMatMulStats } from "../core/kernels/matmul.ts"
import { clipGradStats, reluGradStats } from "../core/kernels/relu-grad.ts"
import { asBlockTranspose } from "../core/kernels/transpose.ts"
import { heapArray } from "../core/kernels/wasm-heap.ts"
import { HeapExhausted } from "../core/errors.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
let tf: Tf

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
})

const seeded = (n: number, seed: number): Float32Array => {
  let s = seed >>> 0 || 1
  return Float32Array.from({ length: n }, () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32) * 2 - 1)
}

/** `f` on wasm and on cpu, from the same values; the worst relative difference. */
const compare = async (f: () => Tensor | Tensor[]): Promise<number> => {
  const run = async (backend: string): Promise<Float32Array[]> => {
    await tf.setBackend(backend)
    const out = f()
    const list = Array.isArray(out) ? out : [out]
    const values = await Promise.all(list.map(async (t) => Float32Array.from((await t.data()) as ArrayLike<number>)))
    tf.dispose(list)
    return values
  }
  const w = await run("wasm")
  const c = await run("cpu")
  await tf.setBackend("wasm")
  expect(w.map((a) => a.length)).toEqual(c.map((a) => a.length))
  let worst = 0
  w.forEach((a, i) => a.forEach((v, j) => (worst = Math.max(worst, Math.abs(v - c[i]![j]!) / (1 + Math.abs(c[i]![j]!))))))
  return worst
}

const t = (shape: number[], seed: number): Tensor => tf.tensor(seeded(shape.reduce((a, b) => a * b, 1), seed), shape)

describe("gradwire's wasm kernels match the cpu backend", () => {
  it("registers its kernels once wasm is loaded", () => {
    const r = registerWasmKernels(tf)
    expect(r.fast).toEqual(expect.arrayContaining(["Conv2DBackpropFilter", "UnsortedSegmentSum"]))
    expect(tf.getKernel("Conv2DBackpropFilter", "wasm")).toBeDefined()
  })

  for (const [x, f, strides, pad] of [
    [[2, 9, 7, 3], [3, 3, 3, 5], 1, "same"],
    [[3, 11, 10, 2], [5, 4, 2, 4], 2, "valid"],
    [[1, 8, 8, 1], [3, 3, 1, 8], [2, 1], "same"],
    [[2, 1, 17, 4], [1, 5, 4, 6], 3, "same"],
    [[2, 6, 5, 16], [3, 3, 16, 4], 1, "same"],
    [[2, 7, 9, 5], [3, 2, 5, 4], 1, "valid"],
    [[3, 6, 7, 3], [2, 4, 3, 5], 1, "same"],
    // 1-d (conv1d) at stride 1: the patch matrix, not the convolution by dy.
    [[2, 1, 17, 4], [1, 5, 4, 6], 1, "same"],
    [[3, 1, 20, 8], [1, 9, 8, 5], 1, "valid"],
    // 21 output channels: the SIMD kernel's 16, 4 and 1 at a time.
    [[2, 5, 6, 3], [3, 3, 3, 21], [1, 2], "same"],
    [[4, 8, 8, 16], [3, 3, 16, 32], 1, "same"],
    // 7 and 6 output channels: the SIMD convolution's last block stores 3 and 2 of its 4 lanes, and
    // the filter gradient takes four taps at a time (FW 3: one pass; 5: a second with one tap).
    [[2, 6, 6, 2], [3, 3, 2, 7], 1, "same"],
    [[3, 12, 12, 1], [5, 5, 1, 6], 1, "same"],
    // 12 output channels (under 16): the four-taps kernel too.
    [[4, 9, 9, 16], [3, 3, 16, 12], 1, "same"],
    // Strides above 1 (the input gradient by the patch matrix): a ResNet-style 7x7 stride-2 stem, a
    // downsampling 3x3 and 1x1, a 2x2 filter at stride 2, a 1x1 filter at stride 3, unequal
    // strides, and filters narrower than their "same" stride along one axis with the other axis
    // padded, which tfjs-backend-wasm's XNNPACK convolution (the run without the heap kernels, and
    // with them a filter of more than 576 taps) got wrong while it was handed "same" as such.
    [[2, 11, 12, 3], [3, 2, 3, 5], [3, 4], "same"],
    [[2, 11, 12, 72], [3, 3, 72, 5], [1, 4], "same"],
    [[2, 16, 16, 3], [7, 7, 3, 8], 2, "same"],
    [[2, 9, 9, 8], [3, 3, 8, 16], 2, "same"],
    [[2, 8, 8, 8], [1, 1, 8, 16], 2, "same"],
    [[2, 8, 6, 4], [2, 2, 4, 4], 2, "valid"],
    [[2, 10, 10, 4], [1, 1, 4, 4], 3, "valid"],
    [[2, 11, 12, 3], [3, 4, 3, 5], [3, 4], "same"],
    [[2, 11, 13, 3], [5, 3, 3, 5], [2, 3], "valid"],
    // Batches over the filter gradient's cache-sized chunk (core/kernels/conv-grads.ts): two images
    // per chunk, then runs of rows of one image at strides 1 and 2.
    [[12, 8, 8, 32], [3, 3, 32, 64], 1, "same"],
    [[2, 40, 40, 16], [3, 3, 16, 16], 1, "same"],
    [[2, 48, 45, 6], [5, 5, 6, 8], 2, "same"],
    // More taps than the SIMD convolution takes (8·9 > 576), and a 1x1 filter: the backend's own.
    [[1, 5, 5, 72], [3, 3, 72, 8], 1, "same"],
    // The patch matrix and the product (conv2d.ts patchConv2d): over 576 taps with 16 output
    // channels (strided, and 5x5 at stride 1), a filter of 73728 floats (valid padding, odd sizes);
    // strided filter gradients likewise (conv-grads.ts).
    [[2, 9, 9, 68], [3, 3, 68, 16], 2, "same"],
    [[3, 7, 6, 64], [3, 3, 64, 128], 2, "valid"],
    [[2, 6, 6, 32], [5, 5, 32, 16], 1, "same"],
    [[2, 4, 4, 8], [1, 1, 8, 12], 1, "valid"]
  ] as Array<[number[], number[], number | [number, number], "same" | "valid"]>) {
    // The filter gradient by gradwire's SIMD kernel on the heap, and by the paths taken without it.
    for (const simd of [true, false]) {
      it(`conv2d and its gradients, x ${x} filter ${f} strides ${strides} ${pad}${simd ? "" : ", without the heap kernels"}`, async () => {
        useHeapKernels(simd)
        try {
          const worst = await compare(() => {
            const conv = (a: Tensor, w: Tensor): Tensor => tf.conv2d(a as never, w as never, strides, pad) as unknown as Tensor
            const [gx, gf] = tf.grads((a: Tensor, w: Tensor) => conv(a, w).mul(t(conv(a, w).shape, 5)).sum())([t(x, 1), t(f, 2)])
            return [conv(t(x, 1), t(f, 2)), gx!, gf!]
          })
          expect(worst).toBeLessThanOrEqual(1e-4)
        } finally {
          useHeapKernels(true)
        }
      })
    }
  }

  it("fused conv2d with a bias and ReLU by the SIMD convolution (a bias at every output column, negatives cut), other activations and PReLU through the backend's own, the same as the cpu backend's", async () => {
    const before = simdConvStats.calls
    for (const [x, f, pad, activation] of [
      [[2, 8, 8, 3], [3, 3, 3, 16], "same", "relu"],
      [[2, 8, 8, 3], [3, 3, 3, 6], "valid", "linear"],
      [[2, 7, 7, 4], [3, 3, 4, 5], "same", "elu"],
      [[2, 7, 7, 4], [3, 3, 4, 8], "same", "prelu"]
    ] as Array<[number[], number[], "same" | "valid", "relu" | "linear" | "elu" | "prelu"]>) {
      const O = f[3]!
      const worst = await compare(() =>
        tf.fused.conv2d({
          x: t(x, 11) as never,
          filter: t(f, 12) as never,
          strides: 1,
          pad,
          bias: t([O], 13).add(0.5) as never,
          activation,
          ...(activation === "prelu" ? { preluActivationWeights: t([O], 14) as never } : {})
        }) as unknown as Tensor
      )
      expect(worst, `${x} ${f} ${activation}`).toBeLessThanOrEqual(1e-4)
    }
    // relu and linear ran on the SIMD kernel; elu and prelu did not (the calls counted are the wasm runs)
    expect(simdConvStats.calls - before).toBe(2)
  })

  it("convolutions whose filter the direct kernel cannot hold (over 576 taps, or 73728 floats and more) and strided 1x1 ones run as their patch matrix and the product, output channels a multiple of 16; strided filter gradients likewise", () => {
    const ran = (f: () => void): { calls: number; filterGrads: number } => {
      const before = { ...patchStats }
      tf.tidy(f)
      return { calls: patchStats.calls - before.calls, filterGrads: patchStats.filterGrads - before.filterGrads }
    }
    const conv2d = (x: number[], f: number[], strides: number) => () => void (tf.conv2d(t(x, 1) as never, t(f, 2) as never, strides, "same") as unknown as Tensor).dataSync()
    const filterGrad = (x: number[], f: number[], strides: number) => () => {
      const dy = t((tf.conv2d(t(x, 1) as never, tf.zeros(f) as never, strides, "same") as unknown as Tensor).shape, 3)
      ;(tf.engine().runKernel("Conv2DBackpropFilter", { x: t(x, 1), dy }, { strides, pad: "same", dataFormat: "NHWC", dimRoundingMode: undefined, filterShape: f } as never) as Tensor).dataSync()
    }
    expect(ran(conv2d([2, 9, 9, 68], [3, 3, 68, 16], 2))).toEqual({ calls: 1, filterGrads: 0 })
    expect(ran(conv2d([2, 9, 9, 64], [3, 3, 64, 128], 2))).toEqual({ calls: 1, filterGrads: 0 })
    expect(ran(conv2d([2, 9, 9, 64], [3, 3, 64, 64], 2))).toEqual({ calls: 0, filterGrads: 0 })
    expect(ran(conv2d([2, 9, 9, 68], [3, 3, 68, 20], 2))).toEqual({ calls: 0, filterGrads: 0 })
    // a 1x1 filter at stride 2 (a projection shortcut) too; at stride 1 it is a product of x as it is
    expect(ran(conv2d([2, 8, 8, 8], [1, 1, 8, 16], 2))).toEqual({ calls: 1, filterGrads: 0 })
    expect(ran(conv2d([2, 8, 8, 8], [1, 1, 8, 16], 1))).toEqual({ calls: 0, filterGrads: 0 })
    expect(ran(filterGrad([2, 9, 9, 8], [3, 3, 8, 16], 2))).toEqual({ calls: 0, filterGrads: 1 })
    expect(ran(filterGrad([2, 9, 9, 8], [5, 5, 8, 16], 1))).toEqual({ calls: 0, filterGrads: 0 })
    expect(ran(filterGrad([2, 9, 9, 6], [3, 3, 6, 16], 2))).toEqual({ calls: 0, filterGrads: 0 })
  })

  it("a patch matrix over its chunk size goes in chunks of images: the convolution the same bits, the strided filter gradient the same sums added up", () => {
    for (const [x, f] of [
      [[5, 9, 9, 68], [3, 3, 68, 16]],
      [[3, 7, 6, 8], [3, 3, 8, 32]]
    ]) {
      const xs = t(x!, 31)
      const w = t(f!, 32)
      const dy = t((tf.conv2d(xs as never, w as never, 2, "same") as unknown as Tensor).shape, 33)
      const passes = (): Float32Array[] => {
        const before = { ...patchStats }
        const y = (tf.conv2d(xs as never, w as never, 2, "same") as unknown as Tensor).dataSync() as Float32Array
        const dw = (tf.engine().runKernel("Conv2DBackpropFilter", { x: xs, dy }, { strides: 2, pad: "same", dataFormat: "NHWC", dimRoundingMode: undefined, filterShape: f } as never) as Tensor).dataSync() as Float32Array
        // the filter gradient by the patch matrix in both runs (and the 612-tap convolution)
        expect(patchStats.filterGrads - before.filterGrads).toBe(1)
        return [y, dw]
      }
      const whole = passes()
      setPatchChunkBytes(1)
      let chunked: Float32Array[]
      try {
        chunked = passes()
      } finally {
        setPatchChunkBytes(32 * 1024 * 1024)
      }
      expect(Array.from(chunked[0]!)).toEqual(Array.from(whole[0]!))
      const top = Math.max(...Array.from(whole[1]!, Math.abs))
      expect(Math.max(...Array.from(whole[1]!, (v, i) => Math.abs(v - chunked[1]![i]!))) / top).toBeLessThan(1e-5)
      expect(Array.from(chunked[1]!)).not.toEqual(Array.from(new Float32Array(chunked[1]!.length)))
      tf.dispose([xs, w, dy])
    }
  })

  it("the filter gradient over a batch in cache-sized chunks: the same bits as one call of the SIMD kernel over the whole batch (whole images per chunk; runs of rows at strides 1, 2 and 3, same and valid)", () => {
    for (const [x, f, strides, pad] of [
      [[12, 8, 8, 32], [3, 3, 32, 64], 1, "same"],
      [[3, 40, 40, 16], [3, 3, 16, 16], 1, "same"],
      [[2, 64, 64, 3], [7, 7, 3, 32], 2, "same"],
      [[4, 30, 30, 16], [3, 3, 16, 16], 1, "valid"],
      // 24 output channels: not a multiple of 16, so not the patch matrix at stride 3
      [[2, 50, 50, 32], [3, 3, 32, 24], 3, "same"]
    ] as Array<[number[], number[], number, "same" | "valid"]>) {
      const xs = t(x, 3)
      const dy = t((tf.conv2d(xs as never, tf.zeros(f) as never, strides, pad) as unknown as Tensor).shape, 4)
      const filterGrad = (chunks: boolean): Float32Array => {
        useFilterGradChunks(chunks)
        try {
          const dw = tf.engine().runKernel("Conv2DBackpropFilter", { x: xs, dy }, { strides, pad, dataFormat: "NHWC", dimRoundingMode: undefined, filterShape: f } as never) as Tensor
          const values = dw.dataSync() as Float32Array
          dw.dispose()
          return values
        } finally {
          useFilterGradChunks(true)
        }
      }
      const whole = filterGrad(false)
      const chunked = filterGrad(true)
      let differing = 0
      for (let i = 0; i < whole.length; i++) if (!Object.is(whole[i], chunked[i])) differing++
      expect({ x, differing }).toEqual({ x, differing: 0 })
      expect(Math.max(...Array.from(whole, Math.abs))).toBeGreaterThan(0)
      tf.dispose([xs, dy])
    }
  })

  it("the SIMD convolution runs for layers whose filter fits the caches, and not without the heap kernels", () => {
    const run = (x: number[], f: number[]): number => {
      const before = simdConvStats.calls
      tf.tidy(() => tf.conv2d(t(x, 1) as never, t(f, 2) as never, 1, "same"))
      return simdConvStats.calls - before
    }
    expect(run([2, 8, 8, 16], [3, 3, 16, 16])).toBe(1)
    expect(run([1, 5, 5, 72], [3, 3, 72, 8])).toBe(0)
    expect(run([2, 4, 4, 8], [1, 1, 8, 12])).toBe(0)
    useHeapKernels(false)
    try {
      expect(run([2, 8, 8, 16], [3, 3, 16, 16])).toBe(0)
    } finally {
      useHeapKernels(true)
    }
  })

  it("sums and means over leading and middle blocks by the heap's SIMD kernel: the same bits as the JavaScript loop (odd channels, rows not a multiple of 8, one row, a mean's scale)", () => {
    for (const [shape, axes, mean] of [
      [[32, 28, 28, 6], [0, 1, 2], false],
      [[3, 7, 5, 3], [1], false],
      [[5, 13, 9], [1], true],
      [[2, 1, 7], [1], false],
      [[4, 9, 8, 16], [1, 2], true],
      // Rows 1e30, 1, -1e30, 1, ...: the float64 sums' order shows in the result (((1e30 + 1) +
      // (-1e30 + 1)) is 0, (((1e30 + 1) - 1e30) + 1) is 1), in channel pairs and the odd one.
      [[2, 16, 5], [1], false]
    ] as Array<[number[], number[], boolean]>) {
      const n = shape.reduce((a, b) => a * b, 1)
      const C = shape.at(-1)!
      const x = shape[1] === 16 ? tf.tensor(Float32Array.from({ length: n }, (_, i) => [1e30, 1, -1e30, 1][Math.floor(i / C) % 4]!), shape) : t(shape, 40).mul(1000)
      const run = (on: boolean): Float32Array => {
        useHeapKernels(on)
        try {
          const y = mean ? tf.mean(x, axes) : tf.sum(x, axes)
          const v = y.dataSync() as Float32Array
          y.dispose()
          return v
        } finally {
          useHeapKernels(true)
        }
      }
      const simd = run(true)
      const js = run(false)
      expect(simd.length).toBe(js.length)
      const differ = [...simd].findIndex((v, j) => !Object.is(v, js[j]))
      expect(differ, `${shape} over ${axes}: element ${differ}, ${simd[differ]} against ${js[differ]}`).toBe(-1)
      x.dispose()
    }
  })

  it("ReLU's gradient as one kernel on wasm: the same values, bit for bit, as tfjs's dy · cast(step(x)) (zeros, negative zeros, NaNs and infinities in x and dy; lengths not a multiple of 4)", () => {
    const grad = (x: Tensor, dy: Tensor): Float32Array => {
      const g = tf.grad((a: Tensor) => tf.relu(a as never) as unknown as Tensor)(x, dy)
      const v = g.dataSync() as Float32Array
      g.dispose()
      return v
    }
    const special = [-1, 0, -0, 1e-30, 2, NaN, Infinity, -Infinity, -1e-30]
    // The third: three elements, all past the last group of four.
    const xs = [tf.tensor(special.flatMap((a) => special.map(() => a))), t([7, 143], 31).sub(0.1), tf.tensor([NaN, -0, 3])]
    const dys = [tf.tensor(special.flatMap(() => special)), t([7, 143], 32), tf.tensor([2, -5, Infinity])]
    for (let i = 0; i < xs.length; i++) {
      const before = reluGradStats.calls
      const fused = grad(xs[i]!, dys[i]!)
      expect(reluGradStats.calls - before).toBe(1)
      useHeapKernels(false)
      let own: Float32Array
      try {
        own = grad(xs[i]!, dys[i]!)
      } finally {
        useHeapKernels(true)
      }
      expect(reluGradStats.calls - before).toBe(1)
      expect(fused.length).toBe(own.length)
      // Object.is tells 0 from -0 and takes NaN as itself.
      const differ = [...fused].findIndex((v, j) => !Object.is(v, own[j]))
      expect(differ, `element ${differ}: ${fused[differ]} against ${own[differ]}`).toBe(-1)
    }
    tf.dispose([...xs, ...dys])
  })

  it("depthwise conv2d and its gradients (multiplier 3; stride 2 same, stride 1 valid, a 3x3 filter at strides [1, 4] same)", async () => {
    for (const [strides, pad] of [[2, "same"], [1, "valid"], [[1, 4], "same"]] as const) {
      const worst = await compare(() => {
        const f = (a: Tensor, w: Tensor): Tensor => tf.depthwiseConv2d(a as never, w as never, strides as never, pad) as unknown as Tensor
        const [gx, gf] = tf.grads((a: Tensor, w: Tensor) => f(a, w).mul(t(f(a, w).shape, 7)).sum())([t([2, 9, 8, 3], 3), t([3, 3, 3, 3], 4)])
        return [f(t([2, 9, 8, 3], 3), t([3, 3, 3, 3], 4)), gx!, gf!]
      })
      expect(worst).toBeLessThanOrEqual(1e-4)
    }
  })

  it("clipByValue's gradient (ReLU6) as one kernel on wasm: the same values, bit for bit, as tfjs's where(x ≥ min and x ≤ max, dy, 0) (the bounds themselves, NaNs, infinities and ±0 in x and dy, bounds that are not float32, lengths not a multiple of 4)", () => {
    const grad = (x: Tensor, dy: Tensor, lo: number, hi: number): Float32Array => {
      const g = tf.grad((a: Tensor) => tf.clipByValue(a as never, lo, hi) as unknown as Tensor)(x, dy)
      const v = g.dataSync() as Float32Array
      g.dispose()
      return v
    }
    const special = [-1, 0, -0, 6, 6.000001, 5.999999, 0.1, NaN, Infinity, -Infinity, -1e-30, 1e-30, 3]
    const cases: Array<[Tensor, Tensor, number, number]> = [
      [tf.tensor(special.flatMap((a) => special.map(() => a))), tf.tensor(special.flatMap(() => special)), 0, 6],
      [t([7, 143], 41).mul(2), t([7, 143], 42), -0.5, 0.1],
      [tf.tensor([0.1, -0, 0.2]), tf.tensor([2, -0, Infinity]), 0.1, 0.2]
    ]
    for (const [x, dy, lo, hi] of cases) {
      const before = clipGradStats.calls
      const fused = grad(x, dy, lo, hi)
      expect(clipGradStats.calls - before).toBe(1)
      useHeapKernels(false)
      let own: Float32Array
      try {
        own = grad(x, dy, lo, hi)
      } finally {
        useHeapKernels(true)
      }
      expect(clipGradStats.calls - before).toBe(1)
      const differ = [...fused].findIndex((v, j) => !Object.is(v, own[j]))
      expect(differ, `element ${differ}: ${fused[differ]} against ${own[differ]}`).toBe(-1)
      tf.dispose([x, dy])
    }
  })

  it("1x1 convolutions at stride 1 (pointwise layers) as products: plain, with a bias and ReLU (fused), their input and filter gradients, and 1x1 at stride 2 kept as a convolution", async () => {
    const before = pointwiseStats.calls
    const worst = await compare(() => {
      const x = t([3, 5, 6, 12], 51)
      const w = t([1, 1, 12, 20], 52)
      const b = t([20], 53)
      const plain = (a: Tensor, f: Tensor): Tensor => tf.conv2d(a as never, f as never, 1, "same") as unknown as Tensor
      const fused = (a: Tensor, f: Tensor, c: Tensor): Tensor => tf.fused.conv2d({ x: a as never, filter: f as never, strides: 1, pad: "valid", bias: c as never, activation: "relu" }) as unknown as Tensor
      const strided = tf.conv2d(x as never, w as never, 2, "same") as unknown as Tensor
      const [gx, gw] = tf.grads((a: Tensor, f: Tensor) => plain(a, f).mul(t([3, 5, 6, 20], 54)).sum())([x, w])
      const [fx, fw, fb] = tf.grads((a: Tensor, f: Tensor, c: Tensor) => fused(a, f, c).mul(t([3, 5, 6, 20], 55)).sum())([x, w, b])
      return [plain(x, w), fused(x, w, b), strided, gx!, gw!, fx!, fw!, fb!]
    })
    expect(worst).toBeLessThanOrEqual(1e-5)
    // on wasm: the plain and fused forward passes, in the gradients too, and each input gradient's turned-round convolution
    expect(pointwiseStats.calls - before).toBeGreaterThanOrEqual(4)
  })

  it("3x3 convolutions at stride 1 as Winograd's F(4x4, 3x3): the forward pass (plain, with a bias and ReLU), the input and filter gradients as the cpu backend's (odd sizes, one pixel, explicit uneven padding, 8 to 300 channels, tiles in several blocks and an odd one out, 260 outputs)", async () => {
    type Pad = "same" | "valid" | number[][]
    for (const [x, O, pad] of [
      [[3, 5, 9, 8], 12, "same"],
      [[4, 7, 7, 20], 36, "valid"],
      [[16, 1, 1, 8], 4, "same"],
      [[3, 9, 6, 16], 16, [[0, 0], [2, 0], [0, 1], [0, 0]]],
      [[17, 4, 4, 12], 8, "same"],
      [[40, 8, 8, 8], 8, "same"],
      [[4, 6, 5, 132], 24, "same"],
      [[8, 4, 4, 300], 20, "same"],
      // 260 outputs: the filter gradient's D in panels (16 of 16 columns and one of 4), tiles of 4 x 4 and 4 x 3
      [[3, 6, 7, 8], 260, "same"]
    ] as Array<[number[], number, Pad]>) {
      const f = [3, 3, x[3]!, O]
      const before = { ...winogradStats }
      const worst = await compare(() => {
        const xs = t(x, 71)
        const w = t(f, 72)
        const b = t([O], 73)
        const plain = (a: Tensor, k: Tensor): Tensor => tf.conv2d(a as never, k as never, 1, pad as never) as unknown as Tensor
        const fused = (a: Tensor, k: Tensor, c: Tensor): Tensor => tf.fused.conv2d({ x: a as never, filter: k as never, strides: 1, pad: pad as never, bias: c as never, activation: "relu" }) as unknown as Tensor
        const y = plain(xs, w)
        const [gx, gw] = tf.grads((a: Tensor, k: Tensor) => plain(a, k).mul(t(y.shape, 74)).sum())([xs, w])
        return [y, fused(xs, w, b), gx!, gw!]
      })
      // 300 channels in (or 260 out, the input gradient's): sums of 2340-2700 unscaled products (values up to about ±40), whose float32 rounding grows with their length
      expect(worst, `${x} -> ${O} ${JSON.stringify(pad)}`).toBeLessThanOrEqual(Math.max(x[3]!, O) > 256 ? 2e-4 : 1e-4)
      // on wasm: the plain and fused forward passes and the one in the gradient, and the input
      // gradient's turned-round convolution where its channels fit (O at least 8); one filter gradient
      expect({ x, calls: winogradStats.calls - before.calls, filterGrads: winogradStats.filterGrads - before.filterGrads }).toEqual({ x, calls: O >= 8 ? 4 : 3, filterGrads: 1 })
    }
  })

  it("Winograd's tiles cut each side into tiles of 4 outputs, ending in one of 2 or 3 (or 3 and 2) where the side is not a multiple of 4: every output in exactly one tile, none past the side but at 1", () => {
    for (let L = 1; L <= 41; L++) {
      const runs = winogradPlan(L)
      let at = 0
      let tiles = 0
      for (const run of runs) {
        expect(run.start, `L ${L}`).toBe(at)
        expect([2, 3, 4], `L ${L}`).toContain(run.m)
        expect(run.size, `L ${L}`).toBe(Math.min(run.m * run.count, L - run.start))
        at += run.m * run.count
        tiles += run.count
      }
      // as many tiles as 4x4 tiles alone take, and only L = 1 computes an output past the side
      expect(tiles, `L ${L}`).toBe(Math.ceil(L / 4))
      expect(at, `L ${L}`).toBe(L === 1 ? 2 : L)
      expect(runs.filter((r) => r.m !== 4).length, `L ${L}`).toBe(L % 4 === 0 ? 0 : L % 4 === 1 && L > 1 ? 2 : 1)
    }
    expect(winogradPlan(14)).toEqual([{ start: 0, m: 4, count: 3, size: 12 }, { start: 12, m: 2, count: 1, size: 2 }])
    expect(winogradPlan(13)).toEqual([{ start: 0, m: 4, count: 2, size: 8 }, { start: 8, m: 3, count: 1, size: 3 }, { start: 11, m: 2, count: 1, size: 2 }])
  })

  it("Winograd's convolutions agree with the direct SIMD kernels, with tiles of 2 and 3 at the sides' ends or 4x4 tiles past them, and they run instead where they apply: not at stride 2, with 4 input channels, a 5x5 filter, fewer than 8 tiles, more than 512 input channels, or when turned off", () => {
    const ran = (f: () => void): number => {
      const before = winogradStats.calls + winogradStats.filterGrads
      f()
      return winogradStats.calls + winogradStats.filterGrads - before
    }
    // 8: 4x4 tiles only; 14: 4 + 4 + 4 + 2 a side; 13 x 7: 4 + 4 + 3 + 2 by 4 + 3
    for (const [shape, O] of [
      [[4, 8, 8, 16], 24],
      [[3, 14, 14, 16], 24],
      [[4, 13, 7, 20], 12]
    ] as Array<[number[], number]>) {
      const x = t(shape, 81)
      const w = t([3, 3, shape[3]!, O], 82)
      const dy = t([...shape.slice(0, 3), O], 83)
      const conv = { strides: 1, pad: "same", dataFormat: "NHWC", dimRoundingMode: undefined }
      const passes = (): Float32Array[] =>
        [
          tf.conv2d(x as never, w as never, 1, "same") as unknown as Tensor,
          tf.engine().runKernel("Conv2DBackpropInput", { dy, filter: w }, { ...conv, inputShape: x.shape } as never) as Tensor,
          tf.engine().runKernel("Conv2DBackpropFilter", { x, dy }, { ...conv, filterShape: w.shape } as never) as Tensor
        ].map((r) => {
          const v = r.dataSync() as Float32Array
          r.dispose()
          return v
        })
      let fast: Float32Array[] = []
      let fours: Float32Array[] = []
      expect(ran(() => (fast = passes()))).toBe(3)
      useWinogradEdgeTiles(false)
      try {
        expect(ran(() => (fours = passes()))).toBe(3)
      } finally {
        useWinogradEdgeTiles(true)
      }
      useWinograd(false)
      let direct: Float32Array[] = []
      try {
        expect(ran(() => (direct = passes()))).toBe(0)
      } finally {
        useWinograd(true)
      }
      direct.forEach((d, i) => {
        const top = Math.max(...Array.from(d, Math.abs))
        expect(top).toBeGreaterThan(1)
        for (const [name, run] of [["edge tiles", fast], ["4x4 tiles", fours]] as const) {
          const diff = Math.max(...Array.from(d, (v, j) => Math.abs(v - run[i]![j]!)))
          expect(diff / top, `${shape} pass ${i}, ${name}`).toBeLessThan(2e-5)
        }
      })
      tf.dispose([x, w, dy])
    }
    const conv2d = (xs: number[], f: number[], strides: number): number => ran(() => tf.tidy(() => void tf.conv2d(t(xs, 1) as never, t(f, 2) as never, strides, "same")))
    expect(conv2d([4, 8, 8, 16], [3, 3, 16, 16], 1)).toBe(1)
    expect(conv2d([4, 8, 8, 16], [3, 3, 16, 16], 2)).toBe(0)
    expect(conv2d([4, 8, 8, 4], [3, 3, 4, 16], 1)).toBe(0)
    expect(conv2d([4, 8, 8, 16], [5, 5, 16, 16], 1)).toBe(0)
    // fewer than 8 tiles of 4x4 outputs (8 run); more than 512 input channels
    expect(conv2d([1, 8, 8, 16], [3, 3, 16, 16], 1)).toBe(0)
    expect(conv2d([2, 8, 8, 16], [3, 3, 16, 16], 1)).toBe(1)
    expect(conv2d([8, 4, 4, 516], [3, 3, 516, 8], 1)).toBe(0)
    expect(conv2d([8, 4, 4, 512], [3, 3, 512, 8], 1)).toBe(1)
  })

  it("GRADWIRE_WINOGRAD=0 runs 3x3 convolutions by the direct kernels, and explain.txt says which run", () => {
    const script = `import { loadEngine } from "./core/engine.ts"; import { winogradStats } from "./core/kernels/conv2d.ts"; import { describeKernels } from "./core/kernels/register.ts"; const { tf } = await loadEngine("wasm"); tf.tidy(() => tf.conv2d(tf.ones([4, 8, 8, 16]), tf.ones([3, 3, 16, 16]), 1, "same").dataSync()); console.log(JSON.stringify([winogradStats.calls, describeKernels("wasm", 0, []).json.winograd]))`
    const run = (value: string): [number, string] => {
      const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: fileURLToPath(new URL("..", import.meta.url)), env: { ...process.env, GRADWIRE_WINOGRAD: value }, encoding: "utf8", timeout: 60_000 })
      return JSON.parse(out.trim().split("\n").pop()!) as [number, string]
    }
    const [onCalls, onSays] = run("1")
    const [offCalls, offSays] = run("0")
    expect([onCalls, offCalls]).toEqual([1, 0])
    expect(onSays).toContain("Winograd's F(4x4, 3x3)")
    expect(offSays).toContain("the direct kernels")
    expect(describeKernels("wasm", 0, []).text).toContain(`3x3 convolutions at stride 1 (8-512 input channels): ${winogradStatus()}`)
  })

  it("the engine's tfjs (loaded with require) is the instance a loop's own import of tfjs gets: one backend, one tensor class", () => {
    const script = `import { loadEngine } from "./core/engine.ts"; const { tf } = await loadEngine("wasm"); const esm = await import("@tensorflow/tfjs"); const t = esm.tensor([1, 2]); console.log(JSON.stringify([esm.getBackend(), esm.Tensor === tf.Tensor, t instanceof tf.Tensor, esm.engine() === tf.engine(), tf.memory().numTensors]))`
    const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: fileURLToPath(new URL("..", import.meta.url)), encoding: "utf8", timeout: 60_000 })
    expect(JSON.parse(out.trim().split("\n").pop()!)).toEqual(["wasm", true, true, true, 1])
  })

  it("an image padded by the heap's SIMD kernel: the same bits as the JavaScript loop (padding on every side, rows and columns cut off, top past the image)", () => {
    const backend = tf.backend() as unknown as Parameters<typeof padImage>[0]
    for (const [shape, HP, WP, top, left] of [
      [[2, 5, 6, 4], 7, 8, 1, 1],
      [[3, 6, 7, 8], 5, 10, 0, 2],
      [[1, 4, 4, 12], 6, 3, 2, 0],
      [[2, 3, 3, 4], 4, 4, 5, 1]
    ] as Array<[number[], number, number, number, number]>) {
      const x = t(shape, 91)
      const info = { dataId: x.dataId, shape: x.shape, dtype: "float32" } as Parameters<typeof padImage>[1]
      const padded = (heap: boolean): Float32Array => {
        useHeapKernels(heap)
        try {
          const out = padImage(backend, info, HP, WP, top, left)
          const values = Float32Array.from(backend.typedArrayFromHeap(out) as Float32Array)
          backend.disposeData(out.dataId)
          return values
        } finally {
          useHeapKernels(true)
        }
      }
      const simd = padded(true)
      const loop = padded(false)
      expect(simd.length).toBe(shape[0]! * HP * WP * shape[3]!)
      expect(Array.from(simd)).toEqual(Array.from(loop))
      // not all zeros, where the image reaches into the padded rows
      if (top < HP) expect(simd.some((v) => v !== 0)).toBe(true)
      x.dispose()
    }
  })

  it("_FusedMatMul (a dense layer's forward) as the SIMD product, then its bias and activation: no bias, a bias, every activation it takes, a batch; both operands transposed and prelu left to the backend's kernel", async () => {
    const before = fusedMatMulStats.calls
    const worst = await compare(() => {
      const a = t([32, 24], 61)
      const b = t([24, 20], 62)
      const bias = t([20], 63)
      const dense = (activation: string, withBias = true, more: Record<string, unknown> = {}): Tensor =>
        tf.fused.matMul({ a: a as never, b: b as never, ...(withBias ? { bias: bias as never } : {}), activation: activation as never, ...more }) as unknown as Tensor
      return [
        dense("linear", false),
        ...["linear", "relu", "relu6", "elu", "sigmoid"].map((f) => dense(f)),
        dense("leakyrelu", true, { leakyreluAlpha: 0.3 }),
        tf.fused.matMul({ a: t([24, 32], 64) as never, b: t([20, 24], 65) as never, transposeA: true, transposeB: true, bias: bias as never, activation: "relu" }) as unknown as Tensor,
        tf.fused.matMul({ a: t([3, 8, 24], 66) as never, b: t([3, 24, 20], 67) as never, bias: bias as never, activation: "relu" }) as unknown as Tensor,
        dense("prelu", true, { preluActivationWeights: t([20], 68) })
      ]
    })
    expect(worst).toBeLessThanOrEqual(1e-5)
    // on wasm: every one but prelu and the doubly transposed product
    expect(fusedMatMulStats.calls - before).toBe(8)
  })

  it("depthwise gradients with multiplier 1 by the heap's SIMD kernels (4, 8, 20 and 36 channels: 16 and 4 at a time; stride 1 and 2, same and valid, a 5x5 filter at strides [1, 3], a batch of one pixel row)", async () => {
    for (const [x, f, strides, pad] of [
      [[2, 9, 8, 4], [3, 3, 4, 1], 1, "same"],
      [[3, 10, 9, 8], [3, 3, 8, 1], 2, "same"],
      [[2, 9, 9, 20], [3, 3, 20, 1], 1, "valid"],
      [[1, 11, 12, 36], [5, 5, 36, 1], [1, 3], "same"],
      [[2, 7, 8, 20], [3, 3, 20, 1], 2, "valid"],
      [[4, 1, 16, 8], [1, 5, 8, 1], 1, "same"]
    ] as const) {
      const before = { ...simdDepthwiseStats }
      const worst = await compare(() => {
        const g = (a: Tensor, w: Tensor): Tensor => tf.depthwiseConv2d(a as never, w as never, strides as never, pad) as unknown as Tensor
        const y = g(t([...x], 5), t([...f], 6))
        const [gx, gf] = tf.grads((a: Tensor, w: Tensor) => g(a, w).mul(t(y.shape, 7)).sum())([t([...x], 5), t([...f], 6)])
        return [y, gx!, gf!]
      })
      expect(worst, JSON.stringify([x, f, strides, pad])).toBeLessThanOrEqual(1e-5)
      // the kernels ran (once each, on wasm)
      expect([simdDepthwiseStats.filter - before.filter, simdDepthwiseStats.input - before.input]).toEqual([1, 1])
    }
  })

  it("max-pool gradient across a batch (tfjs-backend-wasm's own drops the first element of every image but the first)", async () => {
    const worst = await compare(() => tf.grad((a: Tensor) => (tf.maxPool(a as never, 2, 2, "valid") as unknown as Tensor).mul(t([3, 3, 3, 2], 9)).sum())(t([3, 6, 7, 2], 8)))
    expect(worst).toBeLessThanOrEqual(1e-4)
    // Ties (values from a small set of integers: the first maximum of a window takes the gradient),
    // overlapping 3x3 windows at stride 2 with "same" padding, and more channels.
    const ties = () => tf.round(tf.mul(t([2, 7, 9, 5], 10), 2))
    const tied = await compare(() => [
      tf.grad((a: Tensor) => (tf.maxPool(a as never, 2, 2, "valid") as unknown as Tensor).mul(t([2, 3, 4, 5], 11)).sum())(ties()),
      tf.grad((a: Tensor) => (tf.maxPool(a as never, 3, 2, "same") as unknown as Tensor).mul(t([2, 4, 5, 5], 12)).sum())(ties())
    ])
    expect(tied).toBeLessThanOrEqual(1e-4)
    // Windows that do not overlap by the heap's SIMD kernel: "same" padding cutting the last windows
    // short, 4, 6 and 8 channels (every lane, two of a group), 3x3 at stride 3, and NaNs after the
    // first tap of a window (never taking the gradient; a NaN first in its window would here, where
    // the cpu backend skips it), in columns 1, 5 and 7 of every third pixel.
    const nan = (shape: number[], seed: number) => {
      const [, , W, C] = shape as [number, number, number, number]
      const v = seeded(shape.reduce((a, b) => a * b, 1), seed).map((x) => Math.round(x * 2))
      for (let i = 0; i < v.length; i += 3) if ([1, 5, 7].includes(Math.floor(i / C) % W)) v[i] = NaN
      return tf.tensor(v, shape)
    }
    const windows = await compare(() => [
      tf.grad((a: Tensor) => (tf.maxPool(a as never, 2, 2, "same") as unknown as Tensor).mul(t([2, 4, 5, 6], 13)).sum())(ties().slice([0, 0, 0, 0], [2, 7, 9, 1]).tile([1, 1, 1, 6])),
      tf.grad((a: Tensor) => (tf.maxPool(a as never, 2, 2, "same") as unknown as Tensor).mul(t([2, 4, 5, 8], 14)).sum())(t([2, 7, 9, 8], 15)),
      tf.grad((a: Tensor) => (tf.maxPool(a as never, 3, 3, "same") as unknown as Tensor).mul(t([2, 3, 3, 4], 16)).sum())(nan([2, 7, 9, 4], 17)),
      tf.grad((a: Tensor) => (tf.maxPool(a as never, 2, 2, "valid") as unknown as Tensor).mul(t([2, 3, 4, 6], 18)).sum())(nan([2, 7, 9, 6], 19))
    ])
    expect(windows).toBeLessThanOrEqual(1e-4)
  })

  it("GatherV2 as row copies: rows of 1, 8 (element by element) and 40 floats (one copy each), along a middle axis, int32 tables, as the cpu backend's", async () => {
    const ids = () => tf.tensor2d([1, 4, 4, 0, 2, 4], [2, 3], "int32")
    const worst = await compare(() => [
      tf.gather(t([5], 20), ids()),
      tf.gather(t([5, 8], 21), ids()),
      tf.gather(t([5, 40], 22), ids()),
      tf.gather(t([3, 5, 8], 23), ids(), 1),
      tf.gather(tf.round(t([5, 8], 24).mul(100)).toInt(), ids()).toFloat()
    ])
    expect(worst).toBe(0)
  })

  it("UnsortedSegmentSum (the embedding gradient), ids out of range dropped", async () => {
    const worst = await compare(() => [
      tf.unsortedSegmentSum(t([7, 5], 11), tf.tensor1d([3, 0, 3, 9, 1, 1, 3], "int32"), 5),
      tf.unsortedSegmentSum(tf.tensor2d([1, 2, 3, 4, 5, 6], [3, 2], "int32"), tf.tensor1d([2, 2, 0], "int32"), 3),
      tf.grad((w: Tensor) => tf.gather(w, tf.tensor2d([1, 4, 4, 0, 2, 4], [2, 3], "int32")).mul(t([2, 3, 6], 12)).sum())(t([5, 6], 13))
    ])
    expect(worst).toBeLessThanOrEqual(1e-4)
  })

  it("Tile of every rank up to 5, and its gradient", async () => {
    const worst = await compare(() => [
      tf.tile(t([3], 1), [4]),
      tf.tile(t([2, 1, 3], 2), [3, 5, 1]),
      tf.tile(tf.tensor3d([1, 2, 3, 4], [2, 2, 1], "int32"), [1, 2, 3]),
      tf.tile(t([1, 2, 1, 3, 1], 3), [2, 1, 3, 1, 2]),
      tf.grad((a: Tensor) => tf.tile(a, [2, 3, 1]).mul(t([4, 9, 2], 4)).sum())(t([2, 3, 2], 5))
    ])
    expect(worst).toBeLessThanOrEqual(1e-4)
  })

  it("Unpack along every axis (first, middle, last, negative; runs shorter and longer than 16), int32 and bool too, and its gradient", async () => {
    const worst = await compare(() => [
      ...tf.unstack(t([5, 3, 40], 1), 0),
      ...tf.unstack(t([4, 6, 3], 2), 1),
      ...tf.unstack(t([3, 2, 7], 3), 2),
      ...tf.unstack(t([2, 5, 20], 4), -2),
      ...tf.unstack(tf.tensor2d([1, 2, 3, 4, 5, 6], [2, 3], "int32"), 1),
      ...tf.unstack(tf.tensor2d([1, 0, 0, 1, 1, 0], [3, 2], "bool"), 0).map((b) => b.cast("int32")),
      ...tf.unstack(t([7], 5)),
      tf.grad((a: Tensor) => tf.stack(tf.unstack(a, 1).map((s, i) => s.mul(i + 1)), 0).sum())(t([3, 4, 5], 6))
    ])
    expect(worst).toBeLessThanOrEqual(1e-4)
  })

  it("matmuls with transposed operands, batched and not", async () => {
    // xᵀ·dy with x's rows 4 KiB apart (1024 columns): a transposed first, where reading it in
    // place would keep refetching one L1 set (matmul.ts's setConflicting).
    expect([setConflicting(1024, 32), setConflicting(2048, 64), setConflicting(1024, 16), setConflicting(512, 32), setConflicting(1000, 32)]).toEqual([true, true, false, false, false])
    const calls = simdMatMulStats.calls
    const worst = await compare(() => [
      tf.matMul(t([32, 1024], 10), t([32, 20], 11), true, false),
      // b packed in blocks of 16 columns first (n a multiple of 16 above 16, b over 16384 floats or
      // its rows 4 KiB apart), a read in place or not
      tf.matMul(t([5, 130], 12), t([130, 144], 13)),
      tf.matMul(t([40, 7], 14), t([40, 1024], 15), true, false),
      tf.matMul(t([7, 5], 1), t([7, 3], 2), true, false),
      tf.matMul(t([5, 7], 3), t([3, 7], 4), false, true),
      tf.matMul(t([4, 7, 5], 5), t([4, 3, 7], 6), true, true),
      tf.fused.matMul({ a: t([6, 5], 7), b: t([4, 6], 8), transposeA: true, transposeB: true, bias: t([4], 9), activation: "relu" })
    ])
    expect(worst).toBeLessThanOrEqual(1e-4)
    expect(simdMatMulStats.calls).toBeGreaterThan(calls)
    // The packed single product gives the bits of the same product unpacked (a batch of two), its
    // rows in one block and in three (108 rows of 600 floats a block).
    for (const [a, b] of [
      [t([9, 130], 16), t([130, 144], 17)],
      [t([300, 600], 18), t([600, 32], 19)]
    ]) {
      const single = tf.matMul(a!, b!).dataSync()
      const batched = tf.matMul(tf.stack([a!, a!]), tf.stack([b!, b!])).dataSync().slice(0, single.length)
      expect(Array.from(single).every((v, i) => Object.is(v, batched[i]))).toBe(true)
    }
  })

  it("transposes: block transposes of every shape (tiles, runs, batches), int32 and bool, and the others through the backend's own", async () => {
    expect(asBlockTranspose([2, 3], [1, 0])).toEqual({ batch: 1, rows: 2, cols: 3, inner: 1 })
    expect(asBlockTranspose([4, 2, 3, 5], [0, 2, 1, 3])).toEqual({ batch: 4, rows: 2, cols: 3, inner: 5 })
    expect(asBlockTranspose([2, 3, 4], [2, 0, 1])).toEqual({ batch: 1, rows: 6, cols: 4, inner: 1 })
    expect(asBlockTranspose([2, 3, 4], [1, 2, 0])).toEqual({ batch: 1, rows: 2, cols: 12, inner: 1 })
    expect(asBlockTranspose([2, 3, 4], [0, 1, 2])).toBeUndefined()
    expect(asBlockTranspose([2, 3, 4], [2, 1, 0])).toBeUndefined()
    // By the heap's SIMD kernel (float32, int32; runs of 1, 5 and 16 elements; single elements with
    // rows and columns multiples of 4 as 4 x 4 blocks, across 64 x 64 tiles and a batch), and by
    // the JavaScript loop without it.
    for (const simd of [true, false]) {
      useHeapKernels(simd)
      try {
        const worst = await compare(() => [
          tf.transpose(t([130, 67], 1)),
          tf.transpose(t([3, 70, 129], 2), [0, 2, 1]),
          tf.transpose(t([2, 5, 3, 4], 3), [0, 2, 1, 3]),
          tf.transpose(t([5, 6, 7], 4), [2, 0, 1]),
          tf.transpose(t([5, 6, 7], 5), [1, 2, 0]),
          tf.transpose(t([2, 3, 4, 5], 6), [3, 1, 2, 0]),
          tf.transpose(t([4, 2, 70, 16], 9), [0, 2, 1, 3]),
          tf.transpose(t([8, 4], 10)),
          tf.transpose(t([3, 68, 132], 11), [0, 2, 1]),
          tf.transpose(tf.cast(tf.mul(t([12, 20], 12), 100), "int32"), [1, 0]).toFloat(),
          tf.transpose(tf.cast(tf.mul(t([9, 70], 7), 100), "int32"), [1, 0]).toFloat(),
          tf.transpose(tf.greater(t([65, 3], 8), 0), [1, 0]).toFloat()
        ])
        expect(worst).toBe(0)
      } finally {
        useHeapKernels(true)
      }
    }
  })

  it("sum and mean over leading and middle blocks of axes (the rows added on the heap), batch norm's gradients, and the other reductions through the backend's own", async () => {
    expect(asReducedBlock([32, 8, 8, 16], [0, 1, 2])).toEqual({ before: 1, reduced: 2048, after: 16, axes: [0, 1, 2] })
    expect(asReducedBlock([32, 8, 8, 16], [2, -3])).toEqual({ before: 32, reduced: 64, after: 16, axes: [1, 2] })
    expect(asReducedBlock([5, 7], 0)).toEqual({ before: 1, reduced: 5, after: 7, axes: [0] })
    expect(asReducedBlock([2, 3, 4], [2])).toBeUndefined()
    expect(asReducedBlock([2, 3, 4], [0, 2])).toBeUndefined()
    expect(asReducedBlock([2, 3, 4], [0, 1, 2])).toBeUndefined()
    expect(asReducedBlock([2, 3, 4], null)).toBeUndefined()
    // Rows not a multiple of 8, one row, one column, several slices, keepDims, negative axes.
    const worst = await compare(() => [
      tf.sum(t([37, 5], 1), 0),
      tf.mean(t([37, 5], 2), 0),
      tf.sum(t([3, 11, 7, 5], 3), [0, 1, 2]),
      tf.mean(t([3, 11, 7, 5], 4), [0, 1, 2], true),
      tf.sum(t([4, 9, 6, 3], 5), [1, 2]),
      tf.mean(t([4, 9, 6, 3], 6), [-3, -2], true),
      tf.sum(t([1, 6], 7), 0),
      tf.sum(t([19, 1], 8), 0),
      tf.sum(t([2, 3, 4, 5, 6], 9), [1, 2, 3]),
      tf.sum(t([2, 3, 4], 10), [0, 2]),
      tf.mean(t([2, 3, 4], 11), -1),
      tf.sum(t([2, 3, 4], 12)),
      tf.sum(tf.cast(tf.mul(t([9, 4], 13), 100), "int32"), 0).toFloat(),
      tf.grad((x: Tensor) => {
        const { mean, variance } = tf.moments(x, [0, 1, 2])
        return tf.batchNorm(x, mean, variance, t([5], 14), t([5], 15), 1e-3).mul(t([3, 6, 4, 5], 16)).sum()
      })(t([3, 6, 4, 5], 17))
    ])
    expect(worst).toBeLessThanOrEqual(1e-4)
    // NaN and infinities add as they do in the backend's own sums.
    const odd = tf.tensor2d([1, Number.NaN, Infinity, 2, 3, -Infinity, Infinity, 4, 5, 6, 7, Infinity], [4, 3])
    expect(Array.from(await tf.sum(odd, 0).data())).toEqual([Infinity, Number.NaN, Number.NaN])
  })

  it("batch norm's gradient as one kernel on wasm: x, mean, variance, scale and offset as tfjs's (rank 4 against the cpu backend's own gradient; ranks 2 and 3, which tfjs's own cannot take, against the formula in plain ops)", async () => {
    const positive = (shape: number[], seed: number) => tf.add(tf.abs(t(shape, seed)), 0.1)
    const w = (shape: number[]) => t(shape, 99)
    // (Always with a scale: without one, tfjs 4.22 cannot record batchNorm for a gradient at all.)
    const grads = (shape: number[]) => () => {
      const c = shape.at(-1)!
      const args = [t(shape, 1), t([c], 2), positive([c], 3), t([c], 4), t([c], 5)]
      return tf.grads((...a: Tensor[]) => tf.batchNorm(a[0]!, a[1]!, a[2]!, a[3]!, a[4]!, 1e-3).mul(w(shape)).sum())(args)
    }
    expect(await compare(grads([3, 5, 4, 6]))).toBeLessThanOrEqual(1e-4)
    expect(await compare(grads([2, 3, 3, 7]))).toBeLessThanOrEqual(1e-4)
    const prof = await tf.profile(() => tf.dispose(grads([3, 5, 4, 6])()))
    expect(prof.kernels.map((k) => k.name)).toContain("GradwireBatchNormGrad")
    // Ranks 2 and 3 against (x - mean) / sqrt(variance + eps) * scale + offset in plain ops, on wasm.
    for (const shape of [[9, 5], [4, 3, 6]]) {
      const c = shape.at(-1)!
      const args = () => [t(shape, 11), t([c], 12), positive([c], 13), t([c], 14), t([c], 15)]
      const fused = tf.grads((...a: Tensor[]) => tf.batchNorm(a[0]!, a[1]!, a[2]!, a[3]!, a[4]!, 1e-3).mul(w(shape)).sum())(args())
      const plain = tf.grads((...a: Tensor[]) => a[0]!.sub(a[1]!).div(a[2]!.add(1e-3).sqrt()).mul(a[4]!).add(a[3]!).mul(w(shape)).sum())(args())
      for (let i = 0; i < 5; i++) {
        const [f, p] = [(await fused[i]!.data()) as Float32Array, (await plain[i]!.data()) as Float32Array]
        let worst = 0
        f.forEach((v, j) => (worst = Math.max(worst, Math.abs(v - p[j]!) / (1 + Math.abs(p[j]!)))))
        expect(worst, `rank ${shape.length}, input ${i}`).toBeLessThanOrEqual(1e-4)
      }
      tf.dispose([...fused, ...plain])
    }
  })

  it("broadcasting comparisons, maximum, minimum and pow", async () => {
    const a = () => t([4, 1, 5], 1)
    const b = () => t([3, 1], 2)
    const worst = await compare(() => [
      tf.equal(a(), a().max(1, true)).toFloat(),
      tf.greater(a(), b()).toFloat(),
      tf.lessEqual(b(), a()).toFloat(),
      tf.maximum(a(), b()),
      tf.minimum(b(), a()),
      tf.pow(a().abs(), b()),
      tf.logicalAnd(tf.greater(a(), 0), tf.less(b(), 0)).toFloat()
    ])
    expect(worst).toBeLessThanOrEqual(1e-4)
  })

  it("every comparison on equal shapes (run on the heap): float32 with ties, NaN and infinities, and int32", async () => {
    const x = () => tf.tensor1d([1, 2, Number.NaN, Infinity, -Infinity, 0, -0, 3.5, 2, Number.NaN])
    const y = () => tf.tensor1d([1, 3, Number.NaN, Infinity, 5, -0, 0, -3.5, Number.NaN, 1])
    const xi = () => tf.tensor2d([1, -2, 3, 7, 0, 9], [2, 3], "int32")
    const yi = () => tf.tensor2d([1, 2, -3, 7, 1, 8], [2, 3], "int32")
    const ops = [tf.equal, tf.notEqual, tf.greater, tf.greaterEqual, tf.less, tf.lessEqual]
    const worst = await compare(() => [...ops.map((op) => op(x(), y()).toFloat()), ...ops.map((op) => op(xi(), yi()).toFloat()), tf.equal(t([32, 56, 32], 3), t([32, 1, 32], 4).add(0)).toFloat()])
    expect(worst).toBe(0)
    // Against a single number on either side (a clip's bounds), of rank 0 or with ones, and int32.
    const withOne = await compare(() => [
      ...ops.map((op) => op(x(), tf.scalar(2)).toFloat()),
      ...ops.map((op) => op(tf.scalar(2), x()).toFloat()),
      ...ops.map((op) => op(tf.tensor2d([Number.NaN], [1, 1]), x().reshape([2, 5])).toFloat()),
      ...ops.map((op) => op(xi(), tf.scalar(3, "int32")).toFloat()),
      tf.greaterEqual(tf.tensor2d([[0.5]]), tf.tensor1d([0.2, 0.5, 0.9])).toFloat()
    ])
    expect(withOne).toBe(0)
  })

  it("max and min over leading and middle blocks of axes (the heap's SIMD kernel), and their gradients in one kernel, ties and all, as the cpu backend gives them", async () => {
    // Columns not a multiple of 4, one row, keepDims, negative axes, innermost and every axis through the backend's own.
    const tied = (shape: number[], seed: number): Tensor => tf.round(tf.mul(t(shape, seed), 3))
    const worst = await compare(() => [
      tf.max(t([32, 56, 32], 1), 1),
      tf.min(t([32, 56, 32], 2), 1, true),
      tf.max(t([37, 5], 3), 0),
      tf.min(t([3, 11, 7, 6], 4), [0, 1, 2]),
      tf.max(t([4, 9, 6, 3], 5), [-3, -2], true),
      tf.max(t([1, 6], 6), 0),
      tf.max(t([2, 3, 4], 7), -1),
      tf.min(t([2, 3, 4], 8)),
      tf.max(tied([5, 9, 7], 9), 1),
      ...tf.grads((a: Tensor, b: Tensor) => tf.add(tf.max(a, 1).mul(t([5, 7], 10)).sum(), tf.min(b, [0, 1], true).mul(t([1, 1, 6], 11)).sum()))([tied([5, 9, 7], 12), tied([4, 3, 6], 13)]),
      tf.grad((a: Tensor) => tf.max(a, -1).sum())(tied([4, 5], 14))
    ])
    expect(worst).toBe(0)
    for (const reduce of [tf.max, tf.min]) {
      const kernels = (await tf.profile(() => tf.grad((a: Tensor) => reduce(a, 1).sum())(t([4, 9, 8], 15)))).kernels.map((k) => (k as unknown as { name: string }).name)
      expect(kernels).toContain("GradwireMaxMinGrad")
      expect(kernels).not.toContain("Equal")
    }
    // A NaN in a column makes its max NaN, as on the cpu backend.
    expect(Array.from(await tf.max(tf.tensor3d([1, 2, Number.NaN, 4, 5, 6, 7, 8], [1, 2, 4]), 1).data())).toEqual([5, 6, Number.NaN, 8])
  })

  it("Identity shares its input's buffer (no copy): a clone keeps its values after the original is disposed, and a variable's clone keeps the old values after an assign", async () => {
    const backend = tf.backend() as unknown as { refCount(dataId: object): number }
    const x = t([4, 5], 40)
    const values = Float32Array.from((await x.data()) as Float32Array)
    const y = tf.clone(x)
    expect(backend.refCount(x.dataId)).toBe(2)
    x.dispose()
    expect(Array.from((await y.data()) as Float32Array)).toEqual(Array.from(values))
    y.dispose()
    const v = tf.variable(t([3, 4], 41))
    const old = Float32Array.from((await v.data()) as Float32Array)
    const snapshot = v.clone()
    v.assign(t([3, 4], 42))
    expect(Array.from((await snapshot.data()) as Float32Array)).toEqual(Array.from(old))
    expect(Array.from((await v.data()) as Float32Array)).not.toEqual(Array.from(old))
    tf.dispose([v, snapshot])
    // Strings keep the backend's own.
    const s = tf.clone(tf.tensor(["a", "b"]))
    expect(await s.data()).toEqual(["a", "b"])
    s.dispose()
  })

  it("a Cast to the dtype a tensor has shares its buffer (Identity's gradient casts dy so); casts to another dtype convert", async () => {
    const backend = tf.backend() as unknown as { refCount(dataId: object): number }
    const x = t([4, 5], 43)
    const values = Array.from((await x.data()) as Float32Array)
    const y = tf.cast(x, "float32")
    expect(backend.refCount(x.dataId)).toBe(2)
    x.dispose()
    expect(Array.from((await y.data()) as Float32Array)).toEqual(values)
    const i = tf.cast(tf.mul(y, 10), "int32")
    expect(i.dtype).toBe("int32")
    expect(Array.from((await i.data()) as Int32Array)).toEqual(values.map((v) => Math.trunc(Math.fround(v * 10))))
    const b = tf.cast(tf.tensor([0, 2, -1], [3], "int32"), "bool")
    expect(Array.from((await b.data()) as Uint8Array)).toEqual([0, 1, 1])
    // The gradient through a clone (Identity) is dy's values.
    const g = tf.grad((a: Tensor) => tf.clone(a).mul(3).sum())(t([3], 44))
    expect(Array.from((await g.data()) as Float32Array)).toEqual([3, 3, 3])
    tf.dispose([y, i, b, g])
  })

  it("runs a kernel wasm lacks through the cpu backend, with its answer, and records it", async () => {
    expect(tf.getKernel("Einsum", "wasm")).toBeDefined()
    const worst = await compare(() => tf.einsum("ij,jk->ik", t([3, 4], 1), t([4, 2], 2)))
    expect(worst).toBeLessThanOrEqual(1e-5)
    expect(fallbackKernelsUsed()).toContain("Einsum")
  })
})

describe("a tensor the wasm heap cannot hold", () => {
  it("is a HeapExhausted that says what to do, not the typed array's RangeError", () => {
    const x = tf.zeros([4])
    try {
      const backend = tf.backend() as unknown as Parameters<typeof heapArray>[0]
      // a view as large as a batch the heap could not grow for: tfjs's view runs past the heap
      const huge = { dataId: x.dataId, shape: [300_000, 8, 8, 16], dtype: "float32" as const }
      expect(() => heapArray(backend, huge)).toThrow(HeapExhausted)
      expect(() => heapArray(backend, huge)).toThrow(/wasm backend's memory cannot hold a tensor of shape \[300000, 8, 8, 16\] \(1172 MiB; its heap has \d+ MiB.*lower the batch size/)
      // the tensor itself, as it is
      expect(heapArray(backend, { dataId: x.dataId, shape: [4], dtype: "float32" })).toHaveLength(4)
    } finally {
      x.dispose()
    }
  })
})

describe("a program that loaded the wasm backend", () => {
  it("reports its own uncaught error and unhandled rejection as Node does (its stack, exit code 1), not from the backend's file with code 7", () => {
    const root = fileURLToPath(new URL("..", import.meta.url))
    for (const fail of ['throw new Error("my own bug")', 'void Promise.reject(new Error("my own bug"))']) {
      const script = `import { loadEngine } from "./core/engine.ts"\nconst { backend } = await loadEngine("wasm")\nconsole.log(backend)\n${fail}\n`
      const r = spawnSync(process.execPath, ["--input-type=module", "-e", script], { cwd: root, encoding: "utf8", timeout: 60_000 })
      expect(r.stdout.trim(), fail).toBe("wasm")
      expect(r.status, `${fail}: ${r.stderr}`).toBe(1)
      expect(r.stderr, fail).toContain("Error: my own bug")
      expect(r.stderr, fail).not.toContain("tf-backend-wasm")
    }
  })
})
