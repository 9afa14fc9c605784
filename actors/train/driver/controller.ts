// The trainer's controller as a state machine with no I/O: it takes what the workers, the cluster
// and the bus say (reports, finished/failed notices, worker deaths, lost nodes, NATS outages,
// capacity that came back) and turns them into the run's state (scheduling -> running ->
// restarting | resizing -> ... -> finished | errored | interrupted), completed report rounds, and the decision
// at the end of each generation of the worker group: finish, fail, restart (from the latest
// checkpoint or from surviving peers) or resize. trainer.ts and fit-run.ts carry the decisions
// out (spawning, killing, saving), asking the recovery choices at the end of this file (peers or
// checkpoint, a death or a lost node); this module is unit-tested without processes
// (test/controller.test.ts).
import { decide, isEndState, isInfrastructure, type Decision, type GroupFailure, type TrainerState } from "./failure-policy.ts"
import { firstLine } from "../../../core/errors.ts"

export type { GroupFailure, TrainerState } from "./failure-policy.ts"

/** A completed report round: every rank of the generation reported index `index`. */
export interface CompletedRound<C> {
  readonly attempt: number
  readonly index: number
  /** Every rank's metrics, by rank. */
  readonly metrics: ReadonlyArray<Record<string, unknown>>
  /** Rank 0's checkpoint when it handed one in, else the first rank's that did. */
  readonly checkpoint: C | undefined
  /** Per-rank files to add to the checkpoint (compression residuals). */
  readonly aux: Readonly<Record<string, Uint8Array>>
}

/** How a generation of the worker group ended. */
export type Outcome =
  | { readonly type: "finished" }
  | { readonly type: "failed"; readonly failure: GroupFailure }
  /** Capacity changed (elastic): end at a report boundary and start again at `size` workers. */
  | { readonly type: "resize"; readonly size: number; readonly reason: string }

/** What the controller does after a generation ended. */
export type Next =
  | { readonly action: "finish" }
  | { readonly action: "fail"; readonly failure: GroupFailure; readonly reason: string }
  | {
      readonly action: "restart"
      /** Why: the failure, or the resize. */
      readonly cause: { readonly type: "failure"; readonly failure: GroupFailure } | { readonly type: "resize"; readonly size: number; readonly reason: string }
      /** Whether this restart used one of failureConfig.maxFailures. */
      readonly counted: boolean
      /** The world size to ask for: min..max with elasticity, numWorkers without. */
      readonly size: { readonly min: number; readonly max: number }
    }

export interface ControllerOptions {
  /** failureConfig.maxFailures: -1 no limit, 0 the first (counted) failure ends the run. */
  readonly maxFailures: number
  /** World size bounds: equal without elasticity. */
  readonly minWorkers: number
  readonly maxWorkers: number
}

export type ControllerEvent<C> =
  | { readonly type: "state"; readonly from: TrainerState; readonly to: TrainerState; readonly attempt: number }
  | { readonly type: "round"; readonly round: CompletedRound<C> }

interface Round<C> {
  readonly metrics: Array<Record<string, unknown> | undefined>
  checkpoint: C | undefined
  checkpointRank: number
  readonly aux: Record<string, Uint8Array>
  count: number
}

/** The messages a rank sends during a generation. */
export interface ReportMessage<C> {
  readonly attempt: number
  readonly rank: number
  readonly index: number
  readonly metrics: Record<string, unknown>
  readonly checkpoint?: C
  readonly aux?: Readonly<Record<string, Uint8Array>>
}

/** How long the controller waits for every rank's word on where its loop was, once one said its calls mismatched. */
export const MISMATCH_GATHER_MS = 1_000

/** One generation of the worker group (an "attempt"): its size, its report rounds, its outcome. */
export class Generation<C> {
  readonly number: number
  readonly worldSize: number
  /**
   * A regrouped generation: rounds below this index are completed by the survivors alone (the
   * ranks in `survivors`); the joiners skip those reports. 0 for a generation that started afresh.
   */
  readonly survivorsOnlyBelow: number
  readonly survivors: ReadonlySet<number>
  readonly rounds = new Map<number, Round<C>>()
  /** Ranks whose loop returned, with how many reports each made. */
  readonly finished = new Map<number, number>()
  completedRounds = 0
  /** Whether a round with a checkpoint completed in this generation. */
  checkpointed = false
  /** Rounds completed (a report of one sent again after a lost reply is not a new round). */
  readonly completed = new Set<number>()
  settled = false
  /** Ranks that said the group broke on mismatched calls, with where their loop was (Controller.failed). */
  readonly mismatches = new Map<number, { readonly where: string; readonly tag: string; readonly message: string; readonly stack: string }>()
  mismatchTimer: ReturnType<typeof setTimeout> | undefined
  readonly outcome: Promise<Outcome>
  #resolve!: (o: Outcome) => void

  constructor(number: number, worldSize: number, regroup?: { readonly survivors: ReadonlySet<number>; readonly survivorsOnlyBelow: number }) {
    this.number = number
    this.worldSize = worldSize
    this.survivors = regroup?.survivors ?? new Set()
    this.survivorsOnlyBelow = regroup?.survivorsOnlyBelow ?? 0
    this.outcome = new Promise((resolve) => (this.#resolve = resolve))
  }

  /** How many ranks report round `index`. */
  expected(index: number): number {
    return index < this.survivorsOnlyBelow ? this.survivors.size : this.worldSize
  }

  /** The first outcome wins; later ones are ignored. */
  settle(o: Outcome): void {
    if (this.settled) return
    this.settled = true
    clearTimeout(this.mismatchTimer)
    this.#resolve(o)
  }
}

export class Controller<C = unknown> {
  readonly options: ControllerOptions
  #state: TrainerState = "scheduling"
  #attempt = 0
  #counted = 0
  #infraWithoutProgress = 0
  #current: Generation<C> | undefined
  #pendingResize: { size: number; reason: string } | undefined
  readonly #listener: (e: ControllerEvent<C>) => void

  constructor(options: ControllerOptions, listener: (e: ControllerEvent<C>) => void = () => {}) {
    if (!(options.minWorkers >= 1 && options.maxWorkers >= options.minWorkers)) {
      throw new RangeError(`worker bounds must satisfy 1 <= min <= max, got ${options.minWorkers}..${options.maxWorkers}`)
    }
    this.options = options
    this.#listener = listener
  }

  get state(): TrainerState {
    return this.#state
  }

  /** The current generation's number (0 for the first). */
  get attempt(): number {
    return this.#attempt
  }

  /** Restarts that used failureConfig.maxFailures so far. */
  get countedFailures(): number {
    return this.#counted
  }

  get current(): Generation<C> | undefined {
    return this.#current
  }

  get elastic(): boolean {
    return this.options.maxWorkers > this.options.minWorkers
  }

  /**
   * The smallest group the survivors of a failure may go on as while replacements start: an
   * elastic group's min; a fixed-size group runs short-handed down to one worker until its
   * replacements join (fit-run.ts refills it).
   */
  get floor(): number {
    return this.elastic ? this.options.minWorkers : 1
  }

  /** The world sizes to place for the next generation. */
  get wantedSize(): { min: number; max: number } {
    return { min: this.options.minWorkers, max: this.options.maxWorkers }
  }

  #to(to: TrainerState): void {
    const from = this.#state
    if (from === to) return
    if (isEndState(from)) throw new Error(`controller: no transition out of ${from} (to ${to})`)
    this.#state = to
    this.#listener({ type: "state", from, to, attempt: this.#attempt })
  }

  /** The group is placed with `worldSize` workers: a new generation runs. */
  begin(worldSize: number): Generation<C> {
    if (this.#state !== "scheduling") throw new Error(`controller: begin() while ${this.#state}`)
    if (!(worldSize >= this.options.minWorkers && worldSize <= this.options.maxWorkers)) {
      throw new RangeError(`controller: world size ${worldSize} outside ${this.options.minWorkers}..${this.options.maxWorkers}`)
    }
    this.#pendingResize = undefined
    const g = new Generation<C>(this.#attempt, worldSize)
    this.#current = g
    this.#to("running")
    return g
  }

  #live(attempt: number): Generation<C> | undefined {
    const g = this.#current
    return g && g.number === attempt && !g.settled && this.#state === "running" ? g : undefined
  }

  /**
   * A rank's report. Completes the round when every rank of the generation has reported it. Reports
   * of a generation that already ended still count until the next one starts: its survivors may be
   * regrouped, and what they reported meanwhile carries over.
   */
  report(msg: ReportMessage<C>): void {
    const c = this.#current
    const g = c && c.number === msg.attempt && !isEndState(this.#state) ? c : undefined
    if (!g || msg.rank < 0 || msg.rank >= g.worldSize || g.completed.has(msg.index)) return
    // Rounds the survivors of a regroup were in: only theirs count (the joiners skip them).
    if (msg.index < g.survivorsOnlyBelow && !g.survivors.has(msg.rank)) return
    for (const [rank, count] of g.finished) {
      if (msg.index >= count && !g.settled) {
        this.fail(g, {
          kind: "report-mismatch",
          rank: msg.rank,
          tag: "ReportMismatch",
          message:
            `rank ${msg.rank} called report() more than ${count} times, but rank ${rank} finished after ${count} report() calls: ` +
            "every rank must call report() the same number of times"
        })
        return
      }
    }
    let round = g.rounds.get(msg.index)
    if (!round) {
      round = { metrics: new Array(g.worldSize).fill(undefined), checkpoint: undefined, checkpointRank: -1, aux: {}, count: 0 }
      g.rounds.set(msg.index, round)
    }
    if (round.metrics[msg.rank] === undefined) round.count++
    round.metrics[msg.rank] = msg.metrics
    // Rank 0's checkpoint wins when several ranks hand one in (as in Ray, usually only rank 0 does).
    if (msg.checkpoint !== undefined && (round.checkpoint === undefined || msg.rank === 0 || msg.rank < round.checkpointRank)) {
      round.checkpoint = msg.checkpoint
      round.checkpointRank = msg.rank
    }
    if (msg.aux) Object.assign(round.aux, msg.aux)
    this.#completeIfFull(g, msg.index)
  }

  #completeIfFull(g: Generation<C>, index: number): void {
    const round = g.rounds.get(index)
    if (!round || round.count < g.expected(index)) return
    g.rounds.delete(index)
    g.completed.add(index)
    g.completedRounds = Math.max(g.completedRounds, index + 1)
    if (round.checkpoint !== undefined) g.checkpointed = true
    this.#infraWithoutProgress = 0
    this.#listener({
      type: "round",
      round: { attempt: g.number, index, metrics: round.metrics.map((m) => m ?? {}), checkpoint: round.checkpoint, aux: round.aux }
    })
    // A pending resize takes effect at a report boundary that left a checkpoint to resume from.
    const resize = this.#pendingResize
    if (resize && !g.settled && round.checkpoint !== undefined && resize.size !== g.worldSize) g.settle({ type: "resize", ...resize })
  }

  /** A rank's loop returned after `reports` report() calls. */
  finished(msg: { readonly attempt: number; readonly rank: number; readonly reports: number }): void {
    const g = this.#live(msg.attempt)
    if (!g || msg.rank < 0 || msg.rank >= g.worldSize) return
    g.finished.set(msg.rank, msg.reports)
    const counts = new Set(g.finished.values())
    const highest = Math.max(g.completedRounds, ...[...g.rounds.keys()].map((k) => k + 1))
    if (counts.size > 1 || msg.reports < highest) {
      const [r0, c0] = [...g.finished.entries()].find(([, c]) => c !== msg.reports) ?? [-1, highest]
      this.fail(g, {
        kind: "report-mismatch",
        rank: msg.rank,
        tag: "ReportMismatch",
        message:
          `rank ${msg.rank} finished after ${msg.reports} report() calls but ${r0 >= 0 ? `rank ${r0} made ${c0}` : `other ranks reported ${c0} times`}: ` +
          "every rank must call report() the same number of times"
      })
      return
    }
    if (g.finished.size === g.worldSize) g.settle({ type: "finished" })
  }

  /** A rank's loop threw. `blamed`: ranks a collective error on it names (dead or stalled peers). */
  failed(msg: {
    readonly attempt: number
    readonly rank: number
    readonly tag: string
    readonly message: string
    readonly stack: string
    readonly blamed?: ReadonlyArray<number>
    /** The rank is alive and waits to be regrouped (its group broke under it). */
    readonly parked?: boolean
    /** The group broke on mismatched calls (`where` says this rank's place). */
    readonly mismatch?: boolean
    /** What the first blamed rank was doing, asked of it (an idle loop's place, a held main thread's stack). */
    readonly blamedState?: string
    /** Where this rank's loop was. */
    readonly where?: string
  }): void {
    const g = this.#live(msg.attempt)
    if (!g) return
    if (msg.mismatch === true) {
      this.#mismatched(g, msg.rank, { where: msg.where ?? "(its place unknown)", tag: msg.tag, message: msg.message, stack: msg.stack })
      return
    }
    const blamed = msg.blamed?.[0]
    if (msg.parked && blamed === undefined) {
      // The group broke under this rank without naming a culprit: not this rank's loop failing.
      this.fail(g, { kind: "died", rank: -1, tag: msg.tag, message: `rank ${msg.rank}'s group broke: ${msg.message}`, remoteStack: msg.stack })
      return
    }
    const returned = blamed === undefined ? undefined : g.finished.get(blamed)
    if (blamed !== undefined && returned !== undefined) {
      // The rank it waited for had returned from its loop: not a death, the loops ran different
      // lengths (a rank-dependent epoch count, an early return), which a restart would repeat.
      this.fail(g, {
        kind: "call-mismatch",
        rank: blamed,
        tag: "LoopReturnedEarly",
        message:
          `rank ${blamed}'s loop returned (after ${returned} report() call(s)) while rank ${msg.rank}'s went on making collective calls` +
          `${msg.where !== undefined ? ` (rank ${msg.rank} ${msg.where})` : ""}: every rank must run the same epochs and steps; ` +
          `a rank whose loop returns early leaves the others waiting for it (for work on rank 0 alone, keep the other ranks in the loop ` +
          "and skip the work there, with no collective in it)",
        remoteStack: msg.stack
      })
      return
    }
    if (blamed !== undefined) {
      this.fail(g, {
        kind: "died",
        rank: blamed,
        tag: msg.tag,
        message: `rank ${blamed} stopped taking part in collectives${msg.blamedState !== undefined ? `: ${msg.blamedState}` : ""} (reported by rank ${msg.rank}: ${msg.message})`,
        remoteStack: msg.stack
      })
      return
    }
    const kind = msg.tag === "ConfigError" ? "config" : msg.tag === "PeerRecoveryMisaligned" ? "recovery" : "loop-error"
    this.fail(g, { kind, rank: msg.rank, tag: msg.tag, message: msg.message, remoteStack: msg.stack })
  }

  /**
   * The ranks called different collectives (or with different lengths): no process failed, their
   * loops disagree. The other ranks' word on where they were is waited for (MISMATCH_GATHER_MS at
   * most), then the failure names each rank's place. In a generation that started afresh (every rank
   * from the same start or checkpoint) it is the loop's own doing, which a restart would repeat:
   * "call-mismatch", not retryable. In a regrouped one, the survivors and joiners did not line up:
   * "recovery", a restart from the checkpoint.
   */
  #mismatched(g: Generation<C>, rank: number, said: { readonly where: string; readonly tag: string; readonly message: string; readonly stack: string }): void {
    if (g.settled) return
    g.mismatches.set(rank, said)
    const conclude = () => {
      const ranks = [...g.mismatches.keys()].sort((a, b) => a - b)
      const first = g.mismatches.get(ranks[0]!)!
      const places = ranks.map((r) => `rank ${r} ${g.mismatches.get(r)!.where}`).join("; ")
      const detail = first.message.split("\n")[0]
      this.fail(
        g,
        g.survivors.size > 0
          ? { kind: "recovery", rank: -1, tag: first.tag, message: `the regrouped ranks' loops did not line up (${places}): ${detail}`, remoteStack: first.stack }
          : {
              kind: "call-mismatch",
              rank: ranks[0]!,
              tag: first.tag,
              message:
                `the ranks' loops made different collective calls (${places}). Every rank must make the same calls in the same ` +
                `order: the same number of dp.trainStep() calls between two report() calls (with shards of unequal size, take ` +
                `the same number of batches on every rank, as dp.fit() does), and the same collectives of its own. ${detail}`,
              remoteStack: first.stack
            }
      )
    }
    if (g.mismatches.size >= g.worldSize) conclude()
    else if (g.mismatchTimer === undefined) {
      g.mismatchTimer = setTimeout(conclude, MISMATCH_GATHER_MS)
      g.mismatchTimer.unref?.()
    }
  }

  /**
   * A rank's process went down (exit, missed heartbeats, lost node). A rank that already finished
   * its loop may exit; that is not a failure.
   */
  workerDown(attempt: number, rank: number, down: { readonly reason: string; readonly detail: string }): void {
    const g = this.#live(attempt)
    if (!g || g.finished.has(rank)) return
    this.fail(g, {
      kind: down.reason === "node-lost" ? "node-lost" : "died",
      rank,
      tag: down.reason,
      message: down.detail
    })
  }

  /**
   * The group is re-formed from the survivors of the last generation (recovery from peers): a new
   * generation of `worldSize` ranks in which survivor `from` of the old one is rank `to`. Rounds the
   * survivors were in carry over (renumbered); those below `survivorsOnlyBelow` (the reports the
   * furthest survivor had made) complete with the survivors' reports alone.
   */
  regroup(plan: {
    readonly worldSize: number
    readonly survivors: ReadonlyArray<{ readonly from: number; readonly to: number }>
    readonly survivorsOnlyBelow: number
  }): Generation<C> {
    const old = this.#current
    if (this.#state !== "scheduling" || !old) throw new Error(`controller: regroup() while ${this.#state}`)
    if (!(plan.worldSize >= this.floor && plan.worldSize <= this.options.maxWorkers)) {
      throw new RangeError(`controller: world size ${plan.worldSize} outside ${this.floor}..${this.options.maxWorkers}`)
    }
    this.#pendingResize = undefined
    const g = new Generation<C>(this.#attempt, plan.worldSize, {
      survivors: new Set(plan.survivors.map((s) => s.to)),
      survivorsOnlyBelow: plan.survivorsOnlyBelow
    })
    g.completedRounds = old.completedRounds
    for (const index of old.completed) g.completed.add(index)
    for (const [index, round] of old.rounds) {
      const metrics: Array<Record<string, unknown> | undefined> = new Array(plan.worldSize).fill(undefined)
      let count = 0
      let checkpoint: C | undefined
      let checkpointRank = -1
      for (const { from, to } of plan.survivors) {
        const m = round.metrics[from]
        if (m === undefined) continue
        metrics[to] = m
        count++
        if (round.checkpointRank === from) {
          checkpoint = round.checkpoint
          checkpointRank = to
        }
      }
      // (the files other ranks add to a checkpoint, a pipeline's stage shards, stay with it)
      if (count > 0) g.rounds.set(index, { metrics, checkpoint, checkpointRank, aux: { ...round.aux }, count })
    }
    this.#current = g
    this.#to("running")
    // Rounds only the dead rank had yet to report are complete now.
    for (const index of [...g.rounds.keys()].sort((a, b) => a - b)) this.#completeIfFull(g, index)
    return g
  }

  /** Ends the current generation with a failure (the first outcome wins). */
  fail(g: Generation<C> | undefined, failure: GroupFailure): void {
    const live = g ?? this.#current
    if (live && !live.settled && live === this.#current) live.settle({ type: "failed", failure })
  }

  /**
   * Capacity changed: the cluster can now hold `size` workers (elastic runs only). Growing takes
   * effect at the next report round that carries a checkpoint; a size equal to the current one
   * cancels a pending resize.
   */
  capacity(size: number, reason: string): void {
    if (!this.elastic || this.#state !== "running") return
    const g = this.#current
    const clamped = Math.min(this.options.maxWorkers, size)
    if (!g || clamped <= g.worldSize) {
      this.#pendingResize = undefined
      return
    }
    this.#pendingResize = { size: clamped, reason }
  }

  /**
   * Workers started ahead are ready to join generation `g` (it runs short of `size`: a fixed-size
   * group after a failure, an elastic one below the room it has): it ends now with a resize, and
   * the running workers are regrouped with them at their next group operation (no checkpoint needed:
   * the joiners take the survivors' state).
   */
  refill(g: Generation<C>, size: number, reason: string): boolean {
    const clamped = Math.min(this.options.maxWorkers, size)
    if (this.#live(g.number) !== g || clamped <= g.worldSize) return false
    this.#pendingResize = undefined
    g.settle({ type: "resize", size: clamped, reason })
    return true
  }

  /** A resize waiting for the next report boundary with a checkpoint, if any. */
  get pendingResize(): { readonly size: number; readonly reason: string } | undefined {
    return this.#pendingResize
  }

  /**
   * The generation ended with `outcome` (and its workers are gone): decides what happens next and
   * moves to finished, errored, or restarting then scheduling.
   */
  next(outcome: Outcome): Next {
    const g = this.#current
    if (this.#state !== "running" || !g) throw new Error(`controller: next() while ${this.#state}`)
    if (outcome.type === "finished") {
      this.#to("finished")
      return { action: "finish" }
    }
    if (outcome.type === "resize") {
      this.#to("resizing")
      this.#attempt++
      this.#to("scheduling")
      return {
        action: "restart",
        cause: { type: "resize", size: outcome.size, reason: outcome.reason },
        counted: false,
        size: { min: this.options.minWorkers, max: Math.max(this.options.minWorkers, Math.min(this.options.maxWorkers, outcome.size)) }
      }
    }
    const failure = outcome.failure
    const infra = isInfrastructure(failure)
    const progressed = g.completedRounds > 0
    const decision: Decision = decide(failure, this.#counted, this.options.maxFailures, {
      infrastructureRestartsWithoutProgress: infra ? (progressed ? 0 : this.#infraWithoutProgress) : 0
    })
    if (decision.action === "fail") {
      this.#to(failure.kind === "interrupted" ? "interrupted" : "errored")
      return { action: "fail", failure, reason: decision.reason }
    }
    if (decision.counted) this.#counted = decision.failuresSoFar
    if (infra) this.#infraWithoutProgress = progressed ? 0 : this.#infraWithoutProgress + 1
    this.#to("restarting")
    this.#attempt++
    this.#to("scheduling")
    return { action: "restart", cause: { type: "failure", failure }, counted: decision.counted, size: this.wantedSize }
  }

  /** Ends the run outside a generation: errored (placement, the bus), or interrupted (SIGINT, SIGTERM). */
  abort(end: "errored" | "interrupted" = "errored"): void {
    if (isEndState(this.#state)) return
    this.#current?.settle({ type: "failed", failure: { kind: "config", rank: -1, tag: "Aborted", message: end === "interrupted" ? "the run was interrupted" : "the run was aborted" } })
    this.#to(end)
  }
}

// The recovery choices after a generation ended, as functions of plain data: the trainer asks them
// and carries the answer out (regroup the survivors, or restart from the latest checkpoint).

/** Where a restart continues from: the surviving peers, or the latest checkpoint and why not the peers. */
export type Recovery = { readonly from: "peers" } | { readonly from: "checkpoint"; readonly reason: string }

/** Why a generation restarts: a failure, or an elastic resize (Next's restart cause). */
export type RestartCause = Extract<Next, { readonly action: "restart" }>["cause"]

/** The tag of a parameter server's loss (fit-run.ts): recovered from the replica on the next server, or (one server) from the checkpoint. */
export const SERVER_DOWN = "ServerDown"

/** Failures the survivors can be regrouped after: a worker or a node lost, not an error of the loop. */
const PEER_RECOVERABLE: ReadonlySet<GroupFailure["kind"]> = new Set(["died", "node-lost"])

/**
 * Peers or checkpoint. After a failure: a lost worker or node leaves survivors; after a NATS outage
 * every worker may have survived it (they wait out natsOutageTimeoutMs), so all are asked once the
 * bus is back; a failed recovery, an error of the loop or of the whole group goes to the checkpoint.
 * A resize grows in place unless the bus is down. failureConfig.recoverFrom "checkpoint" always
 * restarts from the checkpoint (`recoverFromWhy`: the strategy's reason, where that is the default).
 */
export const recoveryFor = (cause: RestartCause, recoverFrom: "peers" | "checkpoint", busDown: boolean, recoverFromWhy?: string): Recovery => {
  const checkpoint = (reason: string): Recovery => ({ from: "checkpoint", reason })
  if (recoverFrom !== "peers") return checkpoint(`failureConfig.recoverFrom is "${recoverFrom}"${recoverFromWhy !== undefined ? ` (the default here: ${recoverFromWhy})` : ""}`)
  if (cause.type === "resize") return busDown ? checkpoint("the bus is down") : { from: "peers" }
  const failure = cause.failure
  if (failure.kind === "recovery") return checkpoint(`recovering from them failed: ${firstLine(failure.message)}`)
  if (failure.tag === SERVER_DOWN && failure.server === undefined) {
    return checkpoint("a parameter server was lost, and with one server its shard's parameters and optimizer state are only in the checkpoint (with numServers >= 2 each server keeps a replica of the one before it)")
  }
  // (A lost server of several: every worker survives it, and its shard is on the next server.)
  const peers = (PEER_RECOVERABLE.has(failure.kind) && (failure.rank >= 0 || failure.tag === SERVER_DOWN)) || failure.kind === "bus"
  if (!peers) return checkpoint(`a failure of kind "${failure.kind}"${failure.rank < 0 ? " of the whole group" : ""} leaves no survivors to regroup`)
  return { from: "peers" }
}

/**
 * A rank that died may have died with its machine: its peers can name it (a direct link closes at
 * once) before the cluster view has missed the node's heartbeats. The ranks whose nodes are to be
 * watched (their next heartbeat or their death) before the failure is counted: the dead rank's, or,
 * for a group that broke under a rank without naming a culprit (rank -1), every rank's: a node lost
 * with its workers is the likeliest cause, and its loss is not the run's to count.
 */
export const ranksToCheck = (o: Outcome, worldSize: number): ReadonlyArray<number> => {
  if (o.type !== "failed" || o.failure.kind !== "died") return []
  return o.failure.rank >= 0 ? [o.failure.rank] : Array.from({ length: worldSize }, (_, r) => r)
}

/**
 * After that wait: a node still alive (or no longer known) leaves the death standing; a node the
 * cluster saw die (or leave) makes it the lost node's, an infrastructure failure, blamed on the
 * dead rank or, when none was named, on `rank` (one of the lost node's).
 */
export const deathOrNodeLoss = (o: Outcome, node: string, nodeState: "alive" | "dead" | "left" | undefined, rank?: number): Outcome => {
  if (o.type !== "failed" || o.failure.kind !== "died" || nodeState === undefined || nodeState === "alive") return o
  const blamed = o.failure.rank >= 0 ? o.failure.rank : (rank ?? -1)
  return { type: "failed", failure: { ...o.failure, kind: "node-lost", rank: blamed, message: `node ${node} was lost with it: ${o.failure.message}` } }
}

/** The kind of failure a group that could not start had: the bus's, the user's config's (a module or env not allowed), or a death. */
export const startFailureKind = (tag: string, busDown: boolean): GroupFailure["kind"] =>
  busDown ? "bus" : tag === "ModuleNotAllowed" || tag === "EnvNotAllowed" ? "config" : "died"

/** The reason a resize after this restart gives (Result.resizes): the lost node, or the failure's kind and tag. */
export const restartReason = (cause: RestartCause): string =>
  cause.type === "resize"
    ? cause.reason
    : cause.failure.kind === "node-lost"
      ? `lost a node: ${firstLine(cause.failure.message)}`
      : `${cause.failure.kind}: ${cause.failure.tag}`
