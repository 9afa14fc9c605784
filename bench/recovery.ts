// `npm run bench -- recovery [--runs=3] [--only=worker,nats,loss,join] [--modes=checkpoint,peers,peers-cold]`:
// how fast training recovers from a failure, and how much work it redoes, for
//   worker  kill -9 of one worker (embedded cluster, 4 workers);
//   nats    kill -9 of the embedded nats-server (it is restarted; 4 workers);
//   loss    kill -9 of one of two 2-CPU agents (elastic 2..4: the group shrinks to 2);
//   join    a second 2-CPU agent starts while 2 workers train (elastic 2..4: it grows to 4).
// Per scenario, the median of `runs` runs of:
//   step ms   the uninterrupted step time of the group before the fault, measured in the same run
//             (from a report round to the last step of the next epoch, over its steps; epochs 1-2);
//   detect s  fault -> the driver decides to restart or resize (the state leaves "running"; this
//             includes stopping what is left of the old group);
//   resume s  fault -> the first progress message of the next generation (its first step done);
//   lost      steps of the old group's work redone: where rank 0 was when it stopped (its last
//             completed step, which the chaos loop records) minus where the next generation
//             started (its first progress message), in the old group's steps.
// The fault (a worker kill by pid from the chaos loop's pid files, a nats-server kill, an agent
// kill) strikes when rank 0 is halfway through epoch 3 (its step file says); for a join, the new agent starts after that report round and the "fault" is the
// moment it is visible in the cluster view. Figures come from Trainer callbacks (onProgress,
// onReport, onStateChange), the chaos loop's step file and the bench's own clocks.
// Recovery modes are columns (failureConfig.recoverFrom): "checkpoint" restarts the group from the
// latest checkpoint, "peers" regroups the survivors with the furthest one's state.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { launchNatsServer, liveNatsServerPids, type NatsServerProcess } from "../core/nats-server.ts"
import { openNats } from "../core/connection.ts"
import { openClusterView, type ClusterView } from "../scheduler/cluster-view.ts"
import { workerPids, type Progress } from "../test/support/chaos.ts"
import { median } from "../scheduler/cost-model.ts"

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const CLI = path.join(ROOT, "bin", "gradwire.js")
const LOOP = path.join(ROOT, "test", "support", "chaos-loop.ts") + "#trainLoop"

type Scenario = "worker" | "nats" | "loss" | "join"
const SCENARIOS: ReadonlyArray<{ readonly key: Scenario; readonly label: string }> = [
  { key: "worker", label: "worker kill -9 (embedded)" },
  { key: "nats", label: "nats-server kill -9 (embedded)" },
  { key: "loss", label: "node loss: agent kill -9 (elastic)" },
  { key: "join", label: "node join: agent start (elastic)" }
]

/**
 * How the restarted group gets its state. Each mode is a column group of the table; its failure
 * config is merged into the run's failureConfig (a peers mode would set its option here).
 */
const MODES: Readonly<Record<string, { readonly failureConfig: Record<string, unknown>; readonly env?: Readonly<Record<string, string>> }>> = {
  checkpoint: { failureConfig: { recoverFrom: "checkpoint" } },
  peers: { failureConfig: { recoverFrom: "peers" } },
  // The same with no warm actor processes (the agents' pool, GRADWIRE_WARM_HOSTS / --warm-hosts):
  // every replacement worker starts cold, as before the pool.
  "peers-cold": { failureConfig: { recoverFrom: "peers" }, env: { GRADWIRE_WARM_HOSTS: "0" } }
}

/** Runs `f` with the mode's environment (the embedded cluster and the agents started meanwhile read it). */
const withEnv = async <A>(env: Readonly<Record<string, string>> | undefined, f: () => Promise<A>): Promise<A> => {
  const before = Object.fromEntries(Object.keys(env ?? {}).map((k) => [k, process.env[k]]))
  Object.assign(process.env, env)
  try {
    return await f()
  } finally {
    for (const [k, v] of Object.entries(before)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
  }
}

/** No scenario run may take longer than this; past it the bench stops with what it has. */
const RUN_BOUND_MS = 120_000

interface Measure {
  readonly sizes: string
  readonly stepMs: number
  readonly detectMs: number
  readonly resumeMs: number
  readonly lostSteps: number
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

/** Child processes (agents) of this bench, killed on the way out whatever happens. */
const children = new Set<ChildProcess>()
process.once("exit", () => {
  for (const c of children) c.kill("SIGKILL")
})

/** The epoch in whose middle the fault strikes (the epochs before it give the step time). */
const FAULT_EPOCH = 3

/** Where rank 0 of `attempt` was after its last completed step (the chaos loop's trackSteps file). */
const lastStep = (pidDir: string, attempt: number): { pos: number; spe: number } | undefined => {
  try {
    const [epoch, step, spe] = fs.readFileSync(path.join(pidDir, `${attempt}.step`), "utf8").split(" ").map(Number)
    return { pos: epoch + (step + 1) / spe, spe }
  } catch {
    return undefined
  }
}

/**
 * One run's bookkeeping from the Trainer's callbacks: when each generation took its first step
 * and from where, when the driver left "running", and the uninterrupted step time (from the end
 * of an epoch's report round to the last step of the next epoch, whose progress message is always
 * sent, over the steps of that epoch; epoch 0 left out as warm-up).
 */
class Track {
  readonly first = new Map<number, { at: number; pos: number; ranks: number }>()
  readonly stateLeftRunning = new Map<number, number>()
  /**
   * Where rank 0 was when its generation ended, read at that moment: with recovery from peers its
   * process goes on training (and writing the same step file) in the next generation.
   */
  readonly #stoppedAt = new Map<number, { pos: number; spe: number } | undefined>()
  readonly #pidDir: string

  constructor(pidDir: string) {
    this.#pidDir = pidDir
  }
  readonly #reportAt = new Map<number, number>()
  readonly #steps: number[] = []

  onProgress(p: Progress): void {
    const now = Date.now()
    const f = this.first.get(p.attempt)
    // The first step of a generation always sends a progress message: where it started.
    if (!f) this.first.set(p.attempt, { at: now, pos: p.epoch + p.step / p.stepsPerEpoch, ranks: p.rank + 1 })
    else f.ranks = Math.max(f.ranks, p.rank + 1)
    if (p.attempt === 0 && p.rank === 0 && p.step + 1 === p.stepsPerEpoch && p.epoch > 0) {
      const from = this.#reportAt.get(p.epoch - 1)
      if (from !== undefined) this.#steps.push((now - from) / p.stepsPerEpoch)
    }
  }

  /** A completed report round of the first generation, by the epoch it reported. */
  onReport(epoch: number): void {
    if (!this.#reportAt.has(epoch)) this.#reportAt.set(epoch, Date.now())
  }

  onState(s: { from: string; to: string; attempt: number }): void {
    if (s.from === "running" && (s.to === "restarting" || s.to === "resizing") && !this.stateLeftRunning.has(s.attempt)) {
      this.stateLeftRunning.set(s.attempt, Date.now())
      this.#stoppedAt.set(s.attempt, lastStep(this.#pidDir, s.attempt))
    }
  }

  get stepMs(): number {
    return this.#steps.length ? median(this.#steps) : NaN
  }

  /** The measure of a fault at `faultAt` that ended attempt `attempt` (rank 0's steps in `pidDir`). */
  measure(faultAt: number, attempt: number, pidDir: string): Measure {
    const next = this.first.get(attempt + 1)
    const last = this.#stoppedAt.get(attempt) ?? lastStep(pidDir, attempt)
    const left = this.stateLeftRunning.get(attempt)
    if (!next || !last || left === undefined) throw new Error(`attempt ${attempt} was not followed by another generation (did the fault take effect?)`)
    return {
      sizes: `${this.first.get(attempt)!.ranks} -> ${next.ranks}`,
      stepMs: this.stepMs,
      detectMs: left - faultAt,
      resumeMs: next.at - faultAt,
      lostSteps: Math.max(0, (last.pos - next.pos) * last.spe)
    }
  }
}

/**
 * Calls `fire` once rank 0 of the first generation is halfway through FAULT_EPOCH, watching its
 * step file (every 2 ms: progress messages come only every 250 ms, an epoch can be shorter).
 */
const atHalfOfFaultEpoch = (pidDir: string, fire: () => void): ReturnType<typeof setInterval> => {
  const giveUp = Date.now() + 60_000
  const timer: ReturnType<typeof setInterval> = setInterval(() => {
    const at = lastStep(pidDir, 0)
    if ((at && at.pos >= FAULT_EPOCH + 0.5) || Date.now() > giveUp) {
      clearInterval(timer)
      fire()
    }
  }, 2)
  return timer
}

/** A fault that cannot fire says so; the run then ends with "the fault never fired". */
const guarded = (fire: () => void) => (): void => {
  try {
    fire()
  } catch (e) {
    console.error(`  the fault could not fire: ${e instanceof Error ? e.message : String(e)}`)
  }
}

interface Data {
  readonly train: ArrayDataset
  readonly test: ArrayDataset
}

const embedded = async (kind: "worker" | "nats", mode: string, storage: string, data: Data, i: number): Promise<Measure> => {
  const pidDir = fs.mkdtempSync(path.join(storage, "pids-"))
  const track = new Track(pidDir)
  let faultAt = 0
  let faultAttempt = -1
  const fire = (): void => {
    const pid = kind === "worker" ? workerPids(pidDir).get("0-1") : liveNatsServerPids()[0]
    if (pid === undefined) throw new Error(`no ${kind} pid to kill`)
    faultAt = Date.now()
    faultAttempt = 0
    process.kill(pid, "SIGKILL")
  }
  let timer: ReturnType<typeof setTimeout> | ReturnType<typeof setInterval> | undefined
  await new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { epochs: FAULT_EPOCH + 2, pidDir, trackSteps: true },
    scalingConfig: { numWorkers: 4 },
    runConfig: {
      name: `recovery-${kind}-${mode}-${i}`,
      storagePath: storage,
      progress: false,
      failureConfig: { maxFailures: 1, ...MODES[mode].failureConfig },
      callbacks: [
        {
          onStateChange: (s) => track.onState(s),
          onProgress: (p) => track.onProgress(p),
          onReport: ({ metrics }) => {
            if (faultAt || timer) return
            const epoch = metrics.epoch as number
            track.onReport(epoch)
            if (epoch === FAULT_EPOCH - 1) timer = atHalfOfFaultEpoch(pidDir, guarded(fire))
          }
        }
      ]
    },
    datasets: { train: data.train, test: data.test }
  }).fit()
  if (!faultAt) throw new Error("the fault never fired")
  return track.measure(faultAt, faultAttempt, pidDir)
}

/** A nats-server and CLI agents (2 CPUs each) owned by one run. */
class SmallCluster {
  readonly name: string
  readonly #server: NatsServerProcess
  readonly #dir: string
  readonly agents = new Map<string, ChildProcess>()

  private constructor(name: string, server: NatsServerProcess, dir: string) {
    this.name = name
    this.#server = server
    this.#dir = dir
  }

  static async start(name: string, dir: string): Promise<SmallCluster> {
    return new SmallCluster(name, await launchNatsServer({ maxPayload: 8 * 1024 * 1024 }), dir)
  }

  get url(): string {
    return this.#server.url
  }

  agent(node: string): ChildProcess {
    const log = fs.openSync(path.join(this.#dir, `${node}.log`), "a")
    const child = spawn(
      process.execPath,
      [CLI, "start", "--block", "--address", this.url, "--cluster", this.name, "--node-id", node, "--num-cpus", "2", "--backends", "wasm,cpu", "--state-dir", path.join(this.#dir, node)],
      { cwd: ROOT, stdio: ["ignore", log, log], env: { ...process.env, GRADWIRE_LOG: "warn" } }
    )
    fs.closeSync(log)
    children.add(child)
    child.once("exit", () => children.delete(child))
    this.agents.set(node, child)
    return child
  }

  async view<A>(fn: (view: ClusterView) => Promise<A>): Promise<A> {
    const conn = await openNats({ servers: this.url, name: "recovery bench" })
    const view = await openClusterView({ nc: conn.nc, cluster: this.name })
    try {
      return await fn(view)
    } finally {
      view.close()
      await conn.close()
    }
  }

  async stop(): Promise<void> {
    await Promise.all(
      [...this.agents.values()].map(
        (c) =>
          new Promise<void>((resolve) => {
            if (c.exitCode !== null || c.signalCode !== null) return resolve()
            const timer = setTimeout(() => c.kill("SIGKILL"), 10_000)
            c.once("exit", () => {
              clearTimeout(timer)
              resolve()
            })
            c.kill("SIGTERM")
          })
      )
    )
    await this.#server.stop()
  }
}

const elastic = async (kind: "loss" | "join", mode: string, storage: string, data: Data, i: number): Promise<Measure> => {
  const dir = fs.mkdtempSync(path.join(storage, `${kind}-`))
  const pidDir = fs.mkdtempSync(path.join(storage, "pids-"))
  const cluster = await SmallCluster.start(`rec${kind}${i}`, dir)
  try {
    cluster.agent("a")
    if (kind === "loss") cluster.agent("b")
    const want = kind === "loss" ? 2 : 1
    await cluster.view((v) => v.waitFor((nodes) => nodes.filter((n) => n.state === "alive").length === want, 30_000))
    const track = new Track(pidDir)
    let faultAt = 0
    let faultAttempt = -1
    let joined: Promise<void> | undefined
    let timer: ReturnType<typeof setTimeout> | ReturnType<typeof setInterval> | undefined
    const fire = (): void => {
      if (kind === "loss") {
        faultAt = Date.now()
        faultAttempt = 0
        cluster.agents.get("b")!.kill("SIGKILL")
        return
      }
      // A join: the fault's clock starts when the new agent is visible on the bus.
      joined = cluster.view(async (v) => {
        cluster.agent("b")
        await v.waitFor((nodes) => nodes.some((n) => n.ad.nodeId === "b" && n.state === "alive"), 30_000)
        faultAt = Date.now()
        faultAttempt = 0
      })
    }
    await new Trainer({
      trainLoopPerWorker: LOOP,
      // A join grows the group at the next report after the new agent is seen: the agent takes a
      // few seconds to start, so epochs last at least 300 ms (minEpochMs) to leave it the time.
      trainLoopConfig: { epochs: kind === "loss" ? FAULT_EPOCH + 2 : FAULT_EPOCH + 16, pidDir, trackSteps: true, ...(kind === "join" ? { minEpochMs: 300 } : {}) },
      scalingConfig: { numWorkers: { min: 2, max: 4 }, placementTimeoutMs: 20_000 },
      runConfig: {
        name: `recovery-${kind}-${mode}-${i}`,
        storagePath: storage,
        progress: false,
        failureConfig: { maxFailures: 0, ...MODES[mode].failureConfig },
        callbacks: [
          {
            onStateChange: (s) => track.onState(s),
            onProgress: (p) => track.onProgress(p),
            onReport: ({ metrics }) => {
              if (faultAt || joined || timer) return
              const epoch = metrics.epoch as number
              track.onReport(epoch)
              if (epoch === FAULT_EPOCH - 1) timer = kind === "loss" ? atHalfOfFaultEpoch(pidDir, guarded(fire)) : setTimeout(guarded(fire), 0)
            }
          }
        ]
      },
      datasets: { train: data.train, test: data.test },
      cluster: { address: cluster.url, clusterName: cluster.name }
    }).fit()
    await joined
    if (!faultAt) throw new Error("the fault never fired")
    return track.measure(faultAt, faultAttempt, pidDir)
  } finally {
    await cluster.stop()
  }
}

const bounded = <A>(what: string, p: Promise<A>): Promise<A> => {
  let timer: ReturnType<typeof setTimeout> | ReturnType<typeof setInterval> | undefined
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took longer than ${RUN_BOUND_MS / 1000} s`)), RUN_BOUND_MS)
  })
  return Promise.race([p, limit]).finally(() => clearTimeout(timer))
}

const fmt = (ms: number): string => (Number.isFinite(ms) ? (ms / 1000).toFixed(2) : "-")

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const arg = (name: string): string | undefined => args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3)
  const runs = Number(arg("runs") ?? 3)
  const only = new Set((arg("only") ?? SCENARIOS.map((s) => s.key).join(",")).split(","))
  const modes = (arg("modes") ?? Object.keys(MODES).join(",")).split(",")
  for (const m of modes) if (!MODES[m]) throw new Error(`unknown recovery mode "${m}"; known: ${Object.keys(MODES).join(", ")}`)
  const storage = fs.mkdtempSync(path.join(os.tmpdir(), "gw-bench-recovery-"))
  try {
    const { train, test } = trainTestSplit(await loadDigits(), 0.2, 1)
    const data = { train, test }
    console.log(`\nrecovery benchmark (${os.availableParallelism()} cores, load ${os.loadavg()[0].toFixed(1)}), digits MLP, median of ${runs} runs`)
    const results = new Map<string, Measure[]>()
    for (const s of SCENARIOS.filter((x) => only.has(x.key))) {
      for (const mode of modes) {
        const ms: Measure[] = []
        for (let i = 0; i < runs; i++) {
          const what = `${s.key}/${mode} run ${i + 1}`
          const m = await withEnv(MODES[mode]!.env, () =>
            bounded(what, s.key === "worker" || s.key === "nats" ? embedded(s.key, mode, storage, data, i) : elastic(s.key, mode, storage, data, i))
          )
          console.log(`  ${what}: step ${m.stepMs.toFixed(1)} ms, detect ${fmt(m.detectMs)} s, resume ${fmt(m.resumeMs)} s, lost ${m.lostSteps.toFixed(1)} steps (${m.sizes} workers)`)
          ms.push(m)
          await sleep(500)
        }
        results.set(`${s.key}/${mode}`, ms)
      }
    }
    const modeHead = modes.map((m) => `${`recovery from ${m}`.padEnd(34)}`).join(" | ")
    const modeCols = modes.map(() => `${"detect s".padStart(9)} ${"resume s".padStart(9)} ${"lost steps".padStart(11)}   `).join(" | ")
    console.log(`\n${"".padEnd(38)} ${"".padEnd(8)} ${"".padEnd(8)} | ${modeHead}`)
    console.log(`${"scenario".padEnd(38)} ${"workers".padEnd(8)} ${"step ms".padStart(8)} | ${modeCols}`)
    for (const s of SCENARIOS.filter((x) => only.has(x.key))) {
      const first = results.get(`${s.key}/${modes[0]}`)!
      const cells = modes.map((m) => {
        const r = results.get(`${s.key}/${m}`)!
        return `${fmt(median(r.map((x) => x.detectMs))).padStart(9)} ${fmt(median(r.map((x) => x.resumeMs))).padStart(9)} ${median(r.map((x) => x.lostSteps)).toFixed(1).padStart(11)}   `
      })
      console.log(`${s.label.padEnd(38)} ${first[0].sizes.padEnd(8)} ${median(first.map((x) => x.stepMs)).toFixed(1).padStart(8)} | ${cells.join(" | ")}`)
    }
    console.log("\n(detect: fault -> the driver leaves \"running\"; resume: fault -> first step of the next generation; lost: steps redone)")
  } finally {
    fs.rmSync(storage, { recursive: true, force: true })
  }
}
