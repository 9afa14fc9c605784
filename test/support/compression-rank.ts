// One rank process for the compression network tests and benchmark (started by
// compression-fleet.ts): connects to NATS, then runs commands from its parent over IPC. It holds
// GradientReducers by name, feeds them deterministic per-rank gradients (compression-cases.ts),
// returns the reduced result (or only its hash and timing, for the 64 MiB benchmark), and hands
// out / takes back the reducer's error-feedback state, and imports modules that register more
// codecs (the registry proof), optionally over the direct data path ("create" with `direct`). It
// exits when its parent goes away.
import type { NatsConnection } from "@nats-io/nats-core"
import { Communicator, type AllReduceAlgorithm } from "../../collectives/communicator.ts"
import { GradientReducer } from "../../collectives/gradient-reducer.ts"
import type { ResolvedCompressionConfig } from "../../collectives/compression/index.ts"
import { inSimdSpace, spaceSlots } from "../../collectives/simd.ts"
import { fillGradient, layoutOf, type SlotSpec } from "./compression-cases.ts"
import { connectRank, errorOf, serveParent } from "./child-ready.ts"
import { pathToFileURL } from "node:url"

/** `asked`: the sizes in bytes the reducer chose an algorithm for (algorithm "by-size"). */
const reducers = new Map<string, { comm: Communicator; reducer: GradientReducer; asked: number[] }>()
// One gradient buffer shared by the reducers that have none of their own (gradientBuffer), as
// the training loop does
let shared = new Float32Array(0)
let nc: NatsConnection
let cnc: NatsConnection

const entry = (name: string) => {
  const r = reducers.get(name)
  if (!r) throw new Error(`no reducer named ${name}`)
  return r
}

const hashOf = (x: Float32Array): string => {
  const bits = new Uint32Array(x.buffer, x.byteOffset, x.length)
  let h = 0x811c9dc5
  for (let i = 0; i < bits.length; i++) h = Math.imul(h ^ bits[i], 0x01000193) >>> 0
  return h.toString(16)
}

interface ReduceCmd {
  readonly name: string
  readonly slots: ReadonlyArray<SlotSpec>
  readonly seed: number
  readonly step: number
  readonly weight: number
  /** Return the reduced gradient itself (tests) or only its hash (benchmark). */
  readonly returnData: boolean
  /** Barrier before each timed reduction (benchmark). */
  readonly iters?: number
}

const reduce = async (m: ReduceCmd) => {
  const e = entry(m.name)
  const layout = layoutOf(m.slots)
  const n = layout.reduce((a, s) => a + s.size, 0)
  if (shared.length !== n) shared = new Float32Array(n)
  const flat = e.reducer.gradientBuffer(n) ?? shared
  const times: number[] = []
  const cpuMs: number[] = []
  const iters = Math.max(1, Math.min(m.iters ?? 1, 100))
  for (let it = 0; it < iters; it++) {
    fillGradient(flat, m.seed + it, e.comm.rank)
    await e.comm.barrier()
    const t0 = performance.now()
    const c0 = process.cpuUsage()
    await e.reducer.reduceGradients(flat, layout, m.weight, m.step + it)
    times.push(performance.now() - t0)
    const c1 = process.cpuUsage(c0)
    cpuMs.push((c1.user + c1.system) / 1000)
  }
  return { times, cpuMs, hash: hashOf(flat), stats: e.reducer.stats, inSpace: inSimdSpace(flat), slotsTaken: spaceSlots(flat)?.taken ?? 0, asked: e.asked.splice(0), data: m.returnData ? flat.slice() : undefined }
}

const handle = async (m: Record<string, any>): Promise<unknown> => {
  switch (m.cmd) {
    case "create": {
      const comm = await Communicator.create({
        nc,
        controlNc: cnc,
        cluster: "test",
        job: "compression",
        group: m.name,
        rank: m.rank,
        worldSize: m.worldSize,
        node: `node${m.rank}`,
        timeoutMs: m.timeoutMs,
        chunkBytes: m.chunkBytes,
        windowBytes: m.windowBytes,
        // The direct path (benchmark --transport): the secret travels as hex over IPC; `host` is
        // the address to listen on and advertise (a rank's namespace address with --link).
        ...(m.direct ? { direct: { ...m.direct, secret: Buffer.from(m.direct.secret, "hex") } } : {})
      })
      const asked: number[] = []
      // "by-size": tree below 64 KiB, ring from there, each size asked recorded
      const bySize = (bytes: number): AllReduceAlgorithm => (asked.push(bytes), bytes < 65536 ? "tree" : "ring")
      const reducer = new GradientReducer(comm, {
        algorithm: m.algorithm === "by-size" ? bySize : (m.algorithm as AllReduceAlgorithm),
        compression: m.compression as ResolvedCompressionConfig,
        bucketBytes: m.bucketBytes,
        firstBucketBytes: m.firstBucketBytes
      })
      reducers.set(m.name, { comm, reducer, asked })
      // transport "auto" as a training worker runs it: the threshold measured at group start (a
      // collective: every rank gets `measureTransport` in the same create)
      const measured = m.measureTransport ? await comm.measureTransport() : undefined
      return { chunkElems: comm.chunkElems, transport: comm.transport, measured }
    }
    case "reduce":
      return reduce(m as unknown as ReduceCmd)
    case "transport":
      return entry(m.name).comm.transport
    case "state":
      return entry(m.name).reducer.state()
    case "restore":
      entry(m.name).reducer.restore(m.state)
      return null
    case "close": {
      const e = reducers.get(m.name)
      reducers.delete(m.name)
      await e?.comm.close()
      return null
    }
    case "import":
      // a module that registers more algorithms or codecs (registry.ts), as the parent did
      await import(pathToFileURL(m.module).href)
      return null
    case "exit":
      setTimeout(() => process.exit(0), 10)
      return null
    default:
      throw new Error(`unknown command ${String(m.cmd)}`)
  }
}

;({ nc, cnc } = await connectRank("gw-crank"))
serveParent(handle)
