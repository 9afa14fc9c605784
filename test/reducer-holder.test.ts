// GradientReducer.reduceGradients with a holder: where every rank knows that only one rank has
// rows this step (dp.fit's adaptive batching gave the others none), the weighted mean is that
// rank's gradient, sent from it. Over a real nats-server: the holder's call returns before any
// other rank has called (it waits for none of their zeros), every rank ends with the holder's
// bits, the result is the weighted all-reduce's, and with compression the call all-reduces as before.
import type { NatsConnection } from "@nats-io/nats-core"
import { beforeAll, describe, expect, it } from "vitest"
import { Communicator } from "../collectives/communicator.ts"
import { GradientReducer } from "../collectives/gradient-reducer.ts"
import type { ResolvedCompressionConfig } from "../collectives/compression/index.ts"
import { natsFixtures } from "./support/nats.ts"

// One server and six connections for the file, closed and stopped after it.
const nats = natsFixtures("all")
const conns: NatsConnection[] = []
let groups = 0

beforeAll(async () => {
  const server = await nats.server({ jetstream: false })
  for (let i = 0; i < 6; i++) conns.push((await nats.connect(server.url, { noEcho: true })).nc)
})

// Two slots, the second large enough for several buckets (bucketBytes 4 KiB below).
const LAYOUT = [
  { name: "w", shape: [3000], offset: 0, size: 3000 },
  { name: "b", shape: [10], offset: 3000, size: 10 }
]
const N = 3010

const makeGroup = async (p: number, compression: ResolvedCompressionConfig = "none") => {
  const group = `h${groups++}`
  const comms = await Promise.all(
    Array.from({ length: p }, (_, rank) => Communicator.create({ nc: conns[2 * rank]!, controlNc: conns[2 * rank + 1]!, cluster: "t", job: "holder", group, rank, worldSize: p, timeoutMs: 20_000 }))
  )
  return { comms, reducers: comms.map((c) => new GradientReducer(c, { algorithm: "ring", compression, bucketBytes: 4096, firstBucketBytes: 4096 })) }
}

const gradientOf = (rank: number): Float32Array => Float32Array.from({ length: N }, (_, i) => Math.sin(i * 0.37 + rank) * (1 + rank) + 1e-3 * i)

describe("GradientReducer.reduceGradients with a holder", () => {
  it("sends the holder's gradient to every rank, the holder not waiting for the others, equal to the weighted all-reduce", async () => {
    const p = 3
    const holder = 1
    const { comms, reducers } = await makeGroup(p)
    try {
      const flats = Array.from({ length: p }, (_, r) => (r === holder ? gradientOf(r) : new Float32Array(N)))
      const sent = flats[holder]!.slice()
      // The holder's call completes while no other rank has called yet.
      await reducers[holder]!.reduceGradients(flats[holder]!, LAYOUT, 64, 0, undefined, holder)
      expect(Array.from(flats[holder]!)).toEqual(Array.from(sent))
      await Promise.all(reducers.map((red, r) => (r === holder ? undefined : red.reduceGradients(flats[r]!, LAYOUT, 0, 0, undefined, holder))))
      for (const f of flats) expect(Array.from(f)).toEqual(Array.from(sent))
      expect(reducers[0]!.stats.wireBytes).toBe(N * 4)

      // The same step as a weighted all-reduce (no holder named): the same values, to rounding.
      const again = Array.from({ length: p }, (_, r) => (r === holder ? gradientOf(r) : new Float32Array(N)))
      await Promise.all(reducers.map((red, r) => red.reduceGradients(again[r]!, LAYOUT, r === holder ? 64 : 0, 1)))
      for (const f of again) for (let i = 0; i < N; i++) expect(f[i]).toBeCloseTo(sent[i]!, 5)
    } finally {
      await Promise.all(comms.map((c) => c.close()))
    }
  }, 60_000)

  it("all-reduces as before with compression, where the holder's call waits for the others", async () => {
    const p = 2
    const { comms, reducers } = await makeGroup(p, "fp16")
    try {
      const flats = [gradientOf(0), new Float32Array(N)]
      let holderDone = false
      const holderCall = reducers[0]!.reduceGradients(flats[0]!, LAYOUT, 64, 0, undefined, 0).then(() => (holderDone = true))
      await new Promise((resolve) => setTimeout(resolve, 300))
      expect(holderDone).toBe(false)
      await Promise.all([holderCall, reducers[1]!.reduceGradients(flats[1]!, LAYOUT, 0, 0, undefined, 0)])
      // fp16 on the wire: the holder's gradient to half precision, on both ranks alike.
      expect(Array.from(flats[1]!)).toEqual(Array.from(flats[0]!))
      const g = gradientOf(0)
      for (let i = 0; i < N; i++) expect(Math.abs(flats[0]![i]! - g[i]!)).toBeLessThanOrEqual(Math.abs(g[i]!) * 1e-3 + 1e-6)
    } finally {
      await Promise.all(comms.map((c) => c.close()))
    }
  }, 60_000)
})
