// tfjs's Adam update on the webgpu backend as one compute dispatch per variable (and one for
// accBeta1/2), instead of about thirteen tfjs kernels per variable. On a real GPU a tfjs kernel
// costs about 0.2 ms of the CPU to record (a uniform buffer, a bind group, the pass; measured on an
// H200 through Dawn/Vulkan: Adam's kernels took 12 ms of a 21 ms step for the zoo's 4-variable MLP,
// more than its forward and backward), so the update was bound by recording, not by the GPU.
//
// The weights and the moments are updated in place in their GPU buffers, in tfjs's order of float32
// operations (a GPU may fuse a multiply and an add, so the result can differ from applyGradients in
// the last bit; the test bounds it). The state stays tfjs's own (the optimizer's moment variables
// and accBeta1/2), so getWeights(), checkpoints and a switch back to applyGradients see the same
// optimizer. It declines (returns false) on another backend or optimizer, when a buffer it would
// write is shared with another tensor (a clone or a reshape), while tfjs's profiler times kernels,
// and when tfjs's backend lacks what it relies on (tfjs-backend-webgpu 4.x internals).
import type { Tf } from "../tf.ts"
import { adamToFuse } from "./fused-adam.ts"
import type { BindGroupLayout, PassEncoder, Pipeline } from "./webgpu-types.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

// The WebGPU objects this file touches, as far as it touches them.
interface Buffer {
  readonly size: number
  getMappedRange(): ArrayBuffer
}
interface Device {
  createShaderModule(d: { code: string }): unknown
  createComputePipeline(d: { layout: "auto"; compute: { module: unknown; entryPoint: string } }): Pipeline
  createBindGroup(d: { layout: BindGroupLayout; entries: ReadonlyArray<{ binding: number; resource: unknown }> }): unknown
  readonly limits: { readonly maxComputeWorkgroupsPerDimension: number }
}
interface TensorData {
  values: unknown
  resource?: unknown
  refCount: number
  dtype: string
}
interface WebGpuBackend {
  device: Device
  tensorMap: { get(id: object): TensorData | undefined }
  commandEncoder: { beginComputePass(d: object): PassEncoder } | null
  computePassEncoder: PassEncoder | null
  dispatchCountInPass: number
  activeTimers?: unknown
  commandQueueOwnedIds: WeakSet<object>
  uploadToGPU(id: object): void
  ensureCommandEncoderReady(): void
  endComputePassEncoder(): void
  submitQueue(): void
  makeUniforms(u: ReadonlyArray<{ type: "float32"; data: number[] }>): { offset: number; size: number; buffer: Buffer }
}

const WORKGROUP = 256

const UPDATE = /* wgsl */ `
struct Params { b1: f32, b2: f32, c1: f32, c2: f32, eps: f32, negLr: f32, n: f32, pad: f32 }
@group(0) @binding(0) var<storage, read_write> p: array<f32>;
@group(0) @binding(1) var<storage, read_write> m: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read> acc1: array<f32>;
@group(0) @binding(5) var<storage, read> acc2: array<f32>;
@group(0) @binding(6) var<uniform> u: Params;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = gid.x + gid.y * groups.x * ${WORKGROUP}u;
  if (i >= arrayLength(&p)) { return; }
  let d1 = 1.0 - acc1[0];
  let d2 = 1.0 - acc2[0];
  let gk = g[i];
  let mk = m[i] * u.b1 + gk * u.c1;
  let vk = v[i] * u.b2 + (gk * gk) * u.c2;
  m[i] = mk;
  v[i] = vk;
  p[i] = ((mk / d1) / (sqrt(vk / d2) + u.eps)) * u.negLr + p[i];
}`

const ACC = /* wgsl */ `
struct Params { b1: f32, b2: f32, c1: f32, c2: f32, eps: f32, negLr: f32, n: f32, pad: f32 }
@group(0) @binding(0) var<storage, read_write> acc1: array<f32>;
@group(0) @binding(1) var<storage, read_write> acc2: array<f32>;
@group(0) @binding(2) var<uniform> u: Params;
@compute @workgroup_size(1)
fn main() {
  acc1[0] = acc1[0] * u.b1;
  acc2[0] = acc2[0] * u.b2;
}`

const pipelines = new WeakMap<Device, { update: Pipeline; acc: Pipeline }>()

const pipelinesOf = (device: Device): { update: Pipeline; acc: Pipeline } => {
  let p = pipelines.get(device)
  if (!p) {
    const make = (code: string) => device.createComputePipeline({ layout: "auto", compute: { module: device.createShaderModule({ code }), entryPoint: "main" } })
    p = { update: make(UPDATE), acc: make(ACC) }
    pipelines.set(device, p)
  }
  return p
}

const f = Math.fround

/** Applies `grads` (by variable name) as `optimizer.applyGradients(grads)` would; false if it cannot. */
export const fusedAdamStepWebGpu = (tf: Tf, optimizer: unknown, grads: Readonly<Record<string, Tensor>>): boolean => {
  if (tf.getBackend() !== "webgpu") return false
  const backend = tf.backend() as unknown as WebGpuBackend
  if (
    !backend.device ||
    !backend.tensorMap ||
    typeof backend.uploadToGPU !== "function" ||
    typeof backend.makeUniforms !== "function" ||
    typeof backend.ensureCommandEncoderReady !== "function" ||
    typeof backend.submitQueue !== "function" ||
    backend.activeTimers != null
  )
    return false
  const ready = adamToFuse(tf, optimizer, grads, (t) => backend.tensorMap.get(t.dataId)?.refCount === 1)
  if (!ready) return false
  const { opt, names, registered } = ready
  // Every tensor on the GPU first: an upload ends the compute pass.
  const written: Tensor[] = [opt.accBeta1, opt.accBeta2]
  const read: Tensor[] = []
  names.forEach((name, i) => {
    if (!grads[name]) return
    written.push(registered[name]!, opt.accumulatedFirstMoment[i]!.variable, opt.accumulatedSecondMoment[i]!.variable)
    read.push(grads[name])
  })
  const used = [...written, ...read]
  for (const t of used) backend.uploadToGPU(t.dataId)
  const bufferOf = (t: Tensor): Buffer | undefined => {
    const r = backend.tensorMap.get(t.dataId)?.resource as Buffer | undefined
    return r && typeof r.getMappedRange === "function" ? r : undefined
  }
  if (used.some((t) => !bufferOf(t))) return false
  const device = backend.device
  const { update, acc } = pipelinesOf(device)
  const uniforms = backend.makeUniforms(
    [opt.beta1, opt.beta2, 1 - opt.beta1, 1 - opt.beta2, opt.epsilon, -opt.learningRate, 0, 0].map((x) => ({ type: "float32" as const, data: [f(x)] }))
  )
  const bind = (t: Tensor) => ({ buffer: bufferOf(t)!, offset: 0, size: t.size * 4 })
  const maxX = device.limits.maxComputeWorkgroupsPerDimension
  backend.ensureCommandEncoderReady()
  backend.computePassEncoder ??= backend.commandEncoder!.beginComputePass({})
  const pass = backend.computePassEncoder
  let dispatches = 0
  names.forEach((name, i) => {
    const g = grads[name]
    if (!g) return
    const p = registered[name]!
    const m = opt.accumulatedFirstMoment[i]!.variable
    const v = opt.accumulatedSecondMoment[i]!.variable
    const group = device.createBindGroup({
      layout: update.getBindGroupLayout(0),
      entries: [bind(p), bind(m), bind(v), bind(g), bind(opt.accBeta1), bind(opt.accBeta2), uniforms].map((resource, binding) => ({ binding, resource }))
    })
    const groups = Math.ceil(p.size / WORKGROUP)
    const x = Math.min(groups, maxX)
    pass.setPipeline(update)
    pass.setBindGroup(0, group)
    pass.dispatchWorkgroups(x, Math.ceil(groups / x))
    dispatches++
  })
  const accGroup = device.createBindGroup({
    layout: acc.getBindGroupLayout(0),
    entries: [bind(opt.accBeta1), bind(opt.accBeta2), uniforms].map((resource, binding) => ({ binding, resource }))
  })
  pass.setPipeline(acc)
  pass.setBindGroup(0, accGroup)
  pass.dispatchWorkgroups(1)
  dispatches++
  // Written on the GPU: a value cached on the CPU by an earlier read is stale now.
  for (const t of written) backend.tensorMap.get(t.dataId)!.values = null
  // As tfjs's own kernels do: a buffer the pending commands use is not reused before they are submitted.
  for (const t of used) backend.commandQueueOwnedIds.add(t.dataId)
  backend.dispatchCountInPass += dispatches
  if ((tf.env().get("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE") as number) <= backend.dispatchCountInPass) {
    backend.endComputePassEncoder()
    backend.submitQueue()
  }
  opt.incrementIterations()
  return true
}
