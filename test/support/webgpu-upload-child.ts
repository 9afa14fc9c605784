// Child of test/webgpu-upload.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): tensors made on the CPU and used on the webgpu backend with gradwire's
// upload (core/kernels/webgpu-upload.ts) in place, in the orders where a pooled buffer is reused:
// after a read (its last use submitted), while a kernel that reads an earlier upload is still being
// recorded, and many in a row within one command buffer. Also counts the GPU buffers created per
// upload once the pool holds one of that size, with gradwire's upload and with tfjs's own. Prints
// one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { installWebGpuUpload } from "../../core/kernels/webgpu-upload.ts"

const { tf } = await loadEngine("webgpu")
const backend = tf.backend() as unknown as { device: { createBuffer: (d: object) => unknown }; uploadToGPU: unknown }
const installed = Object.hasOwn(backend, "uploadToGPU")
let created = 0
const createBuffer = backend.device.createBuffer.bind(backend.device)
backend.device.createBuffer = (d: object) => {
  created++
  return createBuffer(d)
}

const rand = (n: number, seed: number): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 131 + i * 7.3) * 100)
const same = (a: ArrayLike<number>, b: ArrayLike<number>): boolean => a.length === b.length && Array.from(a).every((x, i) => Math.abs(x - b[i]!) <= 1e-4 * Math.max(1, Math.abs(b[i]!)))
const failures: string[] = []
const check = (what: string, ok: boolean) => void (ok || failures.push(what))

// 1. Every dtype the GPU holds, several sizes (one element, not a multiple of 4, a large one), from
// typed arrays and from plain arrays; a view into a larger buffer (byteOffset) too. Each is combined
// with a tensor already on the GPU: kernels whose inputs are all small CPU tensors run on the CPU
// (tfjs's CPU hand-off), and their values would never be uploaded.
const base = tf.tensor1d(rand(400_000, 0)).add(0)
const zerosOnGpu = (n: number) => base.slice(0, n).mul(0)
for (const n of [1, 3, 17, 4099, 300_000]) {
  const v = rand(n, n)
  check(`float32 ${n}`, same(await tf.tensor1d(v, "float32").add(zerosOnGpu(n)).data(), v))
  const ints = Int32Array.from(v, (x) => Math.round(x))
  check(`int32 ${n}`, same(await tf.tensor1d(ints, "int32").add(zerosOnGpu(n).cast("int32")).data(), ints))
  const bools = Array.from(v, (x) => x > 0)
  check(`bool ${n}`, same(await tf.logicalAnd(tf.tensor1d(bools, "bool"), zerosOnGpu(n).equal(0)).cast("int32").data(), bools.map((b) => (b ? 1 : 0))))
}
const big = rand(64, 5)
const view = big.subarray(16, 48)
check("a view with a byte offset", same(await tf.tensor1d(view).add(zerosOnGpu(32)).data(), view))
check("a plain array", same(await tf.tensor2d([[1, 2], [3, 4]]).add(zerosOnGpu(4).reshape([2, 2])).sum().data(), [10]))

// 2. A pooled buffer reused after its last use was submitted: upload, read, dispose, upload again
// the same size (tfjs's pool hands the same buffer back), and the new values are what is read.
for (let i = 0; i < 5; i++) {
  const v = rand(1024, 100 + i)
  const t = tf.tensor1d(v)
  const r = t.mul(2)
  check(`reuse after a read ${i}`, same(await r.data(), v.map((x) => x * 2)))
  tf.dispose([t, r])
}

// 3. Within one command buffer: a kernel reading upload A is recorded, A is disposed (its buffer
// is held until the submit), B of the same size is uploaded and used, and both results are right.
{
  const va = rand(2048, 7)
  const vb = rand(2048, 8)
  const a = tf.tensor1d(va)
  const ra = a.add(1)
  a.dispose()
  const b = tf.tensor1d(vb)
  const rb = b.sub(1)
  const [da, db] = await Promise.all([ra.data(), rb.data()])
  check("A recorded then disposed before B's upload", same(da, va.map((x) => x + 1)))
  check("B uploaded while A's kernel was unsubmitted", same(db, vb.map((x) => x - 1)))
  tf.dispose([ra, rb])
}

// 4. Many uploads chained in one command buffer (more than tfjs's 15 kernels per submit), read once.
{
  let acc: TfType.Tensor = zerosOnGpu(512)
  let want = new Float32Array(512)
  for (let i = 0; i < 40; i++) {
    const v = rand(512, 200 + i)
    const next = tf.tidy(() => acc.add(tf.tensor1d(v)))
    acc.dispose()
    acc = next
    want = want.map((x, k) => x + v[k]!)
  }
  check("40 chained uploads", same(await acc.data(), want))
  acc.dispose()
}

// 5. GPU buffers created per upload of a size the pool already holds: gradwire's upload, then tfjs's.
const perUpload = async (): Promise<number> => {
  const v = rand(4096, 1)
  for (let i = 0; i < 3; i++) {
    const t = tf.tensor1d(v)
    const r = t.add(0)
    await r.data()
    tf.dispose([t, r])
  }
  created = 0
  for (let i = 0; i < 20; i++) {
    const t = tf.tensor1d(v)
    const r = t.add(0)
    await r.data()
    tf.dispose([t, r])
  }
  return created / 20
}
const ours = await perUpload()
delete (backend as { uploadToGPU?: unknown }).uploadToGPU
const tfjs = await perUpload()
installWebGpuUpload(tf)
const again = Object.hasOwn(backend, "uploadToGPU")

console.log(JSON.stringify({ backend: tf.getBackend(), installed, again, failures, ours, tfjs }))
process.exit(0)
