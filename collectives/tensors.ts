// Thin tfjs adapter over the communicator: all-reduce and broadcast tf.Tensors. The collectives
// core works on Float32Arrays and never loads tfjs (it takes seconds to import); this module
// loads `@tensorflow/tfjs` only when first called (with `require`, as core/engine.ts does), and
// gets the same module instance (and so the same backend) as the application.
import { createRequire } from "node:module"
import type { Tensor } from "@tensorflow/tfjs"
import { allReduceBuckets, type BucketOptions } from "./bucketing.ts"
import type { AllReduceOptions, BroadcastOptions, Communicator } from "./communicator.ts"
import { CollectiveArgumentError } from "./errors.ts"

type Tf = typeof import("@tensorflow/tfjs")
let tfModule: Tf | undefined
const tf = (): Tf => (tfModule ??= createRequire(import.meta.url)("@tensorflow/tfjs") as Tf)

/** The values of a float32 tensor as a Float32Array this module may overwrite (tensor.data() is a copy). */
const valuesOf = async (t: Tensor, op: string): Promise<Float32Array> => {
  if (t.dtype !== "float32") throw new CollectiveArgumentError({ op, reason: `tensors must be float32, got ${t.dtype} (cast with tensor.toFloat())` })
  return (await t.data()) as Float32Array
}

/** All-reduces one tensor; returns a new tensor (the input is left as is; dispose it if done with it). */
export const allReduceTensor = async (comm: Communicator, t: Tensor, opts?: AllReduceOptions): Promise<Tensor> => {
  const values = await valuesOf(t, "allReduceTensor")
  await comm.allReduce(values, opts)
  return tf().tensor(values, t.shape, "float32")
}

/**
 * All-reduces a list of tensors (gradients, in a stable order on every rank) through buckets
 * (bucketing.ts); returns new tensors in the same order.
 */
export const allReduceTensors = async (comm: Communicator, ts: ReadonlyArray<Tensor>, opts?: BucketOptions): Promise<Tensor[]> => {
  const values = await Promise.all(ts.map((t) => valuesOf(t, "allReduceTensors")))
  const reduced = await allReduceBuckets(comm, values, opts)
  const lib = tf()
  return reduced.map((v, i) => lib.tensor(v, ts[i].shape, "float32"))
}

/** Broadcasts `root`'s tensors (e.g. initial weights) to every rank; returns new tensors with root's values. */
export const broadcastTensors = async (comm: Communicator, ts: ReadonlyArray<Tensor>, root: number, opts?: BroadcastOptions): Promise<Tensor[]> => {
  const values = await Promise.all(ts.map((t) => valuesOf(t, "broadcastTensors")))
  // One call for all of them: pack, broadcast, unpack.
  const total = values.reduce((a, v) => a + v.length, 0)
  const packed = new Float32Array(total)
  let off = 0
  for (const v of values) {
    packed.set(v, off)
    off += v.length
  }
  await comm.broadcast(packed, root, opts)
  const lib = tf()
  off = 0
  return values.map((v, i) => {
    const out = lib.tensor(packed.subarray(off, off + v.length), ts[i].shape, "float32")
    off += v.length
    return out
  })
}
