// Pipeline and tensor parallelism: `npm run bench -- pipeline [--part bubble,memory,large,recovery]
// [--steps 4] [--warmup 1] [--width 512] [--batch 128] [--stages 2,4] [--micro 1,2,4,8]
// [--large-width 768] [--large-layers 8] [--large-batch 16] [--limit-mib 128] [--runs 3]`.
//
// bubble: for S stages (one worker each) and m micro-batches, GPipe and 1F1B, each stage's measured
// bubble (the share of the schedule's time it waits for a neighbour), the mean over stages, next
// to (S-1)/(m+S-1) and to the simulated schedule with the op times the stages measured (this
// pipeline re-materialises: a backward op recomputes its forward, and the last stage does all its
// work in its backward ops, so its stages are not the formula's equal F and B).
// memory: each stage's peak stashed activation bytes, GPipe vs 1F1B (m micro-batches in flight
// against at most S - s).
// large: a model of L dense layers of width W, trained data-parallel (every worker holds all of
// it) against pipelined and tensor-parallel grids built from layer factories (no worker ever
// holds all of it), on the same number of workers: steps/s and the peak bytes per worker the tfjs
// engine held (tf.profile) against a per-worker limit that data parallelism does not fit.
// recovery: the digits MLP pipelined on a 2 stages x 2 replicas grid (4 workers, 8 epochs, a
// checkpoint per epoch), rank 1 killed (kill -9) halfway through epoch 4: the time from the
// group running to the end, fault-free, regrouped from the survivors (the default), and restarted
// from the checkpoint (recoverFrom "checkpoint"); `--runs` rounds of the three, interleaved.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer, loadDigits, trainTestSplit } from "../index.ts"
import type { PipelineBenchConfig } from "../test/support/pipeline-bench-loop.ts"
import { bubbleFraction, simulate } from "../actors/train/worker/model-parallel/schedule.ts"
import { optionReader } from "./args.ts"

const LOOP = fileURLToPath(new URL("../test/support/pipeline-bench-loop.ts", import.meta.url)) + "#pipelineBenchLoop"
const FIT_LOOP = fileURLToPath(new URL("../test/support/pipeline-loop.ts", import.meta.url)) + "#fitLoop"

type Metrics = Record<string, unknown>

const MiB = (b: number): string => (b / 2 ** 20).toFixed(1)
const pct = (x: number): string => `${(100 * x).toFixed(1)}%`
const list = (s: string): number[] => s.split(",").map((v) => Number(v.trim()))

export async function run(argv: ReadonlyArray<string>): Promise<void> {
  const get = optionReader(argv)
  const parts = get("--part", "bubble,large").split(",")
  const steps = Number(get("--steps", "4"))
  const warmup = Number(get("--warmup", "1"))
  const width = Number(get("--width", "512"))
  const batch = Number(get("--batch", "128"))
  const stageCounts = list(get("--stages", "2,4"))
  const micros = list(get("--micro", "1,2,4,8"))
  const largeWidth = Number(get("--large-width", "768"))
  const largeLayers = Number(get("--large-layers", "8"))
  const largeBatch = Number(get("--large-batch", "16"))
  const limitMiB = Number(get("--limit-mib", "128"))
  const rounds = Number(get("--runs", "3"))
  const started = performance.now()
  const storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-bench-pipeline-"))
  let runs = 0
  const fit = async (workers: number, cfg: PipelineBenchConfig): Promise<Metrics[]> => {
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: cfg,
      scalingConfig: { numWorkers: workers },
      runConfig: { name: `pipeline-${runs++}`, storagePath: storage, progress: false },
      collectiveConfig: { timeoutMs: 120_000 }
    }).fit()
    const ranks = r.metricsPerRank[0]
    if (!ranks || ranks.length !== workers) throw new Error(`pipeline: a run of ${workers} workers reported ${ranks?.length ?? 0} ranks`)
    return [...ranks]
  }
  try {
    console.log(`pipeline bench: ${os.cpus().length} cores, ${os.cpus()[0]?.model ?? "?"}; steps ${steps} after ${warmup} warm-up`)
    if (parts.includes("bubble") || parts.includes("memory")) {
      for (const S of stageCounts) {
        const configs = micros.flatMap((m) => (["gpipe", "1f1b"] as const).map((schedule) => ({ schedule, micro: m })))
        const ranks = await fit(S, { mode: "bubble", steps, warmup, batch, width, stages: S, layersPerStage: 2, configs })
        console.log(`\n## bubble, S = ${S} stages (${2 * S} dense layers of ${width}, batch ${batch}, one worker per stage)\n`)
        console.log("| schedule | m | (S-1)/(m+S-1) | simulated with measured op times | measured (mean of stages) | per stage | step ms |")
        console.log("|---|---|---|---|---|---|---|")
        for (const c of configs) {
          const k = `${c.schedule}/m${c.micro}`
          const measured = ranks.map((m) => Number(m[`${k}/bubble`]))
          const sim = simulate(c.schedule, S, c.micro, { forward: ranks.map((m) => Number(m[`${k}/forward_ms`])), backward: ranks.map((m) => Number(m[`${k}/backward_ms`])) })
          const mean = measured.reduce((a, b) => a + b, 0) / S
          console.log(`| ${c.schedule} | ${c.micro} | ${pct(bubbleFraction(S, c.micro))} | ${pct(sim.meanBubble)} | ${pct(mean)} | ${measured.map(pct).join(" / ")} | ${Number(ranks[0][`${k}/step_ms`]).toFixed(1)} |`)
        }
        console.log(`\n## activation memory per stage, S = ${S} (peak stashed stage inputs, KiB; micro-batches in flight)\n`)
        console.log(`| m | ${Array.from({ length: S }, (_, s) => `stage ${s} GPipe | stage ${s} 1F1B`).join(" | ")} |`)
        console.log(`|---|${Array.from({ length: 2 * S }, () => "---").join("|")}|`)
        for (const m of micros) {
          const cells = ranks.flatMap((r) =>
            (["gpipe", "1f1b"] as const).map((sch) => `${(Number(r[`${sch}/m${m}/activation_bytes`]) / 1024).toFixed(0)} (${String(r[`${sch}/m${m}/in_flight`])})`)
          )
          console.log(`| ${m} | ${cells.join(" | ")} |`)
        }
      }
    }
    if (parts.includes("large")) {
      const workers = 4
      const params = (largeLayers - 1) * (largeWidth * largeWidth + largeWidth) + largeWidth * 10 + 10
      console.log(
        `\n## a model over the per-worker limit: ${largeLayers} dense layers of ${largeWidth} (${(params / 1e6).toFixed(2)} M parameters, ` +
          `${MiB(params * 4)} MiB of weights), Adam, batch ${largeBatch}, ${workers} workers, limit ${limitMiB} MiB of tfjs tensors per worker\n`
      )
      console.log("| layout | step ms | steps/s | samples/s | x data parallel (samples/s) | peak MiB per worker (step) | peak MiB (prepare) | held MiB | within the limit |")
      console.log("|---|---|---|---|---|---|---|---|---|")
      const layouts: Array<[string, PipelineBenchConfig]> = [
        ["data parallel x 4", { mode: "large", variant: "dp", steps, warmup, batch: largeBatch, width: largeWidth, layers: largeLayers }],
        ["pipeline 4 stages (1F1B, m = 8)", { mode: "large", variant: "pp", stages: 4, micro: 8, steps, warmup, batch: largeBatch, width: largeWidth, layers: largeLayers }],
        ["tensor parallel 4", { mode: "large", variant: "tp", tp: 4, steps, warmup, batch: largeBatch, width: largeWidth, layers: largeLayers }],
        ["pipeline 2 x tensor 2 (m = 4)", { mode: "large", variant: "pp-tp", stages: 2, tp: 2, micro: 4, steps, warmup, batch: largeBatch, width: largeWidth, layers: largeLayers }]
      ]
      let baseRate = 0
      for (const [name, cfg] of layouts) {
        const ranks = await fit(workers, cfg).catch((e: unknown) => {
          // one layout's failure (a worker that blocked past its heartbeat deadline on a loaded machine) is a row, not the end
          console.log(`| ${name} | failed: ${(e instanceof Error ? e.message : String(e)).split("\n")[0]} ||||||||`)
          return undefined
        })
        if (!ranks) continue
        const stepMs = Math.max(...ranks.map((m) => Number(m.step_ms)))
        const peak = Math.max(...ranks.map((m) => Number(m.step_peak_bytes)))
        const prep = Math.max(...ranks.map((m) => Number(m.prepare_peak_bytes)))
        const held = Math.max(...ranks.map((m) => Number(m.held_bytes)))
        const fits = Math.max(peak, prep) <= limitMiB * 2 ** 20
        // data parallelism trains 4 batches per step (one per worker), the others one
        const rate = ((1000 / stepMs) * (cfg.variant === "dp" ? workers : 1) * largeBatch)
        if (cfg.variant === "dp") baseRate = rate
        console.log(
          `| ${name} | ${stepMs.toFixed(0)} | ${(1000 / stepMs).toFixed(2)} | ${rate.toFixed(0)} | ${(rate / baseRate).toFixed(2)} | ${MiB(peak)} | ${MiB(prep)} | ${MiB(held)} | ${fits ? "yes" : "**no**"} |`
        )
      }
    }
    if (parts.includes("recovery")) await recovery(storage, rounds)
    console.log(`\n(${((performance.now() - started) / 1000).toFixed(0)} s)`)
  } finally {
    await fs.rm(storage, { recursive: true, force: true })
  }
}

/** The recovery part (see the module comment). */
const recovery = async (storage: string, rounds: number): Promise<void> => {
  const { train, test } = trainTestSplit(await loadDigits(), 0.2, 5)
  const modes = ["fault-free", "peers", "checkpoint"] as const
  const times: Record<(typeof modes)[number], number[]> = { "fault-free": [], peers: [], checkpoint: [] }
  console.log("\n## recovery of a pipelined model: digits MLP, 2 stages x 2 replicas, 8 epochs, rank 1 killed in epoch 4\n")
  for (let round = 0; round < rounds; round++) {
    for (const mode of modes) {
      let running = 0
      const r = await new Trainer({
        trainLoopPerWorker: FIT_LOOP,
        trainLoopConfig: { epochs: 8, stages: 2, ...(mode === "fault-free" ? {} : { kill: { rank: 1, epoch: 4, step: 10 } }) },
        scalingConfig: { numWorkers: 4 },
        runConfig: {
          name: `pipeline-recovery-${mode}-${round}`,
          storagePath: storage,
          progress: false,
          failureConfig: { maxFailures: 1, ...(mode === "checkpoint" ? { recoverFrom: "checkpoint" as const } : {}) },
          callbacks: [{ onStateChange: (s) => void (s.to === "running" && running === 0 && (running = Date.now())) }]
        },
        datasets: { train, test }
      }).fit()
      const s = (Date.now() - running) / 1000
      times[mode].push(s)
      const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
      const how = events.filter((e) => e.type === "restart").map((e) => String(e.recovery)).join(", ") || "none"
      console.log(`  round ${round + 1}, ${mode}: ${s.toFixed(2)} s (restarts: ${how}; val_accuracy ${Number(r.metrics?.val_accuracy).toFixed(3)})`)
    }
  }
  const med = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
  const free = med(times["fault-free"])
  console.log("\n| recovery | running to end, s (median) | runs | cost of the fault, s |")
  console.log("|---|---|---|---|")
  for (const m of modes) {
    console.log(`| ${m} | ${med(times[m]).toFixed(2)} | ${times[m].map((t) => t.toFixed(2)).join(", ")} | ${m === "fault-free" ? "" : (med(times[m]) - free).toFixed(2)} |`)
  }
}
