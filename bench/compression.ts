// Compression benchmark: `npm run bench -- compression [--mib 64] [--p 4] [--rounds 5] [--steps 3]
// [--max-payload 8M] [--codec-mib 16] [--algorithm ring] [--chunk 1M] [--window 8M] [--no-gloo] [--only none,fp16,...] [--prof DIR]
// [--link 1gbit] [--transport nats|direct|auto]`.
//
// Per registered compressor (collectives/compression/), all measured in this one run:
// - bytes this rank puts on the wire per step (GradientReducer.stats) against uncompressed fp32;
// - encode and decode cost per MiB of fp32 gradient (compression-codecs.ts, in this process);
// - the time of GradientReducer.reduceGradients on a `--mib` gradient set (four matrix-shaped
//   tensors, so PowerSGD applies) at p ranks, one OS process each, over a local nats-server with
//   max_payload 8 MiB: error feedback on, scaling, encode, collective, decode — what a training
//   step pays. Each codec runs in rank processes of its own (all started up front), as in
//   training, where a process runs one codec: no codec pays for another's heap. Time = the
//   slowest rank, barrier to done; the codecs run interleaved round by round so load from other
//   processes hits them alike. In each round a codec takes `--steps` steps back to back (a barrier
//   before each), as training does and as gloo's loop below does, rather than one step after
//   seconds idle while the other codecs ran; median over every step of every round.
// Next to the uncompressed reducer and, when `/usr/bin/python3 -c "import torch"` works, torch
// gloo's uncompressed all_reduce of the same bytes at the same p (run first, on its own).
// --prof DIR: --cpu-prof profiles of the rank processes, in DIR/<codec>.
// --link RATE (needs root): every rank in a network namespace of its own, joined to a switch (a
// bridge in a hub namespace, where the nats-server runs) by a link shaped to RATE each way with
// tc tbf, as on a cluster of p machines; gloo's workers run in the same namespaces over the same
// links. Without it everything runs on loopback, where the 2 cores, not a link, bound the time.
// --transport (default nats, the figures before the direct path existed): "direct" or "auto" makes
// every rank create its Communicator with the direct data path (collectives/direct.ts): "direct"
// sends every call peer to peer, "auto" measures the 4K/64K/1M ladder over both paths at group
// start, as a training worker does, and sends calls direct from where it won. Each rank is a node of its own, so
// its links are TCP (on loopback, or with --link over its shaped link, listening on and advertising
// its namespace's address); one random secret per run is handed to every rank. Rank 0's links of
// each codec's fleet are printed once after creation, and the bytes rank 0 sent direct at the end.
// gloo and the nats-server are the same whatever the transport.
import * as crypto from "node:crypto"
import * as os from "node:os"
import type { ResolvedCompressionConfig } from "../collectives/compression/index.ts"
import type { ReducerStats } from "../collectives/gradient-reducer.ts"
import { describeTransport, type TransportInfo, type TransportMeasurement } from "../collectives/communicator.ts"
import { CompressionFleet } from "../test/support/compression-fleet.ts"
import type { SlotSpec } from "../test/support/compression-cases.ts"
import { benchCodecs, codecFigures, type CodecFigure } from "./compression-codecs.ts"
import { runGloo, torchAvailable } from "./allreduce.ts"
import { benchNatsServer, onStar, type Star } from "../test/support/netns.ts"
import { median } from "../scheduler/cost-model.ts"

const MiB = 1024 * 1024

interface Args {
  readonly mib: number
  readonly p: number
  readonly rounds: number
  /** Back-to-back steps per codec and round. */
  readonly steps: number
  readonly maxPayload: number
  readonly codecMib: number
  readonly algorithm: string
  readonly gloo: boolean
  readonly only: ReadonlyArray<string> | undefined
  /** Directory for --cpu-prof profiles of the rank processes. */
  readonly prof: string | undefined
  /** Communicator chunk and flow-control window (default: the communicator's). */
  readonly chunk: number | undefined
  readonly window: number | undefined
  /** tc rate of each rank's link (--link), or undefined for loopback. */
  readonly link: string | undefined
  /** The ranks' data path (--transport). */
  readonly transport: Transport
}

type Transport = "nats" | "direct" | "auto"
const TRANSPORTS: ReadonlyArray<Transport> = ["nats", "direct", "auto"]

const parseArgs = (args: ReadonlyArray<string>): Args => {
  const get = (flag: string): string | undefined => {
    const i = args.indexOf(flag)
    return i >= 0 ? args[i + 1] : undefined
  }
  const num = (flag: string, dflt: number, min: number, max: number): number => {
    const raw = get(flag)
    const v = raw === undefined ? dflt : Number(raw.replace(/M(i?B)?$/i, ""))
    if (!Number.isFinite(v) || v < min || v > max) throw new RangeError(`${flag} must be a number in [${min}, ${max}], got ${raw}`)
    return v
  }
  return {
    mib: num("--mib", 64, 1, 1024),
    p: num("--p", 4, 2, 16),
    rounds: num("--rounds", 5, 1, 50),
    steps: Math.floor(num("--steps", 3, 1, 20)),
    maxPayload: num("--max-payload", 8, 1, 64) * MiB,
    codecMib: num("--codec-mib", 16, 1, 256),
    algorithm: get("--algorithm") ?? "ring",
    gloo: !args.includes("--no-gloo"),
    only: get("--only")?.split(","),
    prof: get("--prof"),
    chunk: get("--chunk") === undefined ? undefined : num("--chunk", 1, 0.0625, 64) * MiB,
    window: get("--window") === undefined ? undefined : num("--window", 8, 0.0625, 256) * MiB,
    link: get("--link"),
    transport: ((): Transport => {
      const t = get("--transport") ?? "nats"
      if (!TRANSPORTS.includes(t as Transport)) throw new RangeError(`--transport must be one of ${TRANSPORTS.join(", ")}, got ${t}`)
      return t as Transport
    })()
  }
}

interface Variant {
  readonly label: string
  /** Row of codecFigures() with this codec's encode/decode cost. */
  readonly figure: string
  readonly compression: ResolvedCompressionConfig
}

/** Every registered codec, with the config 'auto' would use (else its entry's example). */
const VARIANTS: ReadonlyArray<Variant> = benchCodecs().map((c) => ({ label: c.label, figure: c.label, compression: c.config }))

/** A NATS-safe group name for a variant. */
const groupOf = (v: Variant): string => v.label.replace(/[^A-Za-z0-9]+/g, "-")

/** Four matrices of equal size totalling `mib` MiB (4096 x 1024 each at 64 MiB). */
const gradientSet = (mib: number): SlotSpec[] => {
  const each = (mib * MiB) / 4 / 4
  const cols = Math.min(1024, Math.max(1, Math.floor(Math.sqrt(each / 4))))
  const rows = Math.floor(each / cols)
  return [0, 1, 2, 3].map((i) => ({ name: `layer${i}/kernel`, shape: [rows, cols] }))
}

const fmt = (x: number | undefined, digits = 1): string => (x === undefined || !Number.isFinite(x) ? "" : x.toFixed(digits))

const printTable = (header: string[], rows: string[][]): void => {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)))
  const line = (cols: string[]): string => cols.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join("  ")
  console.log(line(header))
  for (const r of rows) console.log(line(r))
}

interface ReduceReply {
  readonly times: number[]
  /** CPU time of the rank process during the reduction (all its threads). */
  readonly cpuMs: number[]
  readonly stats: ReducerStats
}

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const a = parseArgs(args)
  if (a.link === undefined) await measure(a, undefined, "")
  else await onStar(a.p, a.link, (star, dir) => measure(a, star, dir))
}

const measure = async (a: Args, star: Star | undefined, dir: string): Promise<void> => {
  const variants = VARIANTS.filter((v) => !a.only || a.only.includes(v.label) || v.label === "none")
  const slots = gradientSet(a.mib)
  const n = slots.reduce((s, x) => s + x.shape[0] * x.shape[1], 0)
  const bytes = n * 4
  console.log(
    `compression benchmark: gradient set ${slots.length} x [${slots[0].shape.join(" x ")}] fp32 = ${(bytes / MiB).toFixed(1)} MiB, p = ${a.p} ` +
      `(one OS process per rank), ${a.algorithm} all-reduce, transport ${a.transport}, ${star ? `one network namespace per rank, each on its own ${star.rate} link (tc tbf, both ways) to a switch` : "loopback"}, nats-server max_payload ${a.maxPayload / MiB} MiB, ${os.cpus().length} cores, load average ${os.loadavg()[0].toFixed(1)}`
  )
  console.log(`time = slowest rank, barrier to done, of GradientReducer.reduceGradients (error feedback on); ${a.steps} steps back to back per codec and round; median over all steps\n`)

  const gloo = a.gloo && torchAvailable()
  let glooMs: number | undefined
  if (gloo) glooMs = (await runGloo(a.p, [bytes], star))?.get(bytes)
  else console.log(a.gloo ? "torch not importable by /usr/bin/python3 or python3: no gloo baseline" : "gloo baseline skipped (--no-gloo)")

  const figures = new Map<string, CodecFigure>(codecFigures({ mib: a.codecMib }).map((f) => [f.name, f]))

  const samples = new Map<string, number[]>(variants.map((v) => [v.label, []]))
  const cpu = new Map<string, number[]>(variants.map((v) => [v.label, []]))
  const wire = new Map<string, ReducerStats>()
  /** Per codec, MiB rank 0 sent over its direct links in the whole run (warm-up and auto's measurement included). */
  let directSent: string | undefined
  const server = await benchNatsServer(a.maxPayload, star, dir)
  try {
    // One fleet of rank processes per codec, all alive at once, as in training, where a process
    // runs one codec: a codec's step never pays for another's heap or caches. The rounds still
    // interleave the codecs, so load from outside hits them alike.
    const fleets = new Map<string, CompressionFleet>()
    try {
      const wrap = star ? (rank: number) => ["ip", "netns", "exec", star.ranks[rank].ns] : undefined
      for (const v of variants) {
        const prof = a.prof ? ["--cpu-prof", `--cpu-prof-dir=${a.prof}/${groupOf(v)}`] : []
        fleets.set(v.label, await CompressionFleet.start(a.p, server.url, 30_000, prof, wrap))
      }
      const fleetOf = (v: Variant): CompressionFleet => fleets.get(v.label) as CompressionFleet
      // The direct path: one secret per run, hex over IPC; with --link each rank listens on (and
      // advertises) its namespace's address on the star, the only one its peers can reach it at.
      const secret = crypto.randomBytes(32).toString("hex")
      const directOf = (rank: number): Record<string, unknown> | undefined =>
        a.transport === "nats" ? undefined : { transport: a.transport, secret, ...(star ? { host: star.ranks[rank].ip, unixSocket: false } : {}) }
      const links = new Map<string, string[]>()
      for (const v of variants) {
        const created = await fleetOf(v).all<{ transport: TransportInfo; measured?: TransportMeasurement }>((rank) => ({
          cmd: "create",
          name: groupOf(v),
          rank,
          worldSize: a.p,
          compression: v.compression,
          algorithm: a.algorithm,
          timeoutMs: 120_000,
          chunkBytes: a.chunk,
          windowBytes: a.window,
          ...(directOf(rank) ? { direct: directOf(rank), measureTransport: a.transport === "auto" } : {})
        }))
        if (a.transport !== "nats") {
          const t = created[0].transport
          // explain.txt's lines for rank 0 (the port is not in them): fleets with the same ones
          // share a line; with auto the measurements differ per fleet, so one per codec.
          const lines = `listens on ${t.address?.host ?? "no address"}; ${describeTransport(t, created[0].measured).split("\n").map((l) => l.trim()).join("; ")}`
          const key = t.choice === "auto" ? `${lines}\u0000${v.label}` : lines
          links.set(key, [...(links.get(key) ?? []), v.label])
        }
      }
      if (a.transport !== "nats") {
        console.log(`direct path, rank 0 of each codec's fleet:`)
        for (const [key, labels] of links) console.log(`  ${labels.join(", ")}: ${key.split("\u0000")[0]}`)
        console.log("")
      }
      /** `iters` steps back to back from `step`; per step: the slowest rank's time. */
      const reduce = async (v: Variant, step: number, iters: number): Promise<number[]> => {
        const replies = await fleetOf(v).all<ReduceReply>(
          (rank) => ({ cmd: "reduce", name: groupOf(v), slots, seed: 1000 + step, step, weight: 1, returnData: false, iters }),
          300_000
        )
        wire.set(v.label, replies[0].stats)
        return Array.from({ length: iters }, (_, it) => {
          if (step > 0) cpu.get(v.label)?.push(replies.reduce((s, r) => s + r.cpuMs[it], 0) / replies.length)
          return Math.max(...replies.map((r) => r.times[it]))
        })
      }
      // Warm-up: JIT, buffers, subscriptions, first residuals.
      for (const v of variants) await reduce(v, 0, 1)
      for (let r = 0; r < a.rounds; r++) {
        for (let j = 0; j < variants.length; j++) {
          const v = variants[(j + r) % variants.length]
          samples.get(v.label)?.push(...(await reduce(v, 1 + r * a.steps, a.steps)))
        }
      }
      if (a.transport !== "nats") {
        const sent = await Promise.all(variants.map(async (v) => [v.label, (await fleetOf(v).call<TransportInfo>(0, { cmd: "transport", name: groupOf(v) })).bytesSent] as const))
        directSent = sent.map(([label, b]) => `${label} ${(b / MiB).toFixed(1)}`).join(", ")
      }
      for (const v of variants) await fleetOf(v).all(() => ({ cmd: "close", name: groupOf(v) }))
      if (a.prof) for (const f of fleets.values()) await f.exit()
    } finally {
      await Promise.allSettled([...fleets.values()].map((f) => f.stop()))
    }
  } finally {
    await server.stop()
  }

  const noneMs = median(samples.get("none") ?? [])
  const noneWire = wire.get("none")?.wireBytes ?? bytes
  const rows = variants.map((v) => {
    const ms = median(samples.get(v.label) ?? [])
    const w = wire.get(v.label)?.wireBytes ?? NaN
    const f = figures.get(v.figure)
    return [
      v.label,
      (w / MiB).toFixed(3),
      fmt(noneWire / w),
      fmt(f ? f.encodeWithFeedbackMsPerMiB : undefined, 2),
      fmt(f ? f.decodeMsPerMiB : undefined, 2),
      fmt(median(cpu.get(v.label) ?? [])),
      fmt(ms),
      v.label === "none" ? "" : `${fmt((100 * ms) / noneMs, 0)}%`,
      glooMs === undefined ? "" : `${fmt(ms / glooMs, 2)}x`
    ]
  })
  if (glooMs !== undefined) rows.push(["torch gloo all_reduce", (bytes / MiB).toFixed(3), "1.0", "", "", "", fmt(glooMs), `${fmt((100 * glooMs) / noneMs, 0)}%`, "1.00x"])
  printTable(["codec", "wire MiB/step", "x smaller", "enc+EF ms/MiB", "dec ms/MiB", "rank CPU ms", `${a.mib} MiB ms`, "vs none", "vs gloo"], rows)
  console.log(
    `\nwire MiB/step: what one rank publishes per step (its own messages); enc/dec: ${a.codecMib} MiB in this process, PowerSGD on one square matrix ` +
      `(its "decode" is P·Qᵀ); ` +
      `rank CPU ms: CPU time one rank process spends in the step (mean over ranks, median over steps), less sensitive to other load than wall time; rounds: ${a.rounds}, steps per round: ${a.steps}`
  )
  if (directSent !== undefined) console.log(`MiB rank 0 sent over direct links in the whole run (warm-up${a.transport === "auto" ? " and auto's measurement at group start" : ""} included): ${directSent}`)
}
