// Heterogeneity-aware batching vs an equal split: `npm run bench -- hetero [--mode=cgroup|sleep]`.
//
// cgroup mode (the default where we are root and /sys/fs/cgroup/cpu is writable): really unequal
// workers. One nats-server and two CLI agents (`gradwire start ... --num-cpus 1`), each started
// inside its own cpu cgroup: the fast one capped at one core, the slow one at 1/skew of a core
// (cpu.cfs_quota_us / cpu.cfs_period_us; children inherit the group, so each agent's worker runs
// under its agent's cap). Two workers placed STRICT_SPREAD, one per agent. Per skew (`--skews=2,4`)
// and strategy (`--strategies=allreduce,local-sgd[,auto,auto-local,backup,ssp,async]`: the all-reduce,
// local SGD averaging every `--sync-every` 8 steps, strategy auto with what it ended on (`auto-local`:
// with local SGD offered to it, and the last thing its decisions said of local SGD), and one parameter
// server in sync mode with one backup worker, in SSP (staleness 2) or async; the server, like auto's,
// runs on the fast node inside its one-core cap): a digits model (`--model=cnn`, 3x3 convolutions of `--conv=32,64`
// filters, dense 64 and 10; or `--model=mlp`, `--hidden=256,256`) trained with dp.fit({
// globalBatchSize }), first with an equal split (adaptiveBatching off), then with
// throughput-proportional batches (on); same data, global batch, seed and epochs. Every run is
// compared with the all-reduce's equal split (what DDP does). Reported: samples/s after the first
// (warm-up) epoch, training seconds to the target validation accuracy (both over the epochs'
// steps: each epoch from its first step's end to its last's, times n / (n - 1), so the loop's
// epoch-end evaluation and report, and a rank's wait in the next epoch's first exchange for
// another still in its own, are not counted: a strategy with a cheaper report showed that wait as
// slower steps), final accuracy, re-balances and final per-rank batches; the measured straggler
// ratio (each worker times forward+backward passes on its own before and after training, on a
// global batch's half, while the other does the same) and from it the speed-up a perfect split
// would give; the measured speed-up and its fraction of perfect; strategy auto against the fastest
// strategy it could run in the same skew and split (bench/auto-check.ts).
// Options: --skews=2,4 --epochs=15 --batch=128 --target=0.9 --period-us=10000 --repeat=1 (N: the
// strategies N times, every other time in reverse order; per repeat and medians). `--mix=wasm,cpu`:
// mixed backends, the fast node's worker on wasm and the slow node's on cpu (skews default 1: both
// capped at one core, the backends alone unequal).
//
// sleep mode (`--mode=sleep`, and the fallback when no cgroup can be made): the earlier simulation,
// every worker in one embedded cluster and one rank slowed by an extra delay per sample (`--workers 3
// --slow 1 --delay 1.5 --batch 96 --epochs 3`). Labelled "simulated (sleep)".
//
// Every agent, worker and cgroup this bench makes is removed at the end, on failure and on
// SIGINT/SIGTERM (kill -9 of what is left in each cgroup, then rmdir).
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { openNats } from "../core/connection.ts"
import { openClusterView } from "../scheduler/cluster-view.ts"
import { optionReader } from "./args.ts"
import { createCpuGroup, inGroup, type CpuGroup } from "./cgroups.ts"
import { autoAgainstBest, formatAutoCheck, type AutoCheck } from "./auto-check.ts"
import { median } from "../scheduler/cost-model.ts"

const LOOP = fileURLToPath(new URL("../test/support/hetero-loop.ts", import.meta.url)) + "#heteroLoop"
const CLI = fileURLToPath(new URL("../bin/gradwire.js", import.meta.url))
const SIMULATED = "simulated (sleep)"

/** The strategies the cgroup mode compares, each with an equal and an adaptive split. */
type Strategy = "allreduce" | "local-sgd" | "auto" | "auto-local" | "backup" | "ssp" | "async"
const STRATEGY_LABEL: Record<Strategy, (syncEvery: number) => string> = {
  allreduce: () => "all-reduce",
  "local-sgd": (h) => `local SGD (H = ${h})`,
  auto: () => "auto",
  "auto-local": (h) => `auto, local SGD (H = ${h}) offered`,
  backup: () => "PS sync, 1 backup worker",
  ssp: () => "PS SSP (s = 2)",
  async: () => "PS async"
}
/** The strategies that run a parameter server (one, on the fast node, inside its one-core cap). */
const SERVER_STRATEGIES: ReadonlyArray<Strategy> = ["auto", "auto-local", "backup", "ssp", "async"]
/** collectiveConfig for a strategy run with one parameter server. */
const serverConfig = (strategy: Strategy): Record<string, unknown> => {
  if (strategy === "backup") return { strategy: "parameter-server", parameterServer: { numServers: 1, mode: "sync" }, backupWorkers: 1 }
  if (strategy === "ssp") return { strategy: "parameter-server", parameterServer: { numServers: 1, mode: "ssp", staleness: 2 } }
  if (strategy === "async") return { strategy: "parameter-server", parameterServer: { numServers: 1, mode: "async" } }
  return {}
}

export async function run(argv: ReadonlyArray<string>): Promise<void> {
  const get = optionReader(argv)
  const mode = get("--mode", "cgroup")
  if (mode !== "cgroup" && mode !== "sleep") throw new RangeError(`--mode must be cgroup or sleep, got ${mode}`)
  if (mode === "sleep") return runSleep(argv)
  let groups: { fast: CpuGroup; slow: CpuGroup }
  const period = Number(get("--period-us", "10000"))
  try {
    const fast = createCpuGroup(`gradwire-bench-${process.pid}-fast`, period)
    try {
      groups = { fast, slow: createCpuGroup(`gradwire-bench-${process.pid}-slow`, period) }
    } catch (e) {
      fast.removeSync()
      throw e
    }
  } catch (e) {
    console.log(`hetero: cgroup mode unavailable (${(e as Error).message}); falling back to ${SIMULATED}`)
    return runSleep(argv)
  }
  return runCgroup(argv, groups)
}

// ---------------------------------------------------------------------------------------------
// cgroup mode

interface Epoch {
  readonly epoch: number
  /** Seconds in dp.fit since training began (slowest rank's clock; evaluation excluded). */
  readonly trainS: number
  readonly steps: number
  readonly valAccuracy: number
}

interface RunResult {
  readonly history: ReadonlyArray<Epoch>
  /** Each rank's own forward+backward samples/s, measured before and after training. */
  readonly calib: ReadonlyArray<number>
  readonly calibAfter: ReadonlyArray<number>
  readonly slowRank: number
  readonly batches: ReadonlyArray<number>
  readonly rebalances: number
  /** The fast rank's whole ms per step and its forward+backward ms of it, at the batcher's last exchange (adaptive runs). */
  readonly fastStep?: { readonly stepMs: number; readonly computeMs: number }
  readonly stragglers: string
  /** Strategy "auto": the strategy it ended on, with its switches. */
  readonly picked?: string
  /** Strategy "auto": the strategy it ended on. */
  readonly endedOn?: string
  /** Strategy "auto" with local SGD offered: what its last decision said of local SGD (explain.txt). */
  readonly localWhy?: string
  /** Strategy "auto": its last decision's first line and the line of the strategy it picked (explain.txt). */
  readonly autoWhy?: string
}

const samplesPerS = (r: RunResult, batch: number): number => {
  const h = r.history
  const steps = h.slice(1).reduce((s, e) => s + e.steps, 0)
  return (steps * batch) / (h.at(-1)!.trainS - h[0]!.trainS)
}
const secondsTo = (r: RunResult, target: number): number | undefined => r.history.find((e) => e.valAccuracy >= target)?.trainS
/** The fast worker's own samples/s over the slow one's: geometric mean of before and after training. */
const ratio = (r: RunResult): number =>
  Math.sqrt((r.calib[1 - r.slowRank]! / r.calib[r.slowRank]!) * (r.calibAfter[1 - r.slowRank]! / r.calibAfter[r.slowRank]!))

async function runCgroup(argv: ReadonlyArray<string>, groups: { fast: CpuGroup; slow: CpuGroup }): Promise<void> {
  const get = optionReader(argv)
  // Mixed backends: the "fast" node's workers on the first, the "slow" node's on the second.
  const mixArg = get("--mix", "")
  const mix = mixArg === "" ? undefined : (mixArg.split(",") as [string, string])
  if (mix && (mix.length !== 2 || mix.some((b) => !["wasm", "cpu"].includes(b)))) throw new RangeError(`--mix takes two CPU backends, fast node's first: wasm,cpu; got ${mixArg}`)
  const skews = get("--skews", mix ? "1" : "2,4").split(",").map(Number)
  const epochs = Number(get("--epochs", "15"))
  const batch = Number(get("--batch", "128"))
  const target = Number(get("--target", "0.9"))
  const model = get("--model", "cnn")
  if (model !== "cnn" && model !== "mlp") throw new RangeError(`--model must be cnn or mlp, got ${model}`)
  const hidden = get("--hidden", "256,256").split(",").map(Number)
  const conv = model === "cnn" ? get("--conv", "32,64").split(",").map(Number) : undefined
  for (const n of [...hidden, ...(conv ?? [])]) if (!(Number.isInteger(n) && n >= 1)) throw new RangeError(`--hidden / --conv: layer sizes must be integers >= 1, got ${n}`)
  const strategies = get("--strategies", "allreduce,local-sgd").split(",") as Strategy[]
  for (const st of strategies) if (!(st in STRATEGY_LABEL)) throw new RangeError(`--strategies: each must be one of ${Object.keys(STRATEGY_LABEL).join(", ")}, got ${st}`)
  // Within one bench run the configuration run first tended to be the faster (docs/benchmarks.md):
  // --repeat runs the strategies again, every other time in the reverse order, and each figure is
  // given per repeat and as the median over the repeats.
  const repeat = Number(get("--repeat", "1"))
  if (!(Number.isInteger(repeat) && repeat >= 1)) throw new RangeError(`--repeat must be an integer >= 1, got ${get("--repeat", "1")}`)
  const syncEvery = Number(get("--sync-every", "8"))
  if (!(Number.isInteger(syncEvery) && syncEvery >= 1)) throw new RangeError(`--sync-every must be an integer >= 1, got ${syncEvery}`)
  for (const s of skews) if (!(s >= 1)) throw new RangeError(`--skews: each skew must be a number >= 1, got ${s}`)
  if (!(epochs >= 2)) throw new RangeError(`--epochs must be >= 2 (the first is warm-up), got ${epochs}`)

  const agents: ChildProcess[] = []
  let server: NatsServerProcess | undefined
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), "gw-bench-hetero-"))
  // Synchronous, idempotent: also from a signal or exit handler.
  const cleanupSync = (): void => {
    for (const a of agents) {
      try {
        process.kill(-a.pid!, "SIGKILL")
      } catch {
        // gone already
      }
    }
    for (const g of [groups.fast, groups.slow]) {
      try {
        g.removeSync()
      } catch (e) {
        console.error(`hetero: ${(e as Error).message}`)
      }
    }
    fs.rmSync(work, { recursive: true, force: true })
  }
  const onSignal = (signal: NodeJS.Signals): void => {
    cleanupSync()
    process.off("SIGINT", onSignal)
    process.off("SIGTERM", onSignal)
    // The nats-server's own handler (or the running Trainer's) finishes and re-raises; alone, we do.
    if (process.listenerCount(signal) === 0) process.kill(process.pid, signal)
  }
  process.on("SIGINT", onSignal)
  process.on("SIGTERM", onSignal)
  process.on("exit", cleanupSync)
  try {
    const { train, test } = trainTestSplit(await loadDigits(), 0.2, 7)
    server = await launchNatsServer({ maxPayload: 8 * 1024 * 1024 })
    const cluster = `hetero-${process.pid}`
    groups.fast.setCores(1)
    for (const [node, group] of [["fast", groups.fast], ["slow", groups.slow]] as const) {
      const log = fs.openSync(path.join(work, `${node}.log`), "a")
      const [cmd, args] = inGroup(group, [
        process.execPath,
        CLI,
        "start",
        "--address",
        server.url,
        "--cluster",
        cluster,
        "--node-id",
        node,
        "--num-cpus",
        // A parameter server's CPU (strategy auto reserves one in case it moves there): a second
        // slot on the fast node, inside its one-core cap, so the server gets no CPU the others lack.
        node === "fast" && strategies.some((st) => SERVER_STRATEGIES.includes(st)) ? "2" : "1",
        "--backends",
        mix ? mix[node === "fast" ? 0 : 1] : "wasm,cpu",
        "--block",
        "--state-dir",
        path.join(work, node)
      ])
      agents.push(spawn(cmd, args, { stdio: ["ignore", log, log], detached: true }))
      fs.closeSync(log)
    }
    const conn = await openNats({ servers: server.url, name: "hetero bench" })
    const view = await openClusterView({ nc: conn.nc, cluster })
    try {
      await view.waitFor((nodes) => nodes.filter((n) => n.state === "alive").length === 2, 60_000)
    } finally {
      view.close()
      await conn.close()
    }

    console.log(
      `hetero: real heterogeneity (cgroup cpu quotas, period ${groups.slow.periodUs / 1000} ms): 2 agents, one worker each (STRICT_SPREAD); ` +
        (mix ? `mixed backends: the fast node's worker on ${mix[0]}, the slow node's on ${mix[1]}; ` : "") +
        `fast agent capped at 1 core, ` +
        `slow at 1/skew of a core; digits ${conv ? `CNN conv ${conv.join("-")}, dense 64-10` : `MLP 64-${hidden.join("-")}-10`}, SGD 0.1, dp.fit global batch ${batch}, ${epochs} epochs of ` +
        `${Math.floor(train.size / batch)} steps, target val accuracy ${target}; load average ${os.loadavg().map((l) => l.toFixed(1)).join(" ")} on ${os.cpus().length} cores`
    )
    const rows: string[] = []
    const checks: AutoCheck[] = []
    for (const skew of skews) {
      groups.slow.setCores(1 / skew)
      const fit = (strategy: Strategy, adaptive: boolean) =>
        fitOnce({ adaptive, skew, epochs, batch, hidden, conv, strategy, syncEvery, train, test, server: server!, cluster, work, slow: groups.slow })
      // The baseline: what DDP does, the all-reduce with an equal split; then every strategy's two splits.
      const runs: Array<{ strategy: Strategy; adaptive: boolean; rep: number; r: RunResult }> = []
      const bases: RunResult[] = []
      for (let rep = 0; rep < repeat; rep++) {
        for (const strategy of rep % 2 === 0 ? strategies : [...strategies].reverse()) {
          for (const adaptive of [false, true]) runs.push({ strategy, adaptive, rep, r: await fit(strategy, adaptive) })
        }
        bases.push(runs.find((x) => x.rep === rep && x.strategy === "allreduce" && !x.adaptive)?.r ?? (await fit("allreduce", false)))
      }
      // Straggler ratio: the fast worker's own forward+backward samples/s over the slow one's,
      // measured before and after training in every run (geometric mean).
      const r = Math.exp(runs.reduce((acc, x) => acc + Math.log(ratio(x.r)), 0) / runs.length)
      // Perfect split (2 workers, compute-bound): the equal split waits for the slower worker's B/2
      // samples, B / (2 t_slow); a split proportional to throughput takes B / (t_fast + t_slow).
      // (Under other load the capped "fast" worker may get less CPU than the "slow" one's cap: r < 1.)
      const perfect = (1 + Math.max(r, 1 / r)) / 2
      const fmtT = (t: number | undefined) => (t === undefined ? "not reached" : t.toFixed(1))
      const acc = (x: RunResult) => `${(x.history.at(-1)!.valAccuracy * 100).toFixed(1)}%`
      const bat = (x: RunResult) => x.batches.map((b, i) => (i === x.slowRank ? `${b}s` : String(b))).join("/")
      // Each run against its own repeat's all-reduce with the equal split.
      const speedups = new Map<string, number[]>()
      for (const { strategy, adaptive, rep, r: x } of runs) {
        const base = bases[rep]!
        const se = samplesPerS(base, batch)
        const te = secondsTo(base, target)
        const sx = samplesPerS(x, batch)
        const speedup = sx / se
        const tx = secondsTo(x, target)
        const isBase = x === base
        const key = `${STRATEGY_LABEL[strategy](syncEvery)}, ${adaptive ? "adaptive" : "equal"} split`
        if (!isBase) speedups.set(key, [...(speedups.get(key) ?? []), speedup])
        rows.push(
          `| ${skew}x${mix ? ` (${mix.join(" / ")})` : ""}${repeat > 1 ? ` (${rep + 1})` : ""} | ${r.toFixed(2)}x | ${STRATEGY_LABEL[strategy](syncEvery)}${x.picked ? ` (ended on ${x.picked})` : ""} | ${adaptive ? "adaptive" : "equal"} | ${sx.toFixed(0)} | ${speedup.toFixed(2)} | ` +
            `${fmtT(tx)}${!isBase && te !== undefined && tx !== undefined ? ` (${(te / tx).toFixed(2)}x)` : ""} | ${acc(x)} | ${adaptive ? x.rebalances : "-"} | ${bat(x)} | ` +
            `${perfect.toFixed(2)}x | ${isBase ? "-" : `${((speedup / perfect) * 100).toFixed(0)}%`} |`
        )
      }
      console.log(
        `  skew ${skew}x: worker samples/s fast/slow ${runs.map((x) => `${fmtCalib(x.r)} (${x.strategy}, ${x.adaptive ? "adaptive" : "equal"})`).join(", ")}; ` +
          `batcher stragglers: ${runs.filter((x) => x.adaptive).map((x) => `${x.r.stragglers} (${x.strategy})`).join(", ")}; slow cgroup throttled ${throttled(groups.slow)}`
      )
      // What the fast rank's step held beside its own forward+backward at the last split: its exchange, update and waits for the slow one.
      const steps = runs.filter((x) => x.adaptive && x.r.fastStep !== undefined)
      if (steps.length > 0) console.log(`  skew ${skew}x: the fast rank's step at the last split, ms (forward+backward of it): ${steps.map((x) => `${x.r.fastStep!.stepMs.toFixed(1)} (${x.r.fastStep!.computeMs.toFixed(1)}) at ${bat(x.r)} (${x.strategy})`).join(", ")}`)
      for (const x of runs) if (x.r.autoWhy) console.log(`  skew ${skew}x, ${STRATEGY_LABEL[x.strategy](syncEvery)}, ${x.adaptive ? "adaptive" : "equal"} split, last decision: ${x.r.autoWhy}`)
      for (const x of runs) if (x.r.localWhy) console.log(`  skew ${skew}x, ${STRATEGY_LABEL[x.strategy](syncEvery)}, ${x.adaptive ? "adaptive" : "equal"} split: ${x.r.localWhy}`)
      // auto against the fastest strategy it could have run, measured in this skew and repeat with the same split.
      for (let rep = 0; rep < repeat; rep++) {
        const these = runs.filter((x) => x.rep === rep)
        for (const c of autoAgainstBest(these.map((x) => ({ strategy: x.strategy, adaptive: x.adaptive, samplesPerS: samplesPerS(x.r, batch), ...(x.r.endedOn !== undefined ? { endedOn: x.r.endedOn } : {}) })))) {
          console.log(`  skew ${skew}x${repeat > 1 ? ` (repeat ${rep + 1})` : ""}, ${formatAutoCheck(c)}`)
          checks.push(c)
        }
      }
      if (repeat > 1) {
        for (const [key, xs] of speedups) {
          console.log(`  skew ${skew}x, ${key}: median over ${xs.length} repeats ${median(xs).toFixed(2)}x the all-reduce's equal split (${xs.map((v) => v.toFixed(2)).join(", ")}), ${((median(xs) / perfect) * 100).toFixed(0)}% of the perfect split's`)
        }
      }
    }
    console.log(
      [
        "",
        "| skew (nominal) | measured ratio fast/slow | strategy | split | samples/s | x all-reduce, equal split | s to target | final val acc | re-balances | final batches (s: slow) | perfect split | of perfect |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ...rows
      ].join("\n")
    )
    console.log(
      "samples/s: after the first epoch, over the epochs' steps (first step's end to last's, times n / (n - 1): epoch-end evaluation and reports not counted); s to target: seconds of steps until the first epoch end at the target accuracy (in brackets: the all-reduce's equal split / this run); " +
        "measured ratio r: the fast-cgroup worker's own forward+backward samples/s over the slow one's (before and after training, both runs); " +
        "perfect split: (1 + max(r, 1/r)) / 2, the all-reduce's speed-up with batches proportional to r, communication and fixed per-step costs ignored; of perfect: speed-up / perfect"
    )
    if (checks.length > 0) {
      const at = checks.filter((c) => c.atBest).length
      console.log(
        `strategy auto against the fastest strategy it could run, measured in the same skew and split: within 1.1x in ${at} of ${checks.length} ` +
          `(${checks.map((c) => `${c.ofBest.toFixed(2)}x`).join(", ")}), ending on it in ${checks.filter((c) => c.endedOnBest).length}`
      )
    }
  } finally {
    process.off("SIGINT", onSignal)
    process.off("SIGTERM", onSignal)
    // Agents first by SIGTERM (they stop their workers), then kill -9 of whatever is left.
    for (const a of agents) {
      try {
        process.kill(-a.pid!, "SIGTERM")
      } catch {
        // gone already
      }
    }
    await Promise.all(agents.map((a) => (a.exitCode !== null || a.signalCode !== null ? undefined : new Promise((r) => { a.once("exit", r); setTimeout(r, 5_000) }))))
    cleanupSync()
    process.off("exit", cleanupSync)
    await server?.stop()
    await fsp.rm(work, { recursive: true, force: true })
  }
}

/**
 * Strategy auto's reasons in a run's explain.txt, read once: its last decision's first line and the
 * line of the strategy it picked, and (local SGD offered) the last line about local SGD.
 */
const autoReasons = (runPath: string, localSgd: boolean): { autoWhy: string; localWhy?: string } => {
  let lines: string[]
  try {
    lines = fs.readFileSync(path.join(runPath, "explain.txt"), "utf8").split("\n")
  } catch (e) {
    const why = `explain.txt unreadable (${(e as Error).message})`
    return { autoWhy: why, ...(localSgd ? { localWhy: why } : {}) }
  }
  const last = (pick: (line: string) => boolean): string | undefined => lines.filter(pick).at(-1)?.trim()
  const picked = last((l) => l.endsWith("<- picked"))
  return {
    autoWhy: [last((l) => l.startsWith("strategy:")) ?? "no strategy line in explain.txt", ...(picked !== undefined ? [picked] : [])].join(" / "),
    ...(localSgd ? { localWhy: last((l) => l.includes("local-sgd")) ?? "no local-sgd line in explain.txt" } : {})
  }
}

const fmtCalib = (r: RunResult): string =>
  [r.calib, r.calibAfter].map((c) => `${c[1 - r.slowRank]!.toFixed(0)}/${c[r.slowRank]!.toFixed(0)}`).join(" before, ") + " after"

const throttled = (g: CpuGroup): string => {
  try {
    const stat = Object.fromEntries(
      fs
        .readFileSync(path.join(g.dir, "cpu.stat"), "utf8")
        .trim()
        .split("\n")
        .map((l) => l.split(" ") as [string, string])
    )
    return `${stat.nr_throttled} of ${stat.nr_periods} periods`
  } catch {
    return "?"
  }
}

async function fitOnce(o: {
  adaptive: boolean
  skew: number
  epochs: number
  batch: number
  hidden: number[]
  conv: number[] | undefined
  strategy: Strategy
  syncEvery: number
  train: ArrayDataset
  test: ArrayDataset
  server: NatsServerProcess
  cluster: string
  work: string
  slow: CpuGroup
}): Promise<RunResult> {
  // Which rank runs in the slow cgroup: looked up while the workers live (at the first report).
  let slowRank = -1
  let pids: number[] = []
  const r = await new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { epochs: o.epochs, globalBatchSize: o.batch, hidden: o.hidden, ...(o.conv ? { conv: o.conv } : {}), evaluate: true, calibrateSteps: 20 },
    scalingConfig: { numWorkers: 2, placementStrategy: "STRICT_SPREAD", placementTimeoutMs: 60_000 },
    runConfig: {
      name: `skew${o.skew}-${o.strategy}-${o.adaptive ? "adaptive" : "equal"}`,
      storagePath: o.work,
      progress: false,
      callbacks: [
        {
          onReport: ({ perRank }) => {
            if (slowRank >= 0) return
            pids = perRank.map((m) => Number(m.pid))
            slowRank = pids.findIndex((pid) => o.slow.holds(pid))
          }
        }
      ]
    },
    datasets: { train: o.train, test: o.test },
    collectiveConfig: {
      adaptiveBatching: o.adaptive,
      ...(o.strategy === "local-sgd" ? { strategy: "local-sgd" as const, localSgd: { syncEvery: o.syncEvery, outerOptimizer: "average" as const } } : {}),
      ...(o.strategy === "auto" ? { strategy: "auto" as const } : {}),
      ...(o.strategy === "auto-local" ? { strategy: "auto" as const, localSgd: { syncEvery: o.syncEvery, outerOptimizer: "average" as const } } : {}),
      ...serverConfig(o.strategy)
    },
    cluster: { address: o.server.url, clusterName: o.cluster }
  }).fit()
  const rounds = r.metricsPerRank
  const first = rounds[0]!
  if (slowRank < 0 || pids.length !== 2) throw new Error(`hetero: could not tell which worker ran in the slow cgroup (pids ${pids.join(", ")})`)
  const last = r.metrics!
  const batches = [0, 1].map((i) => Number(last[`batch/rank${i}`]))
  const fastRank = 1 - slowRank
  const stragglers =
    Object.entries(last)
      .filter(([k]) => k.startsWith("straggler/"))
      .map(([k, v]) => `${k.slice(10)} ${String(v)}x`)
      .join(", ") || "none"
  return {
    history: rounds.map((perRank) => ({
      epoch: Number(perRank[0]!.epoch),
      trainS: Math.max(...perRank.map((m) => Number(m.step_s))),
      steps: Number(perRank[0]!.epoch_steps),
      valAccuracy: Number(perRank[0]!.val_accuracy)
    })),
    calib: first.map((m) => Number(m.calib_samples_per_s)),
    calibAfter: rounds.at(-1)!.map((m) => Number(m.calib_after_samples_per_s)),
    slowRank,
    batches,
    rebalances: Number(last["batch/rebalances"] ?? 0),
    ...(last[`step_ms/rank${fastRank}`] !== undefined ? { fastStep: { stepMs: Number(last[`step_ms/rank${fastRank}`]), computeMs: Number(last[`compute_ms/rank${fastRank}`]) } } : {}),
    stragglers,
    ...(typeof last.strategy === "string" ? { picked: `${last.strategy}${last["strategy/switches"] ? `, ${String(last["strategy/switches"])} switches` : ""}`, endedOn: last.strategy } : {}),
    ...(o.strategy === "auto" || o.strategy === "auto-local" ? autoReasons(r.path, o.strategy === "auto-local") : {})
  }
}

// ---------------------------------------------------------------------------------------------
// sleep mode: the simulation

async function runSleep(argv: ReadonlyArray<string>): Promise<void> {
  const get = optionReader(argv)
  const workers = Number(get("--workers", "3"))
  const slow = Number(get("--slow", "1"))
  const delay = Number(get("--delay", "1.5"))
  const batch = Number(get("--batch", "96"))
  const epochs = Number(get("--epochs", "3"))
  const { train } = trainTestSplit(await loadDigits(), 0.2, 7)
  const storage = await fsp.mkdtemp(path.join(os.tmpdir(), "gw-bench-hetero-"))
  try {
    const fit = async (adaptive: boolean) => {
      const r = await new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig: { epochs, globalBatchSize: batch, slowdown: { [String(slow)]: delay } },
        scalingConfig: { numWorkers: workers },
        runConfig: { name: adaptive ? "adaptive" : "equal", storagePath: storage, progress: false },
        datasets: { train },
        collectiveConfig: { adaptiveBatching: adaptive }
      }).fit()
      return r.metrics!
    }
    console.log(
      `hetero, ${SIMULATED}: ${workers} workers, rank ${slow} slowed by ${delay} ms/sample, global batch ${batch}, ${epochs} epochs of ${Math.floor(train.size / batch)} steps (digits MLP)`
    )
    const equal = await fit(false)
    const adaptive = await fit(true)
    const e = equal.steps_per_s as number
    const a = adaptive.steps_per_s as number
    const batches = (m: Record<string, unknown>) => Array.from({ length: workers }, (_, i) => m[`batch/rank${i}`]).join("/")
    const stragglers = (m: Record<string, unknown>) =>
      Object.entries(m)
        .filter(([k]) => k.startsWith("straggler/"))
        .map(([k, v]) => `${k.slice(10)} (${String(v)}x)`)
        .join(", ") || "none"
    console.log(`  equal split        ${e.toFixed(1).padStart(7)} steps/s   batches ${batches(equal)}`)
    console.log(`  heterogeneity-aware ${a.toFixed(1).padStart(6)} steps/s   batches ${batches(adaptive)}   re-balances ${String(adaptive["batch/rebalances"])}   stragglers ${stragglers(adaptive)}`)
    console.log(`  speed-up ${(a / e).toFixed(2)}x (goal >= 1.4x); final loss equal ${(equal.loss as number).toFixed(3)}, adaptive ${(adaptive.loss as number).toFixed(3)}`)
  } finally {
    await fsp.rm(storage, { recursive: true, force: true })
  }
}
