// `npm run bench -- chaos [--every=15] [--seed=N] [--loops=fit,step,pipe] [--strategies=allreduce,zero,zero2,ps,localsgd,localsgd-frag,localsgd-stream,auto]
//                         [--kinds=worker-kill,worker-stop,nats-kill[,agent-kill][,link-cut][,server-kill]] [--epochs-fit=N] [--epochs-step=N] [--epochs-pipe=N]
//                         [--repeat=1] [--order=alternate|fixed] [--warmup=0.25] [--cluster=agents|veth] [--cores-per-agent=X] [--agents=3] [--bound=3] [--spares=0] [--agent-restart-ms=1000] [--cut-ms=10000] [--out=FILE]`
// Goodput under chaos: the same job (digits MLP, 3 workers on the embedded cluster, failureConfig
// { maxFailures: -1 }, recoverFrom left at its default) run fault-free, then under a seeded fault
// schedule, for a `dp.fit` loop (test/support/chaos-loop.ts) and a hand-written `dp.trainStep` loop
// (test/support/step-loop.ts), per strategy; and (`--loops=pipe`) the digits MLP pipelined on a
// 2 stages x 2 replicas grid of 4 workers with `pp.fit()` (test/support/pipeline-loop.ts fitLoop).
//
// Faults (one per `every`-second window, at a seeded random point in it; the first window opens at
// the first checkpoint; kind and victim are seeded too):
//   worker-kill  kill -9 of a random live worker (by the pid files the loops write);
//   worker-stop  SIGSTOP of a random live worker. Nothing sends it SIGCONT: a hung machine is not
//                expected to come back on its own, and gradwire is expected to fence it (its failure
//                model says the hung process is killed once it is declared failed). The bench checks
//                that it was: a victim still alive when the group resumes is SIGKILLed by the bench
//                and the fault is flagged "not fenced";
//   nats-kill    kill -9 of the embedded nats-server (its supervisor restarts it), or of the head
//                agent's (which restarts it) on a cluster of agents;
//   agent-kill   kill -9 of a random agent other than the head, its workers with it; a new agent
//                starts in its place --agent-restart-ms later, as a machine's supervisor would
//                restart a crashed one. With this kind every run (fault-free too) is on a cluster of
//                CLI agents on loopback, one CPU and one worker each (bench/chaos-cluster.ts);
//   server-kill  kill -9 of a random parameter server serving a shard (strategies ps and ps2;
//                skipped in runs of the others): with two servers (ps2) a spare started ahead (or a
//                new server) is made the lost one from the replica the other keeps, with one (ps)
//                the job restarts from the checkpoint;
//   link-cut     (root) the link of one agent, which runs with its workers in a network namespace
//                of its own at the far end of a veth pair, goes down for --cut-ms (10 s), then up;
//                the cluster of agents then listens on the veth's host end instead of loopback.
//                Without root or `ip netns` the kind is left out and the bench says why.
// --cores-per-agent=X (root, with --cluster=agents or a kind that runs on agents) caps each agent, with
// every process it starts, at X cores of CPU time (a cgroup v1 cpu quota each, bench/cgroups.ts;
// the head's nats-server shares the head's): three uncapped workers on two cores step about as fast
// as two, so a short-handed group costs next to nothing there and goodput came out above 100%; at
// 0.6 a group short of a worker has 2/3 of the CPU, as where each worker has a core of its own.
// Where no cgroup can be made the bench says so and runs uncapped.
// --agents=N (with a cluster of agents; default: one per worker) starts N agents, so that N minus the
// workers have room for spares (--spares) or replacements beside the running group's agents.
// A fault due while the group is still recovering from the previous one waits until the group
// steps again (its delay is printed and the effective fault interval is what the table says).
//
// Per run: training time = the first progress message of the first generation to the report round
// of the furthest epoch reached; goodput = (epochs / training time) under chaos over the same in
// the fault-free run (for a run that completed: fault-free time / chaos time for the same work).
// Per fault: detect = fault -> the driver's state leaves "running" (onStateChange); resume = fault
// -> the first step of a later generation (its first progress message or position file, whichever
// is seen first: in a synchronous step every member has stepped by then); lost = steps of the old
// generation redone: the furthest step any of its processes completed minus where the next
// generation started (positions.ts), in steps: step indices when both are in the same epoch (an
// epoch's steps change with the group's size, so a fraction of an epoch would count a short-handed
// epoch's step 13 of 23 as behind step 13 of 15), else epochs x the old generation's steps per
// epoch; recovery = "peers" or "checkpoint" from the
// `restart` events of events.jsonl (with the reason a checkpoint restart gives).
// Before the first pair, a fault-free warm-up run of the first loop and strategy (--warmup: that
// fraction of its epochs; 0 for none), not counted: the first run of a bench process was 2-37%
// slower than the next fault-free one in every sample on the 2-core machine, which made the first
// pair's goodput look better than it was.
// Cost of each fault (bench/chaos-cost.ts): the chaos run's lag behind the fault-free one, followed
// epoch by epoch, gained across the fault (from just before it to 5 s after), less the drift the
// lag shows away from faults (two runs of the same job differ by 10-30% on a shared machine); and
// goodput without the drift, the fault-free time over itself plus the faults' costs; and where each
// cost went (faultPhases): stalled (to the first step of the next generation), short-handed (to the
// group back at its size: a standby replacement let in), the half second after the join, and the rest
// of the 5 s window (the replacement's first, slower steps), each less the drift: per fault, and
// medians over the repeats. Each run's costs over 15 s after each fault (to the next at the latest)
// too: the slower stretch after a join lasted past 5 s in some runs, and what the 5 s window
// missed was counted as drift (docs/benchmarks.md). And each fault's cost against the chaos run's
// own pace (chaos-cost.ts ownPaceCosts: its window's time less as many epochs at the run's mean
// epoch away from faults), which leaves the fault-free partner and its noise out.
// For each join, the joined worker's CPU over its first 5 s in the group beside the survivors'
// (chaos-cost.ts joinCpu, from /proc every 250 ms): every rank runs the same steps, so a joiner that
// needs more CPU per step shows as a higher figure, or as its cap, and the group waits for it;
// split into the main threads' CPU and the rest (V8's optimizing compiler and garbage collector).
// --repeat=N runs N such pairs (a new fault schedule each) and adds each pair's goodput, their
// median and the pooled ratio: run-to-run noise on a small machine is as large as a fault's cost.
// Every other pair runs its chaos run first (--order=alternate, the default; --order=fixed runs
// the fault-free run first in every pair), and the summary gives each order's median: in controls
// with no faults (--every=1000: no fault falls in a run) the second run of a pair was the faster
// in 8 of 10 pairs, by up to 14%.
// A run is bounded: past `bound` x the fault-free run's wall time (and at most 10 minutes) it is
// interrupted and reports what it has. Every process it started is gone at the end (the Trainer
// stops the embedded cluster; leftover worker pids from the pid files are killed, on Ctrl-C too).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset, type CollectiveConfig } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import { processState } from "../actors/node/agent-state.ts"
import { seededRng, type Rng } from "../core/random.ts"
import { median } from "../scheduler/cost-model.ts"
import { actorPids, workerPids, killQuietly } from "../test/support/chaos.ts"
import { compareSteps, readPositions, type StepAt } from "../test/support/positions.ts"
import { faultCosts, faultPhases, growStalls, joinCpu, ownPaceCosts, type FaultPhases, type JoinCpu } from "./chaos-cost.ts"
import { netnsUnavailable } from "../test/support/netns.ts"
import { createCpuGroup } from "./cgroups.ts"
import { startAgentCluster, type AgentCluster } from "./chaos-cluster.ts"
import { mainThreadCpuMs, processStat } from "./thread-cpu.ts"

/** The wider window of a fault's cost the bench also prints (the 5 s one can miss a slower stretch after a join). */
const WIDE_WINDOW_MS = 15_000

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const LOOPS = {
  fit: path.join(ROOT, "test", "support", "chaos-loop.ts") + "#trainLoop",
  step: path.join(ROOT, "test", "support", "step-loop.ts") + "#stepLoop",
  // the digits MLP pipelined: 2 stages x 2 replicas, with pp.fit()
  pipe: path.join(ROOT, "test", "support", "pipeline-loop.ts") + "#fitLoop"
} as const
type LoopShape = keyof typeof LOOPS
const LOOP_LABEL: Readonly<Record<LoopShape, string>> = { fit: "dp.fit", step: "dp.trainStep", pipe: "pp.fit (2 stages x 2)" }

const STRATEGIES: Readonly<Record<string, { readonly label: string; readonly collective: CollectiveConfig }>> = {
  allreduce: { label: "all-reduce", collective: {} },
  zero: { label: "ZeRO-1", collective: { zeroStage: 1 } },
  zero2: { label: "ZeRO-2", collective: { zeroStage: 2 } },
  ps: { label: "param. servers (sync, 1)", collective: { strategy: "parameter-server", parameterServer: { mode: "sync", numServers: 1 } } },
  ps2: { label: "param. servers (sync, 2)", collective: { strategy: "parameter-server", parameterServer: { mode: "sync", numServers: 2 } } },
  localsgd: { label: "local SGD (H=8)", collective: { strategy: "local-sgd", localSgd: { syncEvery: 8 } } },
  "localsgd-frag": { label: "local SGD (H=8, 4 fragments)", collective: { strategy: "local-sgd", localSgd: { syncEvery: 8, fragments: 4, overlap: false } } },
  "localsgd-stream": { label: "local SGD (H=8, 4 fragments, overlap)", collective: { strategy: "local-sgd", localSgd: { syncEvery: 8, fragments: 4, overlap: true } } },
  // Strategy auto with local SGD offered: it recovers from the peers on the all-reduce and local
  // SGD, from the checkpoint on the servers (GRADWIRE_AUTO_PLAN fixes its moves for an A/B).
  auto: { label: "auto", collective: { strategy: "auto", localSgd: { syncEvery: 8 } } }
}

const KINDS = ["worker-kill", "worker-stop", "nats-kill", "agent-kill", "link-cut", "server-kill"] as const
type Kind = (typeof KINDS)[number]
/** What runs without --kinds: the embedded cluster's faults. */
const DEFAULT_KINDS: ReadonlyArray<Kind> = ["worker-kill", "worker-stop", "nats-kill"]
/** Kinds asked for that this machine cannot run, with why (link-cut without root or `ip netns`). */
const NOT_RUN: Array<readonly [string, string]> = []

const WORKERS = 3
/** Agents in the cluster of agents (--agents; one per worker by default). */
let agentTotal = WORKERS
/** Workers of a loop's group: a pipelined one is a 2 stages x 2 replicas grid. */
const workersOf = (loop: LoopShape): number => (loop === "pipe" ? 4 : WORKERS)
const MAX_RUN_MS = 600_000

interface FaultRecord {
  readonly kind: Kind
  /** ms since the run's first step. */
  readonly at: number
  /** How long it waited past its due time for the group to recover from the previous fault. */
  readonly delayMs: number
  readonly victim: string
  readonly attempt: number
  detectMs?: number
  resumeMs?: number
  /** fault -> the group back at its size (a standby replacement let in); absent: never short of workers. */
  wholeMs?: number
  lostSteps?: number
  recovery?: string
  reason?: string
  fenced?: boolean
}

interface RunResult {
  readonly loop: LoopShape
  readonly strategy: string
  readonly chaos: boolean
  readonly wallMs: number
  readonly trainMs: number
  readonly epochs: number
  /** Epochs reported; for a run cut at its bound, the furthest step reached in epochs (fractional). */
  readonly epochsDone: number
  readonly bounded: boolean
  readonly error?: string
  readonly faults: FaultRecord[]
  readonly restarts: number
  /** ms from the first step to the first report of each epoch (by epoch). */
  readonly epochMs: number[]
  /** Each join's CPU, the joined worker's beside the survivors' (chaos-cost.ts joinCpu). */
  readonly joins: JoinCpu[]
}

/** How often the workers' CPU is read, and at most how many reads a process keeps (an hour's). */
const CPU_SAMPLE_MS = 250
const CPU_SAMPLES_MAX = 14_400

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

const alive = (pid: number): boolean => {
  const s = processState(pid)
  return s !== undefined && s !== "Z" && s !== "X"
}
/**
 * A worker process: a node process whose pid a loop wrote (pids are not reused within a run in
 * practice; this checks anyway). One an agent started warm has retitled itself "gradwire-host ...".
 */
const isNode = (pid: number): boolean => {
  try {
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8")
    return cmdline.includes("node") || cmdline.startsWith("gradwire-host")
  } catch {
    return false
  }
}

/** Pid dirs of runs in progress: on Ctrl-C or exit their leftover workers are killed. */
const pidDirs = new Set<string>()
const killLeftovers = (dir: string): number[] => {
  const killed: number[] = []
  let pids: Map<string, number>
  try {
    pids = workerPids(dir)
  } catch {
    return killed
  }
  for (const pid of new Set(pids.values())) {
    if (alive(pid) && isNode(pid)) {
      killQuietly(pid, "SIGKILL")
      killed.push(pid)
    }
  }
  return killed
}
let trainerRunning = false
/** The cluster of agents of a run with agent-kill faults: killed on exit too. */
let agentCluster: AgentCluster | undefined
/** Signals the bench raised itself to cut a run at its bound, and the Trainer's re-raise of each: ignored. */
let ownSignals = 0
let interrupted = false
const onExit = (): void => {
  for (const d of pidDirs) killLeftovers(d)
  agentCluster?.killNow()
}
const onSigint = (): void => {
  // The Trainer's own handler stops the group and the embedded cluster, then raises the signal
  // again; this one kills what the pid files name and exits on that second signal (or at once
  // when no run is in progress). A bound the bench hit itself raises the signal too: ignored here.
  if (ownSignals > 0) {
    ownSignals--
    return
  }
  onExit()
  if (!trainerRunning || interrupted) process.exit(130)
  interrupted = true
  setTimeout(() => process.exit(130), 15_000)
}

interface Spec {
  readonly loop: LoopShape
  readonly strategy: string
  readonly epochs: number
  /** failureConfig.spares. */
  readonly spares: number
  readonly chaos?: { readonly every: number; readonly rng: Rng; readonly kinds: ReadonlyArray<Kind>; readonly boundMs: number; readonly agentRestartMs: number; readonly cutMs: number }
}

const runOnce = async (spec: Spec, storage: string, data: { train: ArrayDataset; test: ArrayDataset }, index: number, log: (line: string) => void): Promise<RunResult> => {
  const pidDir = fs.mkdtempSync(path.join(storage, "pids-"))
  pidDirs.add(pidDir)
  const name = `chaos-${spec.loop}-${spec.strategy}-${spec.chaos ? "faults" : "free"}-${index}`
  const t0 = Date.now()
  let start: number | undefined
  let furthest = { epoch: -1, at: 0 }
  const epochMs: number[] = []
  let state = { name: "scheduling", attempt: 0 }
  const leftRunning = new Map<number, number>()
  /** When a resize (a replacement let in) had the group running again. */
  const grownAt: number[] = []
  let resizing = false
  /** The first sign of a step per attempt (progress message or position file). */
  const firstStep = new Map<number, number>()
  const doneMax = new Map<number, number>()
  const firstMin = new Map<number, number>()
  // The same as (epoch, step) points, and each attempt's steps per epoch.
  const doneAtMax = new Map<number, StepAt>()
  const firstAtMin = new Map<number, StepAt>()
  const epochSteps = new Map<number, number>()
  const faults: FaultRecord[] = []
  let boundHit = false
  let boundAt = 0

  const snapshot = (): void => {
    let positions
    try {
      positions = readPositions(pidDir)
    } catch {
      return
    }
    const now = Date.now()
    for (const p of positions) {
      doneMax.set(p.attempt, Math.max(doneMax.get(p.attempt) ?? -Infinity, p.done))
      firstMin.set(p.attempt, Math.min(firstMin.get(p.attempt) ?? Infinity, p.first))
      const d = doneAtMax.get(p.attempt)
      if (!d || compareSteps(p.doneAt, d) > 0) doneAtMax.set(p.attempt, p.doneAt)
      const f = firstAtMin.get(p.attempt)
      if (!f || compareSteps(p.firstAt, f) < 0) firstAtMin.set(p.attempt, p.firstAt)
      epochSteps.set(p.attempt, p.stepsPerEpoch)
      if (!firstStep.has(p.attempt)) firstStep.set(p.attempt, now)
    }
  }

  // The fault schedule.
  const chaos = spec.chaos
  let scheduleFrom: number | undefined
  let timer: ReturnType<typeof setInterval> | undefined
  let boundTimer: ReturnType<typeof setTimeout> | undefined
  const stopped = new Map<number, FaultRecord>()
  const due = (k: number): number => scheduleFrom! + (k + windows[k]!) * chaos!.every * 1000
  const windows: number[] = []
  const liveWorkers = (): Array<[string, number]> => [...workerPids(pidDir).entries()].filter(([, pid]) => { const s = processState(pid); return s !== undefined && s !== "Z" && s !== "X" && s !== "T" && isNode(pid) })
  const recovered = (): boolean => {
    if (state.name !== "running") return false
    const last = faults.at(-1)
    return !last || [...firstStep.keys()].some((a) => a > last.attempt)
  }
  const fire = (k: number): void => {
    const rng = chaos!.rng
    const kind = chaos!.kinds[Math.floor(rng() * chaos!.kinds.length)]!
    const pick = rng()
    let victim: string
    let pid: number
    let agentNode: string | undefined
    if (kind === "nats-kill") {
      const server = agentCluster ? agentCluster.natsServerPid() : liveNatsServerPids()[0]
      if (server === undefined) return log(`    fault ${k + 1}: no nats-server pid to kill; skipped`)
      pid = server
      victim = `nats-server pid ${pid}`
    } else if (kind === "link-cut") {
      const node = agentCluster!.cuttable()
      if (node === undefined) return log(`    fault ${k + 1}: the agent behind the cuttable link is not alive; skipped`)
      pid = -1
      victim = `agent ${node}'s link`
    } else if (kind === "server-kill") {
      // The serving servers: an idle spare's death costs training nothing (it is started again). A
      // spare that took a lost server's place serves; the idle one is the newest spare, there while
      // more servers live than the job has shards (by name alone, once both first servers had been
      // replaced by spares, no server was left to kill).
      const live = [...actorPids("ps").entries()].filter(([, p]) => alive(p))
      const shards = STRATEGIES[spec.strategy]!.collective.parameterServer?.numServers ?? 1
      const spareNo = (name: string): number => Number(/spare(\d+)$/.exec(name)?.[1] ?? -1)
      const idle = live.length > shards ? live.filter(([name]) => spareNo(name) >= 0).sort(([a], [b]) => spareNo(b) - spareNo(a))[0]?.[0] : undefined
      const servers = live.filter(([name]) => name !== idle).sort(([a], [b]) => (a < b ? -1 : 1))
      if (!servers.length) return log(`    fault ${k + 1}: no parameter server to kill (the strategy has none); skipped`)
      const [name, p] = servers[Math.floor(pick * servers.length)]!
      pid = p
      victim = `server ${name} pid ${pid}`
    } else if (kind === "agent-kill") {
      const agents = agentCluster!.killable()
      if (!agents.length) return log(`    fault ${k + 1}: no live agent to kill; skipped`)
      const a = agents[Math.floor(pick * agents.length)]!
      pid = a.pid
      agentNode = a.node
      victim = `agent ${a.node} pid ${pid}`
    } else {
      const ws = liveWorkers().sort(([a], [b]) => (a < b ? -1 : 1))
      if (!ws.length) return log(`    fault ${k + 1}: no live worker to ${kind === "worker-kill" ? "kill" : "stop"}; skipped`)
      const [key, p] = ws[Math.floor(pick * ws.length)]!
      pid = p
      victim = `worker ${key} pid ${pid}`
    }
    const now = Date.now()
    const f: FaultRecord = { kind, at: now - start!, delayMs: Math.max(0, now - due(k)), victim, attempt: state.attempt }
    if (agentNode !== undefined) {
      const replacement = agentCluster!.killAgent(agentNode, chaos!.agentRestartMs)
      log(`    (agent ${replacement} starts in its place in ${chaos!.agentRestartMs} ms)`)
    } else if (kind === "link-cut") log(`    (${agentCluster!.cutLink(chaos!.cutMs)})`)
    else process.kill(pid, kind === "worker-stop" ? "SIGSTOP" : "SIGKILL")
    if (kind === "worker-stop") stopped.set(pid, f)
    faults.push(f)
    log(`    fault ${faults.length} at ${(f.at / 1000).toFixed(1)} s: ${kind} ${victim} (attempt ${f.attempt}${f.delayMs > 100 ? `, ${(f.delayMs / 1000).toFixed(1)} s late: the group was still recovering` : ""})`)
  }
  // Every worker's CPU (joinCpu): by pid, its samples, and the attempt its pid file names.
  const cpu = new Map<number, Array<readonly [number, number]>>()
  const mainCpu = new Map<number, Array<readonly [number, number]>>()
  const firstAttempt = new Map<number, number>()
  let lastCpuRead = 0
  /** Appends a sample to `pid`'s series in `to` (up to CPU_SAMPLES_MAX of them). */
  const sample = (to: Map<number, Array<readonly [number, number]>>, pid: number, now: number, ms: number): void => {
    const series = to.get(pid) ?? []
    if (series.length < CPU_SAMPLES_MAX) series.push([now, ms])
    to.set(pid, series)
  }
  const readCpu = (): void => {
    const now = Date.now()
    if (now - lastCpuRead < CPU_SAMPLE_MS) return
    lastCpuRead = now
    for (const [key, pid] of workerPids(pidDir)) {
      const ms = processStat(pid)?.cpuMs
      if (ms === undefined) continue
      if (!firstAttempt.has(pid)) firstAttempt.set(pid, Number(key.split("-")[0]))
      sample(cpu, pid, now, ms)
      const main = mainThreadCpuMs(pid)
      if (main !== undefined) sample(mainCpu, pid, now, main)
    }
  }
  const tick = (): void => {
    snapshot()
    readCpu()
    if (!chaos || scheduleFrom === undefined) return
    // Fence check: a stopped victim still alive once the group stepped again.
    for (const [pid, f] of stopped) {
      if ([...firstStep.keys()].some((a) => a > f.attempt)) {
        stopped.delete(pid)
        f.fenced = !alive(pid)
        if (!f.fenced) {
          killQuietly(pid, "SIGKILL")
          log(`    the stopped worker pid ${pid} was still there when the group resumed: killed by the bench`)
        }
      }
    }
    // No fault in the last 2 epochs: the run would end before it is detected.
    if (furthest.epoch >= spec.epochs - 3) return
    const k = faults.length
    while (windows.length <= k) windows.push(chaos.rng())
    if (Date.now() >= due(k) && recovered()) fire(k)
  }

  // The loops take the same options here (pid files, position files; a pipeline its stages).
  const cfg = { epochs: spec.epochs, pidDir, positions: true, ...(spec.loop === "pipe" ? { stages: 2 } : {}) }
  const strategy = STRATEGIES[spec.strategy]!
  let error: string | undefined
  // Every agent back (one killed in the previous run is replaced) before the group is placed.
  await agentCluster?.waitForAgents(agentTotal)
  trainerRunning = true
  try {
    timer = setInterval(tick, 50)
    if (chaos) {
      boundTimer = setTimeout(() => {
        boundHit = true
        boundAt = Date.now()
        ownSignals += 2
        log(`    bound reached (${(chaos.boundMs / 1000).toFixed(0)} s): interrupting the run`)
        process.kill(process.pid, "SIGINT")
      }, chaos.boundMs)
    }
    await new Trainer({
      trainLoopPerWorker: LOOPS[spec.loop],
      trainLoopConfig: cfg,
      scalingConfig: { numWorkers: workersOf(spec.loop) },
      collectiveConfig: strategy.collective,
      runConfig: {
        name,
        storagePath: storage,
        progress: false,
        failureConfig: { maxFailures: -1, ...(spec.spares > 0 ? { spares: spec.spares } : {}) },
        callbacks: [
          {
            onStateChange: (s) => {
              const now = Date.now()
              if (s.from === "running" && (s.to === "restarting" || s.to === "resizing") && !leftRunning.has(s.attempt)) {
                snapshot()
                leftRunning.set(s.attempt, now)
              }
              state = { name: s.to, attempt: s.attempt }
              if (s.to === "resizing") resizing = true
              else if (s.to === "running" && resizing) {
                resizing = false
                grownAt.push(now)
              }
              if (process.env.GW_CHAOS_DEBUG) log(`      state ${s.from} -> ${s.to} (attempt ${s.attempt}) at ${((now - (start ?? now)) / 1000).toFixed(2)} s`)
            },
            onProgress: (p) => {
              const now = Date.now()
              start ??= now
              if (!firstStep.has(p.attempt)) firstStep.set(p.attempt, now)
            },
            onReport: ({ metrics }) => {
              const epoch = Number(metrics.epoch)
              if (epoch > furthest.epoch) furthest = { epoch, at: Date.now() }
              if (start !== undefined && epochMs[epoch] === undefined) epochMs[epoch] = Date.now() - start
              if (process.env.GW_CHAOS_DEBUG) log(`      report epoch ${epoch} at ${((Date.now() - (start ?? Date.now())) / 1000).toFixed(2)} s`)
            },
            onCheckpoint: () => {
              if (chaos && scheduleFrom === undefined) scheduleFrom = Date.now()
            }
          }
        ]
      },
      datasets: { train: data.train, test: data.test },
      ...(agentCluster ? { cluster: { address: agentCluster.url, clusterName: agentCluster.clusterName } } : {})
    }).fit()
  } catch (e) {
    error = boundHit ? "bounded" : e instanceof Error ? `${e.name}: ${e.message.split("\n")[0]}` : String(e)
  } finally {
    clearInterval(timer)
    clearTimeout(boundTimer)
    trainerRunning = false
    const killed = killLeftovers(pidDir)
    if (killed.length) log(`    killed ${killed.length} leftover worker process(es): ${killed.join(", ")}`)
    for (const pid of liveNatsServerPids()) {
      killQuietly(pid, "SIGKILL")
      log(`    killed a leftover nats-server (pid ${pid})`)
    }
    pidDirs.delete(pidDir)
    // The Trainer raises the signal again once its teardown is written: wait for it (at most 15 s).
    for (let waited = 0; ownSignals > 0 && waited < 15_000; waited += 100) await sleep(100)
    ownSignals = 0
  }
  snapshot()
  // Per fault: detection, resumption, steps lost, how the group recovered.
  const events = readEvents(path.join(storage, name, "events.jsonl"))
  const restartEvents = events.filter((e) => e.type === "restart")
  for (const [i, f] of faults.entries()) {
    const at = start! + f.at
    const nextFault = faults[i + 1] !== undefined ? start! + faults[i + 1]!.at : Number.POSITIVE_INFINITY
    const grown = grownAt.find((t) => t >= at && t < nextFault)
    if (grown !== undefined) f.wholeMs = grown - at
    const left = [...leftRunning.entries()].filter(([a, t]) => a >= f.attempt && t >= at).sort((x, y) => x[1] - y[1])[0]
    if (left) f.detectMs = left[1] - at
    const next = [...firstStep.entries()].filter(([a]) => a > f.attempt).sort((x, y) => x[0] - y[0])[0]
    if (next) {
      f.resumeMs = Math.max(0, Math.min(...[...firstStep.entries()].filter(([a]) => a > f.attempt).map(([, t]) => t)) - at)
      const done = doneMax.get(f.attempt)
      const first = firstMin.get(next[0])
      const doneAt = doneAtMax.get(f.attempt)
      const firstAt = firstAtMin.get(next[0])
      if (doneAt && firstAt && doneAt.epoch === firstAt.epoch) f.lostSteps = Math.max(0, doneAt.step - firstAt.step)
      else if (done !== undefined && first !== undefined) f.lostSteps = Math.max(0, (done - first) * (epochSteps.get(f.attempt) ?? 0))
      const rs = restartEvents.filter((e) => Number(e.attempt) > f.attempt && Number(e.attempt) <= next[0])
      const ckpt = rs.find((e) => e.recovery === "checkpoint")
      f.recovery = ckpt ? "checkpoint" : rs.length ? String(rs.at(-1)!.recovery) : "?"
      if (ckpt?.reason !== undefined) f.reason = String(ckpt.reason)
    }
  }
  // A run cut at its bound: the work is the furthest step any process completed, over the time to the cut.
  const reached = Math.max(furthest.epoch + 1, ...doneMax.values())
  const end = boundHit ? boundAt : furthest.at || Date.now()
  return {
    loop: spec.loop,
    strategy: spec.strategy,
    chaos: !!chaos,
    wallMs: Date.now() - t0,
    trainMs: start !== undefined ? end - start : NaN,
    epochs: spec.epochs,
    epochsDone: boundHit ? reached : furthest.epoch + 1,
    bounded: boundHit,
    ...(error !== undefined ? { error } : {}),
    faults,
    restarts: restartEvents.length,
    epochMs: Array.from(epochMs, (x) => x ?? Number.NaN),
    joins: joinCpu(cpu, firstAttempt, firstStep, undefined, mainCpu)
  }
}

const readEvents = (file: string): Array<Record<string, unknown>> => {
  try {
    return fs
      .readFileSync(file, "utf8")
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map((l) => JSON.parse(l) as Record<string, unknown>)
  } catch {
    return []
  }
}

/** Why no cpu cgroup can be made here (not root, no cpu controller), or undefined: one is made and removed. */
const cgroupsUnavailable = (): string | undefined => {
  try {
    createCpuGroup(`gwchaos${process.pid}-probe`).removeSync()
    return undefined
  } catch (e) {
    return (e as Error).message
  }
}

const s2 = (ms: number | undefined): string => (ms !== undefined && Number.isFinite(ms) ? (ms / 1000).toFixed(2) : "-")
const medMax = (xs: ReadonlyArray<number | undefined>, f: (x: number) => string): string => {
  const v = xs.filter((x): x is number => x !== undefined && Number.isFinite(x))
  return v.length ? `${f(median(v))} / ${f(Math.max(...v))}` : "-"
}

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const arg = (name: string): string | undefined => args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3)
  const every = Number(arg("every") ?? 15)
  const seed = Number(arg("seed") ?? 1)
  const repeat = Number(arg("repeat") ?? 1)
  if (!Number.isInteger(repeat) || repeat < 1) throw new Error(`--repeat must be a whole number of run pairs >= 1, got ${arg("repeat")}`)
  const loops = (arg("loops") ?? "fit,step").split(",") as LoopShape[]
  const strategies = (arg("strategies") ?? "allreduce").split(",")
  let kinds = (arg("kinds") ?? DEFAULT_KINDS.join(",")).split(",") as Kind[]
  const agentRestartMs = Number(arg("agent-restart-ms") ?? 1000)
  const cutMs = Number(arg("cut-ms") ?? 10_000)
  if (!(cutMs > 0)) throw new Error(`--cut-ms must be a number > 0, got ${arg("cut-ms")}`)
  if (!(agentRestartMs >= 0)) throw new Error(`--agent-restart-ms must be a number >= 0, got ${arg("agent-restart-ms")}`)
  const boundX = Number(arg("bound") ?? 3)
  const warmup = Number(arg("warmup") ?? 0.25)
  if (!(warmup >= 0 && warmup <= 1)) throw new Error(`--warmup must be a fraction of the epochs from 0 to 1, got ${arg("warmup")}`)
  const spares = Number(arg("spares") ?? 0)
  if (!(Number.isInteger(spares) && spares >= 0)) throw new Error(`--spares must be an integer >= 0, got ${arg("spares")}`)
  const order = arg("order") ?? "alternate"
  if (order !== "alternate" && order !== "fixed") throw new Error(`--order must be "alternate" or "fixed", got ${order}`)
  for (const l of loops) if (!(l in LOOPS)) throw new Error(`unknown loop "${l}"; known: ${Object.keys(LOOPS).join(", ")}`)
  for (const s of strategies) if (!STRATEGIES[s]) throw new Error(`unknown strategy "${s}"; known: ${Object.keys(STRATEGIES).join(", ")}`)
  for (const k of kinds) if (!KINDS.includes(k)) throw new Error(`unknown fault kind "${k}"; known: ${KINDS.join(", ")}`)
  if (!(every > 0) || !Number.isInteger(seed)) throw new Error("--every must be > 0 seconds and --seed an integer")
  const noNetns = kinds.includes("link-cut") ? netnsUnavailable() : undefined
  if (noNetns !== undefined) {
    NOT_RUN.push(["link-cut", `needs root and network namespaces here (${noNetns})`])
    kinds = kinds.filter((k) => k !== "link-cut")
    if (kinds.length === 0) throw new Error(`no fault kind left to run: link-cut ${NOT_RUN.at(-1)![1]}`)
  }
  const epochs: Record<LoopShape, number> = { fit: Number(arg("epochs-fit") ?? 80), step: Number(arg("epochs-step") ?? 70), pipe: Number(arg("epochs-pipe") ?? 60) }

  const storage = fs.mkdtempSync(path.join(os.tmpdir(), "gw-bench-chaos-"))
  const out = arg("out") ?? path.join(os.tmpdir(), `gw-bench-chaos-${new Date().toISOString().replace(/[:.]/g, "-")}.json`)
  process.on("exit", onExit)
  process.on("SIGINT", onSigint)
  const log = (line: string): void => console.log(line)
  try {
    const { train, test } = trainTestSplit(await loadDigits(), 0.2, 1)
    const data = { train, test }
    // --cluster=agents (or veth: one agent behind a veth link) runs on CLI agents whatever the kinds.
    const clusterArg = arg("cluster")
    if (clusterArg !== undefined && clusterArg !== "agents" && clusterArg !== "veth") throw new Error(`--cluster must be agents or veth, not ${clusterArg}`)
    const linkCut = kinds.includes("link-cut") || clusterArg === "veth"
    if (loops.includes("pipe") && (kinds.includes("agent-kill") || linkCut || clusterArg === "agents" || strategies.some((st) => st !== "allreduce"))) {
      throw new Error("--loops=pipe runs on the embedded cluster with --strategies=allreduce (a pipeline's stages take no collectiveConfig strategy), without agent kills or link cuts")
    }
    // --cores-per-agent=X: each agent and what it starts capped at X cores of CPU time (a cgroup each, root).
    let coresPerAgent = arg("cores-per-agent") === undefined ? undefined : Number(arg("cores-per-agent"))
    if (coresPerAgent !== undefined) {
      if (!(coresPerAgent > 0)) throw new Error(`--cores-per-agent must be a number of cores > 0, got ${arg("cores-per-agent")}`)
      if (!(kinds.includes("agent-kill") || linkCut || clusterArg === "agents")) throw new Error("--cores-per-agent caps CLI agents: add --cluster=agents (or a kind that runs on them: agent-kill, link-cut)")
      const why = cgroupsUnavailable()
      if (why !== undefined) {
        NOT_RUN.push(["--cores-per-agent", `agents run uncapped: ${why}`])
        coresPerAgent = undefined
      }
    }
    const onAgents = kinds.includes("agent-kill") || linkCut || clusterArg === "agents"
    const agentCount = Number(arg("agents") ?? WORKERS)
    if (arg("agents") !== undefined && !onAgents) throw new Error("--agents sizes a cluster of CLI agents: add --cluster=agents (or a kind that runs on them: agent-kill, link-cut)")
    if (!(Number.isInteger(agentCount) && agentCount >= WORKERS)) throw new Error(`--agents must be a whole number >= ${WORKERS} (one per worker), got ${arg("agents")}`)
    agentTotal = agentCount
    if (onAgents) agentCluster = await startAgentCluster(fs.mkdtempSync(path.join(storage, "agents-")), agentCount, { linkCut, ...(coresPerAgent !== undefined ? { coresPerAgent } : {}) })
    const where = agentCluster
      ? `${agentCount} CLI agents (one CPU each${coresPerAgent !== undefined ? `, each agent and all it starts capped at ${coresPerAgent} cores of CPU time` : ""}; an agent killed is replaced after ${agentRestartMs} ms${linkCut ? `; one behind a veth link in its own network namespace, cut for ${cutMs / 1000} s at a time` : ""})`
      : "the embedded cluster"
    console.log(
      `\nchaos benchmark (${os.availableParallelism()} cores, load ${os.loadavg()[0]!.toFixed(1)}): digits MLP, ${WORKERS} workers (a pipeline: ${workersOf("pipe")}) on ${where}, ` +
        `${spares > 0 ? `${spares} spare(s), ` : ""}one fault per ${every} s window (seed ${seed}), kinds ${kinds.join(", ")}`
    )
    for (const [k, why] of NOT_RUN) console.log(`  not run: ${k}: ${why}`)
    const rows: Array<{ free: RunResult; chaos: RunResult; chaosFirst: boolean }> = []
    let i = 0
    const warmEpochs = Math.round(warmup * epochs[loops[0]!])
    if (warmEpochs > 0) {
      const w = await runOnce({ loop: loops[0]!, strategy: strategies[0]!, epochs: warmEpochs, spares }, storage, data, i++, log)
      console.log(`\n  warm-up (not counted): ${loops[0]} loop, ${warmEpochs} epochs fault-free, ${s2(w.trainMs)} s training${w.error ? `; ${w.error}` : ""}`)
    }
    for (const loop of loops) {
      for (const strategy of strategies) {
        console.log(`\n  ${loop} loop, ${STRATEGIES[strategy]!.label}, ${epochs[loop]} epochs${repeat > 1 ? `, ${repeat} pairs of runs` : ""}`)
        let lastFreeWallMs: number | undefined
        for (let pair = 0; pair < repeat; pair++) {
          // Every other pair runs its chaos run first (fault-free, chaos | chaos, fault-free | ...):
          // the second run of a pair was the faster in 8 of 10 pairs of controls with no faults
          // (docs/benchmarks.md), and alternating cancels such an order effect in the median.
          const chaosFirst = order === "alternate" && pair % 2 === 1
          if (repeat > 1) console.log(`   pair ${pair + 1} of ${repeat}${chaosFirst ? " (the chaos run first)" : ""}`)
          const runFree = async (): Promise<RunResult> => {
            const r = await runOnce({ loop, strategy, epochs: epochs[loop], spares }, storage, data, i++, log)
            console.log(`    fault-free: ${s2(r.trainMs)} s training (${s2(r.wallMs)} s wall)${r.error ? `; ${r.error}` : ""}`)
            lastFreeWallMs = r.wallMs
            return r
          }
          const before = chaosFirst ? undefined : await runFree()
          // The bound comes from the latest fault-free run: this pair's, or with the chaos run first the last pair's.
          const boundMs = Math.min(MAX_RUN_MS, boundX * (lastFreeWallMs ?? MAX_RUN_MS))
          const rng = seededRng(seed * 1000 + i)
          const chaos = await runOnce({ loop, strategy, epochs: epochs[loop], spares, chaos: { every, rng, kinds, boundMs, agentRestartMs, cutMs } }, storage, data, i++, log)
          console.log(
            `    under chaos: ${s2(chaos.trainMs)} s training for ${+chaos.epochsDone.toFixed(1)}/${chaos.epochs} epochs (${s2(chaos.wallMs)} s wall), ${chaos.faults.length} faults${chaos.error ? `; ${chaos.error}` : ""}`
          )
          for (const [n, f] of chaos.faults.entries()) {
            console.log(
              `      ${String(n + 1).padStart(2)} ${f.kind.padEnd(11)} detect ${s2(f.detectMs)} s, resume ${s2(f.resumeMs)} s, lost ${f.lostSteps?.toFixed(1) ?? "-"} steps, from ${f.recovery ?? "-"}` +
                `${f.reason ? ` (${f.reason})` : ""}${f.fenced === false ? ", not fenced: the bench killed it" : f.fenced ? ", fenced by gradwire" : ""}`
            )
          }
          const free = before ?? (interrupted ? undefined : await runFree())
          if (free === undefined) return
          rows.push({ free, chaos, chaosFirst })
          fs.writeFileSync(out, JSON.stringify({ every, seed, kinds, notRun: Object.fromEntries(NOT_RUN), cores: os.availableParallelism(), rows }, null, 1))
          if (interrupted) return
        }
      }
    }
    const goodput = (r: { free: RunResult; chaos: RunResult }): number =>
      r.chaos.epochsDone / r.chaos.trainMs / (r.free.epochsDone / r.free.trainMs)
    const head =
      "| loop | strategy | fault-free s | chaos s | epochs | faults | mean s between | goodput | detect s (med / max) | resume s (med / max) | lost steps (med / max) | recovery |"
    const lines = [head, head.replace(/[^|]+/g, "---")]
    for (const r of rows) {
      const fs_ = r.chaos.faults
      const modes = new Map<string, number>()
      for (const f of fs_) modes.set(f.recovery ?? "not resumed", (modes.get(f.recovery ?? "not resumed") ?? 0) + 1)
      lines.push(
        `| ${LOOP_LABEL[r.chaos.loop]} | ${STRATEGIES[r.chaos.strategy]!.label} | ${s2(r.free.trainMs)} | ${s2(r.chaos.trainMs)}${r.chaos.bounded ? " (bounded)" : ""} | ` +
          `${+r.chaos.epochsDone.toFixed(1)}/${r.chaos.epochs} | ${fs_.length} | ${fs_.length ? (r.chaos.trainMs / 1000 / fs_.length).toFixed(1) : "-"} | ${(100 * goodput(r)).toFixed(1)}% | ` +
          `${medMax(fs_.map((f) => f.detectMs), s2)} | ${medMax(fs_.map((f) => f.resumeMs), s2)} | ${medMax(fs_.map((f) => f.lostSteps), (x) => x.toFixed(1))} | ` +
          `${[...modes].map(([m, n]) => `${m} ${n}`).join(", ")} |`
      )
    }
    const byKind = ["| loop | strategy | fault | n | detect s (med / max) | resume s (med / max) | lost steps (med / max) | recovery |", "|---|---|---|---|---|---|---|---|"]
    for (const r of rows) {
      for (const k of kinds) {
        const fs_ = r.chaos.faults.filter((f) => f.kind === k)
        if (!fs_.length) continue
        const modes = new Map<string, number>()
        for (const f of fs_) modes.set(f.recovery ?? "not resumed", (modes.get(f.recovery ?? "not resumed") ?? 0) + 1)
        byKind.push(
          `| ${LOOP_LABEL[r.chaos.loop]} | ${STRATEGIES[r.chaos.strategy]!.label} | ${k} | ${fs_.length} | ${medMax(fs_.map((f) => f.detectMs), s2)} | ` +
            `${medMax(fs_.map((f) => f.resumeMs), s2)} | ${medMax(fs_.map((f) => f.lostSteps), (x) => x.toFixed(1))} | ${[...modes].map(([m, n]) => `${m} ${n}`).join(", ")}${fs_.some((f) => f.fenced === false) ? "; not fenced" : ""} |`
        )
      }
    }
    const reasons = new Set(rows.flatMap((r) => r.chaos.faults.flatMap((f) => (f.reason ? [f.reason] : []))))
    console.log(`\n${lines.join("\n")}\n\nper fault kind:\n${byKind.join("\n")}`)
    // Each fault's own cost, apart from the two runs' drift (bench/chaos-cost.ts).
    const costs = new Map(rows.map((r) => [r, faultCosts(r.free.epochMs, r.chaos.epochMs, r.chaos.faults.map((f) => f.at))] as const))
    // Each fault's cost against the chaos run's own pace away from faults (chaos-cost.ts ownPaceCosts).
    const own = new Map(rows.map((r) => [r, ownPaceCosts(r.chaos.epochMs, r.chaos.faults.map((f) => f.at))] as const))
    // Each fault's cost split at the resume and at the group being whole again (chaos-cost.ts faultPhases).
    const phases = new Map(
      rows.map((r) => {
        const times = r.chaos.faults.map((f) => ({
          at: f.at,
          ...(f.resumeMs !== undefined ? { resumeAt: f.at + f.resumeMs } : {}),
          ...(f.wholeMs !== undefined ? { wholeAt: f.at + f.wholeMs } : {})
        }))
        return [r, faultPhases(r.free.epochMs, r.chaos.epochMs, times, costs.get(r)!.drift)] as const
      })
    )
    const split = (p: FaultPhases | undefined): string =>
      p === undefined ? "-" : `${p.stall.toFixed(2)} + ${p.shortHanded.toFixed(2)} + ${p.join.toFixed(2)} + ${p.after.toFixed(2)}`
    const phaseLine = (all: ReadonlyArray<FaultPhases | undefined>): string => {
      const ps = all.filter((p): p is FaultPhases => p !== undefined)
      return ps.length === 0
        ? "no fault to split"
        : `stalled ${median(ps.map((p) => p.stall)).toFixed(2)} s, short-handed ${median(ps.map((p) => p.shortHanded)).toFixed(2)} s, ` +
          `the half second after the join ${median(ps.map((p) => p.join)).toFixed(2)} s, the rest of the 5 s ${median(ps.map((p) => p.after)).toFixed(2)} s (medians over ${ps.length} fault(s))`
    }
    console.log("\ncost of each fault (the chaos run's lag behind the fault-free one gained across it, less the drift the lag shows away from faults):")
    for (const r of rows) {
      const c = costs.get(r)!
      console.log(
        `  ${LOOP_LABEL[r.chaos.loop]}, ${STRATEGIES[r.chaos.strategy]!.label}: ` +
          `${r.chaos.faults.map((f, i) => `${f.kind} ${c.costs[i] !== undefined ? `${c.costs[i]!.toFixed(2)} s` : "-"}`).join(", ") || "no faults"}; ` +
          `drift ${(100 * c.drift).toFixed(1)}% (the chaos run's lag growing ${c.drift.toFixed(3)} s per s away from faults); goodput without the drift ${(100 * c.netGoodput).toFixed(1)}% (goodput ${(100 * goodput(r)).toFixed(1)}%)`
      )
      console.log(
        `    where each went (s: stalled + short-handed + the half second after the join + the rest): ` +
          r.chaos.faults.map((f, i) => `${f.kind} ${split(phases.get(r)![i])}`).join(", ")
      )
      // A grow back to the group's size pauses the survivors while the replacement forms the group with them and replays to their step.
      const grows = r.chaos.faults.flatMap((f) => (f.wholeMs !== undefined ? [f.at + f.wholeMs] : []))
      if (grows.length > 0) {
        const stalls = growStalls(r.chaos.epochMs, grows)
        console.log(`    the first grow after each fault, its epoch's time past the median epoch: ${stalls.map((x) => (x !== undefined ? `${x.toFixed(2)} s` : "-")).join(", ")}`)
      }
      // Whether the joined worker came in slower than the survivors (its CPU per step over its first seconds).
      if (r.chaos.joins.length > 0) {
        const j = r.chaos.joins
        console.log(
          `    each joined worker's CPU over its first ${Math.max(...j.map((x) => x.seconds)).toFixed(0)} s beside the survivors' (cores, joiner / survivors' mean): ` +
            `${j.map((x) => `${x.joiner.toFixed(2)} / ${x.survivors.toFixed(2)}`).join(", ")}; ratio median ${median(j.map((x) => x.joiner / x.survivors)).toFixed(2)}x`
        )
        const split = j.filter((x) => x.joinerMain !== undefined && x.survivorsMain !== undefined)
        if (split.length > 0) {
          console.log(
            `      of it, main thread + the other threads (V8's optimizing compiler and garbage collector), cores, joiner / survivors' mean: ` +
              split.map((x) => `${x.joinerMain!.toFixed(2)} + ${(x.joiner - x.joinerMain!).toFixed(2)} / ${x.survivorsMain!.toFixed(2)} + ${(x.survivors - x.survivorsMain!).toFixed(2)}`).join(", ")
          )
        }
      }
      if (r.chaos.faults.length > 0) {
        // Each fault against the chaos run alone: its window's time less as many epochs at the run's
        // mean epoch away from faults (the fault-free partner's noise left out).
        const o = own.get(r)!
        console.log(
          `    against the chaos run's own pace (its mean epoch away from faults, no fault-free run in it): ${o.costs.map((x) => (x !== undefined ? `${x.toFixed(2)} s` : "-")).join(", ")}; ` +
            `goodput ${(100 * o.goodput).toFixed(1)}%`
        )
        // A slower stretch after a join can outlast the 5 s window: what it missed would count as drift.
        const wide = faultCosts(r.free.epochMs, r.chaos.epochMs, r.chaos.faults.map((f) => f.at), WIDE_WINDOW_MS)
        console.log(
          `    over ${WIDE_WINDOW_MS / 1000} s after each fault (or to the next): ${wide.costs.map((x) => (x !== undefined ? `${x.toFixed(2)} s` : "-")).join(", ")}; ` +
            `drift ${(100 * wide.drift).toFixed(1)}%; goodput without the drift ${(100 * wide.netGoodput).toFixed(1)}%`
        )
      }
    }
    if (repeat > 1) {
      // One machine's run-to-run noise (the fault-free runs alone vary by 10-30% here) is as large as
      // what a fault costs: the median of the pairs, and the pooled ratio (all epochs over all time).
      console.log(`\nover ${repeat} pairs (${order === "alternate" ? "fault-free then chaos, and chaos then fault-free, every other pair" : "fault-free, then chaos, each pair"}):`)
      for (const loop of loops) {
        for (const strategy of strategies) {
          const rs = rows.filter((r) => r.chaos.loop === loop && r.chaos.strategy === strategy)
          if (!rs.length) continue
          const g = rs.map(goodput).sort((a, b) => a - b)
          // Each order's median apart: where they differ beyond the pairs' spread, the order matters.
          const byOrder = (first: boolean): string => {
            const x = rs.filter((r) => r.chaosFirst === first).map(goodput)
            return x.length ? `${(100 * median(x)).toFixed(1)}% (${x.length})` : "-"
          }
          const sum = (f: (r: { free: RunResult; chaos: RunResult }) => number): number => rs.reduce((a, r) => a + f(r), 0)
          const pooled = sum((r) => r.chaos.epochsDone) / sum((r) => r.chaos.trainMs) / (sum((r) => r.free.epochsDone) / sum((r) => r.free.trainMs))
          const free = rs.map((r) => r.free.trainMs / 1000)
          const net = rs.map((r) => costs.get(r)!.netGoodput).sort((a, b) => a - b)
          const perFault = rs.flatMap((r) => costs.get(r)!.costs.filter((c): c is number => c !== undefined))
          console.log(
            `  ${LOOP_LABEL[loop]}, ${STRATEGIES[strategy]!.label}: goodput median ${(100 * median(g)).toFixed(1)}% (${g.map((x) => `${(100 * x).toFixed(1)}%`).join(", ")}), ` +
              `pooled ${(100 * pooled).toFixed(1)}%, ${sum((r) => r.chaos.faults.length)} faults; fault-free runs ${Math.min(...free).toFixed(2)}-${Math.max(...free).toFixed(2)} s; ` +
              `without the drift median ${(100 * median(net)).toFixed(1)}% (${net.map((x) => `${(100 * x).toFixed(1)}%`).join(", ")}), cost per fault median ${perFault.length ? median(perFault).toFixed(2) : "-"} s`
          )
          const ownGoodput = rs.map((r) => own.get(r)!.goodput).sort((a, b) => a - b)
          const ownPerFault = rs.flatMap((r) => own.get(r)!.costs.filter((c): c is number => c !== undefined))
          console.log(
            `    against each chaos run's own pace: goodput median ${(100 * median(ownGoodput)).toFixed(1)}% (${ownGoodput.map((x) => `${(100 * x).toFixed(1)}%`).join(", ")}), ` +
              `cost per fault median ${ownPerFault.length ? median(ownPerFault).toFixed(2) : "-"} s, max ${ownPerFault.length ? Math.max(...ownPerFault).toFixed(2) : "-"} s`
          )
          if (order === "alternate" && rs.length > 1) console.log(`    goodput by order, median (pairs): the fault-free run first ${byOrder(false)}, the chaos run first ${byOrder(true)}`)
          console.log(`    where it went: ${phaseLine(rs.flatMap((r) => phases.get(r)!))}`)
        }
      }
    }
    if (reasons.size) console.log(`\ncheckpoint restarts, why not from peers: ${[...reasons].join("; ")}`)
    const workerKills = rows.flatMap((r) => r.chaos.faults.filter((f) => f.kind === "worker-kill").map((f) => f.resumeMs)).filter((x): x is number => x !== undefined)
    console.log(
      `\ntargets: goodput >= 95% at one fault per 15 s, >= 98% at one per 30 s (this run: one per ${every} s window); kill -9 to every survivor stepping again <= 1 s ` +
        `(this run's worker kill -9: median ${s2(median(workerKills))} s, max ${s2(workerKills.length ? Math.max(...workerKills) : NaN)} s)` +
        `\nanchor: torchft + DiLoCo kept 97.7% of fault-free throughput through 62 faults in 30 minutes; Ray Train restarts the whole group from a checkpoint on any failure` +
        `\n(goodput: epochs per second of training under chaos / the same fault-free; detect: fault -> the driver leaves "running"; resume: fault -> the first step of the next generation; lost: steps of the old generation redone)` +
        `\nJSON: ${out}`
    )
  } finally {
    await agentCluster?.stop()
    agentCluster = undefined
    process.off("SIGINT", onSigint)
    if (process.env.GW_CHAOS_KEEP) console.log(`run directories kept in ${storage}`)
    else fs.rmSync(storage, { recursive: true, force: true })
  }
}
