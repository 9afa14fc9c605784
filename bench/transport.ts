// Transport benchmark: a 64 MiB float32 tensor through NATS as gradwire sends it (encode, split into
// max_payload frames, publish, receive, reassemble, decode; verified intact), next to raw NATS
// moving the same bytes as max_payload-sized messages between the same two connections, measured
// in the same run. `npm run bench -- codec [--transport-mib N] [--runs N]` (after bench/codec.ts).
// Run for the server's default max_payload (1 MiB) and for 8 MiB. Figures are medians; compare
// ratios, not absolute GB/s, across machines.
//
// Both variants are shown: encodeMessage + splitMessage copies the tensor twice before the first
// byte goes out, encodeFrames once. The breakdown printed last says where the chunked time goes;
// what separates chunked from raw is mostly those copies into fresh 64 MiB buffers (the encoded
// frames, the reassembly buffer), whose page faults cost more than the copying itself, while raw
// NATS reuses one message buffer and nats.js's own <= max_payload buffers come back from the heap.
// The subscriber's status is watched so a slow-consumer disconnect fails the run instead of
// passing for a slow transfer.
import { Reassembler, encodeFrames, splitMessage } from "../core/chunking.ts"
import { openNats, type NatsHandle } from "../core/connection.ts"
import { launchNatsServer } from "../core/nats-server.ts"
import { type WireTensor, decodeMessage, encodeMessage, wireTensor } from "../core/wire.ts"

const MiB = 1024 * 1024
// One transfer must finish within this; beyond it something is stuck (lost messages, a slow
// consumer disconnect), and the bench fails loudly rather than hang.
const TRANSFER_DEADLINE_MS = 60_000

type Nats = NatsHandle & { close(): Promise<void> }

const median = (xs: ReadonlyArray<number>): number => {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

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

/**
 * (b) gradwire: encode the tensor, split it into frames of at most maxPayload, publish, reassemble,
 * decode. Timed from before encoding to the decoded tensor; the intactness check runs after the
 * clock stops (it is a check, not part of sending).
 */
const chunkedTransfer = async (
  pub: Nats,
  sub: Nats,
  trouble: { current?: (e: Error) => void },
  tensor: WireTensor<"float32">,
  maxPayload: number,
  round: number,
  fused: boolean
): Promise<ChunkedResult> => {
  const subject = `gw.bench.chunked.${round}.${fused ? "fused" : "split"}`
  const reassembler = new Reassembler()
  let decoded: unknown
  let reassembled = 0
  let decodedAt = 0
  const rx = receive(sub, trouble, subject, (frame) => {
    const whole = reassembler.push(frame)
    if (whole === undefined) return false
    reassembled = performance.now()
    decoded = decodeMessage(whole)
    decodedAt = performance.now()
    return true
  })
  await rx.ready
  const t0 = performance.now()
  const frames = fused
    ? encodeFrames({ grad: tensor }, maxPayload, `bench-${round}`)
    : splitMessage(encodeMessage({ grad: tensor }), maxPayload, `bench-${round}`)
  const encoded = performance.now()
  for (const frame of frames) pub.nc.publish(subject, frame)
  await pub.nc.flush()
  const published = performance.now()
  await rx.done
  const ms = performance.now() - t0
  const phases = { encode: encoded - t0, publish: published - encoded, arrive: reassembled - encoded, decode: decodedAt - reassembled }
  const got = (decoded as { grad?: WireTensor } | undefined)?.grad
  if (!got || got.dtype !== "float32" || got.shape.length !== 1 || got.shape[0] !== tensor.shape[0]) {
    throw new Error(`round ${round}: decoded value is not the float32 tensor of shape [${tensor.shape[0]}] that was sent`)
  }
  const a = Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength)
  const b = Buffer.from(got.data.buffer, got.data.byteOffset, got.data.byteLength)
  if (Buffer.compare(a, b) !== 0) throw new Error(`round ${round}: the tensor arrived corrupted`)
  return { ms, frames: frames.length, phases }
}

const gbps = (bytes: number, ms: number): string => (bytes / (ms / 1000) / 1e9).toFixed(2)

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const totalMiB = numberArg(args, "--transport-mib", 64)
  const runs = Math.round(numberArg(args, "--runs", 3))
  const total = Math.round(totalMiB * MiB)
  const elements = Math.floor(total / 4)
  const values = new Float32Array(elements)
  // Not constant: a run of equal bytes would hide a misplaced chunk.
  for (let i = 0; i < elements; i++) values[i] = Math.sin(i) * 1000 + i
  const tensor = wireTensor("float32", [elements], values)

  console.log(`\ntransport: ${totalMiB} MiB float32 tensor through a local nats-server, 1 publisher -> 1 subscriber connection, median of ${runs}`)
  console.log(
    "max_payload".padEnd(12) +
      "raw NATS".padStart(20) +
      "encodeMessage+split".padStart(22) +
      "ratio".padStart(7) +
      "encodeFrames".padStart(22) +
      "ratio".padStart(7) +
      "frames".padStart(8)
  )
  const breakdown: string[] = []
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
      const raw: number[] = []
      const split: ChunkedResult[] = []
      const fused: ChunkedResult[] = []
      // Round 0 warms up (JIT, first large allocations) and is not counted. Variants are
      // interleaved so background load hits them alike.
      for (let round = 0; round <= runs; round++) {
        const r = await rawTransfer(pub, sub, trouble, total, maxPayload, round)
        const s = await chunkedTransfer(pub, sub, trouble, tensor, maxPayload, round, false)
        const f = await chunkedTransfer(pub, sub, trouble, tensor, maxPayload, round, true)
        if (round === 0) continue
        raw.push(r)
        split.push(s)
        fused.push(f)
      }
      const rawMs = median(raw)
      const splitMs = median(split.map((r) => r.ms))
      const fusedMs = median(fused.map((r) => r.ms))
      const cell = (ms: number): string => `${gbps(total, ms)} GB/s ${ms.toFixed(0).padStart(4)} ms`
      const ratio = (ms: number): string => `${((rawMs / ms) * 100).toFixed(0)}%`
      console.log(
        `${maxPayload / MiB} MiB`.padEnd(12) +
          cell(rawMs).padStart(20) +
          cell(splitMs).padStart(22) +
          ratio(splitMs).padStart(7) +
          cell(fusedMs).padStart(22) +
          ratio(fusedMs).padStart(7) +
          String(split[0].frames).padStart(8)
      )
      for (const [name, results] of [["encodeMessage+split", split], ["encodeFrames", fused]] as const) {
        const m = (k: keyof ChunkedResult["phases"]): string => median(results.map((r) => r.phases[k])).toFixed(0)
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
  console.log("ratio = chunked throughput / raw NATS throughput; every chunked transfer was decoded and compared byte for byte")
  console.log("where the chunked time goes (medians; publish and arrival are counted from the end of encoding):")
  for (const line of breakdown) console.log(line)
}
