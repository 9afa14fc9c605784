// How the webgpu backend records one kernel: with its uniforms and its bind group reused from
// earlier steps, instead of tfjs-backend-webgpu 4.22's way, which for every kernel takes a uniform
// buffer from its pool, writes the kernel's uniforms into it (queue.writeBuffer), asks the pipeline
// for its bind group layout and creates a new bind group. A training step runs the same kernels on
// the same shapes every step, and tfjs's buffer pool hands the same buffers back in the same order,
// so the uniforms' bytes and the bind groups repeat. On SwiftShader (this repository's CI adapter)
// those four calls took 25 of the 35 µs that recording a kernel costs (createBindGroup alone 13 µs);
// on a real GPU the CPU recording kernels is what limits tfjs (docs/gpu-and-backends.md).
//
// - Uniforms: one GPU buffer per distinct content, written once when made and never again, so no
//   write can race a command that reads it. The uniforms are laid out exactly as tfjs's makeUniforms
//   lays them out (WGSL's alignments). At UNIFORM_LIMIT contents the cache starts over: the old
//   buffers are destroyed after the next submit, once no unsubmitted command can use them.
// - Bind groups: keyed by the pipeline and the buffers bound. tfjs never destroys a tensor's buffer
//   (its pool keeps each one until the backend is disposed), so a cached bind group never names a
//   destroyed buffer; it is dropped with the uniforms it binds.
// Kernels that bind a texture, that tfjs times (tf.profile with timestamp queries) and the pixel
// programs keep tfjs's own recording. The submit rule is tfjs's (WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE).
//
// Installed on the backend instance once webgpu is up (`../engine.ts`), next to the upload
// (`webgpu-upload.ts`); it leaves tfjs's recording in place when the backend lacks what it relies on.
import type { Tf } from "../tf.ts"
import type { PassEncoder, Pipeline } from "./webgpu-types.ts"

interface Buffer {
  readonly size: number
  readonly usage: number
  destroy(): void
}
interface Device {
  createBuffer(d: { size: number; usage: number }): Buffer
  createBindGroup(d: { layout: unknown; entries: ReadonlyArray<{ binding: number; resource: unknown }> }): unknown
}
interface TensorInfo {
  dataId: object
  shape: number[]
}
interface Uniform {
  type: string
  data: ArrayLike<number>
}
interface Program {
  pipeline: Pipeline | Promise<Pipeline>
  pixelsOpType?: unknown
  size?: boolean
  outputShape: number[]
  outputComponent?: number
  dispatch: [number, number, number]
}
type Record = ((program: Program, output: TensorInfo, inputs: TensorInfo[], uniforms?: Uniform[]) => void) & { [PATCHED]?: true }
interface WebGpuBackend {
  device: Device
  queue: { writeBuffer(b: Buffer, offset: number, data: ArrayBufferLike, dataOffset: number, size: number): void }
  tensorMap: { get(id: object): { resource?: unknown } | undefined }
  commandEncoder: { beginComputePass(d: object): PassEncoder } | null
  computePassEncoder: PassEncoder | null
  dispatchCountInPass: number
  activeTimers?: unknown
  commandQueueOwnedIds: WeakSet<object>
  ensureCommandEncoderReady(): void
  endComputePassEncoder(): void
  submitQueue: (() => void) & { [PATCHED]?: true }
  recordAndSubmit: Record
  bufferManager?: {
    freeBuffers: Map<string, Buffer[]>
    releaseBuffer(buffer: Buffer, reuse?: boolean): void
  }
  [STATS]?: DispatchStats
}

/** Marks gradwire's methods, so that a second install keeps the first. */
const PATCHED = Symbol.for("gradwire.webgpuDispatch")

/** GPUBufferUsage's UNIFORM | COPY_DST. */
const UNIFORM_USAGE = 0x0040 | 0x0008
/** Distinct uniform contents kept before the cache starts over (a few hundred per model in practice). */
export const UNIFORM_LIMIT = 4096
/** Bind groups kept before that cache starts over. */
export const BIND_GROUP_LIMIT = 16384

const looksLikeTfjsWebGpu = (b: Partial<WebGpuBackend>): b is WebGpuBackend =>
  typeof b.recordAndSubmit === "function" &&
  typeof b.submitQueue === "function" &&
  typeof b.ensureCommandEncoderReady === "function" &&
  typeof b.endComputePassEncoder === "function" &&
  typeof b.tensorMap?.get === "function" &&
  typeof b.device?.createBindGroup === "function" &&
  typeof b.queue?.writeBuffer === "function" &&
  b.commandQueueOwnedIds instanceof WeakSet

/** Where each field of `fields` goes in the uniform struct and its size: WGSL's alignment rules, as tfjs's makeUniforms applies them. */
export const uniformLayout = (lengths: ReadonlyArray<number>): { offsets: number[]; size: number } => {
  const offsets: number[] = []
  let at = 0
  let largest = 1
  let previous = 0
  for (const raw of lengths) {
    const n = raw === 0 ? 1 : raw
    if (n > 6) throw new Error(`a webgpu uniform of ${n} numbers: tfjs's uniforms hold at most 6`)
    // vec2 aligns to 8 bytes, vec3/vec4 and tfjs's 5- and 6-number arrays to 16, and so does whatever follows a 5 or 6.
    const align = previous === 5 || previous === 6 ? 16 : n === 1 ? 4 : n === 2 ? 8 : 16
    if (align > largest) largest = align
    at = Math.ceil(at / align) * align
    offsets.push(at)
    at += n * 4
    previous = n
  }
  return { offsets, size: Math.ceil(at / largest) * largest }
}

/** A small integer per object, for cache keys. */
const idsOf = (): ((o: object) => number) => {
  const ids = new WeakMap<object, number>()
  let next = 0
  return (o) => {
    let id = ids.get(o)
    if (id === undefined) ids.set(o, (id = ++next))
    return id
  }
}

export interface DispatchStats {
  /** Kernels recorded by gradwire's path. */
  kernels: number
  /** Uniform buffers made (one per distinct content). */
  uniformsMade: number
  /** Bind groups made. */
  bindGroupsMade: number
  /** Times the caches started over. */
  restarts: number
}
const STATS = Symbol.for("gradwire.webgpuDispatchStats")

/** The counters of the webgpu dispatch cache on `tf`'s backend, or undefined where it is not installed. */
export const webGpuDispatchStats = (tf: Tf): DispatchStats | undefined =>
  (tf.backend() as unknown as { [STATS]?: DispatchStats })[STATS]

/**
 * Makes the webgpu backend of `tf` reuse kernels' uniforms and bind groups across steps.
 * Returns whether it did (false on another backend, or a tfjs whose webgpu backend differs).
 * `limits` are for tests: the cache sizes at which each cache starts over.
 */
export const installWebGpuDispatch = (tf: Tf, limits: { uniforms?: number; bindGroups?: number } = {}): boolean => {
  const uniformLimit = limits.uniforms ?? UNIFORM_LIMIT
  const bindGroupLimit = limits.bindGroups ?? BIND_GROUP_LIMIT
  if (tf.getBackend() !== "webgpu") return false
  const backend = tf.backend() as unknown as Partial<WebGpuBackend>
  if (!looksLikeTfjsWebGpu(backend)) return false
  if (backend.recordAndSubmit[PATCHED]) return true
  const own = backend.recordAndSubmit.bind(backend)
  const ownSubmit = backend.submitQueue.bind(backend)
  const device = backend.device
  const id = idsOf()
  const stats: DispatchStats = { kernels: 0, uniformsMade: 0, bindGroupsMade: 0, restarts: 0 }
  backend[STATS] = stats
  let uniforms = new Map<string, Buffer>()
  let groups = new Map<string, unknown>()
  const layouts = new WeakMap<Pipeline, unknown>()
  let retired: Buffer[] = []
  // The uniforms are written here first; their bytes, as 16-bit codes, are the cache's key.
  let scratch = new ArrayBuffer(256)

  const startOver = (): void => {
    for (const b of uniforms.values()) retired.push(b)
    uniforms = new Map()
    groups = new Map()
    stats.restarts++
  }

  const uniformBuffer = (fields: ReadonlyArray<Uniform>): Buffer => {
    const { offsets, size } = uniformLayout(fields.map((f) => f.data.length))
    if (scratch.byteLength < size) scratch = new ArrayBuffer(Math.max(size, scratch.byteLength * 2))
    new Uint8Array(scratch, 0, size).fill(0)
    fields.forEach((f, i) => {
      const data = f.data.length === 0 ? [1] : f.data
      const view = f.type === "int32" ? new Int32Array(scratch, offsets[i], data.length) : f.type === "uint32" ? new Uint32Array(scratch, offsets[i], data.length) : new Float32Array(scratch, offsets[i], data.length)
      view.set(data)
    })
    const key = String.fromCharCode.apply(null, new Uint16Array(scratch, 0, size / 2) as unknown as number[])
    let buffer = uniforms.get(key)
    if (buffer === undefined) {
      if (uniforms.size >= uniformLimit) startOver()
      buffer = device.createBuffer({ size, usage: UNIFORM_USAGE })
      backend.queue.writeBuffer(buffer, 0, scratch, 0, size)
      uniforms.set(key, buffer)
      stats.uniformsMade++
    }
    return buffer
  }

  const record: Record = (program, output, inputs, programDefinedUniform) => {
    if (program.pipeline instanceof Promise || program.pixelsOpType != null || backend.activeTimers != null) {
      return own(program, output, inputs, programDefinedUniform)
    }
    const buffers: Buffer[] = []
    for (const t of [output, ...inputs]) {
      const resource = backend.tensorMap.get(t.dataId)?.resource as Buffer | undefined
      // A texture (or anything but a plain buffer): tfjs's own recording.
      if (resource == null || typeof (resource as { mapAsync?: unknown }).mapAsync !== "function") {
        return own(program, output, inputs, programDefinedUniform)
      }
      buffers.push(resource)
    }
    // The uniforms tfjs gives every kernel: NaN, Infinity, each input's and the output's shape and
    // strides, the output's size when the program asks for it, then the program's own.
    const fields: Uniform[] = [{ type: "float32", data: [NaN] }, { type: "float32", data: [Infinity] }]
    for (const t of [...inputs, output]) {
      fields.push({ type: "int32", data: t.shape }, { type: "int32", data: tf.util.computeStrides(t.shape) })
    }
    if (program.size) {
      const size = tf.util.sizeFromShape(program.outputShape)
      fields.push({ type: "int32", data: [program.outputComponent ? size / program.outputComponent : size] })
    }
    if (programDefinedUniform) fields.push(...programDefinedUniform)
    const uniform = uniformBuffer(fields)
    const pipeline = program.pipeline
    let key = `${id(pipeline)}:${id(uniform)}`
    for (const b of buffers) key += `,${id(b)}`
    let group = groups.get(key)
    if (group === undefined) {
      let layout = layouts.get(pipeline)
      if (layout === undefined) layouts.set(pipeline, (layout = pipeline.getBindGroupLayout(0)))
      const entries = buffers.map((buffer, binding) => ({ binding, resource: { buffer } }))
      entries.push({ binding: entries.length, resource: { buffer: uniform } })
      group = device.createBindGroup({ layout, entries })
      if (groups.size >= bindGroupLimit) groups = new Map()
      groups.set(key, group)
      stats.bindGroupsMade++
    }
    // As tfjs does: a buffer the pending commands use goes back to the pool only after the submit.
    for (const t of inputs) backend.commandQueueOwnedIds.add(t.dataId)
    backend.commandQueueOwnedIds.add(output.dataId)
    backend.ensureCommandEncoderReady()
    backend.computePassEncoder ??= backend.commandEncoder!.beginComputePass({})
    const pass = backend.computePassEncoder
    pass.setPipeline(pipeline)
    pass.setBindGroup(0, group)
    pass.dispatchWorkgroups(program.dispatch[0], program.dispatch[1], program.dispatch[2])
    stats.kernels++
    backend.dispatchCountInPass++
    if ((tf.env().get("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE") as number) <= backend.dispatchCountInPass) {
      backend.endComputePassEncoder()
      backend.submitQueue()
    }
  }

  const submit = (): void => {
    ownSubmit()
    // Submitted: no command still to be submitted can name these.
    if (retired.length > 0) {
      for (const b of retired) b.destroy()
      retired = []
    }
  }
  // tfjs's pool hands out the buffer released last (a stack per size). Which one that is shifts
  // from step to step with the moments tfjs submits, so the same kernel of the next step binds other
  // buffers and its bind group misses. Kept in order of the buffers' ids instead, the pool hands out
  // the lowest id free, and a step that frees and takes the same buffers takes them in the same
  // places: the bind groups repeat within a few steps.
  const pool = backend.bufferManager
  if (pool && typeof pool.releaseBuffer === "function" && pool.freeBuffers instanceof Map && !(pool.releaseBuffer as { [PATCHED]?: true })[PATCHED]) {
    const ownRelease = pool.releaseBuffer.bind(pool)
    const release = (buffer: Buffer, reuse = true): void => {
      ownRelease(buffer, reuse)
      const free = reuse ? pool.freeBuffers.get(`${buffer.size}_${buffer.usage}`) : undefined
      // tfjs pushed it last; acquireBuffer pops from the end, so the list runs from the highest id to the lowest.
      if (!free || free.length < 2 || free[free.length - 1] !== buffer) return
      const mine = id(buffer)
      let lo = 0
      let hi = free.length - 1
      while (lo < hi) {
        const mid = (lo + hi) >> 1
        if (id(free[mid]!) > mine) lo = mid + 1
        else hi = mid
      }
      if (lo < free.length - 1) {
        free.pop()
        free.splice(lo, 0, buffer)
      }
    }
    pool.releaseBuffer = Object.assign(release, { [PATCHED]: true as const })
  }
  backend.recordAndSubmit = Object.assign(record, { [PATCHED]: true as const })
  backend.submitQueue = Object.assign(submit, { [PATCHED]: true as const })
  return true
}
