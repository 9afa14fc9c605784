// All-reduce vs parameter servers with a straggler: `npm run bench -- strategy [--epochs 10]
// [--slow-factor 3] [--slow-rank 1] [--workers 4] [--batch 32] [--lr 0.01] [--servers 1]
// [--repeats 5] [--warmup 10] [--split both|shared|equal] [--no-reference] [--only a,b]
// [--with-auto] [--cpu-share 0.2]`.
//
// Trainer runs in this process (real worker and server processes on the embedded cluster) of the
// digits MLP with Adam, the same epochs, per-rank batch and learning rate under every strategy of
// STRATEGIES: all-reduce; parameter servers sync, sync with one backup worker, async, SSP
// (staleness 2); with --with-auto also collectiveConfig.strategy "auto". One rank is a straggler:
// it does slowFactor - 1 extra forward/backward passes per step (real CPU work, see
// test/support/strategy-loop.ts for why not a sleep), or with --cpu-share its worker process is
// limited to that many cores by a cgroup cpu quota (root and a cgroup v1 cpu controller needed),
// as a slower machine's worker is: everything it does is slower, not only its compute. Tables, each run `repeats` times
// (interleaved, medians printed):
//   - with the straggler, "shared" split: ranks stop when the group has applied the epochs'
//     gradients, so fast ranks may take over the straggler's share (what async and backup
//     workers are for);
//   - without the straggler (reference; --no-reference leaves it out);
//   - with the straggler, "equal" split: dp.fit() on every rank's own shard, every rank the same
//     steps, a barrier at every epoch's end (what a loop like examples/digits/train.ts gets).
// --split shared|equal keeps one split, --no-reference drops the table without the straggler,
// --only async,ssp keeps the all-reduce and the strategies whose names contain one of the words.
// A run that fails is shown as FAILED with its error; the others go on.
// Per strategy: gradients applied per second by the group after every rank's first `warmup`
// steps (speed-up against the all-reduce of the same table), every rank's steps/s, training and
// fit() wall time, held-out accuracy (targets: async and SSP within 2 points of the all-reduce),
// staleness and dropped gradients. Then where the time goes, measured: every rank's ms per step
// in forward/backward (the straggler's extra passes included, and shown alone), exchange and
// apply (the workers' own phase timings, from the progress messages), and the CPU the processes
// of the run used per applied gradient (workers, parameter servers, nats-server, this driver;
// /proc sampled every 50 ms, over the same window), against the machine's cores.
import * as fs from "node:fs/promises"
import { readFileSync } from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer, loadDigits, loadEngine, trainTestSplit, type ArrayDataset } from "../index.ts"
import { buildModel } from "../examples/digits/model.ts"
import type { StrategyLoopConfig, StrategyRankReport } from "../test/support/strategy-loop.ts"
import { optionReader } from "./args.ts"
import { benchVariants, type BenchVariant } from "../actors/train/worker/strategies/index.ts"
import { median } from "../scheduler/cost-model.ts"
import { clockTicks, processStat } from "./thread-cpu.ts"
import { livePids, procEntries } from "../core/proc.ts"

/** The median of the finite values (NaN when none: a failed run gives NaN figures). */
const finiteMedian = (xs: ReadonlyArray<number>): number => median(xs.filter((x) => Number.isFinite(x)))

const LOOP = fileURLToPath(new URL("../test/support/strategy-loop.ts", import.meta.url)) + "#strategyLoop"

/**
 * The configurations compared: every registered strategy's bench variants (strategy registry,
 * actors/train/worker/strategies/), the all-reduce's first as the baseline; an opt-in variant runs
 * when its flag is given ("auto" with --with-auto).
 */
const STRATEGIES: ReadonlyArray<BenchVariant> = benchVariants(process.argv)

type Split = "shared" | "equal"

interface Scenario {
  readonly title: string
  readonly split: Split
  readonly slowFactor: number
}

// ---------------------------------------------------------------------------------------------
// CPU of the run's processes, from /proc.

type ProcClass = "workers" | "servers" | "nats" | "driver"
const CLASSES: ReadonlyArray<ProcClass> = ["workers", "servers", "nats", "driver"]

interface CpuSample {
  readonly t: number
  /** Cumulative CPU ms per class (processes that exited keep their last value). */
  readonly ms: Readonly<Record<ProcClass, number>>
  /** Cumulative busy ms of the whole machine (all cores). */
  readonly machine: number
}

const machineBusyMs = (): number => {
  const f = readFileSync("/proc/stat", "latin1").split("\n", 1)[0]!.trim().split(/\s+/).slice(1).map(Number)
  // user nice system idle iowait irq softirq steal
  return ((f[0]! + f[1]! + f[2]! + f[5]! + f[6]! + (f[7] ?? 0)) * 1000) / clockTicks()
}

/** Samples the CPU of this process and its descendants by class while a run goes. */
class CpuSampler {
  readonly samples: CpuSample[] = []
  readonly #kind = new Map<number, ProcClass | null>()
  readonly #last = new Map<number, number>()
  #timer: NodeJS.Timeout | undefined

  #classify(pid: number): ProcClass | null {
    const known = this.#kind.get(pid)
    if (known !== undefined) return known
    let kind: ProcClass | null = null
    // Ours: this process or one of its descendants.
    let p = pid
    let ours = false
    for (let i = 0; i < 8 && p > 1; i++) {
      if (p === process.pid) {
        ours = true
        break
      }
      p = processStat(p)?.ppid ?? 0
    }
    if (ours) {
      if (pid === process.pid) kind = "driver"
      else {
        const actor = procEntries(pid, "environ").find((e) => e.startsWith("GRADWIRE_ACTOR="))?.slice(15) ?? ""
        const comm = processStat(pid)?.comm ?? ""
        kind = /^w\d+-\d+$/.test(actor) ? "workers" : /^ps\d+-\d+$/.test(actor) ? "servers" : comm === "nats-server" ? "nats" : null
      }
    }
    this.#kind.set(pid, kind)
    return kind
  }

  sample(): void {
    for (const pid of livePids()) {
      if (this.#classify(pid) === null) continue
      const s = processStat(pid)
      if (s) this.#last.set(pid, s.cpuMs)
    }
    const ms: Record<ProcClass, number> = { workers: 0, servers: 0, nats: 0, driver: 0 }
    for (const [pid, v] of this.#last) ms[this.#kind.get(pid)!] += v
    this.samples.push({ t: performance.timeOrigin + performance.now(), ms, machine: machineBusyMs() })
  }

  start(): void {
    this.sample()
    this.#timer = setInterval(() => this.sample(), 50)
  }

  stop(): void {
    clearInterval(this.#timer)
    this.sample()
  }

  /** CPU ms per class and of the machine between two wall-clock times (linear between samples). */
  between(t0: number, t1: number): { ms: Record<ProcClass, number>; machine: number } {
    const at = (t: number, get: (s: CpuSample) => number): number => {
      const s = this.samples
      if (s.length === 0) return 0
      if (t <= s[0]!.t) return get(s[0]!)
      for (let i = 1; i < s.length; i++) {
        if (s[i]!.t >= t) {
          const a = s[i - 1]!
          const b = s[i]!
          return get(a) + ((get(b) - get(a)) * (t - a.t)) / Math.max(1e-9, b.t - a.t)
        }
      }
      return get(s.at(-1)!)
    }
    const ms = {} as Record<ProcClass, number>
    for (const c of CLASSES) ms[c] = at(t1, (s) => s.ms[c]) - at(t0, (s) => s.ms[c])
    return { ms, machine: at(t1, (s) => s.machine) - at(t0, (s) => s.machine) }
  }
}

// ---------------------------------------------------------------------------------------------

/** What one Trainer run measured. */
interface RunStats {
  readonly gradsPerS: number
  readonly rankStepsPerS: number[]
  readonly trainS: number
  readonly fitS: number
  readonly accuracy: number
  readonly staleness: number
  readonly stalenessMax: number
  readonly dropped: number
  readonly steps: number
  readonly strategy: string
  readonly switches: number
  /** Per rank, ms per step after warm-up: forward/backward (extra passes included), exchange, apply, extra passes. */
  readonly phases: Array<[number, number, number, number]>
  /** CPU ms per applied gradient in the window, per class, and the machine's busy cores. */
  readonly cpuPerGrad: Record<ProcClass, number>
  readonly cores: number
  readonly leaked: number
}

/** One forward/backward pass of the digits MLP on a batch, alone in this process before any run (ms, median of 5 x 200). */
const soloPassMs = async (train: ArrayDataset, batch: number): Promise<{ ms: number; backend: string }> => {
  const { tf, backend } = await loadEngine("auto")
  const model = buildModel(tf, "mlp")
  const x = tf.tensor(train.x.subarray(0, batch * 64), [batch, 64])
  const y = tf.oneHot(tf.tensor1d(train.y.subarray(0, batch), "int32"), train.numClasses)
  const vars = model.trainableWeights.map((w) => w.read() as import("@tensorflow/tfjs").Variable)
  const pass = (): void => {
    const { value, grads } = tf.variableGrads(() => tf.metrics.categoricalCrossentropy(y, model.apply(x) as import("@tensorflow/tfjs").Tensor).mean() as import("@tensorflow/tfjs").Scalar, vars)
    void value.dataSync()
    tf.dispose([value, ...Object.values(grads)])
  }
  try {
    for (let i = 0; i < 200; i++) pass()
    const times: number[] = []
    for (let k = 0; k < 5; k++) {
      const t0 = performance.now()
      for (let i = 0; i < 200; i++) pass()
      times.push((performance.now() - t0) / 200)
    }
    return { ms: finiteMedian(times), backend }
  } finally {
    tf.dispose([x, y])
    model.dispose()
  }
}

/** A cgroup (v1 cpu controller) whose processes share `cores` of CPU time: the straggler's real CPU limit. */
async function cpuLimitGroup(cores: number): Promise<string> {
  const dir = `/sys/fs/cgroup/cpu/gradwire-bench-${process.pid}`
  try {
    await fs.mkdir(dir)
    // A 10 ms period (the default is 100 ms): the quota is then handed out in small slices, so the
    // rank runs slowly all the time rather than at full speed and then frozen for most of a period.
    const period = 10_000
    await fs.writeFile(path.join(dir, "cpu.cfs_period_us"), String(period))
    await fs.writeFile(path.join(dir, "cpu.cfs_quota_us"), String(Math.max(1000, Math.round(period * cores))))
    return dir
  } catch (e) {
    await fs.rmdir(dir).catch(() => {})
    throw new Error(
      `strategy: --cpu-share needs a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu (run as root on a machine that has one); ` +
        `leave --cpu-share out to slow the rank with extra passes instead (${(e as Error).message})`
    )
  }
}

/** Removes the group once its processes (the straggler's worker) have exited. */
async function removeCpuLimitGroup(dir: string): Promise<void> {
  for (let i = 0; i < 50; i++) {
    try {
      await fs.rmdir(dir)
      return
    } catch {
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  console.log(`strategy: could not remove ${dir} (a process still in it?)`)
}

const mean = (xs: ReadonlyArray<number>): number => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)

export async function run(argv: ReadonlyArray<string>): Promise<void> {
  const get = optionReader(argv)
  const epochs = Number(get("--epochs", "10"))
  const slowFactor = Number(get("--slow-factor", "3"))
  const slowRank = Number(get("--slow-rank", "1"))
  const workers = Number(get("--workers", "4"))
  const batch = Number(get("--batch", "32"))
  const lr = Number(get("--lr", "0.01"))
  const servers = Number(get("--servers", "1"))
  const repeats = Number(get("--repeats", "5"))
  const warmup = Number(get("--warmup", "10"))
  const splitArg = get("--split", "both")
  const cpuShare = argv.includes("--cpu-share") ? Number(get("--cpu-share", "0.2")) : undefined
  if (cpuShare !== undefined && !(cpuShare > 0 && cpuShare <= os.cpus().length)) throw new Error(`strategy: --cpu-share must be a number of cores in (0, ${os.cpus().length}], got ${cpuShare}`)
  const only = argv.includes("--only") ? get("--only", "").split(",").map((s) => s.trim().toLowerCase()) : undefined
  if (!(epochs >= 1) || !(slowFactor >= 1) || !(workers >= 2) || !(slowRank >= 0 && slowRank < workers) || !(batch >= 1) || !(repeats >= 1) || !(warmup >= 1) || !(servers >= 1)) {
    throw new Error(`strategy: bad arguments (epochs ${epochs}, slow-factor ${slowFactor}, slow-rank ${slowRank}, workers ${workers}, batch ${batch}, repeats ${repeats}, warmup ${warmup}, servers ${servers})`)
  }
  if (!["both", "shared", "equal"].includes(splitArg)) throw new Error(`strategy: --split must be both, shared or equal, got ${splitArg}`)
  const strategies = STRATEGIES.filter((s, i) => i === 0 || !only || only.some((o) => s.name.toLowerCase().includes(o)))
  const extra = Math.round(slowFactor - 1)
  const scenarios: Scenario[] = []
  if (splitArg !== "equal") {
    scenarios.push({ title: `with the straggler, shared split`, split: "shared", slowFactor })
    if (!argv.includes("--no-reference")) scenarios.push({ title: "without a straggler (reference), shared split", split: "shared", slowFactor: 1 })
  }
  if (splitArg !== "shared") scenarios.push({ title: "with the straggler, equal split (dp.fit on every rank's own shard)", split: "equal", slowFactor })

  const started = performance.now()
  const { train, test } = trainTestSplit(await loadDigits(), 0.2, 7)
  const solo = train.featureShape.length === 1 && train.featureShape[0] === 64 ? await soloPassMs(train, batch) : undefined
  const storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-bench-strategy-"))
  const cgroup = cpuShare !== undefined ? await cpuLimitGroup(cpuShare) : undefined
  try {
    const fit = async (s: BenchVariant, sc: Scenario, rep: number): Promise<{ stats: RunStats; ranks: StrategyRankReport[] }> => {
      const trainLoopConfig: StrategyLoopConfig = {
        epochs,
        batchSize: batch,
        learningRate: lr,
        split: sc.split,
        slowRank,
        slowFactor: sc.slowFactor,
        ...(cgroup && sc.slowFactor > 1 ? { cpuCgroup: cgroup } : {})
      }
      const phases = new Map<number, number[][]>()
      const sampler = new CpuSampler()
      sampler.start()
      const t0 = performance.now()
      let r
      try {
        r = await new Trainer({
          trainLoopPerWorker: LOOP,
          trainLoopConfig,
          scalingConfig: { numWorkers: workers },
          runConfig: {
            name: `strategy-${rep}`,
            storagePath: storage,
            progress: false,
            callbacks: [
              {
                onProgress: (info: { rank: number }) => {
                  const st = (info as { stepTimes?: number[][] }).stepTimes ?? []
                  const list = phases.get(info.rank) ?? []
                  list.push(...st)
                  phases.set(info.rank, list)
                }
              }
            ]
          },
          datasets: { train, test } as Record<string, ArrayDataset>,
          collectiveConfig: s.collective(servers)
        }).fit()
      } finally {
        sampler.stop()
      }
      const fitS = (performance.now() - t0) / 1000
      if (s.name === "auto" && process.env.GW_BENCH_EXPLAIN) {
        const text = await fs.readFile(path.join(r.path, "explain.txt"), "utf8").catch(() => "")
        console.log(`auto, ${sc.title}, run ${rep}:\n${text.slice(text.indexOf("strategy:"))}`)
      }
      const ranks = (r.metricsPerRank.at(-1) ?? []) as unknown as StrategyRankReport[]
      if (ranks.length !== workers) throw new Error(`strategy: ${s.name} reported ${ranks.length} ranks of ${workers}`)
      // The window: from when every rank has done its warm-up steps to the last step of any.
      const T0 = Math.max(...ranks.map((m) => m.stamps[Math.min(warmup, m.stamps.length) - 1] ?? m.start))
      const T1 = Math.max(...ranks.map((m) => m.stamps.at(-1) ?? m.start))
      const windowS = Math.max(1e-6, (T1 - T0) / 1000)
      let appliedIn = 0
      const rankStepsPerS = ranks.map((m) => {
        let n = 0
        m.stamps.forEach((t, i) => {
          if (t > T0 && t <= T1) {
            n++
            appliedIn += m.applied[i]!
          }
        })
        return n / windowS
      })
      const steps = ranks.reduce((a, m) => a + m.stamps.length, 0)
      const cpu = sampler.between(T0, T1)
      const cpuPerGrad = {} as Record<ProcClass, number>
      for (const c of CLASSES) cpuPerGrad[c] = cpu.ms[c] / Math.max(1, appliedIn)
      const phaseOf = (m: StrategyRankReport): [number, number, number, number] => {
        const t = (phases.get(m.rank) ?? []).filter((x) => x[0]! >= warmup)
        const extraMs = mean(m.extraMs.slice(warmup))
        return [mean(t.map((x) => x[1]!)), mean(t.map((x) => x[2]!)), mean(t.map((x) => x[3]!)), extraMs]
      }
      return {
        ranks,
        stats: {
          gradsPerS: appliedIn / windowS,
          rankStepsPerS,
          trainS: (T1 - Math.min(...ranks.map((m) => m.start))) / 1000,
          fitS,
          accuracy: ranks[0]!.valAccuracy,
          staleness: ranks.reduce((a, m) => a + m.staleness * m.stamps.length, 0) / Math.max(1, steps),
          stalenessMax: Math.max(...ranks.map((m) => m.stalenessMax)),
          dropped: ranks.reduce((a, m) => a + m.dropped, 0),
          steps,
          strategy: ranks[0]!.strategy,
          switches: ranks[0]!.switches,
          phases: ranks.map(phaseOf),
          cpuPerGrad,
          cores: cpu.machine / ((T1 - T0) || 1),
          leaked: Math.max(...ranks.map((m) => m.leakedTensors))
        }
      }
    }

    let header = false
    const results = new Map<string, RunStats[]>()
    const failures = new Map<string, string[]>()
    const key = (sc: Scenario, s: BenchVariant): string => `${sc.title}|${s.name}`
    for (let rep = 0; rep < repeats; rep++) {
      for (const sc of scenarios) {
        for (const s of strategies) {
          let got: Awaited<ReturnType<typeof fit>>
          try {
            got = await fit(s, sc, rep)
          } catch (e) {
            // A configuration that fails is shown as failed; the others go on.
            const list = failures.get(key(sc, s)) ?? []
            list.push(e instanceof Error ? e.message : String(e))
            failures.set(key(sc, s), list)
            continue
          }
          const { stats, ranks } = got
          if (!header) {
            header = true
            const r0 = ranks[0]!
            const stepsPerEpoch = Math.ceil(Math.floor(train.size / workers) / batch)
            console.log(
              `strategy: ${workers} workers on the embedded cluster, digits MLP (${r0.parameters.toLocaleString("en-US")} parameters, backend ${r0.backend}), Adam lr ${lr}, ` +
                `per-rank batch ${batch}, ${epochs} epochs = ${epochs * stepsPerEpoch * workers} gradients of ${batch} rows per run; ${servers} parameter server${servers > 1 ? "s" : ""}; ` +
                `${os.cpus().length} CPU cores; ${train.size} training rows, ${test.size} held out (digits is the only dataset in the repository)`
            )
            console.log(
              (cgroup
                ? `  straggler: rank ${slowRank}'s process is limited to ${cpuShare} of a core (a cgroup cpu quota: everything it does is slower, its compute and its share of the exchange), the rest of the cores left to the others;\n`
                : `  straggler: rank ${slowRank} does ${extra} extra forward/backward pass${extra === 1 ? "" : "es"} per step inside its step's compute (${1 + extra}x compute, real CPU work, results discarded);\n`) +
                `  one pass alone in this process before the runs: ${solo ? `${solo.ms.toFixed(2)} ms (${solo.backend})` : "not measured"}\n` +
                `  grads/s: gradients applied per second by the group, from when every rank has done ${warmup} steps to the last step; x a-r: against the all-reduce of the same table;\n` +
                `  per rank: each rank's steps/s over the same window (dropped gradients included); train: first step to last; fit: the whole Trainer.fit(), process starts included;\n` +
                `  medians of ${repeats} interleaved repeat${repeats > 1 ? "s" : ""} (in brackets: lowest-highest); target: async and SSP within 2 points of the all-reduce's accuracy\n`
            )
          }
          const list = results.get(key(sc, s)) ?? []
          list.push(stats)
          results.set(key(sc, s), list)
        }
      }
    }

    const f1 = (x: number): string => (Number.isFinite(x) ? x.toFixed(1) : "-")
    for (const sc of scenarios) {
      const base = results.get(key(sc, strategies[0]!)) ?? []
      const baseRate = finiteMedian(base.map((x) => x.gradsPerS))
      const baseAcc = finiteMedian(base.map((x) => x.accuracy))
      const gradients = epochs * Math.ceil(Math.floor(train.size / workers) / batch) * workers
      console.log(
        `${sc.title}${sc.slowFactor > 1 ? (cgroup ? ` (rank ${slowRank} limited to ${cpuShare} of a core)` : ` (rank ${slowRank} at ${1 + Math.round(sc.slowFactor - 1)}x compute)`) : ""}: ` +
          (sc.split === "shared" ? `every run applies ${gradients} gradients, fast ranks may take over the straggler's share` : `every rank does ${gradients / workers} steps, a barrier every epoch`)
      )
      console.log(
        "  strategy               grads/s (low-high)  x a-r  per rank steps/s        train s  fit s   val acc (low-high)  target           staleness mean/max  dropped"
      )
      for (const s of strategies) {
        const rs = results.get(key(sc, s)) ?? []
        const failed = failures.get(key(sc, s)) ?? []
        for (const f of [...new Set(failed)]) console.log(`  ${s.name.padEnd(20)} FAILED ${failed.filter((x) => x === f).length} of ${repeats}: ${f.slice(0, 400)}`)
        if (rs.length === 0) continue
        const rate = finiteMedian(rs.map((x) => x.gradsPerS))
        const acc = finiteMedian(rs.map((x) => x.accuracy))
        const perRank = Array.from({ length: workers }, (_, i) => finiteMedian(rs.map((x) => x.rankStepsPerS[i]!)).toFixed(0)).join("/")
        const target = s.accuracyTarget ? `>= ${(100 * (baseAcc - 0.02)).toFixed(1)} ${acc >= baseAcc - 0.02 ? "ok  " : "MISS"}` : ""
        const dropped = finiteMedian(rs.map((x) => x.dropped))
        const steps = finiteMedian(rs.map((x) => x.steps))
        const autoNote = s.name === "auto" ? `  ended on ${rs.map((x) => `${x.strategy} (${x.switches} switch${x.switches === 1 ? "" : "es"})`).join(", ")}` : ""
        console.log(
          `  ${s.name.padEnd(20)} ${rate.toFixed(0).padStart(7)} (${Math.min(...rs.map((x) => x.gradsPerS)).toFixed(0)}-${Math.max(...rs.map((x) => x.gradsPerS)).toFixed(0)})`.padEnd(44) +
            ` ${(rate / baseRate).toFixed(2).padStart(5)}  ${perRank.padEnd(22)}  ${f1(finiteMedian(rs.map((x) => x.trainS))).padStart(7)}  ${f1(finiteMedian(rs.map((x) => x.fitS))).padStart(5)}` +
            `  ${`${(100 * acc).toFixed(1)}% (${(100 * Math.min(...rs.map((x) => x.accuracy))).toFixed(1)}-${(100 * Math.max(...rs.map((x) => x.accuracy))).toFixed(1)})`.padStart(19)}  ${target.padEnd(15)}  ${finiteMedian(rs.map((x) => x.staleness)).toFixed(2).padStart(9)} / ${String(finiteMedian(rs.map((x) => x.stalenessMax))).padEnd(5)}` +
            `  ${dropped.toFixed(0)} of ${steps.toFixed(0)}${autoNote}`
        )
      }
      console.log(
        `  where the time goes, ms per step after warm-up (forward/backward with the extra passes | exchange | apply; extra passes alone), and CPU ms per applied gradient\n` +
          `  (workers + servers + nats-server + driver = all; cores: the machine's busy cores over the window, of ${os.cpus().length})`
      )
      for (const s of strategies) {
        const rs = results.get(key(sc, s)) ?? []
        if (rs.length === 0) continue
        const ph = (rank: number, i: number): number => finiteMedian(rs.map((x) => x.phases[rank]![i]!))
        const fast = Array.from({ length: workers }, (_, r) => r).filter((r) => r !== slowRank || sc.slowFactor <= 1)
        const fastPh = (i: number): number => mean(fast.map((r) => ph(r, i)))
        const cpu = (c: ProcClass): number => finiteMedian(rs.map((x) => x.cpuPerGrad[c]))
        const all = CLASSES.reduce((a, c) => a + cpu(c), 0)
        const slowPart =
          sc.slowFactor > 1 ? `   rank ${slowRank} ${f1(ph(slowRank, 0))} | ${f1(ph(slowRank, 1))} | ${f1(ph(slowRank, 2))} (extra ${f1(ph(slowRank, 3))} = ${(ph(slowRank, 3) / Math.max(1, extra)).toFixed(2)}/pass)` : ""
        const leaks = Math.max(...rs.map((x) => x.leaked))
        console.log(
          `  ${s.name.padEnd(20)} ${sc.slowFactor > 1 ? "others" : "ranks "} ${f1(fastPh(0))} | ${f1(fastPh(1))} | ${f1(fastPh(2))}${slowPart}`.padEnd(92) +
            `   CPU/grad ${f1(cpu("workers"))} + ${f1(cpu("servers"))} + ${f1(cpu("nats"))} + ${f1(cpu("driver"))} = ${f1(all)}   cores ${finiteMedian(rs.map((x) => x.cores)).toFixed(2)}` +
            (leaks > 0 ? `   LEAK ${leaks} tensors` : "")
        )
      }
      console.log("")
    }
    console.log(`  total ${((performance.now() - started) / 1000).toFixed(0)} s`)
  } finally {
    if (cgroup) await removeCpuLimitGroup(cgroup)
    await fs.rm(storage, { recursive: true, force: true })
  }
}
