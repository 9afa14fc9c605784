// Strategy "auto": training starts on the all-reduce and, from measured compute and communication
// times, moves to the parameter servers (backup workers, SSP, async), to local SGD where
// collectiveConfig.localSgd offers it, and back (scheduler/strategy-choice.ts prices the candidates
// the registered strategies declare). Every rank takes part in the same decision rounds, computes
// the same choice, and a change moves the parameters and the optimizer state; rank 0 explains every
// decision; in a hand-written loop a move off the servers waits for a report() call of every rank
// (#pending). A regroup carries what runs and the decision clock to every member (AUTO_FILE); in a
// move the group restarts from the checkpoint.
import * as os from "node:os"
import { createHash } from "node:crypto"
import { chooseStrategy, onServers, type StrategyName } from "../../../../scheduler/strategy-choice.ts"
import { hasPsFiles, psWholeState } from "../ps-client.ts"
import { flatStateFromTfjs, readTfjsOptimizerWeights } from "../../common/optim/tfjs-state.ts"
import { AllReduceWorker } from "./allreduce.ts"
import { LocalSgdWorker, localSgd } from "./local-sgd.ts"
import { ParameterServerWorker, checkServersConfig, type AutoMode } from "./parameter-server.ts"
import { strategies } from "./registry.ts"
import { defineStrategy, type Exchanged, type StepExchange, type StrategyHost, type StrategyWorker } from "./strategy.ts"
import { ConfigError } from "../../../../core/errors.ts"
import { autoPlan } from "../../../../core/settings.ts"
import { OPTIMIZER_FILE } from "../../../../core/model-io.ts"
import { decodeMessage, encodeMessage } from "../../../../core/wire.ts"

/** The CPU ms this machine's cores have been busy (everything but idle and iowait) since boot. */
const machineBusyMs = (): number => {
  let busy = 0
  for (const c of os.cpus()) busy += c.times.user + c.times.nice + c.times.sys + c.times.irq
  return busy
}

/** This machine, as a number that survives a Float32Array exchange exactly (24 bits of a hash of the host name). */
const hostHash = createHash("sha1").update(os.hostname()).digest().readUIntBE(0, 3)

/** The first decision (steps before it measure the all-reduce), its window and how often it is taken again. */
const AUTO_FIRST_DECISION = 12
/** The first round only measures (its window is warm-up); the first choice is made at this clock. */
const AUTO_FIRST_CHOICE = 24
const AUTO_WINDOW = 10
const AUTO_EVERY = 48
/** Rounds a strategy's measured rate stands in for its prediction. */
const AUTO_REMEMBER = 4

/** The decision point after clock `clock` (every rank computes it from the same clock). */
const nextDecisionAfter = (clock: number): number => {
  const after = Math.floor(clock + 1e-9)
  if (after < AUTO_FIRST_DECISION) return AUTO_FIRST_DECISION
  if (after < AUTO_FIRST_CHOICE) return AUTO_FIRST_CHOICE
  return AUTO_FIRST_CHOICE + AUTO_EVERY * (Math.floor((after - AUTO_FIRST_CHOICE) / AUTO_EVERY) + 1)
}

/** What one decision round gathered, as every rank computes it. */
interface DecisionRound {
  readonly computeMs: number[][]
  readonly steps: number
  readonly step: number
  readonly anyFinishing: boolean
  readonly allFinishing: boolean
  /** The most report() calls any rank had made (-1: a rank outside a Trainer's worker, which has no count). */
  readonly reports: number
  /** The group's decision clock at the round (the greatest of the ranks'). */
  readonly clock: number
  readonly cpu: { busyCores: number[]; stepsPerSec: number[]; cores: number[]; host: number[]; ownCores: number[] }
}

/** A survivor's snapshot file of auto's state: what runs, its decision clock and what it measured (the same on every rank). */
export const AUTO_FILE = "auto.msgpack"

interface AutoState {
  readonly current: StrategyName
  /** beforeStep calls completed before the step in flight. */
  readonly calls: number
  readonly nextDecision: number
  readonly rounds: number
  readonly choices: number
  readonly switches: number
  readonly measured: ReadonlyArray<readonly [StrategyName, number, number]>
  readonly allReduceMs?: number
  readonly pushPullMs?: number
  /** The group step the measuring window began at (none before the second step). */
  readonly markGlobal?: number
  /** Training has run on the servers (AutoWorker.replicated). */
  readonly wasOnServers: boolean
  /** On the servers: the mode and where its version counts from. */
  readonly servers?: AutoMode
  /** A move from the servers waiting for a report() call (AutoWorker.#pending). */
  readonly pending?: { readonly to: StrategyName; readonly atReport: number }
}

/** The candidates auto may move to: the cost-model entries the registered strategies declare. */
export const autoCandidates = (): ReadonlySet<StrategyName> => new Set(strategies().flatMap((e) => e.autoCandidates ?? []))

export class AutoWorker implements StrategyWorker {
  readonly #host: StrategyHost
  readonly #allreduce: AllReduceWorker
  readonly #servers: ParameterServerWorker
  /** Local SGD's outer loop while training runs on it. */
  #local: LocalSgdWorker | undefined
  /** What runs now. */
  #current: StrategyName = "allreduce"
  /** This rank's recent compute, all-reduce and push-pull times (ms, -1: not measured). */
  #computeLog: number[] = []
  #commLog: number[] = []
  #psLog: number[] = []
  /** When the last decision round was, and the machine's busy CPU ms then. */
  #cpuMark: { at: number; busy: number; own: number } | undefined
  #allReduceMs: number | undefined
  /** The group's measured price of one push-pull. */
  #pushPullMs: number | undefined
  #switches = 0
  /** Training has run on the servers in this process (replicated). */
  #wasOnServers = false
  /** Decision rounds that made a choice (GRADWIRE_AUTO_PLAN's entries are taken in this order). */
  #choices = 0
  /**
   * Recovery from peers: a move between strategies under way (no regroup carries its state:
   * peersCannotNow), and how many survivors' states this rank took (a decision round whose gather
   * a regroup completed for it then leaves the outcome to the state it took).
   */
  #moving: { readonly from: StrategyName; readonly to: StrategyName } | undefined
  #adoptions = 0
  /**
   * A move off the servers decided in a hand-written loop, made at report() call `atReport` (0-based)
   * on every rank. There each rank takes its own steps, so at the decision the ranks stand at
   * different steps of their loops, and the all-reduce (or local SGD) would then see a rank's loop
   * end while another still steps (a fixed number of steps each: call-mismatch); every rank makes the
   * same report() calls, which line them up. Until then no decision round is held.
   */
  #pending: { readonly to: StrategyName; readonly atReport: number } | undefined
  /**
   * The decision clock's next point (the same on every rank). Inside dp.fit() the clock is this
   * rank's trainStep calls (dp.fit gives every rank the same steps); outside it, the group step,
   * which every rank reaches whatever steps it took itself.
   */
  #nextDecision = AUTO_FIRST_DECISION
  #calls = 0
  /**
   * Where the current measuring window began (performance.now() and the group step; undefined
   * until the second step), and the rates measured per strategy with the round they were measured
   * in (forgotten after AUTO_REMEMBER rounds, so a changed group is tried again).
   */
  #mark: { at: number; global: number } | undefined
  #measured = new Map<StrategyName, { rate: number; round: number }>()
  #rounds = 0

  constructor(host: StrategyHost) {
    this.#host = host
    this.#allreduce = new AllReduceWorker(host)
    this.#servers = new ParameterServerWorker(host)
  }

  get name(): string {
    return this.#current
  }

  get viaServers(): boolean {
    return onServers(this.#current)
  }

  /**
   * On the all-reduce every rank holds the same state between steps (the move there makes it so),
   * which the report rounds' state parity checks, each rank deciding for itself: ranks at the same
   * report() call must be on the same strategy. In a dp.fit() loop they are (decisions come at the
   * same step count on every rank, reports too); a hand-written loop's ranks take their own steps
   * on the servers and may meet a move back to the all-reduce on either side of a report() call,
   * so after the servers no parity is checked there.
   */
  get replicated(): boolean {
    return this.#current === "allreduce" && !this.#local && (this.#host.fitUsed || !this.#wasOnServers)
  }

  get #active(): StrategyWorker {
    return this.#local ?? (onServers(this.#current) ? this.#servers : this.#allreduce)
  }

  async beforeStep(): Promise<void> {
    // In a hand-written loop on the servers each rank meets the decision point at its own place in
    // its loop, which the round lines up as long as the ranks' report() calls exchange nothing; a
    // group below its size exchanges at each of them (its replacements join there), and a round
    // one rank holds in a step would meet another's report(): the decision waits for the group to
    // be whole again.
    if (this.#decisionClock() >= this.#nextDecision && !(onServers(this.#current) && !this.#host.fitUsed && this.#host.reportsExchange)) await this.#decideStrategy()
    this.#calls++
    if (this.#calls === 2 && !this.#mark) this.#mark = { at: performance.now(), global: this.#host.global }
  }

  inPlace(): boolean {
    return this.#active.inPlace()
  }

  async afterInPlace(samples: number): Promise<void> {
    await this.#active.afterInPlace?.(samples)
  }

  computed(ms: number, step: number, inPlace: boolean): void {
    if (step >= 2 && (!inPlace || this.#local)) this.#computeLog.push(ms)
  }

  async exchange(flat: Float32Array, x: StepExchange): Promise<Exchanged> {
    const r = await this.#active.exchange(flat, x)
    if (x.step >= 2) {
      if (r.onServers) {
        this.#commLog.push(-1)
        this.#psLog.push(r.commMs ?? -1)
      } else this.#commLog.push(r.commMs ?? -1)
    }
    return r
  }

  async settle(): Promise<void> {
    await this.#local?.settle()
  }

  /**
   * Tells the servers this rank's loop ended. On the servers, ranks that are still training may be
   * waiting in a decision (or reach one); this rank takes part in the group's decision rounds,
   * changing nothing, until every rank has finished.
   */
  async finish(): Promise<void> {
    await this.settle()
    await this.#servers.finish()
    // (With a move pending, no rank holds rounds: every rank's loop ended before the report() call
    // it waited for, the same call on every rank.)
    if (onServers(this.#current) && !this.#pending) while ((await this.#decisionRound(true))?.allFinishing === false);
  }

  /**
   * A move off the servers decided in a hand-written loop (#pending) is made at its report() call,
   * where every rank's loop stands at the same place: the group step and the step counter, each
   * rank's own on the servers, are agreed first (the greatest), and decision rounds go on after it.
   */
  async atReport(index: number): Promise<void> {
    const pending = this.#pending
    if (!pending || index < pending.atReport) return
    // This rank pushes no more: a rank still behind in its loop (with backup workers its pushes
    // wait for a quota of the group's) takes its last steps without the ones waiting here.
    await this.#servers.finish()
    const all = await this.#host.sync.allGather!(Float32Array.of(this.#host.global, this.#host.step))
    let global = 0
    let steps = 0
    for (let r = 0; r < all.length / 2; r++) {
      global = Math.max(global, all[2 * r]!)
      steps = Math.max(steps, all[2 * r + 1]!)
    }
    this.#host.global = global
    this.#host.step = steps
    this.#pending = undefined
    await this.#switchStrategy(pending.to)
    this.#nextDecision = nextDecisionAfter(this.#decisionClock())
  }

  async checkpointFiles(optimizerFile: () => Promise<Uint8Array>): Promise<Record<string, Uint8Array>> {
    return this.#active.checkpointFiles ? this.#active.checkpointFiles(optimizerFile) : { [OPTIMIZER_FILE]: await optimizerFile() }
  }

  /**
   * Resumes on the all-reduce: a checkpoint taken while on the servers is their state, which every
   * rank loads into its own optimizer.
   */
  async restore(files: Readonly<Record<string, Uint8Array>>): Promise<boolean> {
    if (this.#local) await this.#local.restore(files)
    this.#current = "allreduce"
    this.#pending = undefined
    this.#servers.auto = undefined
    if (!hasPsFiles(files)) return false
    const whole = psWholeState(files, this.#host.parameterCount)
    this.#host.assignFlat(whole.params)
    await this.#host.loadTfjsOptimizer(this.#servers.spec, whole.optimizer)
    return true
  }

  /**
   * Recovery from peers: what runs now and the decision clock go to every member (a replacement
   * starts on the all-reduce with a clock at 0), with local SGD's outer state while it runs, the
   * servers' mode while on them. While moving, a regroup does not follow (peersCannotNow).
   */
  snapshotFiles(inStep: boolean): Record<string, Uint8Array> {
    const state: AutoState = {
      current: this.#current,
      // The step in flight (this rank is past its beforeStep) is not counted: a member takes it
      // up from the step before, as the step counter (data-parallel.ts snapshot).
      calls: this.#calls - (inStep ? 1 : 0),
      nextDecision: this.#nextDecision,
      rounds: this.#rounds,
      choices: this.#choices,
      switches: this.#switches,
      measured: [...this.#measured].map(([name, m]) => [name, m.rate, m.round] as const),
      ...(this.#allReduceMs !== undefined ? { allReduceMs: this.#allReduceMs } : {}),
      ...(this.#pushPullMs !== undefined ? { pushPullMs: this.#pushPullMs } : {}),
      ...(this.#mark ? { markGlobal: this.#mark.global } : {}),
      wasOnServers: this.#wasOnServers,
      ...(this.#servers.auto ? { servers: this.#servers.auto } : {}),
      ...(this.#pending ? { pending: this.#pending } : {})
    }
    return { ...this.#local?.snapshotFiles(inStep), ...(onServers(this.#current) ? this.#servers.snapshotFiles() : {}), [AUTO_FILE]: encodeMessage(state) }
  }

  peersCannotNow(): string | undefined {
    if (this.#moving) return `strategy auto was moving from ${this.#moving.from} to ${this.#moving.to} (parameters and optimizer state on their way), which a regroup does not follow`
    // In a hand-written loop on the servers each rank takes its own steps and auto's clock is the
    // group step (counted on from a regroup at the new size: ParameterServerWorker.exchange): on
    // SSP and async the decision rounds line up once a short group's report() exchanges hold none
    // back (beforeStep), and a rank still behind at a move back takes its last steps alone
    // (atReport). With backup workers a step needs all ranks' gradients but one: a replacement
    // behind the survivors would wait on the servers for a second gradient while they wait for it
    // in a decision round, so a rank in a round is away for the servers until its next push
    // (#decisionRound). dp.fit() counts steps alike on every rank.
    return undefined
  }

  /** On the servers, an async or SSP push in flight is applied as it arrives (ParameterServerWorker.stepApplied). */
  get stepApplied(): boolean {
    return onServers(this.#current) && this.#servers.stepApplied
  }

  /** A survivor's state: its strategy (local SGD's outer loop made here first where it runs that), then local SGD's own adoption. */
  async beforeAdopt(files: Readonly<Record<string, Uint8Array>>): Promise<(() => void) | undefined> {
    const s = this.#stateIn(files)
    if (s && s.current === "local-sgd" && !this.#local) {
      this.#local = new LocalSgdWorker(this.#host)
      await this.#local.init()
    } else if (s && s.current !== "local-sgd") this.#local = undefined
    return this.#local?.beforeAdopt(files)
  }

  async adopted(files: Readonly<Record<string, Uint8Array>>, at: { readonly inStep: boolean; readonly redoingStep: boolean }): Promise<void> {
    const s = this.#stateIn(files)
    if (!s) return
    this.#current = s.current
    this.#servers.auto = s.servers
    // A rank redoing its step in flight has made that step's beforeStep call.
    this.#calls = s.calls + (at.inStep && at.redoingStep ? 1 : 0)
    this.#nextDecision = s.nextDecision
    this.#rounds = s.rounds
    this.#choices = s.choices
    this.#switches = s.switches
    this.#wasOnServers = s.wasOnServers
    this.#pending = s.pending
    this.#measured = new Map(s.measured.map(([name, rate, round]) => [name, { rate, round }]))
    this.#allReduceMs = s.allReduceMs
    this.#pushPullMs = s.pushPullMs
    // The window's group step as every rank holds it (the rates every rank computes from it must agree).
    this.#mark = s.markGlobal !== undefined ? { at: this.#mark?.at ?? performance.now(), global: s.markGlobal } : undefined
    this.#adoptions++
    // On the servers every member goes on from their parameters, the newest there are.
    if (onServers(this.#current)) await this.#servers.adopted(files)
  }

  #stateIn(files: Readonly<Record<string, Uint8Array>>): AutoState | undefined {
    const f = files[AUTO_FILE]
    return f ? (decodeMessage(f) as AutoState) : undefined
  }

  metrics(): Record<string, number | string> {
    return { strategy: this.#current, "strategy/switches": this.#switches, ...this.#local?.metrics(), ...(this.viaServers ? this.#servers.metrics() : {}) }
  }

  #decisionClock(): number {
    return this.#host.inFit ? this.#calls : Math.floor(this.#host.global + 1e-9)
  }

  /**
   * Strategy "auto": one round of the group's decision exchange. Every rank's recent compute,
   * all-reduce and push-pull times, its group step, step counter, decision clock and whether it has
   * finished are gathered; every rank leaves with the same group step and next decision point.
   */
  async #decisionRound(finishing: boolean): Promise<DecisionRound | undefined> {
    // With backup workers in a hand-written loop the ranks meet the round at their own steps: one
    // still pushing would wait on the servers for a second gradient while the others wait for it
    // here (a replacement counting from its join, behind the survivors). Away until its next push,
    // this rank does not count for the servers' steps meanwhile.
    if (this.#current === "backup" && !this.#host.fitUsed && !finishing) await this.#servers.away()
    const k = AUTO_WINDOW
    const w = 3 * k + 12
    // This rank's last k compute, all-reduce and push-pull times (-1: not measured), then the rest.
    const mine = new Float32Array(w).fill(-1)
    const c = this.#computeLog.slice(-k)
    const m = this.#commLog.slice(-k)
    const q = this.#psLog.slice(-k)
    mine.set(c, k - c.length)
    mine.set(m, 2 * k - m.length)
    mine.set(q, 3 * k - q.length)
    mine[3 * k] = this.#host.global
    mine[3 * k + 1] = this.#host.step
    mine[3 * k + 2] = this.#decisionClock()
    mine[3 * k + 3] = finishing ? 1 : 0
    mine[3 * k + 4] = this.#servers.serverMs ?? -1
    mine[3 * k + 5] = this.#mark ? performance.now() - this.#mark.at : -1
    // Since the last round: this machine's busy cores (every process on it) and this rank's
    // steps/s; its cores, and the machine (a 24-bit hash of the host name: ranks of one machine
    // share its cores).
    const usage = process.cpuUsage()
    const now = { at: performance.now(), busy: machineBusyMs(), own: (usage.user + usage.system) / 1000 }
    const took = this.#computeLog.length
    if (this.#cpuMark && took > 0 && now.at > this.#cpuMark.at) {
      mine[3 * k + 6] = (now.busy - this.#cpuMark.busy) / (now.at - this.#cpuMark.at)
      mine[3 * k + 7] = (took * 1000) / (now.at - this.#cpuMark.at)
      mine[3 * k + 10] = (now.own - this.#cpuMark.own) / (now.at - this.#cpuMark.at)
    }
    this.#cpuMark = now
    mine[3 * k + 8] = os.availableParallelism()
    mine[3 * k + 9] = hostHash
    mine[3 * k + 11] = this.#host.reports ?? -1
    this.#computeLog = []
    this.#commLog = []
    this.#psLog = []
    const adoptions = this.#adoptions
    const rounds = this.#rounds
    const all = await this.#host.sync.allGather!(mine)
    // A regroup completed this round for this rank with the state of a survivor that had made it,
    // which holds its outcome (the gather's answer is a stand-in then). Where that survivor was in
    // this round too (its state counts no more rounds), the round was made again in the new group
    // and its answer stands (taken for a stand-in, the survivor held a round of its own at its
    // next step while the others moved on).
    if (this.#adoptions !== adoptions && this.#rounds > rounds) return undefined
    const p = this.#host.sync.worldSize
    let global = 0
    let steps = 0
    let clock = 0
    let done = 0
    let serverMs = -1
    let elapsed = -1
    let reports = 0
    for (let r = 0; r < p; r++) {
      const made = all[r * w + 3 * k + 11]!
      reports = reports < 0 || made < 0 ? -1 : Math.max(reports, made)
      global = Math.max(global, all[r * w + 3 * k]!)
      steps = Math.max(steps, all[r * w + 3 * k + 1]!)
      clock = Math.max(clock, all[r * w + 3 * k + 2]!)
      done += all[r * w + 3 * k + 3]!
      serverMs = Math.max(serverMs, all[r * w + 3 * k + 4]!)
      elapsed = Math.max(elapsed, all[r * w + 3 * k + 5]!)
    }
    // The group's rate since the window began (gradient steps/s: p per synchronous step's worth).
    this.#rounds++
    // The first window (from the second step) is warm-up: kernels compiled, buffers and links
    // made; its rate would sell the starting strategy short, so that round only measures.
    if (this.#mark && elapsed > 0 && !finishing && this.#rounds > 1) {
      const rate = ((global - this.#mark.global) * p * 1000) / elapsed
      if (rate > 0) this.#measured.set(this.#current, { rate, round: this.#rounds })
    }
    for (const [name, m] of this.#measured) if (this.#rounds - m.round > AUTO_REMEMBER) this.#measured.delete(name)
    this.#mark = { at: performance.now(), global }
    this.#host.global = global
    this.#nextDecision = nextDecisionAfter(clock)
    // Per step, the least any rank spent exchanging (the last to arrive waited for nobody), averaged:
    // rates follow the mean time, and a rank throttled in bursts has many quick steps and a few slow ones.
    const leastPerStep = (part: number): number | undefined => {
      const mins: number[] = []
      for (let t = 0; t < k; t++) {
        let least = Number.POSITIVE_INFINITY
        for (let r = 0; r < p; r++) {
          const v = all[r * w + part * k + t]!
          if (v >= 0) least = Math.min(least, v)
        }
        if (Number.isFinite(least)) mins.push(least)
      }
      return mins.length > 0 ? mins.reduce((a, b) => a + b, 0) / mins.length : undefined
    }
    this.#allReduceMs = leastPerStep(1) ?? this.#allReduceMs
    this.#pushPullMs = leastPerStep(2) ?? this.#pushPullMs
    if (serverMs >= 0) this.#servers.serverMs = serverMs
    const computeMs: number[][] = []
    for (let r = 0; r < p; r++) computeMs.push(Array.from(all.subarray(r * w, r * w + k)).filter((v) => v >= 0))
    const field = (i: number): number[] => Array.from({ length: p }, (_, r) => all[r * w + 3 * k + i]!)
    const cpu = { busyCores: field(6), stepsPerSec: field(7), cores: field(8), host: field(9), ownCores: field(10) }
    return { computeMs, steps, step: Math.floor(global + 1e-9), anyFinishing: done > 0, allFinishing: done >= p, reports, clock, cpu }
  }

  /**
   * Strategy "auto", each time the decision clock passes the next decision point, the same points
   * on every rank, so the exchange lines up: inside dp.fit() every rank's step count; outside it the
   * group step, which lines up even where ranks take different numbers of steps (backup workers,
   * SSP, async: a rank enters when it hears the group got there, so the others wait at most for its
   * step in flight). Every rank computes the same choice from the gathered measurements
   * (scheduler/strategy-choice.ts), rank 0 explains it, and a change moves training. Once any rank
   * has finished its loop nothing changes any more.
   */
  async #decideStrategy(): Promise<void> {
    const auto = this.#host.sync.auto!
    if (!this.#host.sync.allGather) return
    const round = await this.#decisionRound(false)
    if (!round) return
    const { computeMs, steps, step, anyFinishing, reports, cpu } = round
    // The first round (warm-up) only measures: its compute times' jitter and its rate are the
    // first steps', and the machine's busy cores have no window yet.
    if (this.#rounds === 1) return
    if (anyFinishing) return
    // dp.fit()'s batcher left a rank without rows (hetero-batching.ts: where that made the group's
    // steps faster): only the all-reduce and local SGD go on with such a rank (the same update on
    // it; local SGD's rounds weighted by samples), and the candidates are priced from every rank's
    // compute, which such a rank no longer measures. The strategy stays until the batcher gives it
    // rows again (it tries that every ZERO_RECHECK exchanges).
    const idle = this.#host.ranksWithoutRows
    if ((this.#current === "allreduce" || this.#current === "local-sgd") && idle.length > 0) {
      if (this.#host.sync.rank === 0) {
        const ranks = `rank${idle.length > 1 ? "s" : ""} ${idle.join(", ")}`
        auto.explain(
          `strategy: ${this.#current} (kept); adaptive batching gives ${ranks} no rows: only the all-reduce and local SGD go on with a rank without rows, and the candidates are priced from every rank's compute; they are weighed again once every rank has rows`,
          { step, pick: this.#current, previous: this.#current, changed: false, ranksWithoutRows: idle },
          `gradwire: strategy ${this.#current} at step ${step}: kept, ${ranks} without rows`
        )
      }
      return
    }
    if (this.#allReduceMs === undefined) return
    if (computeMs.some((r) => r.length === 0)) {
      // A rank without compute times yet where others have them: a replacement let in at this
      // round (the survivors' next group operation), whose log starts with its first step here.
      // The choice is made once it has some, a window later, not at the next point: a CI run whose
      // replacement, held up by the machine's load, joined at the round at step 168 ended its 13
      // epochs before 216, where GRADWIRE_AUTO_PLAN's move back to the all-reduce came next.
      if (computeMs.some((r) => r.length > 0)) this.#nextDecision = Math.min(this.#nextDecision, round.clock + AUTO_WINDOW)
      return
    }
    const choice = chooseStrategy(
      {
        computeMs,
        allReduceMs: this.#allReduceMs,
        numServers: auto.numServers,
        equalSteps: this.#host.inFit,
        candidates: autoCandidates(),
        ...(this.#pushPullMs !== undefined ? { pushPullMs: this.#pushPullMs } : {}),
        ...(this.#servers.serverMs !== undefined ? { serverMs: this.#servers.serverMs } : {}),
        measured: Object.fromEntries([...this.#measured].map(([name, m]) => [name, m.rate])),
        // Held to what the machines' cores run (no rank without a CPU figure yet: none is applied).
        ...(cpu.busyCores.every((c) => c > 0) && cpu.ownCores.every((c) => c > 0) ? { cpu } : {}),
        // collectiveConfig.localSgd offers local SGD: one round of the whole vector per H steps.
        ...(this.#host.sync.localSgd ? { localSgd: { syncEvery: this.#host.sync.localSgd.syncEvery } } : {})
      },
      this.#current
    )
    // GRADWIRE_AUTO_PLAN: this round's move is given (the same list on every rank); the cost
    // model's choice is explained beside it.
    const planned = this.#planned(this.#choices++)
    const pick = planned ?? choice.pick
    const changed = pick !== this.#current
    // Off the servers in a hand-written loop: at the first report() call no rank has made yet.
    const atReport = changed && onServers(this.#current) && !onServers(pick) && !this.#host.inFit && reports >= 0 ? reports : undefined
    const when = atReport === undefined ? "" : ` from every rank's report() call ${atReport + 1} (each rank takes its own steps on the servers; its report() calls line the ranks up)`
    if (this.#host.sync.rank === 0) {
      const best = choice.predictions.find((x) => x.name === choice.pick)
      if (planned !== undefined) {
        auto.explain(
          `strategy: ${planned}${changed ? ` (was ${this.#current})` : " (kept)"}${when}, planned by GRADWIRE_AUTO_PLAN; the cost model's choice: ${choice.pick}\n${choice.text}`,
          { step, ...choice.json, pick: planned, changed, planned: true, modelPick: choice.pick },
          `gradwire: strategy ${planned}${changed ? ` (was ${this.#current})` : ""} at step ${step}${when}: planned (GRADWIRE_AUTO_PLAN; the cost model's choice ${choice.pick})`
        )
      } else auto.explain(when ? `${choice.text}\n(the move${when})` : choice.text, { step, ...choice.json, ...(atReport !== undefined ? { atReport } : {}) }, `gradwire: strategy ${choice.pick}${choice.changed ? ` (was ${this.#current})` : ""} at step ${step}${when}: predicted ${best?.stepsPerSec.toFixed(1)} gradient steps/s`)
    }
    if (atReport !== undefined) {
      this.#pending = { to: pick, atReport }
      this.#nextDecision = Number.POSITIVE_INFINITY
      return
    }
    if (changed) {
      // The next strategy starts every rank at the same step (the all-reduce and sync steps are numbered by it).
      this.#host.step = steps
      await this.#switchStrategy(pick)
    }
  }

  /**
   * GRADWIRE_AUTO_PLAN's entry for the choice-th choice, or undefined past its end. A name auto
   * cannot move to here is a ConfigError (every rank reads the same list and throws alike).
   */
  #planned(choice: number): StrategyName | undefined {
    const name = autoPlan.read()[choice]
    if (name === undefined) return undefined
    const can = ["allreduce", ...[...autoCandidates()].filter((c) => c !== "local-sgd" || this.#host.sync.localSgd !== undefined)]
    if (!can.includes(name)) {
      throw new ConfigError({
        field: "GRADWIRE_AUTO_PLAN",
        reason: `entry ${choice + 1} is "${name}"; strategy auto can move to ${can.join(", ")} in this job${autoCandidates().has("local-sgd") && !this.#host.sync.localSgd ? " (local-sgd needs collectiveConfig.localSgd)" : ""}`
      })
    }
    return name as StrategyName
  }

  /** Every rank takes rank 0's optimizer state (all ranks call it). */
  async #takeRankZeroOptimizer(): Promise<void> {
    const spec = this.#servers.spec
    const weights = await readTfjsOptimizerWeights(this.#host.optimizer as unknown as Parameters<typeof readTfjsOptimizerWeights>[0])
    // Whole slots on every rank, so the broadcast's length matches (flatStateFromTfjs fills a
    // variable a rank never updated with the slot's initial value).
    const mine = flatStateFromTfjs(spec, this.#host.layout, this.#host.parameterCount, weights)
    const names = Object.keys(mine.slots).sort()
    const n = this.#host.parameterCount
    const buf = new Float32Array(1 + names.length * n)
    buf[0] = mine.scalars["step"] ?? 0
    names.forEach((k, i) => buf.set(mine.slots[k]!, 1 + i * n))
    await this.#host.sync.broadcast(buf)
    const slots = Object.fromEntries(names.map((k, i) => [k, buf.subarray(1 + i * n, 1 + (i + 1) * n)]))
    await this.#host.loadTfjsOptimizer(spec, { kind: mine.kind, slots, scalars: { step: buf[0]! } })
  }

  /** Moves training between the all-reduce and the servers, carrying the parameters and the optimizer state. */
  async #switchStrategy(target: StrategyName): Promise<void> {
    this.#moving = { from: this.#current, to: target }
    try {
      await this.#move(target)
    } finally {
      this.#moving = undefined
    }
  }

  async #move(target: StrategyName): Promise<void> {
    const ps = this.#servers.ps
    const spec = this.#servers.spec
    if (this.#local) {
      // Leaving local SGD: one last round of every fragment, so every rank holds the same weights.
      await this.#local.flush()
      this.#local = undefined
      // Each rank's inner optimizer state (Adam's moments) is its own: for the all-reduce, whose
      // ranks apply the same gradient, every rank takes rank 0's (the servers take rank 0's below).
      if (!onServers(target)) await this.#takeRankZeroOptimizer()
    }
    if (onServers(this.#current)) {
      // Leaving the servers: every rank takes their whole state (they are idle: every rank is here).
      const whole = await ps.wholeState(this.#host.parameterCount)
      this.#host.assignFlat(whole.params)
      await this.#host.loadTfjsOptimizer(spec, whole.optimizer)
    }
    if (onServers(target) && this.#host.sync.rank === 0) {
      const weights = await readTfjsOptimizerWeights(this.#host.optimizer as unknown as Parameters<typeof readTfjsOptimizerWeights>[0])
      const state = flatStateFromTfjs(spec, this.#host.layout, this.#host.parameterCount, weights)
      const as = target === "backup" ? { mode: "sync" as const, backupWorkers: 1 } : { mode: target as "ssp" | "async", backupWorkers: 0 }
      await ps.takeOver(await this.#host.readFlatParams(), state, this.#host.learningRate ?? 0, spec, this.#host.sync.worldSize, this.#host.weightDecay, as)
    }
    // Nobody pushes before the servers hold the state; then every rank learns their version.
    await this.#host.sync.sum(new Float32Array(1))
    if (onServers(target)) await ps.pull(this.#host.parameterCount)
    // The servers' version starts again at 0: the group step and step counter it is counted from.
    this.#servers.auto = onServers(target) ? { mode: target as AutoMode["mode"], globalBase: this.#host.global, syncBase: this.#host.step } : undefined
    this.#current = target
    if (onServers(target)) this.#wasOnServers = true
    // Local SGD's outer loop starts at the weights every rank holds now.
    if (target === "local-sgd") {
      this.#local = new LocalSgdWorker(this.#host)
      await this.#local.init()
    }
    this.#switches++
    // The new strategy's window starts after the move.
    this.#mark = { at: performance.now(), global: this.#host.global }
  }
}

export const auto = defineStrategy({
  name: "auto",
  hint: "starts on the all-reduce and moves to the parameter servers' modes (or local SGD, with collectiveConfig.localSgd) when they are predicted faster",
  // It may move to the servers' modes, so the servers start with the job.
  servers: true,
  validate: (input) => {
    if (input.collective.parameterServer?.mode !== undefined) {
      throw new ConfigError({ field: "collectiveConfig.parameterServer.mode", reason: `strategy "auto" picks the mode itself (backup workers or ssp); leave mode unset, or use strategy "parameter-server"` })
    }
    checkServersConfig(input)
  },
  // A regroup follows it (but in a move: the checkpoint then, peersCannotNow says why).
  peersCannot: (input) => localSgd.peersCannot(input),
  benchVariants: [{ name: "auto", collective: (s) => ({ strategy: "auto", parameterServer: { numServers: s } }), optIn: "--with-auto" }],
  create: (host) => new AutoWorker(host)
})
