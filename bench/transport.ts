// Transport benchmark: a 64 MiB float32 tensor through NATS as gradwire sends it (encode, split into
// max_payload frames, publish, receive, reassemble, decode; verified intact), next to raw NATS
// moving the same bytes as max_payload-sized messages between the same two connections, measured
// in the same run. `npm run bench -- codec [--transport-mib N] [--runs N (default 9)]` (after bench/codec.ts).
// Run for the server's default max_payload (1 MiB) and for 8 MiB. Figures are medians; compare
// ratios, not absolute GB/s, across machines.
//
// Three chunked variants are shown. "gradwire (pooled)" is how a steady sender/receiver should run:
// encodeFrames into a frame buffer from a BufferPool, given back after flush, and a Reassembler
// with a pool, the payload released once the decoded tensor is done with. "fresh buffers" is
// encodeFrames and a plain Reassembler; "encodeMessage+split" copies the tensor twice before the
// first byte goes out. What separates fresh buffers from raw is mostly the copies into fresh 64 MiB
// buffers (the encoded frames, the reassembly buffer), whose page faults cost more than the copying
// itself, while raw NATS reuses one message buffer; the pools remove those page faults.
// The subscriber's status is watched so a slow-consumer disconnect fails the run instead of
// passing for a slow transfer.
import { BufferPool, Reassembler, encodeFrames, splitMessage } from "../core/chunking.ts"
import { openNats, type NatsHandle } from "../core/connection.ts"
import { launchNatsServer } from "../core/nats-server.ts"
import { type WireTensor, decodeMessage, encodeMessage, wireTensor } from "../core/wire.ts"
import { median } from "../scheduler/cost-model.ts"

const MiB = 1024 * 1024
// One transfer must finish within this; beyond it something is stuck (lost messages, a slow
// consumer disconnect), and the bench fails loudly rather than hang.
const TRANSFER_DEADLINE_MS = 60_000

type Nats = NatsHandle & { close(): Promise<void> }

const numberArg = (args: ReadonlyArray<string>, name: string, fallback: number): number => {
  const at = args.indexOf(name)
  const value = at >= 0 ? Number(args[at + 1]) : fallback
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} needs a positive number, got "${args[at + 1]}"`)
  return value
}

/**
 * Reports the subscriber connection's trouble (slow consumer, disconnect, server error) to the
 * transfer in progress: otherwise it would show up only as the deadline passing.
 */
const watchTrouble = (sub: Nats): { current?: (e: Error) => void } => {
  const slot: { current?: (e: Error) => void } = {}
  void (async () => {
    for await (const s of sub.nc.status()) {
      if (s.type === "disconnect" || s.type === "slowConsumer" || s.type === "error") {
        slot.current?.(new Error(`subscriber connection: ${JSON.stringify(s)}`))
      }
    }
  })().catch(() => {})
  return slot
}

/**
 * Delivers the messages published on `subject` to `onMessage` until it returns true; rejects at
 * the deadline or on trouble, naming how far it got.
 */
const receive = (
  sub: Nats,
  trouble: { current?: (e: Error) => void },
  subject: string,
  onMessage: (data: Uint8Array) => boolean
): { ready: Promise<void>; done: Promise<void> } => {
  let messages = 0
  let settle!: (e?: Error) => void
  const done = new Promise<void>((resolve, reject) => {
    settle = (e) => (e ? reject(e) : resolve())
  })
  const subscription = sub.nc.subscribe(subject, {
    callback: (err, msg) => {
      if (err) return settle(err)
      messages++
      try {
        if (onMessage(msg.data)) settle()
      } catch (e) {
        settle(e as Error)
      }
    }
  })
  trouble.current = (e) => settle(new Error(`${e.message} after ${messages} messages on ${subject}`))
  const timer = setTimeout(
    () => settle(new Error(`transfer on ${subject} did not complete within ${TRANSFER_DEADLINE_MS} ms (${messages} messages arrived)`)),
    TRANSFER_DEADLINE_MS
  )
  void done
    .finally(() => {
      clearTimeout(timer)
      trouble.current = undefined
      subscription.unsubscribe()
    })
    .catch(() => {})
  return { ready: sub.nc.flush(), done }
}

/** (a) raw NATS: `total` bytes as messages of exactly maxPayload bytes; returns ms. */
const rawTransfer = async (pub: Nats, sub: Nats, trouble: { current?: (e: Error) => void }, total: number, maxPayload: number, round: number): Promise<number> => {
  const subject = `gw.bench.raw.${round}`
  const message = new Uint8Array(maxPayload).fill(7)
  const count = Math.ceil(total / maxPayload)
  let bytes = 0
  const rx = receive(sub, trouble, subject, (data) => (bytes += data.length) >= count * maxPayload)
  await rx.ready
  const t0 = performance.now()
  for (let i = 0; i < count; i++) pub.nc.publish(subject, message)
  await pub.nc.flush()
  await rx.done
  return performance.now() - t0
}

interface ChunkedResult {
  readonly ms: number
  readonly frames: number
  /** Where the time went: encode (+split), publish + flush, until reassembled, decode. */
  readonly phases: { readonly encode: number; readonly publish: number; readonly arrive: number; readonly decode: number }
}

type Variant = "split" | "fused" | "pooled"

/** Buffers the pooled variant keeps between transfers: one pool per side, as two processes would. */
interface Pools {
  readonly send: BufferPool
  readonly receive: BufferPool
}

/**
 * (b) gradwire: encode the tensor, split it into frames of at most maxPayload, publish, reassemble,
 * decode. Timed from before encoding to the decoded tensor; the intactness check runs after the
 * clock stops (it is a check, not part of sending). Variants: "split" = encodeMessage +
 * splitMessage, "fused" = encodeFrames, both into fresh buffers on both sides; "pooled" =
 * encodeFrames into a pooled frame buffer and a Reassembler with a pool, buffers given back once
 * flushed (sender) and once the decoded tensor has been checked (receiver).
 */
const chunkedTransfer = async (
  pub: Nats,
  sub: Nats,
  trouble: { current?: (e: Error) => void },
  tensor: WireTensor<"float32">,
  maxPayload: number,
  round: number,
  variant: Variant,
  pools: Pools
): Promise<ChunkedResult> => {
  const subject = `gw.bench.chunked.${round}.${variant}`
  const reassembler = new Reassembler(variant === "pooled" ? { pool: pools.receive } : {})
  let decoded: unknown
  let whole: Uint8Array | undefined
  let reassembled = 0
  let decodedAt = 0
  const rx = receive(sub, trouble, subject, (frame) => {
    whole = reassembler.push(frame)
    if (whole === undefined) return false
    reassembled = performance.now()
    decoded = decodeMessage(whole)
    decodedAt = performance.now()
    return true
  })
  await rx.ready
  const t0 = performance.now()
  const frames =
    variant === "split"
      ? splitMessage(encodeMessage({ grad: tensor }), maxPayload, `bench-${round}`)
      : encodeFrames({ grad: tensor }, maxPayload, `bench-${round}`, variant === "pooled" ? { pool: pools.send } : {})
  const encoded = performance.now()
  for (const frame of frames) pub.nc.publish(subject, frame)
  await pub.nc.flush()
  // nats.js has copied every frame into its outbound buffer once flush() resolves.
  if (variant === "pooled") pools.send.give(frames[0])
  const published = performance.now()
  await rx.done
  const ms = performance.now() - t0
  const phases = { encode: encoded - t0, publish: published - encoded, arrive: reassembled - encoded, decode: decodedAt - reassembled }
  const got = (decoded as { grad?: WireTensor } | undefined)?.grad
  if (!got || got.dtype !== "float32" || got.shape.length !== 1 || got.shape[0] !== tensor.shape[0]) {
    throw new Error(`round ${round} ${variant}: decoded value is not the float32 tensor of shape [${tensor.shape[0]}] that was sent`)
  }
  const a = Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength)
  const b = Buffer.from(got.data.buffer, got.data.byteOffset, got.data.byteLength)
  if (Buffer.compare(a, b) !== 0) throw new Error(`round ${round} ${variant}: the tensor arrived corrupted`)
  if (variant === "pooled" && !reassembler.release(whole!)) throw new Error(`round ${round}: the payload did not come from the pool`)
  return { ms, frames: frames.length, phases }
}

const gbps = (bytes: number, ms: number): string => (bytes / (ms / 1000) / 1e9).toFixed(2)

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const totalMiB = numberArg(args, "--transport-mib", 64)
  const runs = Math.round(numberArg(args, "--runs", 9))
  const total = Math.round(totalMiB * MiB)
  const elements = Math.floor(total / 4)
  const values = new Float32Array(elements)
  // Not constant: a run of equal bytes would hide a misplaced chunk.
  for (let i = 0; i < elements; i++) values[i] = Math.sin(i) * 1000 + i
  const tensor = wireTensor("float32", [elements], values)

  console.log(
    `\ntransport: ${totalMiB} MiB float32 tensor through a local nats-server, 1 publisher -> 1 subscriber connection; ` +
      `${runs} rounds after 1 warm-up, the 4 variants interleaved in a rotating order each round`
  )
  const header =
    "max_payload".padEnd(12) +
    "raw NATS".padStart(10) +
    "gradwire (pooled)".padStart(19) +
    "ratio".padStart(7) +
    "fresh buffers".padStart(15) +
    "ratio".padStart(7) +
    "encodeMessage+split".padStart(21) +
    "ratio".padStart(7) +
    "frames".padStart(8)
  console.log(header)
  const breakdown: string[] = []
  const perRound: string[] = []
  for (const maxPayload of [1 * MiB, 8 * MiB]) {
    const server = await launchNatsServer({ jetstream: false, maxPayload })
    const connections: Nats[] = []
    try {
      const pub = await openNats({ servers: server.url, name: "gw-bench-pub" })
      connections.push(pub)
      const sub = await openNats({ servers: server.url, name: "gw-bench-sub" })
      connections.push(sub)
      if (pub.maxPayload !== maxPayload) throw new Error(`server reports max_payload ${pub.maxPayload}, configured ${maxPayload}`)
      const trouble = watchTrouble(sub)
      const pools: Pools = { send: new BufferPool(), receive: new BufferPool() }
      const raw: number[] = []
      const results: Record<Variant, ChunkedResult[]> = { split: [], fused: [], pooled: [] }
      // Per round, chunked time / raw time of that same round: the ratio least hit by load that
      // changes between rounds.
      const roundRatio: Record<Variant, number[]> = { split: [], fused: [], pooled: [] }
      const order = ["raw", "pooled", "fused", "split"] as const
      // Round 0 warms up (JIT, first large allocations, fills the pools) and is not counted.
      for (let round = 0; round <= runs; round++) {
        let r = 0
        const got: Partial<Record<Variant, ChunkedResult>> = {}
        for (let k = 0; k < order.length; k++) {
          const v = order[(k + round) % order.length]
          if (v === "raw") r = await rawTransfer(pub, sub, trouble, total, maxPayload, round)
          else got[v] = await chunkedTransfer(pub, sub, trouble, tensor, maxPayload, round, v, pools)
        }
        if (round === 0) continue
        raw.push(r)
        for (const v of ["split", "fused", "pooled"] as const) {
          results[v].push(got[v]!)
          roundRatio[v].push(r / got[v]!.ms)
        }
      }
      const rawMs = median(raw)
      const ms = (v: Variant): number => median(results[v].map((x) => x.ms))
      const rate = (t: number): string => `${gbps(total, t)} GB/s`
      const ratio = (v: Variant): string => `${(median(roundRatio[v]) * 100).toFixed(0)}%`
      console.log(
        `${maxPayload / MiB} MiB`.padEnd(12) +
          rate(rawMs).padStart(10) +
          rate(ms("pooled")).padStart(19) +
          ratio("pooled").padStart(7) +
          rate(ms("fused")).padStart(15) +
          ratio("fused").padStart(7) +
          rate(ms("split")).padStart(21) +
          ratio("split").padStart(7) +
          String(results.split[0].frames).padStart(8)
      )
      perRound.push(
        `  ${`${maxPayload / MiB} MiB`.padEnd(8)}raw ms ${raw.map((x) => x.toFixed(0)).join(" ")}; ` +
          `pooled/raw ${roundRatio.pooled.map((x) => (x * 100).toFixed(0)).join(" ")} (ratio of medians ${((rawMs / ms("pooled")) * 100).toFixed(0)}%)`
      )
      for (const [name, v] of [["pooled", "pooled"], ["fresh buffers", "fused"], ["encodeMessage+split", "split"]] as const) {
        const m = (k: keyof ChunkedResult["phases"]): string => median(results[v].map((x) => x.phases[k])).toFixed(0)
        breakdown.push(
          `  ${`${maxPayload / MiB} MiB`.padEnd(8)}${name.padEnd(21)}encode ${m("encode").padStart(4)} ms, ` +
            `publish+flush ${m("publish").padStart(4)} ms, until reassembled ${m("arrive").padStart(4)} ms, decode ${m("decode").padStart(3)} ms`
        )
      }
    } finally {
      await Promise.all(connections.map((c) => c.close()))
      await server.stop()
    }
  }
  console.log(
    "GB/s = medians over the rounds; ratio = median over rounds of (raw NATS time / chunked time) in the same round. " +
      "Every chunked transfer was decoded and compared byte for byte."
  )
  console.log("per round (raw ms; pooled chunked throughput as % of raw):")
  for (const line of perRound) console.log(line)
  console.log("where the chunked time goes (medians; publish and arrival are counted from the end of encoding):")
  for (const line of breakdown) console.log(line)
}
