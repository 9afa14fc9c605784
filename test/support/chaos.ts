// Helpers of the chaos suite (test/chaos.test.ts) and the recovery benchmark (bench/recovery.ts):
// a seeded schedule of faults fired from the Trainer's progress callback, the pids the chaos loop
// (chaos-loop.ts) wrote, and a scan of /proc for processes that mention a marker (a temp dir, a job
// name), to prove that none the test started is left behind.
import * as fs from "node:fs"
import * as path from "node:path"
import { seededRng, type Rng } from "../../core/random.ts"
import { liveNatsServerPids } from "../../core/nats-server.ts"
import { livePids, procEntries, procLine } from "../../core/proc.ts"

/** The suite's seed: $GRADWIRE_CHAOS_SEED when set (to reproduce a run), else a fresh one. */
export const chaosSeed = (): number => {
  const env = process.env.GRADWIRE_CHAOS_SEED
  if (env !== undefined && env.trim() !== "") {
    const n = Number(env)
    if (!Number.isInteger(n) || n < 0) throw new RangeError(`GRADWIRE_CHAOS_SEED must be a non-negative integer, got ${JSON.stringify(env)}`)
    return n
  }
  return Math.floor(Math.random() * 2 ** 31)
}

export interface Progress {
  readonly attempt: number
  readonly rank: number
  readonly epoch: number
  readonly step: number
  readonly stepsPerEpoch: number
}

export interface Fault {
  readonly name: string
  /** Fires only once this holds (e.g. "the group has grown back to 4"). */
  readonly ready?: (p: Progress, plan: FaultPlan) => boolean
  /** The fault itself; what it returns is kept for the report (e.g. the pid killed). */
  readonly fire: (p: Progress) => string
}

export interface Fired {
  readonly name: string
  readonly at: number
  readonly attempt: number
  readonly epoch: number
  readonly step: number
  readonly what: string
}

/**
 * Faults fired one after the other, each at a seeded random point: in the generation after the
 * previous fault's (the group has recovered), `offset` (0 or 1) epochs after the first epoch that
 * generation reports, at a seeded step of that epoch. Feed it every progress message.
 */
export class FaultPlan {
  readonly seed: number
  readonly fired: Fired[] = []
  readonly #faults: ReadonlyArray<Fault>
  readonly #points: ReadonlyArray<{ readonly offset: number; readonly fraction: number }>
  /** The largest rank seen per attempt, plus one: a lower bound of its world size. */
  readonly #sizes = new Map<number, number>()
  #firstEpoch: { attempt: number; epoch: number } | undefined
  #errors: unknown[] = []

  constructor(seed: number, faults: ReadonlyArray<Fault>) {
    this.seed = seed
    this.#faults = faults
    const rng: Rng = seededRng(seed)
    this.#points = faults.map(() => ({ offset: rng() < 0.5 ? 0 : 1, fraction: 0.15 + 0.7 * rng() }))
  }

  /** Where each fault will fire, for the log. */
  describe(): string {
    return this.#faults
      .map((f, i) => `${f.name} at epoch +${this.#points[i].offset}, ${Math.round(this.#points[i].fraction * 100)}% into it`)
      .join("; ")
  }

  /** The world size of `attempt` as far as its progress messages tell. */
  sizeOf(attempt: number): number {
    return this.#sizes.get(attempt) ?? 0
  }

  get done(): boolean {
    return this.fired.length === this.#faults.length
  }

  /** Errors thrown by faults (rethrown by the test after fit()). */
  get errors(): ReadonlyArray<unknown> {
    return this.#errors
  }

  onProgress(p: Progress): void {
    this.#sizes.set(p.attempt, Math.max(this.#sizes.get(p.attempt) ?? 0, p.rank + 1))
    const i = this.fired.length
    const fault = this.#faults[i]
    if (!fault) return
    const last = this.fired.at(-1)
    if (last && p.attempt <= last.attempt) return
    if (fault.ready && !fault.ready(p, this)) return
    if (this.#firstEpoch?.attempt !== p.attempt) this.#firstEpoch = { attempt: p.attempt, epoch: p.epoch }
    const { offset, fraction } = this.#points[i]
    if (p.epoch < this.#firstEpoch.epoch + offset) return
    if (p.epoch === this.#firstEpoch.epoch + offset && p.step < Math.max(1, Math.floor(fraction * p.stepsPerEpoch))) return
    try {
      const what = fault.fire(p)
      this.fired.push({ name: fault.name, at: Date.now(), attempt: p.attempt, epoch: p.epoch, step: p.step, what })
    } catch (e) {
      this.#errors.push(e)
      this.fired.push({ name: fault.name, at: Date.now(), attempt: p.attempt, epoch: p.epoch, step: p.step, what: `failed: ${String(e)}` })
    }
  }
}

/** The pids the chaos loop wrote: "<attempt>-<rank>" -> pid. */
export const workerPids = (pidDir: string): Map<string, number> => {
  const out = new Map<string, number>()
  for (const f of fs.readdirSync(pidDir)) {
    const m = /^(\d+-\d+)\.pid$/.exec(f)
    if (m) out.set(m[1], Number(fs.readFileSync(path.join(pidDir, f), "utf8")))
  }
  return out
}


/**
 * Live processes (other than this one) whose command line or environment contains `marker`: a
 * temp dir only this test uses, a job or cluster name only it uses. Linux only (/proc); elsewhere
 * it finds nothing.
 */
export const processesMentioning = (marker: string): Array<{ pid: number; cmdline: string }> => {
  const out: Array<{ pid: number; cmdline: string }> = []
  for (const pid of livePids()) {
    if (pid === process.pid) continue
    const cmdline = procLine(pid, "cmdline")
    if (cmdline === "") continue
    if (cmdline.includes(marker) || procLine(pid, "environ").includes(marker)) out.push({ pid, cmdline })
  }
  return out
}

/** Whether `pid` is alive and still the process `marker` identifies (not a reused pid). */
export const aliveAs = (pid: number, marker: string): boolean => {
  const cmdline = procLine(pid, "cmdline")
  return cmdline !== "" && (cmdline.includes(marker) || procLine(pid, "environ").includes(marker))
}

/**
 * This machine's live processes running an actor whose name starts with `prefix` (the agent sets
 * GRADWIRE_ACTOR in each one's environment), by actor name: e.g. "ps" for the parameter servers.
 */
export const actorPids = (prefix: string): Map<string, number> => {
  const out = new Map<string, number>()
  for (const pid of livePids()) {
    const actor = procEntries(pid, "environ").find((v) => v.startsWith(`GRADWIRE_ACTOR=${prefix}`))
    if (actor !== undefined) out.set(actor.slice("GRADWIRE_ACTOR=".length), pid)
  }
  return out
}

export const killQuietly = (pid: number, signal: NodeJS.Signals = "SIGKILL"): void => {
  try {
    process.kill(pid, signal)
  } catch {
    // already gone
  }
}

/**
 * A Trainer callback that kills the embedded nats-server (SIGKILL) once, when report round `index`
 * completes; `killed()` is its pid (0 before). There must be exactly one nats-server running.
 */
export const natsKillAtReport = (index: number): { readonly callback: { onReport(r: { readonly index: number }): void }; killed(): number } => {
  let killed = 0
  return {
    callback: {
      onReport: ({ index: at }) => {
        if (at !== index || killed) return
        const pids = liveNatsServerPids()
        if (pids.length !== 1) throw new Error(`expected one nats-server, found pids ${pids.join(", ") || "none"}`)
        killed = pids[0]!
        process.kill(killed, "SIGKILL")
      }
    },
    killed: () => killed
  }
}
