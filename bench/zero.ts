// ZeRO stage 0 vs 1 vs 2: `npm run bench -- zero [--steps 12] [--batch 32] [--workers 1,2,4]
// [--warmup 3] [--stages 0,1,2] [--breakdown] [--verbose] [--peers] [--clip-norm X]`. For each number of workers p, three Trainer runs in this process
// (real worker processes on the embedded cluster), one per collectiveConfig.zeroStage, of the same
// dense MLP (1024 -> 2048 -> 2048 -> 10, 6.3M parameters) with Adam on the same seeded synthetic
// batches (test/support/zero-bench-loop.ts). Per stage: the bytes each rank holds
// (dp.memoryStats(): optimizer state, reduced gradient, gradient buffers, parameter buffers), the
// median ms per dp.trainStep on rank 0 after the warm-up steps, and the bytes per step per rank
// on the wire, measured (the NATS client's counters of the rank's connections, mean over ranks)
// next to the model of the algorithms. Stage 0 is the baseline of each p block. With --breakdown
// every run also times the pieces of a step one by one (on every rank; rank 0's printed); with
// --verbose every rank's time of every timed step is printed. Runs recover from the checkpoint
// (no replicas: the memory ZeRO saves) unless --peers (the default recoverFrom: each rank keeps its
// predecessor's shard; stage 2 also sends each reduced segment to the next rank). --clip-norm X
// clips every stage's gradient by its global norm (prepareModel clipNorm; at stage 2 one more
// 4-byte all-reduce a step sums the ranks' segments' squares).
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer } from "../index.ts"
import type { ZeroBenchConfig } from "../test/support/zero-bench-loop.ts"
import { optionReader } from "./args.ts"

const LOOP = fileURLToPath(new URL("../test/support/zero-bench-loop.ts", import.meta.url)) + "#zeroBenchLoop"

type Metrics = Record<string, unknown>

const MiB = (b: number): string => (b / 2 ** 20).toFixed(1)
const num = (m: Metrics, k: string): number => Number(m[k])
const mean = (xs: ReadonlyArray<number>): number => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)

/**
 * Bytes each rank receives per step under the algorithms' model (fp32): ring all-reduce 2(p-1)/p·N,
 * ring reduce-scatter (p-1)/p·Np, fan-out all-gather (p-1)·S (S = ceil(N/p), Np = S·p). Fan-out
 * publishes a block once and the server copies it to the p-1 others, so a rank sends less than
 * it receives: N·4 for the all-reduce (the ring's reduce-scatter half, then its segment once), S·4
 * for the all-gather.
 */
const modelBytes = (stage: 0 | 1 | 2, N: number, p: number): { received: number; sent: number } => {
  if (p === 1) return { received: 0, sent: 0 }
  const S = Math.ceil(N / p)
  const Np = S * p
  const allReduce = { received: (2 * (p - 1) * N * 4) / p, sent: N * 4 }
  const reduceScatter = { received: ((p - 1) * Np * 4) / p, sent: ((p - 1) * Np * 4) / p }
  const allGather = { received: (p - 1) * S * 4, sent: S * 4 }
  if (stage === 0) return allReduce
  if (stage === 1) return { received: allReduce.received + allGather.received, sent: allReduce.sent + allGather.sent }
  return { received: reduceScatter.received + allGather.received, sent: reduceScatter.sent + allGather.sent }
}

export async function run(argv: ReadonlyArray<string>): Promise<void> {
  const get = optionReader(argv)
  const steps = Number(get("--steps", "12"))
  const warmup = Number(get("--warmup", "3"))
  const batch = Number(get("--batch", "32"))
  const workers = get("--workers", "1,2,4")
    .split(",")
    .map((w) => Number(w.trim()))
  const breakdown = argv.includes("--breakdown")
  const verbose = argv.includes("--verbose")
  const peers = argv.includes("--peers")
  const clipNormArg = get("--clip-norm", "")
  const clipNorm = clipNormArg === "" ? undefined : Number(clipNormArg)
  if (clipNorm !== undefined && !(clipNorm > 0)) throw new Error(`zero: --clip-norm must be a number > 0, got ${clipNormArg}`)
  const STAGES = get("--stages", "0,1,2")
    .split(",")
    .map((s) => Number(s.trim()) as 0 | 1 | 2)
  if (STAGES[0] !== 0 || STAGES.some((s) => s !== 0 && s !== 1 && s !== 2)) throw new Error(`zero: --stages must start with 0 (the baseline), got ${STAGES.join(",")}`)
  if (!(steps > warmup) || !(batch >= 1) || workers.some((w) => !Number.isInteger(w) || w < 1)) {
    throw new Error(`zero: need --steps > --warmup, --batch >= 1 and --workers a list of integers >= 1 (got ${steps}, ${warmup}, ${batch}, ${workers.join(",")})`)
  }
  const started = performance.now()
  const storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-bench-zero-"))
  try {
    const fit = async (p: number, stage: 0 | 1 | 2): Promise<Metrics[]> => {
      const trainLoopConfig: ZeroBenchConfig = { steps, warmup, batch, breakdown, ...(clipNorm !== undefined ? { clipNorm } : {}) }
      const r = await new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig,
        scalingConfig: { numWorkers: p },
        // Without --peers, recoverFrom "checkpoint": no rank keeps its predecessor's shard (what
        // ZeRO saves); with it, the default: a replica per rank (stage 2 also shifts each reduced segment).
        runConfig: { name: `zero-p${p}-s${stage}`, storagePath: storage, progress: false, ...(peers ? {} : { failureConfig: { recoverFrom: "checkpoint" as const } }) },
        collectiveConfig: { zeroStage: stage }
      }).fit()
      const ranks = r.metricsPerRank[0]
      if (!ranks || ranks.length !== p) throw new Error(`zero: p=${p} stage ${stage} reported ${ranks?.length ?? 0} ranks`)
      return [...ranks]
    }
    let header = false
    const breakdowns: string[] = []
    for (const p of workers) {
      const runs = new Map<number, Metrics[]>()
      for (const stage of STAGES) runs.set(stage, await fit(p, stage))
      const r0 = runs.get(0)![0]!
      const N = num(r0, "parameters")
      if (!header) {
        header = true
        console.log(
          `zero: dense MLP 1024-2048-2048-10, ${N.toLocaleString("en-US")} parameters, Adam, per-rank batch ${batch}, ` +
            `${steps} steps (${warmup} warm-up), backend ${String(r0.backend)}, ${os.cpus().length} CPU cores`
        )
        console.log(
          "  memory per rank in MiB (dp.memoryStats()); step = median ms per dp.trainStep on rank 0; wire = MiB per step per rank,\n" +
            "  measured (NATS client byte counters of the rank's connections, mean over ranks: received / sent) and model (received / sent:\n" +
            "  all-reduce 2(p-1)/p·N·4 (ring; 'auto' may take tree for a bucket, same mean over ranks), reduce-scatter (p-1)/p·Np·4,\n" +
            "  fan-out all-gather (p-1)·S·4, S = ceil(N/p), Np = S·p); targets: stage 2 optimizer state <= 1.1/p of stage 0's (--peers: 2.2/p), step <= 1.2x\n"
        )
        console.log(
          "  p  stage  opt state  x st0  (target)       red.grad  grad buf  param buf   step ms  x st0  (target)      wire measured  wire model   leaks"
        )
      }
      for (const stage of STAGES) {
        const ranks = runs.get(stage)!
        const m = ranks[0]!
        if (num(m, "parameters") !== N) throw new Error("zero: the stages' models differ")
        const opt = Math.max(...ranks.map((r) => num(r, "optimizer_state_bytes")))
        const opt0 = Math.max(...runs.get(0)!.map((r) => num(r, "optimizer_state_bytes")))
        const frac = opt / opt0
        const ms = num(m, "step_ms")
        const ratio = ms / num(r0, "step_ms")
        // "1/p + 10%": at most 1.1/p of stage 0's optimizer state; step time within 1.2x of stage 0's.
        // (--peers: each rank also holds its predecessor's shard, so 2/p + 10%.)
        const share = (peers && p > 1 ? 2.2 : 1.1) / p
        const optTarget = stage === 2 ? `<= ${share.toFixed(2)} ${frac <= share ? "ok  " : "MISS"}` : "".padEnd(12)
        const msTarget = stage === 2 ? `<= 1.20 ${ratio <= 1.2 ? "ok  " : "MISS"}` : "".padEnd(12)
        const recv = mean(ranks.map((r) => num(r, "received_bytes_per_step")))
        const sent = mean(ranks.map((r) => num(r, "sent_bytes_per_step")))
        const model = modelBytes(stage, N, p)
        const leaks = ranks.map((r) => num(r, "leaked_tensors"))
        const row =
          `  ${String(p).padStart(1)}  ${String(stage).padStart(5)}  ${MiB(opt).padStart(9)}  ${frac.toFixed(2).padStart(5)}  ${optTarget}` +
          `  ${MiB(Math.max(...ranks.map((r) => num(r, "reduced_gradient_bytes")))).padStart(8)}` +
          `  ${MiB(Math.max(...ranks.map((r) => num(r, "gradient_buffer_bytes")))).padStart(8)}` +
          `  ${MiB(Math.max(...ranks.map((r) => num(r, "parameter_buffer_bytes")))).padStart(9)}` +
          `  ${ms.toFixed(1).padStart(8)}  ${ratio.toFixed(2).padStart(5)}  ${msTarget}` +
          `  ${`${MiB(recv)} / ${MiB(sent)}`.padStart(13)}  ${`${MiB(model.received)} / ${MiB(model.sent)}`.padStart(11)}` +
          `  ${leaks.every((l) => l === 0) ? "0" : leaks.join("/")}`
        console.log(row)
        if (verbose) breakdowns.push(`  p=${p} stage ${stage} ms per step: ${ranks.map((r, i) => `rank ${i}: ${String(r.step_ms_each)}`).join("; ")}`)
        if (breakdown) {
          const pieces = Object.entries(m)
            .filter(([k]) => k.startsWith("bd_"))
            .map(([k, v]) => `${k.slice(3).replace(/_ms$/, "")} ${Number(v).toFixed(1)}`)
            .join(", ")
          breakdowns.push(`  p=${p} stage ${stage} (rank 0, ms): ${pieces}`)
        }
      }
      console.log("")
    }
    if (breakdown || verbose) {
      if (breakdown) console.log("pieces of a step, each timed alone (median):")
      for (const b of breakdowns) console.log(b)
      console.log("")
    }
    console.log(`  total ${((performance.now() - started) / 1000).toFixed(0)} s`)
  } finally {
    await fs.rm(storage, { recursive: true, force: true })
  }
}
