// How much of a webgpu training step is the CPU recording kernels, and what gradwire's changes to
// tfjs's webgpu backend save: the zoo's benchmark step in plain tfjs (bench/zoo-plain.ts's loop),
// timed in one process with each way of uploading and recording, alternated round by round so that
// drift hits every way alike:
//   tfjs        tfjs-backend-webgpu 4.22 as it ships (a staging buffer per upload; a uniform write
//               and a bind group per kernel; a submit every 15 kernels)
//   +upload     gradwire's upload into pooled buffers (core/kernels/webgpu-upload.ts)
//   +dispatch   and gradwire's recording, uniforms and bind groups reused, the buffer pool in a
//               fixed order (core/kernels/webgpu-dispatch.ts)
//   +submit64   and a submit every 64 kernels (tfjs's WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE): what
//               gradwire's webgpu workers run (core/engine.ts)
// Then, with --breakdown, the time of each WebGPU call per kernel with tfjs's own recording, and
// with --profile DIR, a CPU profile of the +dispatch way's steps per model (DIR/MODEL.cpuprofile).
//
//   node bench/webgpu-recording.ts [--models mlp,cnn,resnet,lstm] [--batch 32] [--rounds 2] [--seconds 1] [--breakdown] [--profile DIR]
//
// Prints a table of ms per step (the median over rounds) and CPU ms per step. Needs the webgpu
// backend (a GPU, or SwiftShader with GRADWIRE_WEBGPU_SOFTWARE=1, where the GPU's work is the CPU's).
import { optionReader } from "./args.ts"
import { loadEngine } from "../index.ts"
import type { ZooModel } from "../examples/zoo/models.ts"
import { plainZooStep } from "./zoo-step.ts"

const args = process.argv.slice(2)
const option = optionReader(args)
const opt = (name: string, fallback: string): string => option(`--${name}`, fallback)
const models = opt("models", "mlp,cnn,resnet,lstm").split(",") as ZooModel[]
const batch = Number(opt("batch", "32"))
const rounds = Number(opt("rounds", "2"))
const seconds = Number(opt("seconds", "1"))

const { tf } = await loadEngine("webgpu")
type Patched = { uploadToGPU?: unknown; recordAndSubmit?: unknown; submitQueue?: unknown }
const backend = tf.backend() as unknown as Patched & { device: object; queue: object; bufferManager: { releaseBuffer?: unknown } }
const WAYS = ["tfjs", "+upload", "+dispatch", "+submit64"] as const
type Way = (typeof WAYS)[number]
// gradwire's methods, as the engine installed them on the backend instance (their caches stay warm
// from round to round, as in a long run); tfjs's come back from the prototype once these are deleted.
const ours = {
  upload: backend.uploadToGPU,
  record: backend.recordAndSubmit,
  submit: backend.submitQueue,
  release: backend.bufferManager.releaseBuffer
}
if (![ours.upload, ours.record, ours.submit, ours.release].every((f) => typeof f === "function")) {
  throw new Error("gradwire's webgpu upload and recording are not installed on this backend (core/engine.ts installs them)")
}
const use = (way: Way): void => {
  delete backend.uploadToGPU
  delete backend.recordAndSubmit
  delete backend.submitQueue
  delete backend.bufferManager.releaseBuffer
  tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", way === "+submit64" ? 64 : 15)
  if (way !== "tfjs") backend.uploadToGPU = ours.upload
  if (way === "+dispatch" || way === "+submit64") {
    backend.recordAndSubmit = ours.record
    backend.submitQueue = ours.submit
    backend.bufferManager.releaseBuffer = ours.release
  }
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
console.log(`webgpu recording, batch ${batch}, ${rounds} rounds of about ${seconds} s per way (ms per step; CPU ms per step)`)
console.log(["model", ...WAYS, "tfjs / +dispatch"].join(" | "))
for (const model of models) {
  const { step, dispose } = await plainZooStep(tf, model, batch)
  // Warm every way once (shader compiles, pools), and size the runs from the slowest.
  let slowest = 0
  for (const way of WAYS) {
    use(way)
    for (let s = 0; s < 3; s++) await step()
    const t0 = performance.now()
    await step()
    slowest = Math.max(slowest, performance.now() - t0)
  }
  const steps = Math.max(3, Math.round((seconds * 1000) / slowest))
  const wall = new Map<Way, number[]>(WAYS.map((w) => [w, []]))
  const cpu = new Map<Way, number[]>(WAYS.map((w) => [w, []]))
  for (let r = 0; r < rounds; r++) {
    for (const way of r % 2 === 0 ? WAYS : [...WAYS].reverse()) {
      use(way)
      await step()
      const c0 = process.cpuUsage()
      const t0 = performance.now()
      for (let s = 0; s < steps; s++) await step()
      const c = process.cpuUsage(c0)
      wall.get(way)!.push((performance.now() - t0) / steps)
      cpu.get(way)!.push((c.user + c.system) / 1000 / steps)
    }
  }
  const cells = WAYS.map((w) => `${median(wall.get(w)!).toFixed(2)} (${median(cpu.get(w)!).toFixed(2)})`)
  console.log([`${model} (${steps} steps)`, ...cells, `${(median(wall.get("tfjs")!) / median(wall.get("+dispatch")!)).toFixed(2)}x`].join(" | "))

  if (args.includes("--breakdown")) {
    // Where tfjs's own recording spends its time, per kernel: each WebGPU call timed.
    use("tfjs")
    const spent = new Map<string, number>()
    let kernels = 0
    const undo: Array<() => void> = []
    const time = (obj: Record<string, unknown>, name: string, label = name): void => {
      const own = obj[name] as (...a: unknown[]) => unknown
      if (typeof own !== "function") return
      obj[name] = function (this: unknown, ...a: unknown[]) {
        const t = performance.now()
        try {
          return own.apply(this, a)
        } finally {
          spent.set(label, (spent.get(label) ?? 0) + performance.now() - t)
        }
      }
      undo.push(() => void (obj[name] = own))
    }
    const b = backend as unknown as Record<string, unknown>
    const recordOwn = b.recordAndSubmit as (...a: unknown[]) => unknown
    b.recordAndSubmit = function (this: unknown, ...a: unknown[]) {
      kernels++
      return recordOwn.apply(this, a)
    }
    time(b, "recordAndSubmit", "recordAndSubmit (all of it)")
    time(b, "makeUniforms", "makeUniforms (pool + write)")
    time(b, "uploadToGPU")
    time(b, "submitQueue", "submitQueue (finish + submit)")
    time(backend.device as Record<string, unknown>, "createBindGroup")
    time(backend.device as Record<string, unknown>, "createBuffer")
    time(backend.queue as Record<string, unknown>, "writeBuffer")
    for (let s = 0; s < 2; s++) await step()
    kernels = 0
    spent.clear()
    const t0 = performance.now()
    for (let s = 0; s < steps; s++) await step()
    const total = performance.now() - t0
    for (const u of undo.reverse()) u()
    delete b.recordAndSubmit
    console.log(`  ${model}: ${(kernels / steps).toFixed(0)} kernels recorded per step, ${((total / kernels) * 1000).toFixed(1)} µs of the step per kernel; per kernel:`)
    for (const [k, t] of [...spent].sort((p, q) => q[1] - p[1])) console.log(`    ${k}: ${((t / kernels) * 1000).toFixed(1)} µs`)
  }
  const profileDir = opt("profile", "")
  if (profileDir) {
    use("+dispatch")
    for (let s = 0; s < 2; s++) await step()
    const { Session } = await import("node:inspector/promises")
    const session = new Session()
    session.connect()
    await session.post("Profiler.enable")
    await session.post("Profiler.start")
    for (let s = 0; s < steps; s++) await step()
    const { profile } = await session.post("Profiler.stop")
    session.disconnect()
    const fs = await import("node:fs")
    fs.mkdirSync(profileDir, { recursive: true })
    fs.writeFileSync(`${profileDir}/${model}.cpuprofile`, JSON.stringify(profile))
  }
  dispose()
}
process.exit(0)
