// core/kernels/heap-simd.ts: gradwire's SIMD kernels on tfjs-backend-wasm's own heap, against the
// JavaScript loops they stand in for (batch-norm-train.ts, layer-norm.ts) and against the cpu
// backend's matmul. Inputs far from zero (a mean of 1000 over 25088 rows) check that the sums over
// rows keep their precision.
import { execFileSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { farthest as far, seeded } from "./support/kernel-compare.ts"
import { loadEngine, type Tf } from "../core/engine.ts"
import { batchNormTrainBackward, batchNormTrainForward } from "../core/kernels/batch-norm-train.ts"
import { addressOf, heapKernels, heapKernelsFused, heapKernelsStatus, type HeapKernels } from "../core/kernels/heap-simd.ts"
import { HEAP_KERNELS_FMA_WASM_BASE64, HEAP_KERNELS_WASM_BASE64 } from "../core/kernels/simd/heap-kernels-wasm.ts"
import { layerNormBackward, layerNormForward } from "../core/kernels/layer-norm.ts"
import { cellBackward, cellForward } from "../core/kernels/lstm-cell.ts"
import { simdMatMulStats } from "../core/kernels/matmul.ts"
import { describeKernels } from "../core/kernels/register.ts"
import type { TensorInfo, WasmBackend } from "../core/kernels/wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
let tf: Tf
let backend: WasmBackend
let kernels: HeapKernels
/** What explain.txt would say right after the engine loads, before any kernel ran. */
let statusAtLoad: string

// The few WebAssembly globals used here (the project's TypeScript lib has no DOM types).
declare const WebAssembly: {
  Module: { new (bytes: Uint8Array): object; exports(module: object): Array<{ name: string }> }
  Instance: new (module: object, imports: object) => { readonly exports: unknown }
}

/** Both binaries on the backend's heap: multiply then add, and with fused multiply-adds (FUSED in heap-kernels.wat.mjs). */
const binaries: Record<"plain" | "fused", HeapKernels> = {} as Record<"plain" | "fused", HeapKernels>
/** Whether this CPU fuses relaxed SIMD's multiply-add (the fused binary's probe, 2⁻²⁴ against 0). */
let cpuFuses: boolean

beforeAll(async () => {
  tf = (await loadEngine("wasm")).tf
  statusAtLoad = heapKernelsStatus()
  backend = tf.backend() as unknown as WasmBackend
  kernels = heapKernels(backend)!
  const memory = (backend as unknown as { wasm: { asm: { memory: object } } }).wasm.asm.memory
  const load = (b64: string) => new WebAssembly.Instance(new WebAssembly.Module(Buffer.from(b64, "base64")), { env: { memory } }).exports as unknown as HeapKernels
  binaries.plain = load(HEAP_KERNELS_WASM_BASE64)
  binaries.fused = load(HEAP_KERNELS_FMA_WASM_BASE64)
  cpuFuses = binaries.fused.maddProbe(1 + 2 ** -12, 1 + 2 ** -12, -(1 + 2 ** -11)) !== 0
})

const f32 = new Float32Array(1)
const i32 = new Int32Array(f32.buffer)
/** The float32 next to r (a float32) toward the sign of `dir`. */
const nextFloat = (r: number, dir: number): number => {
  if (r === 0) return Math.sign(dir) * 2 ** -149
  f32[0] = r
  i32[0]! += r > 0 === dir > 0 ? 1 : -1
  return f32[0]!
}
/** a·b + c rounded once to float32 (a, b, c float32): the product is exact in float64, the sum's error found by TwoSum, a tie broken by it. */
const fma32 = (a: number, b: number, c: number): number => {
  const p = a * b
  const s = p + c
  const v = s - p
  const e = p - (s - v) + (c - v)
  const r = Math.fround(s)
  if (e === 0 || r === s) return r
  const other = nextFloat(r, s - r)
  return (r + other) / 2 === s && e > 0 === other > r ? other : r
}
/** c + a·b as a kernel's f32x4 lanes sum it: rounded once where `fused`, else the product first. */
const madd = (fused: boolean) => (c: number, a: number, b: number): number => (fused ? fma32(a, b, c) : Math.fround(c + Math.fround(a * b)))

/** Arrays copied onto the heap as tensors, fresh outputs of `outShapes`, `run` on their addresses; the outputs' values. */
/**
 * Where two arrays first differ, bit for bit (-0 and 0 apart, NaN equal to NaN): undefined where they
 * do not, else the index and both values. A failed toEqual on arrays of 200 K floats made vitest
 * diff them for minutes; this fails at once and names the element.
 */
const firstDifference = (got: ArrayLike<number>, want: ArrayLike<number>): { index: number; got: number; want: number } | "lengths differ" | undefined => {
  if (got.length !== want.length) return "lengths differ"
  for (let i = 0; i < got.length; i++) if (!Object.is(got[i], want[i])) return { index: i, got: got[i]!, want: want[i]! }
  return undefined
}

const onHeap = (ins: Array<[Float32Array, number[]]>, outShapes: number[][], run: (ins: number[], outs: number[]) => void): Float32Array[] => {
  const tensors = ins.map(([v, shape]) => tf.tensor(v, shape))
  const outs = outShapes.map((shape) => backend.makeOutput(shape, "float32"))
  run(
    tensors.map((t) => addressOf(backend, t as unknown as TensorInfo)),
    outs.map((o) => addressOf(backend, o))
  )
  const values = outs.map((o) => Float32Array.from(backend.typedArrayFromHeap(o)))
  outs.forEach((o) => backend.disposeData(o.dataId))
  tf.dispose(tensors)
  return values
}

describe("SIMD kernels on the wasm heap", () => {
  it("are available on this runtime (WebAssembly SIMD, the backend's memory imported), with fused multiply-adds where the CPU has them, and explain.txt says so, from the engine's start on", () => {
    const status = `in use, ${cpuFuses ? "fused multiply-add" : "multiply, then add (this CPU has no fused multiply-add)"}`
    expect(statusAtLoad).toBe(status)
    expect(kernels).toBeDefined()
    expect(heapKernels(backend)).toBe(kernels)
    expect(heapKernelsStatus()).toBe(status)
    expect(heapKernelsFused()).toBe(cpuFuses)
    // the kernels in use are the fused binary's (the plain one's probe rounds the product first)
    expect(binaries.plain.maddProbe(1 + 2 ** -12, 1 + 2 ** -12, -(1 + 2 ** -11))).toBe(0)
    expect(kernels.maddProbe(1 + 2 ** -12, 1 + 2 ** -12, -(1 + 2 ** -11))).toBe(cpuFuses ? 2 ** -24 : 0)
    expect(describeKernels("wasm", 0, []).text).toContain(`SIMD kernels on the wasm heap (matmuls, convolutions and their gradients (depthwise too), max-pool, ReLU and clip gradients, normalization, the LSTM and GRU cells, transposes, Adam): ${status}`)
    expect(describeKernels("wasm", 0, []).json.heapSimd).toBe(status)
  })

  it("both binaries export the same kernels, and GRADWIRE_FMA=0 loads the one that multiplies, then adds", () => {
    const names = (b64: string) => WebAssembly.Module.exports(new WebAssembly.Module(Buffer.from(b64, "base64"))).map((e) => e.name)
    expect(names(HEAP_KERNELS_FMA_WASM_BASE64)).toEqual(names(HEAP_KERNELS_WASM_BASE64))
    const script = `import { loadEngine } from "./core/engine.ts"; import { heapKernelsStatus, heapKernelsFused } from "./core/kernels/heap-simd.ts"; await loadEngine("wasm"); console.log(JSON.stringify([heapKernelsStatus(), heapKernelsFused()]))`
    const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: fileURLToPath(new URL("..", import.meta.url)), env: { ...process.env, GRADWIRE_FMA: "0" }, encoding: "utf8", timeout: 60_000 })
    expect(JSON.parse(out.trim().split("\n").pop()!)).toEqual(["in use, multiply, then add (GRADWIRE_FMA=0)", false])
  })

  it("col2im (a strided convolution's input gradient): patch gradients added back where their patches were read, bit for bit as the JavaScript loop adds them (stride 2 same, stride 3 valid, a 5x3 filter at strides [2, 1] padded, taps off the image left out)", () => {
    for (const [N, H, W, C, FH, FW, SH, SW, top, left] of [
      [2, 9, 9, 8, 3, 3, 2, 2, 1, 1],
      [1, 10, 11, 4, 3, 3, 3, 3, 0, 0],
      [3, 7, 6, 12, 5, 3, 2, 1, 2, 1]
    ] as const) {
      const OH = Math.floor((H + 2 * top - FH) / SH) + 1
      const OW = Math.floor((W + 2 * left - FW) / SW) + 1
      const K = FH * FW * C
      const dcol = seeded(N * OH * OW * K, 41)
      const js = new Float32Array(N * H * W * C)
      let m = 0
      for (let b = 0; b < N; b++)
        for (let oh = 0; oh < OH; oh++)
          for (let ow = 0; ow < OW; ow++, m++)
            for (let fh = 0; fh < FH; fh++)
              for (let fw = 0; fw < FW; fw++) {
                const ih = oh * SH + fh - top
                const iw = ow * SW + fw - left
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue
                for (let c = 0; c < C; c++) js[((b * H + ih) * W + iw) * C + c] += dcol[m * K + (fh * FW + fw) * C + c]!
              }
      const src = tf.tensor(dcol, [N * OH * OW, K])
      const dx = tf.zeros([N, H, W, C])
      kernels.col2im(addressOf(backend, src as unknown as TensorInfo), addressOf(backend, dx as unknown as TensorInfo), N, H, W, C, OH, OW, FH, FW, SH, SW, top, left)
      const simd = dx.dataSync() as Float32Array
      expect(firstDifference(simd, js)).toBeUndefined()
      expect(simd.some((v) => v !== 0)).toBe(true)
      tf.dispose([src, dx])
    }
  })

  // 16 channels at a time, then 4: 4 and 8 channels (only the latter), 16 and 64 (only the former), 20 and 52 (both)
  for (const [M, C, shift] of [
    [1, 4, 0],
    [7, 8, 0],
    [2048, 16, 0],
    [25088, 8, 1000],
    [37, 20, 0],
    [300, 64, 0],
    [9, 52, 100]
  ] as const) {
    it(`batch norm while training, [${M}, ${C}], values around ${shift}: y, the batch's mean and variance, dx, dγ and dβ bit for bit as the JavaScript loops give them`, () => {
      const n = M * C
      const x = seeded(n, 1, 3, shift)
      const gamma = seeded(C, 2, 1, 1)
      const beta = seeded(C, 3)
      const js = [new Float32Array(n), new Float32Array(C), new Float32Array(C)] as const
      batchNormTrainForward(x, gamma, beta, C, 1e-3, ...js)
      // (the passes go over blocks of 2048 / C rows: one block for [9, 52], several for [25088, 8], and with a part one for [300, 64])
      const simd = onHeap([[x, [M, C]], [gamma, [C]], [beta, [C]]], [[M, C], [C], [C], [8 * C]], ([xa, g, b], [y, m, v, scratch]) => kernels.bnTrainForward(xa!, g!, b!, y!, m!, v!, M, C, 1e-3, scratch!))
      // float64 in the JavaScript's order of operations: the same bits.
      js.forEach((a, i) => expect(firstDifference(simd[i]!, a), `output ${i}`).toBeUndefined())
      const dy = seeded(n, 4)
      const dmean = seeded(C, 5)
      const dvar = seeded(C, 6)
      const jsBack = [new Float32Array(n), new Float32Array(C), new Float32Array(C)] as const
      batchNormTrainBackward(dy, x, gamma, js[1], js[2], dmean, dvar, C, 1e-3, ...jsBack)
      const simdBack = onHeap(
        [[dy, [M, C]], [x, [M, C]], [gamma, [C]], [js[1], [C]], [js[2], [C]], [dmean, [C]], [dvar, [C]]],
        [[M, C], [C], [C], [8 * C]],
        ([d, xa, g, m, v, dm, dv], [dx, dg, db, scratch]) => kernels.bnTrainBackward(d!, xa!, g!, m!, v!, dm!, dv!, dx!, dg!, db!, M, C, 1e-3, scratch!)
      )
      jsBack.forEach((a, i) => expect(firstDifference(simdBack[i]!, a), `gradient ${i}`).toBeUndefined())
    })
  }

  for (const [N, D] of [
    [1, 4],
    [5, 12],
    [1024, 32],
    [64, 1024]
  ] as const) {
    for (const bin of ["plain", "fused"] as const) it(`layer norm, [${N}, ${D}] (${bin}): y, dx, dγ and dβ as the JavaScript loops give them`, () => {
      const kernels = binaries[bin]
      const n = N * D
      const x = seeded(n, 7, 2, 5)
      const gamma = seeded(D, 8, 1, 1)
      const beta = seeded(D, 9)
      const y = new Float32Array(n)
      layerNormForward(x, gamma, beta, D, 1e-3, y)
      const [sy] = onHeap([[x, [N, D]], [gamma, [D]], [beta, [D]]], [[N, D]], ([xa, g, b], [o]) => kernels.lnForward(xa!, g!, b!, o!, N, D, 1e-3))
      expect(far(sy!, y)).toBeLessThan(1e-5)
      const dy = seeded(n, 10)
      const js = [new Float32Array(n), new Float32Array(D), new Float32Array(D)] as const
      layerNormBackward(dy, x, gamma, D, 1e-3, ...js)
      const simd = onHeap([[dy, [N, D]], [x, [N, D]], [gamma, [D]]], [[N, D], [D], [D]], ([d, xa, g], [dx, dg, db]) => kernels.lnBackward(d!, xa!, g!, dx!, dg!, db!, N, D, 1e-3))
      expect(far(simd[0]!, js[0])).toBeLessThan(1e-4)
      for (const i of [1, 2]) expect(far(simd[i]!, js[i]!) / Math.sqrt(N)).toBeLessThan(1e-5)
    })
  }

  for (const recurrent of ["hardSigmoid", "sigmoid"] as const) {
    for (const bin of ["plain", "fused"] as const) it(`an LSTM cell's gates (${recurrent}, ${bin}): h, c', dz and dc as the JavaScript loops give them, tanh and the sigmoid near 0, at tanh's branch point, at the clip's bounds and saturated`, () => {
      const kernels = binaries[bin]
      const [B, H] = [6, 12]
      const special = [0, 1e-7, -1e-7, 0.3, 0.6249, -0.6249, 0.625, -0.625, 0.6251, 2.5, -2.5, 9, -9, 30, -30, 100, -100, 1e-30]
      const z = seeded(B * 4 * H, 21, 6)
      z.set(special, 0)
      z.set(special, 4 * H + H)
      const c = seeded(B * H, 22, 3)
      // Row 2: no carry, and tiny cell inputs, so c' = i·tanh(z_g) and h are tiny: relative errors show there.
      c.fill(0, 2 * H, 3 * H)
      const tiny = [1e-7, -1e-7, 3e-6, -1e-5, 1e-3, -0.01, 0.1, 0.3, -0.5, 0.62, -0.624, 0.626]
      z.set(tiny, 2 * 4 * H + 2 * H)
      const js = [new Float32Array(B * H), new Float32Array(B * H)] as const
      cellForward(z, c, H, recurrent, ...js)
      const hard = recurrent === "hardSigmoid" ? 1 : 0
      const simd = onHeap([[z, [B, 4 * H]], [c, [B, H]]], [[B, H], [B, H]], ([za, ca], [h, cn]) => kernels.lstmCellForward(za!, ca!, h!, cn!, B, H, hard))
      js.forEach((a, i) => expect(far(simd[i]!, a)).toBeLessThan(2e-7))
      for (const i of [0, 1]) {
        for (let j = 2 * H; j < 3 * H; j++) expect(Math.abs(simd[i]![j]! - js[i][j]!)).toBeLessThanOrEqual(1e-6 * Math.abs(js[i][j]!))
      }
      const dh = seeded(B * H, 23)
      const dc = seeded(B * H, 24)
      const jsBack = [new Float32Array(B * 4 * H), new Float32Array(B * H)] as const
      cellBackward(dh, dc, z, c, H, recurrent, ...jsBack)
      const simdBack = onHeap([[dh, [B, H]], [dc, [B, H]], [z, [B, 4 * H]], [c, [B, H]]], [[B, 4 * H], [B, H]], ([d, dca, za, ca], [dz, dcp]) =>
        kernels.lstmCellBackward(d!, dca!, za!, ca!, dz!, dcp!, B, H, hard)
      )
      jsBack.forEach((a, i) => expect(far(simdBack[i]!, a)).toBeLessThan(1e-6))
    })
  }

  for (const bin of ["plain", "fused"] as const) it(`matmul (${bin}): the bits of float32 sums over k in order, ${bin === "plain" ? "a multiply then an add" : "fused multiply-adds where the CPU has them (the last n mod 4 columns, one at a time, a multiply then an add)"} (rows two at a time, an odd last row, 16, 4 and 1 columns at a time, a read in place or transposed)`, () => {
    const kernels = binaries[bin]
    for (const [m, k, n, transposed] of [
      [5, 11, 21, false],
      [6, 7, 35, false],
      [7, 13, 16, true],
      [2, 3, 1, false],
      [9, 33, 50, true],
      [1, 5, 20, false]
    ] as const) {
      const a = seeded(m * k, m + 100)
      const b = seeded(k * n, n + 200)
      const [c] = onHeap([[a, [transposed ? k : m, transposed ? m : k]], [b, [k, n]]], [[m, n]], ([pa, pb], [pc]) =>
        kernels.matmul(pa!, pb!, pc!, 1, m, k, n, 0, 0, transposed ? 4 : 4 * k, transposed ? 4 * m : 4)
      )
      let differing = 0
      for (let i = 0; i < m; i++)
        for (let j = 0; j < n; j++) {
          let sum = 0
          const add = madd(bin === "fused" && cpuFuses && j < n - (n % 4))
          for (let kk = 0; kk < k; kk++) sum = add(sum, a[transposed ? kk * m + i : i * k + kk]!, b[kk * n + j]!)
          if (!Object.is(sum, c![i * n + j])) differing++
        }
      expect({ m, k, n, differing }).toEqual({ m, k, n, differing: 0 })
    }
  })

  for (const bin of ["plain", "fused"] as const) it(`matmulTB (${bin}): the bits of four float32 partial sums over k (lane by lane, in order, ${bin === "plain" ? "a multiply then an add" : "fused multiply-adds where the CPU has them"}), added as (l0 + l1) + (l2 + l3) (rows two at a time against four of b, an odd last row, the last columns one at a time)`, () => {
    const kernels = binaries[bin]
    const add = madd(bin === "fused" && cpuFuses)
    for (const [m, k, n] of [
      [5, 36, 7],
      [6, 8, 13],
      [1, 32, 9],
      [9, 12, 4]
    ] as const) {
      const a = seeded(m * k, m + 300)
      const b = seeded(n * k, n + 400)
      const [c] = onHeap([[a, [m, k]], [b, [n, k]]], [[m, n]], ([pa, pb], [pc]) => kernels.matmulTB(pa!, pb!, pc!, 1, m, k, n, 0, 0))
      let differing = 0
      for (let i = 0; i < m; i++)
        for (let j = 0; j < n; j++) {
          const lanes = [0, 0, 0, 0]
          for (let kk = 0; kk < k; kk++) lanes[kk % 4] = add(lanes[kk % 4]!, a[i * k + kk]!, b[j * k + kk]!)
          const sum = Math.fround(Math.fround(lanes[0]! + lanes[1]!) + Math.fround(lanes[2]! + lanes[3]!))
          if (!Object.is(sum, c![i * n + j])) differing++
        }
      expect({ m, k, n, differing }).toEqual({ m, k, n, differing: 0 })
    }
  })

  it("matmuls through the SIMD kernels: batched, batches broadcast, the left operand transposed in place, a·bᵀ as dot products, every column count's remainder, as the cpu backend gives them", async () => {
    const t = (shape: number[], seed: number): Tensor => tf.tensor(seeded(shape.reduce((a, b) => a * b, 1), seed), shape)
    const cases: Array<() => Tensor> = [
      () => tf.matMul(t([32, 2, 32, 16], 1), t([32, 2, 16, 32], 2)),
      () => tf.matMul(t([3, 2, 5, 7], 3), t([7, 20], 4)),
      () => tf.matMul(t([6, 7], 5), t([2, 3, 7, 8], 6)),
      () => tf.matMul(t([1, 6, 7], 7), t([4, 7, 12], 8)),
      () => tf.matMul(t([4, 9, 6], 9), t([4, 9, 5], 10), true, false),
      () => tf.matMul(t([4, 6, 9], 11), t([4, 5, 9], 12), false, true),
      () => tf.matMul(t([300, 24], 13), t([300, 40], 14), true, false),
      // a·bᵀ as dot products of rows (k ≥ 32), batched, broadcast, with column counts not a multiple of 4
      () => tf.matMul(t([5, 36], 30), t([7, 36], 31), false, true),
      () => tf.matMul(t([3, 4, 64], 32), t([3, 6, 64], 33), false, true),
      () => tf.matMul(t([2, 4, 32], 34), t([9, 32], 35), false, true),
      // more than 256 rows: b transposed once, then the plain kernel
      () => tf.matMul(t([300, 36], 36), t([12, 36], 37), false, true),
      ...Array.from({ length: 21 }, (_, n) => () => tf.matMul(t([5, 11], 20 + n), t([11, n + 1], 50 + n))),
      // b packed in blocks of 16 columns first (a single product, n a multiple of 16 above 16, b over
      // 16384 floats or its rows 4 KiB apart)
      () => tf.matMul(t([5, 130], 80), t([130, 144], 81)),
      () => tf.matMul(t([9, 6], 82), t([9, 1024], 83), true, false),
      // ... and a's rows in blocks of 256 KiB: 108 rows of 600 floats, three blocks, a read in place or transposed
      () => tf.matMul(t([300, 600], 84), t([600, 32], 85)),
      () => tf.matMul(t([600, 300], 86), t([600, 32], 87), true, false),
      () => tf.matMul(t([3, 0], 15), t([0, 4], 16))
    ]
    for (const f of cases) {
      const before = simdMatMulStats.calls
      await tf.setBackend("wasm")
      const w = f()
      const wv = Float32Array.from((await w.data()) as Float32Array)
      const wshape = w.shape
      expect(simdMatMulStats.calls).toBe(before + 1)
      await tf.setBackend("cpu")
      const c = f()
      expect(wshape).toEqual(c.shape)
      expect(far(wv, (await c.data()) as Float32Array)).toBeLessThan(1e-5)
      tf.dispose([w, c])
    }
    await tf.setBackend("wasm")
    // A right operand that outgrows the caches: the SIMD kernel for a few rows (a training step's
    // batch, whose weights XNNPACK would pack again every step), and packed in blocks of 16 columns
    // at any number of rows; XNNPACK for more than 64 rows where b cannot be packed (matmul.ts).
    const before = simdMatMulStats.calls
    tf.dispose(tf.matMul(t([8, 256], 17), t([256, 256], 18)))
    tf.dispose(tf.matMul(t([200, 256], 17), t([256, 256], 18)))
    tf.dispose(tf.matMul(t([3000, 256], 17), t([256, 256], 18)))
    expect(simdMatMulStats.calls).toBe(before + 3)
    tf.dispose(tf.matMul(t([100, 256], 17), t([256, 250], 18)))
    expect(simdMatMulStats.calls).toBe(before + 3)
  })
})
