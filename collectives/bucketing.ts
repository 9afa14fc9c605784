// Gradient bucketing (tensor fusion): many per-variable gradients are packed into a few large
// buffers and each buffer is all-reduced as one call, because one call per small tensor would pay
// the per-message latency hundreds of times. As in PyTorch DDP, buckets are up to 25 MiB with a
// smaller first one (1 MiB) so communication starts while later gradients are still being
// produced; a bucket goes out as soon as all its gradients are in, and several can be in flight.
//
// The plan depends only on the variable sizes, so every rank builds the same one, and buckets are
// always started in plan order (whatever order gradients arrive in): every rank issues the same
// collectives in the same order. A variable at least as large as a bucket is reduced in place in
// the caller's array, with no packing copy.
import { BUCKET_SIZE_MIB, FIRST_BUCKET_SIZE_MIB, MiB } from "../core/defaults.ts"
import type { AllReduceOptions, Communicator } from "./communicator.ts"
import { CollectiveArgumentError } from "./errors.ts"

export interface BucketOptions extends AllReduceOptions {
  /** Largest bucket in bytes. Default 25 MiB. */
  readonly bucketBytes?: number
  /** Size of the first bucket in bytes. Default 1 MiB. */
  readonly firstBucketBytes?: number
  /** Buckets being all-reduced at once. Default 2. */
  readonly maxInFlight?: number
}

export interface Bucket {
  /** Variable indices, in order. */
  readonly vars: ReadonlyArray<number>
  /** Element offset of each variable in the bucket. */
  readonly offsets: ReadonlyArray<number>
  readonly length: number
  /** A single variable reduced in place in the caller's array (no bucket buffer). */
  readonly direct: boolean
}

export const DEFAULT_BUCKET_BYTES = BUCKET_SIZE_MIB * MiB
export const DEFAULT_FIRST_BUCKET_BYTES = FIRST_BUCKET_SIZE_MIB * MiB

/** Packs variables (element counts, in order) into buckets: greedy, in order, by byte size. */
export const planBuckets = (sizes: ReadonlyArray<number>, bucketBytes = DEFAULT_BUCKET_BYTES, firstBucketBytes = DEFAULT_FIRST_BUCKET_BYTES): Bucket[] => {
  if (!(bucketBytes >= 4) || !(firstBucketBytes >= 4)) {
    throw new CollectiveArgumentError({ op: "planBuckets", reason: `bucket sizes must be >= 4 bytes, got ${bucketBytes} and ${firstBucketBytes}` })
  }
  const buckets: Bucket[] = []
  let vars: number[] = []
  let offsets: number[] = []
  let length = 0
  const limit = (): number => Math.floor((buckets.length === 0 ? firstBucketBytes : bucketBytes) / 4)
  const close = (): void => {
    if (vars.length === 0) return
    buckets.push({ vars, offsets, length, direct: false })
    vars = []
    offsets = []
    length = 0
  }
  for (let v = 0; v < sizes.length; v++) {
    const n = sizes[v]
    if (!Number.isInteger(n) || n < 0) throw new CollectiveArgumentError({ op: "planBuckets", reason: `size of variable ${v} must be an integer >= 0, got ${n}` })
    if (n >= Math.floor(bucketBytes / 4)) {
      close()
      buckets.push({ vars: [v], offsets: [0], length: n, direct: true })
      continue
    }
    if (length > 0 && length + n > limit()) close()
    vars.push(v)
    offsets.push(length)
    length += n
  }
  close()
  return buckets
}

/**
 * All-reduces a list of gradients through buckets. Create one per model (the plan and the bucket
 * buffers are reused step after step); per step, `add` each gradient as it becomes ready, then
 * `flush` to get the reduced values written back into the arrays that were added.
 */
export class GradientBucketer {
  readonly buckets: ReadonlyArray<Bucket>
  readonly #comm: Communicator
  readonly #sizes: ReadonlyArray<number>
  readonly #opts: BucketOptions
  readonly #buffers: Array<Float32Array | undefined>
  readonly #bucketOf: Int32Array
  readonly #maxInFlight: number
  #grads: Array<Float32Array | undefined> = []
  #missing: number[] = []
  #running: Array<Promise<void> | undefined> = []
  #nextLaunch = 0
  #inFlight = 0
  #error: unknown = undefined
  #slot: (() => void) | undefined

  constructor(comm: Communicator, sizes: ReadonlyArray<number>, opts: BucketOptions = {}) {
    this.#comm = comm
    this.#sizes = [...sizes]
    this.#opts = opts
    this.buckets = planBuckets(sizes, opts.bucketBytes, opts.firstBucketBytes)
    this.#maxInFlight = Math.max(1, opts.maxInFlight ?? 2)
    this.#buffers = this.buckets.map((b) => (b.direct ? undefined : new Float32Array(b.length)))
    this.#bucketOf = new Int32Array(sizes.length)
    this.buckets.forEach((b, k) => {
      for (const v of b.vars) this.#bucketOf[v] = k
    })
    this.#reset()
  }

  #reset(): void {
    this.#grads = new Array(this.#sizes.length).fill(undefined)
    this.#missing = this.buckets.map((b) => b.vars.length)
    this.#running = this.buckets.map(() => undefined)
    this.#nextLaunch = 0
    this.#error = undefined
  }

  /** Hands over gradient `index` (length must match the plan). It is packed now; the array receives the result at flush. */
  add(index: number, grad: Float32Array): void {
    if (!Number.isInteger(index) || index < 0 || index >= this.#sizes.length) {
      throw new CollectiveArgumentError({ op: "GradientBucketer.add", reason: `index ${index} out of range 0..${this.#sizes.length - 1}` })
    }
    if (!(grad instanceof Float32Array) || grad.length !== this.#sizes[index]) {
      throw new CollectiveArgumentError({ op: "GradientBucketer.add", reason: `gradient ${index} must be a Float32Array of ${this.#sizes[index]} elements` })
    }
    if (this.#grads[index] !== undefined) throw new CollectiveArgumentError({ op: "GradientBucketer.add", reason: `gradient ${index} was already added this step` })
    this.#grads[index] = grad
    const k = this.#bucketOf[index]
    const bucket = this.buckets[k]
    const buffer = this.#buffers[k]
    if (buffer) buffer.set(grad, bucket.offsets[bucket.vars.indexOf(index)])
    this.#missing[k]--
    this.#launchReady()
  }

  /** Starts, in plan order, every complete bucket while fewer than maxInFlight are running. */
  #launchReady(): void {
    while (this.#nextLaunch < this.buckets.length && this.#missing[this.#nextLaunch] === 0 && this.#inFlight < this.#maxInFlight) {
      const k = this.#nextLaunch++
      const bucket = this.buckets[k]
      const data = bucket.direct ? (this.#grads[bucket.vars[0]] as Float32Array) : (this.#buffers[k] as Float32Array)
      this.#inFlight++
      this.#running[k] = this.#comm.allReduce(data, this.#opts).then(
        () => this.#finished(k),
        (e) => {
          this.#error ??= e
          this.#finished(k)
        }
      )
    }
  }

  #finished(k: number): void {
    this.#inFlight--
    const bucket = this.buckets[k]
    const buffer = this.#buffers[k]
    if (buffer && this.#error === undefined) {
      for (let j = 0; j < bucket.vars.length; j++) {
        const grad = this.#grads[bucket.vars[j]] as Float32Array
        grad.set(buffer.subarray(bucket.offsets[j], bucket.offsets[j] + grad.length))
      }
    }
    this.#launchReady()
    this.#slot?.()
  }

  /** Waits until every bucket is reduced; returns the added arrays, now holding the results. Resets for the next step. */
  async flush(): Promise<Float32Array[]> {
    const missing = this.#missing.reduce((a, b) => a + b, 0)
    if (missing > 0) {
      const absent = this.#grads.flatMap((g, i) => (g === undefined ? [i] : []))
      throw new CollectiveArgumentError({ op: "GradientBucketer.flush", reason: `gradients ${absent.slice(0, 10).join(", ")}${absent.length > 10 ? ", ..." : ""} were not added` })
    }
    while (this.#nextLaunch < this.buckets.length || this.#inFlight > 0) {
      await new Promise<void>((resolve) => (this.#slot = resolve))
    }
    this.#slot = undefined
    const error = this.#error
    const grads = this.#grads as Float32Array[]
    this.#reset()
    if (error !== undefined) throw error
    return grads
  }
}

/** One-shot: all-reduces `grads` (in place, through buckets) and returns the same arrays. */
export const allReduceBuckets = async (comm: Communicator, grads: ReadonlyArray<Float32Array>, opts: BucketOptions = {}): Promise<Float32Array[]> => {
  const bucketer = new GradientBucketer(
    comm,
    grads.map((g) => g.length),
    opts
  )
  grads.forEach((g, i) => bucketer.add(i, g))
  return bucketer.flush()
}
