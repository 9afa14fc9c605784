// The in-process model of a group of GradientReducers (one error-feedback store and codec per
// rank), shared by the compression network test and the conformance suite: the same scaled
// per-rank gradients (compression-cases.ts), bucket by bucket, through simulateCompressedAllReduce,
// so a network result can be compared with what the simulation says it must be.
import { planBuckets } from "../../collectives/bucketing.ts"
import { ErrorFeedback, createCompressor, simulateCompressedAllReduce, type Codec, type ResolvedCompressionConfig } from "../../collectives/compression/index.ts"
import type { GradientSlotInfo } from "../../collectives/gradient-reducer.ts"
import { gradientsOf, layoutOf, type SlotSpec } from "./compression-cases.ts"

/** What a reducer group is made of: its variables, bucket plan, and the ranks' sample counts. */
export interface GroupShape {
  readonly slots: ReadonlyArray<SlotSpec>
  readonly layout: ReadonlyArray<GradientSlotInfo>
  /** Elements of the flat gradient. */
  readonly n: number
  readonly buckets: ReadonlyArray<{ readonly start: number; readonly end: number }>
  readonly weights: ReadonlyArray<number>
  readonly p: number
  readonly bucketBytes: number
  readonly firstBucketBytes: number
}

export const groupShape = (slots: ReadonlyArray<SlotSpec>, weights: ReadonlyArray<number>, bucketBytes: number, firstBucketBytes: number): GroupShape => {
  const layout = layoutOf(slots)
  const buckets = planBuckets(
    layout.map((s) => s.size),
    bucketBytes,
    firstBucketBytes
  ).map((b) => ({ start: layout[b.vars[0]].offset, end: layout[b.vars[0]].offset + b.length }))
  return { slots, layout, n: layout.reduce((a, s) => a + s.size, 0), buckets, weights, p: weights.length, bucketBytes, firstBucketBytes }
}

/** Every rank's input after the reducer's local scaling by w_r / W (in fp32, as it does). */
const scaledInputs = (g: GroupShape, seed: number): Float32Array[] => {
  const total = g.weights.reduce((a, b) => a + b, 0)
  return gradientsOf(g.n, seed, g.p).map((x, r) => {
    const scaleBy = g.weights[r] / total
    for (let i = 0; i < x.length; i++) x[i] *= scaleBy
    return x
  })
}

/** Stateful in-process model of one reducer group (all-reduce algorithm "ring"). */
export class Simulation {
  readonly efs: ErrorFeedback[]
  readonly config: ResolvedCompressionConfig
  readonly shape: GroupShape
  readonly #codec: Codec
  // a custom codec (PowerSGD): one instance per rank and tensor (each counts its own steps and warm-start factor)
  readonly #custom = new Map<string, Codec[]>()

  constructor(config: ResolvedCompressionConfig, shape: GroupShape) {
    this.config = config
    this.shape = shape
    this.efs = Array.from({ length: shape.p }, () => new ErrorFeedback())
    this.#codec = createCompressor(config)
  }

  step(seed: number, step: number): Float32Array {
    const { p, n, layout, buckets } = this.shape
    const inputs = scaledInputs(this.shape, seed)
    const out = new Float32Array(n)
    if (this.isCustom) {
      for (const s of layout) {
        let comps = this.#custom.get(s.name)
        if (!comps) this.#custom.set(s.name, (comps = Array.from({ length: p }, () => createCompressor(this.config))))
        const slice = (x: Float32Array) => x.subarray(s.offset, s.offset + s.size)
        out.set(simulateCompressedAllReduce(inputs.map(slice), comps, this.efs, { key: s.name, shape: s.shape, step }), s.offset)
      }
      return out
    }
    const codec = this.#codec
    buckets.forEach((b, k) => {
      const slice = (x: Float32Array) => x.subarray(b.start, b.end)
      if (codec.aggregation === "linear" && codec.castsToWire) {
        // fp16 on a ring: the segment owned by rank c starts its trip at rank c + 1 and ends at
        // c, so the simulation (which starts segment c at rank c) gets the ranks rotated by one.
        const rot = (r: number) => (r + 1) % p
        const sim = simulateCompressedAllReduce(
          inputs.map((_, r) => slice(inputs[rot(r)])),
          codec,
          this.efs.map((_, r) => this.efs[rot(r)]),
          { key: `bucket${k}`, step }
        )
        out.set(sim, b.start)
      } else {
        out.set(simulateCompressedAllReduce(inputs.map(slice), codec, this.efs, { key: `bucket${k}`, step }), b.start)
      }
    })
    return out
  }

  get isCustom(): boolean {
    return this.#codec.aggregation === "custom"
  }

  /** What rank r's reducer should report as its residual state. */
  residuals(r: number): Record<string, Float32Array> {
    return this.efs[r].state()
  }
}

/**
 * How close the network must be to the simulation. Gathered codecs decode the same messages in the
 * same order, and fp16's ring is simulated hop by hop: bit for bit. Custom codecs (PowerSGD), 'none'
 * and other linear codecs sum in fp32 in the ring's order rather than rank order, so they agree to
 * fp32 rounding (relative to the largest entry).
 */
export const tolerance = (config: ResolvedCompressionConfig): number => {
  const c = createCompressor(config)
  if (c.aggregation === "custom") return 2e-5
  return c.aggregation === "none" || (c.aggregation === "linear" && !c.castsToWire) ? 1e-6 : 0
}

export const maxAbs = (x: Float32Array): number => x.reduce((m, v) => Math.max(m, Math.abs(v)), 0)

export const maxDiff = (a: Float32Array, b: Float32Array): number => {
  let m = 0
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]))
  return m
}

export const sameBits = (a: Float32Array, b: Float32Array): boolean =>
  a.length === b.length && Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0
