// One rank process for collectives tests and benchmarks (started by collectives-fleet.ts). It
// connects to NATS, then executes commands from its parent over IPC: create/close communicators,
// run case lists (verifying each result against the float64 reference), and time all-reduces or
// raw NATS traffic patterns (or, on shaped links, raw TCP) for the benchmark, and import modules that register more all-reduce
// algorithms (the registry proof). It exits when its parent goes away.
import type { NatsConnection } from "@nats-io/nats-core"
import { allReduceBuckets } from "../../collectives/bucketing.ts"
import { Communicator, type AllReduceAlgorithm, type PeerLiveness } from "../../collectives/communicator.ts"
import { MeasuredDeadlines } from "../../collectives/deadlines.ts"
import { decodeHalf, encodeHalf } from "../../collectives/float16.ts"
import {
  broadcasted,
  compare,
  gathered,
  hashOf,
  inputOf,
  reference,
  sameBits,
  segmentBounds,
  weightOf,
  type Case,
  type CaseResult
} from "./collectives-cases.ts"
import { connectRank, errorOf, serveParent } from "./child-ready.ts"
import { receivePoolStats, sendPoolStats } from "../../core/nats-internals/index.ts"
import { spaceSlots } from "../../collectives/simd.ts"
import { pathToFileURL } from "node:url"
import * as net from "node:net"
import { cpuBetween, threadTimes, type CpuSpent, type ThreadTimes } from "../../bench/thread-cpu.ts"

const comms = new Map<string, Communicator>()
let nc: NatsConnection
let cnc: NatsConnection

const comm = (group: string): Communicator => {
  const c = comms.get(group)
  if (!c) throw new Error(`no communicator for group ${group}`)
  return c
}

/**
 * An fp16 sum whose input comes as binary16 bits: the same bits as the call on the decoded values
 * (which must be the rounded input, within the fp16 tolerance of the reference), whatever `data`
 * held before, and the bits themselves left as they were.
 */
const halfInputCase = async (c: Communicator, k: Case, length: number): Promise<CaseResult> => {
  const bits = new Uint16Array(length)
  encodeHalf(inputOf(k.seed, c.rank, length), bits)
  const before = bits.slice()
  const opts = { op: "sum", algorithm: k.algorithm as AllReduceAlgorithm, wire: "f16", hierarchy: k.hierarchy, fanout: k.fanout } as const
  const plain = new Float32Array(length)
  decodeHalf(bits, plain)
  await c.allReduce(plain, opts)
  const data = new Float32Array(length).fill(NaN)
  await c.allReduce(data, { ...opts, halfInput: bits })
  const { ref, scale } = reference(k, c.worldSize)
  const cmp = compare(data, ref, scale, c.worldSize, true)
  const same = sameBits(plain, data)
  const kept = Buffer.from(bits.buffer).equals(Buffer.from(before.buffer))
  return {
    ok: cmp.ok && same && kept,
    maxErr: cmp.maxErr,
    detail: !same ? "result differs from the call on the decoded values" : !kept ? "halfInput was modified" : cmp.detail,
    hash: hashOf(data)
  }
}

/** The payload slots of an allocated buffer, once the tasks that give them back have run. */
const slotsAfter = async (data: Float32Array): Promise<CaseResult["slots"]> => {
  const slots = spaceSlots(data)
  if (!slots) return undefined
  for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve))
  return { taken: slots.taken, free: slots.free, count: slots.count }
}

/** Runs one case on this rank and checks it. */
const runCase = async (c: Communicator, k: Case): Promise<CaseResult> => {
  const p = c.worldSize
  const r = c.rank
  // A group of one moves nothing, so the wire format does not apply.
  const half = k.wire === "f16" && p > 1
  const length = k.length + (k.lengthSkew ?? 0) * r
  switch (k.op) {
    case "barrier": {
      await c.barrier()
      return { ok: true, hash: "", maxErr: 0, detail: "" }
    }
    case "allReduce": {
      if (k.halfInput) return halfInputCase(c, k, length)
      const data = k.allocated ? c.allocate(length) : inputOf(k.seed, r, length)
      if (k.allocated) data.set(inputOf(k.seed, r, length))
      await c.allReduce(data, {
        op: k.reduce,
        algorithm: k.algorithm as AllReduceAlgorithm,
        wire: k.wire,
        weight: weightOf(k.seed, r),
        hierarchy: k.hierarchy,
        fanout: k.fanout
      })
      const returnedAt = Date.now()
      let busyUntil: number | undefined
      if (k.busy?.rank === r) {
        while (Date.now() - returnedAt < k.busy.ms) {
          // the event loop held, as by a long synchronous computation
        }
        busyUntil = Date.now()
      }
      const timing = k.busy ? { returnedAt, ...(busyUntil !== undefined ? { busyUntil } : {}) } : {}
      const result = k.clobber ? data.slice() : data
      if (k.clobber) data.fill(NaN)
      const { ref, scale } = reference(k, p)
      const slots = k.allocated ? await slotsAfter(data) : undefined
      return { ...compare(result, ref, scale, p, half), hash: hashOf(result), ...timing, ...(slots ? { slots } : {}) }
    }
    case "reduceScatter": {
      const data = inputOf(k.seed, r, length)
      const out = await c.reduceScatter(data, { op: k.reduce, wire: k.wire, weight: weightOf(k.seed, r) })
      const seg = k.clobber ? out.slice() : out
      if (k.clobber) data.fill(NaN)
      const [s, e] = segmentBounds(k.length, p, r)
      if (seg.length !== e - s) return { ok: false, hash: "", maxErr: Infinity, detail: `segment has ${seg.length} elements, want ${e - s}` }
      const { ref, scale } = reference(k, p)
      return { ...compare(seg, ref, scale, p, half, s), hash: hashOf(seg) }
    }
    case "broadcast": {
      const data = inputOf(k.seed, r, length)
      await c.broadcast(data, k.root ?? 0, { algorithm: k.algorithm as "fanout" | "tree", wire: k.wire })
      const ok = sameBits(data, broadcasted(k, p))
      return { ok, hash: hashOf(data), maxErr: 0, detail: ok ? "" : "broadcast result differs from the root's input" }
    }
    case "allGather": {
      const out = await c.allGather(inputOf(k.seed, r, length), { algorithm: k.algorithm as "fanout" | "ring", wire: k.wire })
      const ok = sameBits(out, gathered(k, p))
      return { ok, hash: hashOf(out), maxErr: 0, detail: ok ? "" : "all-gather result differs from the inputs" }
    }
    case "shift": {
      // The previous rank's input, bit for bit.
      const out = await c.shift(inputOf(k.seed, r, length))
      const ok = sameBits(out, inputOf(k.seed, (r + p - 1) % p, length))
      return { ok, hash: hashOf(out), maxErr: 0, detail: ok ? "" : "shift result differs from the previous rank's input" }
    }
    case "buckets": {
      const sizes = k.sizes ?? []
      const grads = sizes.map((n, v) => inputOf(k.seed + v * 31, r, n))
      const results = await allReduceBuckets(c, grads, {
        op: k.reduce,
        algorithm: k.algorithm as AllReduceAlgorithm,
        wire: k.wire,
        weight: weightOf(k.seed, r),
        bucketBytes: k.bucketBytes,
        firstBucketBytes: k.firstBucketBytes
      })
      let maxErr = 0
      let detail = ""
      const parts: Float32Array[] = []
      for (let v = 0; v < sizes.length; v++) {
        // weightOf depends on the seed: use the case's weights for every variable.
        const kv: Case = { ...k, seed: k.seed + v * 31, length: sizes[v] }
        const w = (rank: number) => weightOf(k.seed, rank)
        const { ref, scale } = referenceWithWeights(kv, p, w)
        const cmp = compare(results[v], ref, scale, p, half)
        maxErr = Math.max(maxErr, cmp.maxErr)
        if (!cmp.ok && !detail) detail = `variable ${v}: ${cmp.detail}`
        if (results[v] !== grads[v]) detail ||= `variable ${v}: result is not the caller's array`
        parts.push(results[v])
      }
      const all = new Float32Array(parts.reduce((a, x) => a + x.length, 0))
      let o = 0
      for (const x of parts) {
        all.set(x, o)
        o += x.length
      }
      return { ok: detail === "", hash: hashOf(all), maxErr, detail }
    }
  }
}

/** reference() with explicit per-rank weights (bucketed cases use one weight for all variables). */
const referenceWithWeights = (k: Case, p: number, w: (rank: number) => number) => {
  if (k.reduce !== "weightedMean") return reference(k, p)
  const n = k.length
  const ref = new Float64Array(n)
  const scale = new Float64Array(n)
  let total = 0
  for (let r = 0; r < p; r++) {
    const x = inputOf(k.seed, r, n)
    const wr = w(r)
    total += wr
    for (let i = 0; i < n; i++) {
      ref[i] += wr * x[i]
      scale[i] += Math.abs(wr * x[i])
    }
  }
  for (let i = 0; i < n; i++) {
    ref[i] = total === 0 ? 0 : ref[i] / total
    scale[i] = total === 0 ? 0 : scale[i] / total
  }
  return { ref, scale }
}

const runCases = async (c: Communicator, cases: ReadonlyArray<Case>): Promise<Array<CaseResult & { index: number }>> => {
  const out: Array<CaseResult & { index: number }> = []
  for (let i = 0; i < cases.length; i++) {
    const k = cases[i]
    if (k.concurrent && k.concurrent > 1) {
      const copies = Array.from({ length: k.concurrent }, (_, j) => ({ ...k, seed: k.seed + j * 1000, concurrent: 1 }))
      const results = await Promise.all(copies.map((kk) => runCase(c, kk)))
      const bad = results.find((x) => !x.ok)
      out.push({ index: i, ok: !bad, hash: results.map((x) => x.hash).join(","), maxErr: Math.max(...results.map((x) => x.maxErr)), detail: bad?.detail ?? "" })
    } else {
      out.push({ index: i, ...(await runCase(c, k)) })
    }
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// benchmark commands

/**
 * The benchmark's buffer of each length, allocated once (as gloo's loop allocates its tensor once
 * per size), by the communicator (Communicator.allocate: its sums run in place), as a user keeps one.
 */
const benchBuffers = new Map<number, Float32Array>()

/**
 * Times `iters` all-reduces of n floats (after `warmup`), each started right after a barrier. With
 * `cpu`, also this process's CPU a timed call (its busiest thread, all its threads; barriers
 * included, as gloo's loop counts them: bench/allreduce.ts --cpu).
 */
const benchAllReduce = async (
  c: Communicator,
  n: number,
  algorithm: AllReduceAlgorithm,
  iters: number,
  warmup: number,
  wire?: "f32" | "f16",
  fanout?: boolean,
  cpu?: boolean
): Promise<{ times: number[]; cpu?: CpuSpent }> => {
  let data = benchBuffers.get(n)
  if (!data) benchBuffers.set(n, (data = process.env.GRADWIRE_BENCH_PLAIN_BUFFER === "1" ? new Float32Array(n) : c.allocate(n)))
  for (let i = 0; i < n; i++) data[i] = ((i * 7 + c.rank) % 13) / 13
  const times: number[] = []
  let before: ThreadTimes | undefined
  for (let it = 0; it < warmup + iters; it++) {
    if (cpu === true && it === warmup) before = threadTimes(process.pid)
    await c.barrier()
    const t0 = performance.now()
    await c.allReduce(data, { algorithm, wire, op: "sum", fanout })
    const dt = performance.now() - t0
    if (it >= warmup) times.push(dt)
  }
  if (cpu !== true) return { times }
  const spent = cpuBetween(before, threadTimes(process.pid))
  return { times, cpu: { busiestMs: spent.busiestMs / iters, totalMs: spent.totalMs / iters } }
}

/**
 * Raw NATS moving given byte volumes (no reduction, no flow control, no acks): each flow is
 * `bytes` from this rank to a rank or to "all", in `chunkBytes` messages; the iteration ends when
 * this rank has received `inbound` bytes. The transport's ceiling for a pattern.
 */
const benchRaw = async (
  c: Communicator,
  flows: ReadonlyArray<{ to: number | "all"; bytes: number }>,
  inbound: number,
  chunkBytes: number,
  iters: number,
  warmup: number,
  tag: string
): Promise<number[]> => {
  const prefix = `gw.bench.raw.${tag}`
  const buf = new Uint8Array(Math.max(1, ...flows.map((f) => f.bytes)))
  let got = 0
  let iter = 0
  let wake: (() => void) | undefined
  const subs = [
    nc.subscribe(`${prefix}.*.${c.rank}`, { callback: (_e, m) => onMsg(m.data) }),
    nc.subscribe(`${prefix}.*.all`, { callback: (_e, m) => onMsg(m.data) })
  ]
  const onMsg = (d: Uint8Array): void => {
    // The first byte carries the iteration, so a straggler of a previous round is not counted.
    if (d[0] !== (iter & 255)) return
    got += d.length
    if (got >= inbound && wake) wake()
  }
  await nc.flush()
  await c.barrier()
  const times: number[] = []
  try {
    for (let it = 0; it < warmup + iters; it++) {
      iter = it
      got = 0
      const done = new Promise<void>((resolve) => (wake = resolve))
      await c.barrier()
      const t0 = performance.now()
      // Interleave the flows chunk by chunk, as the algorithms do.
      const offsets = flows.map(() => 0)
      let more = true
      while (more) {
        more = false
        for (let f = 0; f < flows.length; f++) {
          const flow = flows[f]
          if (offsets[f] >= flow.bytes) continue
          const len = Math.min(chunkBytes, flow.bytes - offsets[f])
          const msg = buf.subarray(offsets[f], offsets[f] + len)
          msg[0] = it & 255
          nc.publish(`${prefix}.${c.rank}.${flow.to}`, msg)
          offsets[f] += len
          more ||= offsets[f] < flow.bytes
        }
      }
      if (got < inbound) {
        const timeout = new Promise<void>((_, reject) => setTimeout(() => reject(new Error(`raw pattern: got ${got} of ${inbound} bytes (lost?)`)), 60_000).unref())
        await Promise.race([done, timeout])
      }
      const dt = performance.now() - t0
      if (it >= warmup) times.push(dt)
      // Everyone must have received everything before the next round reuses the subjects.
      await c.barrier()
    }
  } finally {
    for (const s of subs) s.unsubscribe()
  }
  return times
}

/**
 * Raw TCP in a ring (the all-reduce bench on shaped links): data flows from each rank to the next
 * on one connection, no framing, no reduction; the ceiling of what a ring can move over those
 * links. Each rank dials the previous one (`tcpIn`, the receiving end, so it can read into one
 * reused buffer) and sends on the connection the next rank dialled (`tcpOut`).
 */
let tcpServer: net.Server | undefined
let tcpIn: net.Socket | undefined
let tcpOut: net.Socket | undefined
let tcpGot = 0
let tcpWant = Infinity
let tcpWake: (() => void) | undefined

/** Listens for the next rank's connection, the one this rank sends on. */
const tcpListen = (host: string): Promise<{ port: number }> =>
  new Promise((resolve, reject) => {
    const server = net.createServer((sock) => {
      sock.setNoDelay(true)
      sock.on("error", () => undefined)
      tcpOut = sock
    })
    server.once("error", reject)
    server.listen({ host, port: 0 }, () => resolve({ port: (server.address() as net.AddressInfo).port }))
    tcpServer = server
  })

/**
 * Connects to the previous rank (the connection this rank receives on, read into one reused 1 MiB
 * buffer, as the direct links read) and waits (10 s at most) for the next rank's connection.
 */
const tcpConnect = async (host: string, port: number): Promise<null> => {
  const readBuffer = Buffer.alloc(1 << 20)
  tcpIn = await new Promise<net.Socket>((resolve, reject) => {
    const sock = net.connect({
      host,
      port,
      onread: {
        buffer: readBuffer,
        callback: (n: number) => {
          tcpGot += n
          if (tcpGot >= tcpWant) tcpWake?.()
          return true
        }
      }
    }, () => resolve(sock))
    sock.setNoDelay(true)
    sock.once("error", reject)
  })
  const until = Date.now() + 10_000
  while (!tcpOut) {
    if (Date.now() > until) throw new Error("no connection from the next rank within 10 s")
    await new Promise((r) => setTimeout(r, 10))
  }
  return null
}

const tcpBuffers = new Map<number, Buffer>()

/** Writes `buf` in one call (libuv writes what the socket takes each time it is writable, no copy); resolves once it is all handed to the kernel. */
const writeAll = (sock: net.Socket, buf: Buffer): Promise<void> => new Promise((resolve, reject) => sock.write(buf, (e) => (e ? reject(e) : resolve())))

/** Times `iters` rounds (after `warmup`) of `bytes` to the next rank while `bytes` come from the previous one. */
const benchTcp = async (c: Communicator, bytes: number, iters: number, warmup: number): Promise<number[]> => {
  if (!tcpOut || !tcpIn) throw new Error("benchTcp before tcpListen/tcpConnect")
  let buf = tcpBuffers.get(bytes)
  if (!buf) tcpBuffers.set(bytes, (buf = Buffer.alloc(bytes, 1)))
  const out = tcpOut
  const times: number[] = []
  for (let it = 0; it < warmup + iters; it++) {
    // Reset before the barrier: the previous rank sends this round's bytes only after it.
    tcpGot = 0
    tcpWant = bytes
    const got = new Promise<void>((resolve) => (tcpWake = resolve))
    await c.barrier()
    const t0 = performance.now()
    const written = writeAll(out, buf)
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`raw TCP: got ${tcpGot} of ${bytes} bytes within 120 s`)), 120_000)))
    await Promise.race([Promise.all([got, written]), timeout]).finally(() => clearTimeout(timer))
    const dt = performance.now() - t0
    if (it >= warmup) times.push(dt)
  }
  tcpWant = Infinity
  return times
}

const tcpClose = (): null => {
  tcpOut?.destroy()
  tcpIn?.destroy()
  tcpServer?.close()
  tcpOut = tcpIn = tcpServer = undefined
  return null
}

// ---------------------------------------------------------------------------------------------

const handle = async (m: Record<string, any>): Promise<unknown> => {
  switch (m.cmd) {
    case "create": {
      const c = await Communicator.create({
        nc,
        controlNc: m.singleConnection ? undefined : cnc,
        cluster: "test",
        job: m.job ?? "collectives",
        group: m.group,
        rank: m.rank,
        worldSize: m.worldSize,
        node: m.node,
        timeoutMs: m.timeoutMs,
        createTimeoutMs: m.createTimeoutMs,
        chunkBytes: m.chunkBytes,
        windowBytes: m.windowBytes,
        ...(m.maxPayload !== undefined ? { maxPayload: m.maxPayload } : {}),
        // Deadlines derived (not explicit), capped at timeoutMs, and an owner that vouches for the
        // ranks in heldPeers: beating from their thread, their event loop held so long, their
        // process using `cpu` cores (a stand-in for the driver's answer, actors/train/worker/worker-run.ts).
        ...(m.heldPeers
          ? {
              deadlines: new MeasuredDeadlines({ capMs: m.timeoutMs }),
              ...(m.busyPeerWaitMs !== undefined ? { busyPeerWaitMs: m.busyPeerWaitMs } : {}),
              peerLiveness: async (ranks: ReadonlyArray<number>): Promise<PeerLiveness[]> =>
                ranks
                  .filter((r) => m.heldPeers.ranks.includes(r))
                  .map((rank) => ({ rank, heardAgoMs: m.heldPeers.heardAgoMs, heldMs: m.heldPeers.heldMs, hungAfterMs: m.heldPeers.hungAfterMs, ...(m.heldPeers.cpu !== undefined ? { cpu: m.heldPeers.cpu } : {}) }))
            }
          : {}),
        // The direct path: the secret travels as hex over IPC (a test may hand one rank another).
        ...(m.direct ? { direct: { ...m.direct, secret: Buffer.from(m.direct.secret, "hex") } } : {})
      })
      comms.set(m.group, c)
      return { chunkElems: c.chunkElems, windowBytes: c.windowBytes, peers: c.peers, server: nc.info?.server_id, transport: c.transport }
    }
    case "close":
      await comms.get(m.group)?.close()
      comms.delete(m.group)
      return null
    case "run":
      return runCases(comm(m.group), m.cases)
    case "start": {
      // Starts one case without waiting: the test then kills or stops ranks mid-call.
      const c = comm(m.group)
      const t0 = Date.now()
      pendingCall = runCase(c, m.case).then(
        (value) => ({ ok: true as const, value, ms: Date.now() - t0 }),
        (e) => ({ ok: false as const, error: errorOf(e), ms: Date.now() - t0 })
      )
      return null
    }
    case "result":
      return pendingCall ?? null
    case "splitFrames":
      return (comms.get(m.group) as Communicator).splitFrames
    case "transport":
      return comm(m.group).transport
    case "measureTransport": {
      // (the fleet's IPC uses advanced serialization: an Infinity threshold arrives as Infinity)
      const r = await comm(m.group).measureTransport({ sizes: m.sizes, reps: m.reps, ...(m.pairSizes ? { pairSizes: m.pairSizes } : {}) })
      return { ...r, info: comm(m.group).transport }
    }
    case "benchAllReduce":
      return benchAllReduce(comm(m.group), m.n, m.algorithm, m.iters, m.warmup, m.wire, m.fanout, m.cpu)
    case "benchRaw":
      return benchRaw(comm(m.group), m.flows, m.inbound, m.chunkBytes, m.iters, m.warmup, m.tag)
    case "tcpListen":
      return tcpListen(m.host)
    case "tcpConnect":
      return tcpConnect(m.host, m.port)
    case "benchTcp":
      return benchTcp(comm(m.group), m.bytes, m.iters, m.warmup)
    case "tcpClose":
      return tcpClose()
    case "poolStats":
      // the NATS buffer pools of this process (core/nats-internals/)
      return { receive: { ...receivePoolStats }, send: { ...sendPoolStats } }
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

let pendingCall: Promise<unknown> | undefined

;({ nc, cnc } = await connectRank("gw-rank"))
serveParent(handle)
