// The tfjs adapter: all-reduce and broadcast of tf.Tensors between two ranks (two connections in
// this process, one real nats-server), and the p = 1 no-op; allReduce's halfInput on one rank and
// its argument errors.
import { connect } from "@nats-io/transport-node"
import type { NatsConnection } from "@nats-io/nats-core"
import * as tf from "@tensorflow/tfjs"
import * as Effect from "effect/Effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Communicator } from "../collectives/communicator.ts"
import { createCommunicatorEffect } from "../collectives/effect.ts"
import { allReduceTensor, allReduceTensors, broadcastTensors } from "../collectives/tensors.ts"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"

let server: NatsServerProcess
const conns: NatsConnection[] = []

beforeAll(async () => {
  server = await launchNatsServer({ jetstream: false })
  for (let i = 0; i < 4; i++) conns.push(await connect({ servers: server.url, noEcho: true }))
})

afterAll(async () => {
  await Promise.all(conns.map((c) => c.close()))
  await server?.stop()
})

describe("tfjs adapter", () => {
  it("all-reduces and broadcasts tensors between ranks", async () => {
    const comms = await Promise.all(
      [0, 1].map((rank) => Communicator.create({ nc: conns[2 * rank], controlNc: conns[2 * rank + 1], cluster: "t", job: "tensors", group: "g", rank, worldSize: 2, timeoutMs: 10_000 }))
    )
    const grads = [0, 1].map((rank) => [tf.tensor2d([[1 + rank, 2], [3, 4 * rank]]), tf.tensor1d([rank, 10, -rank])])
    const reduced = await Promise.all(comms.map((c, rank) => allReduceTensors(c, grads[rank], { op: "mean", bucketBytes: 16, firstBucketBytes: 8 })))
    for (const r of reduced) {
      expect(r[0].shape).toEqual([2, 2])
      expect(Array.from(await r[0].data())).toEqual([1.5, 2, 3, 2])
      expect(Array.from(await r[1].data())).toEqual([0.5, 10, -0.5])
    }
    const one = await Promise.all(comms.map((c, rank) => allReduceTensor(c, tf.scalar(rank + 1), { op: "max" })))
    for (const t of one) expect(await t.data()).toEqual(new Float32Array([2]))
    const bcast = await Promise.all(comms.map((c, rank) => broadcastTensors(c, [tf.fill([3], rank), tf.fill([2, 1], 10 + rank)], 1)))
    for (const b of bcast) {
      expect(Array.from(await b[0].data())).toEqual([1, 1, 1])
      expect(b[1].shape).toEqual([2, 1])
      expect(Array.from(await b[1].data())).toEqual([11, 11])
    }
    await expect(allReduceTensor(comms[0], tf.tensor1d([1], "int32"))).rejects.toMatchObject({ _tag: "CollectiveArgumentError" })
    await Promise.all(comms.map((c) => c.close()))
  })

  it("with one rank is a no-op that sends nothing", async () => {
    const nc = conns[0]
    const before = nc.stats().outMsgs
    const comm = await Communicator.create({ nc, cluster: "t", job: "tensors", group: "solo", rank: 0, worldSize: 1 })
    const [t] = await allReduceTensors(comm, [tf.tensor1d([1, 2, 3])], { op: "mean" })
    expect(Array.from(await t.data())).toEqual([1, 2, 3])
    await comm.barrier()
    await comm.close()
    expect(nc.stats().outMsgs).toBe(before)
  })

  it("the Effect entry point closes the communicator with its scope", async () => {
    const program = Effect.scoped(
      Effect.gen(function* () {
        const comms = yield* Effect.all(
          [0, 1].map((rank) => createCommunicatorEffect({ nc: conns[rank], cluster: "t", job: "tensors", group: "fx", rank, worldSize: 2, timeoutMs: 10_000 })),
          { concurrency: "unbounded" }
        )
        const out = yield* Effect.promise(() => Promise.all(comms.map((c, rank) => c.allReduce(Float32Array.of(rank, 1)))))
        return { comms, out }
      })
    )
    const { comms, out } = await Effect.runPromise(program)
    for (const o of out) expect(Array.from(o)).toEqual([1, 2])
    for (const c of comms) expect(c.closed).toBe(true)
  })
})

describe("allReduce halfInput", () => {
  const solo = (group: string): Promise<Communicator> => Communicator.create({ nc: conns[0], cluster: "t", job: "half-input", group, rank: 0, worldSize: 1 })

  it("on one rank the result is the decoded bits, whatever data held", async () => {
    const comm = await solo("ok")
    const data = new Float32Array(3).fill(NaN)
    await comm.allReduce(data, { op: "sum", wire: "f16", halfInput: Uint16Array.of(0x3c00, 0xc000, 0x0001) })
    expect(Array.from(data)).toEqual([1, -2, 2 ** -24])
    await comm.close()
  })

  it("refuses bits of the wrong length, or with an op other than sum or a wire other than f16, with a typed error", async () => {
    const cases: Array<[string, Parameters<Communicator["allReduce"]>[1], RegExp]> = [
      ["length", { op: "sum", wire: "f16", halfInput: new Uint16Array(2) }, /2 values for 3 elements/],
      ["op", { op: "mean", wire: "f16", halfInput: new Uint16Array(3) }, /needs op "sum" and wire "f16"/],
      ["wire", { op: "sum", halfInput: new Uint16Array(3) }, /needs op "sum" and wire "f16"/],
      ["type", { op: "sum", wire: "f16", halfInput: new Float32Array(3) as unknown as Uint16Array }, /must be a Uint16Array/]
    ]
    for (const [name, opts, reason] of cases) {
      const comm = await solo(`bad-${name}`)
      await expect(comm.allReduce(new Float32Array(3), opts)).rejects.toMatchObject({ _tag: "CollectiveArgumentError", reason: expect.stringMatching(reason) })
      await comm.close()
    }
  })
})
