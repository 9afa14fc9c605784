// What gradwire's fused layer kernels share (lstm-cell.ts, layer-norm.ts, batch-norm-train.ts):
// one host computation serving as both the wasm and the cpu kernel, running a WGSL program on the
// webgpu backend, registering a forward kernel and its gradient kernel on every backend that has
// them, and replacing a tfjs-layers class's `call` (keeping tfjs-layers' own for the cases a kernel
// does not cover, and for tests that compare the two).
import type { Tf } from "../tf.ts"
import { addressOf, heapKernels, type HeapKernels } from "./heap-simd.ts"
import { floats, type KernelArgs, type TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The prototype of a tfjs-layers class by its registered class name ("LSTM", "LayerNormalization"),
 * from tfjs's serialization registry: creating a layer to reach its prototype would take one of
 * tfjs-layers' automatic names ("lstm_LSTM1"), and every layer a user makes after it would be named
 * one further on. */
export const layerPrototype = <T>(tf: Tf, className: string): T | undefined => {
  const entry = (tf.serialization.SerializationMap.getMap().classNameMap as Record<string, [unknown, unknown] | undefined>)[className]
  const cls = entry?.[0] as { prototype?: T } | undefined
  return cls?.prototype
}

/** The cpu backend, as far as the kernels use it. */
interface CpuBackend {
  data: { get(id: object): { values: unknown } | undefined }
  makeTensorInfo(shape: number[], dtype: string, values: Float32Array): TensorInfo
}
type CpuArgs = { inputs: Record<string, TensorInfo>; backend: CpuBackend; attrs: Record<string, unknown> }

/** A float32 tensor's values on the cpu backend. */
const cpuValues = (backend: CpuBackend, t: TensorInfo): Float32Array => {
  const v = backend.data.get(t.dataId)?.values
  return v instanceof Float32Array ? v : Float32Array.from(v as ArrayLike<number>)
}

/** A float32 computation on the host: it reads the inputs `names` (in that order) and writes outputs of the shapes `shapes` gives. */
export interface HostKernel {
  names: string[]
  shapes: (inputs: Record<string, TensorInfo>, attrs: Record<string, unknown>) => number[][]
  compute: (ins: Float32Array[], outs: Float32Array[], attrs: Record<string, unknown>, inputs: Record<string, TensorInfo>) => void
  /**
   * The same computation by gradwire's SIMD kernels on the wasm heap (heap-simd.ts), given the
   * inputs' and outputs' byte addresses there; false where it does not apply (then `compute` runs).
   */
  heap?: (kernels: HeapKernels, ins: number[], outs: number[], attrs: Record<string, unknown>, inputs: Record<string, TensorInfo>, scratch: number) => boolean
  /** Floats of scratch the heap kernel wants (its address the last argument of `heap`; freed after the call). */
  scratch?: (inputs: Record<string, TensorInfo>) => number
}

/** `k` as the wasm kernel (on its heap; its SIMD form where it has one) and as the cpu kernel; one output is returned as itself, several as a list. */
export const hostKernels = (k: HostKernel): readonly [unknown, unknown] => {
  const result = (outs: TensorInfo[]): TensorInfo | TensorInfo[] => (outs.length === 1 ? outs[0]! : outs)
  const wasm = ({ inputs, backend, attrs }: KernelArgs): TensorInfo | TensorInfo[] => {
    // Every output made before any view is taken: a new output can grow the heap and detach earlier views.
    const outs = k.shapes(inputs, attrs).map((shape) => backend.makeOutput(shape, "float32"))
    const kernels = k.heap && heapKernels(backend)
    if (kernels) {
      const scratch = k.scratch ? backend.makeOutput([k.scratch(inputs)], "float32") : undefined
      try {
        if (
          k.heap!(
            kernels,
            k.names.map((n) => addressOf(backend, inputs[n]!)),
            outs.map((o) => addressOf(backend, o)),
            attrs,
            inputs,
            scratch ? addressOf(backend, scratch) : 0
          )
        )
          return result(outs)
      } finally {
        if (scratch) backend.disposeData(scratch.dataId)
      }
    }
    k.compute(
      k.names.map((n) => floats(backend, inputs[n]!)),
      outs.map((o) => floats(backend, o)),
      attrs,
      inputs
    )
    return result(outs)
  }
  const cpu = ({ inputs, backend, attrs }: CpuArgs): TensorInfo | TensorInfo[] => {
    const shapes = k.shapes(inputs, attrs)
    const outs = shapes.map((shape) => new Float32Array(shape.reduce((a, b) => a * b, 1)))
    k.compute(
      k.names.map((n) => cpuValues(backend, inputs[n]!)),
      outs,
      attrs,
      inputs
    )
    return result(outs.map((values, i) => backend.makeTensorInfo(shapes[i]!, "float32", values)))
  }
  return [wasm, cpu]
}

/** The webgpu backend, as far as the kernels use it. */
export interface WebGpuBackend {
  runWebGPUProgram(program: object, inputs: TensorInfo[], dtype: string, uniforms?: Array<{ type: string; data: number[] }>): TensorInfo
  disposeData(dataId: object): void
}
export type WebGpuArgs = { inputs: Record<string, TensorInfo>; backend: WebGpuBackend; attrs: Record<string, unknown> }
const WORKGROUP = 64

/**
 * Runs a WGSL program through tfjs's runWebGPUProgram (so gradwire's recording, uploads and pools
 * apply: webgpu-dispatch.ts, webgpu-upload.ts): `code` defines `fn main(t : i32)`, run by `threads`
 * threads in workgroups of 64, reading the inputs under `names` and writing one float32 output of
 * `outputShape`; `size` adds tfjs's `uniforms.size` (the output's length), `uniforms` the program's
 * own fields and their values. Every input must be read: the pipeline's "auto" layout leaves out a
 * binding its shader never reads, and tfjs binds every input.
 */
export const runWgsl = (
  backend: WebGpuBackend,
  p: { key: string; names: string[]; inputs: TensorInfo[]; outputShape: number[]; threads: number; size?: boolean; uniforms?: { fields: string; values: Array<{ type: string; data: number[] }> }; code: string }
): TensorInfo =>
  backend.runWebGPUProgram(
    {
      variableNames: p.names,
      outputShape: p.outputShape,
      ...(p.size ? { size: true } : {}),
      ...(p.uniforms ? { uniforms: p.uniforms.fields } : {}),
      workgroupSize: [WORKGROUP, 1, 1],
      dispatchLayout: { x: p.outputShape.map((_, i) => i) },
      dispatch: [Math.ceil(p.threads / WORKGROUP), 1, 1],
      shaderKey: p.key,
      getUserCode: () => p.code
    },
    p.inputs,
    "float32",
    p.uniforms?.values
  )

const REDUCE_WORKGROUP = 256
/**
 * Rows each thread adds down its column in one level, at most. Two costs pull apart: a GPU thread's
 * loop is latency-bound where a sum has few threads (batch norm's 16 channels at batch 256 with 512
 * rows a thread are 512 threads in all; in two runs on an H200 the residual CNN's step there took
 * 10.9 ms of compute with loops of up to 512 rows, 6.9 ms with loops of up to 128), while each
 * further level is one more program for the CPU to record (30-40 µs on that host). So a sum takes
 * the fewest levels in which no thread adds more than this many rows, and splits its rows evenly
 * between them.
 */
const ROWS_PER_THREAD = 256
/** WebGPU's least maxComputeWorkgroupsPerDimension: a level's chunks are its workgroups along x. */
const REDUCE_MAX_GROUPS = 65_535

/** One level of columnSums: its terms, `groups` chunks of rows, one scale for the finished sums. */
type SumLevel = Omit<ColumnSums, "prelude" | "scale" | "functions"> & { prelude: string; functions: string; groups: number; scale: number }

/** One level of columnSums: `terms` summed down each column, in `groups` chunks of rows, into [terms, groups, columns] (or [columns]). */
const columnSumLevel = (backend: WebGpuBackend, v: SumLevel): TensorInfo => {
  const block = Math.min(v.columns, REDUCE_WORKGROUP)
  const acc = v.terms.map((_, j) => j)
  const shape = v.groups === 1 && acc.length === 1 ? (v.shape ?? [v.columns]) : [acc.length, v.groups, v.columns]
  const each = (f: (j: number) => string, sep = " ") => acc.map(f).join(sep)
  // Built only when tfjs compiles the program (once per shader key), not at every call.
  const code = () => `
  ${v.functions}
  ${each((j) => `var<workgroup> gwPart${j} : array<f32, ${REDUCE_WORKGROUP}>;`, "\n  ")}
  fn main(t : i32) {
    let M = uniforms.rows;
    let C = uniforms.columns;
    let block = min(C, ${REDUCE_WORKGROUP});
    let lanes = ${REDUCE_WORKGROUP} / block;
    let l = i32(localId.x);
    let g = i32(workgroupId.x);
    let c = i32(workgroupId.y) * block + l % block;
    let lane = l / block;
    ${each((j) => `var acc${j} = 0.0;`)}
    if (lane < lanes && c < C) {
      ${v.prelude}
      let end = min(g * uniforms.chunk + uniforms.chunk, M);
      for (var i = g * uniforms.chunk + lane; i < end; i += lanes) {
        ${each((j) => `acc${j} += ${v.terms[j]};`, "\n        ")}
      }
    }
    ${each((j) => `gwPart${j}[l] = acc${j};`)}
    workgroupBarrier();
    if (l < block && c < C) {
      ${each((j) => `var s${j} = 0.0;`)}
      for (var k = 0; k < lanes; k++) {
        ${each((j) => `s${j} += gwPart${j}[k * block + l];`)}
      }
      ${each((j) => `setOutputAtIndex((${j} * uniforms.groups + g) * C + c, s${j} * uniforms.scale);`, "\n      ")}
    }
  }`
  // Only the inputs the terms and prelude read, the rest of the code reading none (a binding the
  // shader never reads is left out of its layout).
  const reads = `${v.functions} ${v.prelude} ${v.terms.join(" ")}`
  const used = v.names.map((n, i) => [n, v.inputs[i]!] as const).filter(([n]) => new RegExp(`\\b${n}\\[`).test(reads))
  return backend.runWebGPUProgram(
    {
      variableNames: used.map(([n]) => n),
      outputShape: shape,
      uniforms: `rows : i32, columns : i32, chunk : i32, groups : i32, scale : f32, ${v.uniforms?.fields ?? ""}`,
      workgroupSize: [REDUCE_WORKGROUP, 1, 1],
      dispatchLayout: { x: shape.map((_, i) => i) },
      dispatch: [v.groups, Math.ceil(v.columns / block), 1],
      shaderKey: `gradwire_colsum_${v.key}`,
      getUserCode: code
    },
    used.map(([, t]) => t),
    "float32",
    [
      { type: "int32", data: [v.rows] },
      { type: "int32", data: [v.columns] },
      { type: "int32", data: [Math.ceil(v.rows / v.groups)] },
      { type: "int32", data: [v.groups] },
      { type: "float32", data: [v.scale] },
      ...(v.uniforms?.values ?? [])
    ]
  )
}

/** What columnSums adds up: see there. */
export interface ColumnSums {
  /** Names the program: one key per distinct `terms`, `prelude` and `uniforms` fields. */
  key: string
  names: string[]
  inputs: TensorInfo[]
  rows: number
  columns: number
  /** One WGSL expression per sum (one or two), of the row `i` and the column `c`, reading the inputs by `names`. */
  terms: string[]
  /** WGSL run once per thread before its rows, for `let`s the terms use (of `c` and the uniforms). */
  prelude?: string
  /** WGSL functions at the shader's top level for the terms to call (they read the inputs and the uniforms, not main's `let`s). */
  functions?: string
  /** The finished sums' shape where there is one term ([columns] by default; its product must be `columns`). */
  shape?: number[]
  /** A factor per term applied to the finished sum (a mean: 1 / rows); 1 by default. */
  scale?: number[]
  /** The program's own uniforms, after columnSums' (rows, columns, chunk, groups, scale). */
  uniforms?: { fields: string; values: Array<{ type: string; data: number[] }> }
}

/** The threads of a workgroup that share a column (256 over the columns it covers). */
const columnLanes = (columns: number): number => Math.floor(REDUCE_WORKGROUP / Math.min(columns, REDUCE_WORKGROUP))

/** How many chunks of rows a level of columnSums takes: with L levels left (the fewest in which no thread adds more than ROWS_PER_THREAD rows), each thread adds about (rows / lanes)^(1/L). */
export const columnSumGroups = (rows: number, columns: number): number => {
  const perColumnThread = rows / columnLanes(columns)
  if (perColumnThread <= ROWS_PER_THREAD) return 1
  const levels = Math.ceil(Math.log(perColumnThread) / Math.log(ROWS_PER_THREAD) - 1e-9)
  const each = Math.ceil(perColumnThread ** (1 / levels))
  return Math.max(1, Math.min(REDUCE_MAX_GROUPS, Math.ceil(rows / (columnLanes(columns) * each))))
}

/** The rows each thread of a first level of columnSums adds down its column (what columnSumGroups bounds). */
export const columnSumRowsPerThread = (rows: number, columns: number): number => Math.ceil(Math.ceil(rows / columnSumGroups(rows, columns)) / columnLanes(columns))

/**
 * Per column of a [rows, columns] problem, the sums of `terms` over the rows: one [columns] tensor per
 * term. A GPU adds a long column well only in parallel: each workgroup of 256 threads takes a chunk
 * of the rows, its threads split the chunk's rows between them (neighbouring threads on neighbouring
 * columns, so that reads are contiguous) and add their parts in workgroup memory; the chunks' sums
 * (one [terms, chunks, columns] tensor) are added the same way, per term, until one chunk is left.
 * A problem small enough for one chunk takes one program per term.
 */
export const columnSums = (backend: WebGpuBackend, p: ColumnSums): TensorInfo[] => {
  const C = p.columns
  const scale = (j: number) => p.scale?.[j] ?? 1
  const first = columnSumGroups(p.rows, C)
  const own = { names: p.names, inputs: p.inputs, rows: p.rows, columns: C, prelude: p.prelude ?? "", functions: p.functions ?? "", ...(p.uniforms ? { uniforms: p.uniforms } : {}) }
  const last = p.shape && p.terms.length === 1 ? { shape: p.shape } : {}
  if (first === 1) return p.terms.map((term, j) => columnSumLevel(backend, { ...own, ...last, key: `${p.key}_${j}`, terms: [term], groups: 1, scale: scale(j) }))
  const partials = columnSumLevel(backend, { ...own, key: `${p.key}_all`, terms: p.terms, groups: first, scale: 1 })
  const sums = p.terms.map((_, j) => {
    // Term j's chunk sums, added down again: "gp" is [terms, rows, C] (one term below the first level).
    let input = partials
    let rows = first
    let offset = j
    for (;;) {
      const groups = columnSumGroups(rows, C)
      const next = columnSumLevel(backend, {
        key: `chunks_${offset}`,
        names: ["gp"],
        inputs: [input],
        rows,
        columns: C,
        terms: [`gp[(${offset} * uniforms.rows + i) * uniforms.columns + c]`],
        prelude: "",
        functions: "",
        ...(groups === 1 ? last : {}),
        groups,
        scale: groups === 1 ? scale(j) : 1
      })
      if (input !== partials) backend.disposeData(input.dataId)
      input = next
      if (groups === 1) return input
      rows = groups
      offset = 0
    }
  })
  backend.disposeData(partials.dataId)
  return sums
}

/** Registers kernel `name` (gradwire's) with each backend's function in `byBackend`, where tfjs has none. */
export const registerKernels = (tf: Tf, name: string, byBackend: Record<string, unknown>): void => {
  for (const [backendName, kernelFunc] of Object.entries(byBackend))
    if (!tf.getKernel(name, backendName)) tf.registerKernel({ kernelName: name, backendName, kernelFunc: kernelFunc as never })
}

/** Registers `forward` and `backward` (gradwire's names) for each backend in `kernels`, where tfjs has none, and `gradient` for `forward`. */
export const registerFused = (
  tf: Tf,
  forward: string,
  backward: string,
  kernels: Record<string, readonly [unknown, unknown]>,
  gradient: { inputsToSave: string[]; outputsToSave?: boolean[]; gradFunc: (dy: Tensor | Tensor[], saved: Tensor[], attrs: Record<string, unknown>) => Record<string, () => Tensor> }
): void => {
  registerKernels(tf, forward, Object.fromEntries(Object.entries(kernels).map(([backendName, [f]]) => [backendName, f])))
  registerKernels(tf, backward, Object.fromEntries(Object.entries(kernels).map(([backendName, [, b]]) => [backendName, b])))
  if (!tf.getGradient(forward)) tf.registerGradient({ kernelName: forward, ...gradient, gradFunc: gradient.gradFunc as never })
}

/** A layer's `call`, as tfjs-layers defines it. */
export type LayerCall<L> = (this: L, inputs: Tensor | Tensor[], kwargs: Record<string, unknown>) => Tensor | Tensor[]
const PATCHED = Symbol.for("gradwire.fusedLayer")
const ORIGINAL = Symbol.for("gradwire.fusedLayer.original")
type Marked = { [PATCHED]?: true; [ORIGINAL]?: (...a: never[]) => unknown }

/** Replaces `className`'s call with `make(own)`, once (a second install keeps the first). Returns whether the class exists. */
export const patchLayerCall = <L>(tf: Tf, className: string, make: (own: LayerCall<L>) => LayerCall<L>): boolean => {
  const proto = layerPrototype<{ call: LayerCall<L> & Marked }>(tf, className)
  if (!proto) return false
  if (!proto.call[PATCHED]) {
    const own = proto.call
    proto.call = Object.assign(make(own), { [PATCHED]: true as const, [ORIGINAL]: own })
  }
  return true
}

/** Whether `call` is one that patchLayerCall installed. */
export const isPatchedCall = (call: unknown): boolean => (call as Marked | undefined)?.[PATCHED] === true

/** Runs `f` with tfjs-layers' own call on each of `classNames` (for tests and benchmarks that compare the two). */
export const withTfjsCalls = <T>(tf: Tf, classNames: string[], f: () => T): T => {
  const protos = classNames.map((n) => layerPrototype<{ call: Marked }>(tf, n)).filter((p) => p?.call[ORIGINAL] !== undefined) as Array<{ call: Marked }>
  const patched = protos.map((p) => p.call)
  protos.forEach((p) => (p.call = p.call[ORIGINAL] as Marked))
  try {
    return f()
  } finally {
    protos.forEach((p, i) => (p.call = patched[i]!))
  }
}

/** The one input tensor of a layer's call, or undefined (several inputs). */
export const oneInput = (inputs: Tensor | Tensor[]): Tensor | undefined => (Array.isArray(inputs) ? (inputs.length === 1 ? inputs[0] : undefined) : inputs)
