// A worker's place in its group, across regroups: the current generation's placement (rank,
// world size, nodes), its communicator and gradient reducer, and where the loop is (group
// operations completed, report() calls made).
//
// Recovery from surviving peers. When a rank of the group dies, the survivors do not restart:
// each one's current (or next) group operation parks it, the controller asks where it is (pause),
// places replacements, and tells it its new place and where the furthest survivor is (resume).
// The session forms the new group; a survivor that completed fewer operations than the furthest
// takes its state (the operation it was in is then done, not redone); one at the furthest position
// retries its operation in the new group. A worker that joins a regrouped generation runs the loop
// from the checkpoint it is given, skips the steps and reports the survivors already did (the
// data-parallel model does the skipping, data-parallel.ts), and takes the survivors' state when
// it gets to where they are: in dp.fit() at the survivors' epoch and step, in a hand-written
// trainStep loop at the survivors' count of report() calls and of steps since the last one. A failure costs the step in flight, not the work since the last
// checkpoint. Anything that does not line up throws PeerRecoveryMisaligned and the controller
// restarts the group from the checkpoint instead.
import * as Schema from "effect/Schema"
import type { Communicator } from "../../../collectives/communicator.ts"
import type { GradientReducer } from "../../../collectives/gradient-reducer.ts"
import type { PeerState, Placement, Position, StageHandover, StreamCursor } from "../common/train-protocol.ts"
import { groupBroke } from "../../../collectives/errors.ts"

/** The joining worker's loop does not reach the survivors' position the way they did. */
export class PeerRecoveryMisaligned extends Schema.TaggedError<PeerRecoveryMisaligned>()("PeerRecoveryMisaligned", {
  reason: Schema.String
}) {
  override get message(): string {
    return (
      `recovering from surviving peers failed: ${this.reason}. The loop must resume from the checkpoint the way every ` +
      "rank ran it (the same dp.fit epochs and report() calls on every rank); the group restarts from the checkpoint instead"
    )
  }
}

/** Where the prepared model's loop is in dp.fit() (DataParallelModel implements it). */
export interface LoopPosition {
  readonly inFit: boolean
  readonly epoch: number
  readonly stepInEpoch: number
  readonly stepsPerEpoch: number
  readonly stream?: StreamCursor
  /** Why the loop's streamed data cannot follow a regroup (a loader, made for this rank's place: train-context.ts). */
  readonly dataPinned?: string
  /** Why the strategy's state cannot follow a regroup now (StrategyWorker.peersCannotNow: strategy auto on the servers or moving). */
  readonly strategyPinned?: string
  /** Outside dp.fit(): why no rank can join here; a grow waits for a report() where this is unset (reportBoundary). */
  readonly joinLater?: string
  /** Why the group cannot go on short-handed nor renumber its ranks (a pipelined model's grid). */
  readonly wholeGroup?: string
}

/** What a joiner's replay answers from (Position.evaluations, Position.epochs): read by position() alone. */
export interface ReplayLog {
  /** The loop's recent distributed evaluations, as the group computed them. */
  readonly evaluations?: ReadonlyArray<ReadonlyArray<number>>
  /** dp.fit()'s recent epoch results. */
  readonly epochs?: ReadonlyArray<ReadonlyArray<number>>
}

/** What a regroup needs of the prepared model (DataParallelModel implements it). */
export interface RecoverableModel {
  /** The state to hand to the other members (checkpoint files of weights and optimizer, step counter). */
  snapshot(): Promise<Omit<PeerState, "position">>
  /** Takes a survivor's state; `redoingStep`: this rank redoes the step it is in, in the new group. */
  adopt(state: PeerState, options?: { readonly redoingStep?: boolean }): Promise<void>
  /** The group's size or this rank's place changed: per-rank batches must be recomputed. */
  regrouped(): void
  loopPosition(): LoopPosition
  /** The figures a joiner's replay takes from the group (copies: the position travels after the loop goes on). */
  replayLog?(): ReplayLog
  /** Whether the loop has called dp.fit() (its grows park at a step, not at a report). */
  fitUsed?(): boolean
  /** Whether a training step (dp.trainStep, also inside dp.fit) is running. */
  inStep?(): boolean
  /** What the regroup merges from every survivor (ZeRO stage 1's shard and replica), in the pause reply. */
  peerFiles?(): Record<string, Uint8Array> | undefined
  /** A pipelined model's stage, which the regroup merges with its replicas' (in the pause reply). */
  stageHandover?(): Promise<StageHandover>
  /** A pause came: the model's own links (a pipeline's channels, outside the group's communicator) are to fail now. */
  interrupt?(): void
  /** The files of a regroup's state this rank loads, when not all (a pipelined model's stage: the others stay with the driver). */
  stateFiles?(): ReadonlyArray<string>
}

export interface LiveGroup {
  readonly placement: Placement
  readonly comm: Communicator
  readonly reducer: GradientReducer
}

export interface GroupSessionHooks {
  /**
   * Forms the group of a placement: its communicator and reducer (every member calls it). Once
   * `signal` is aborted the group is not wanted any more: the build fails as a broken group would.
   */
  build(placement: Placement, signal?: AbortSignal): Promise<{ readonly comm: Communicator; readonly reducer: GradientReducer }>
  /** Closes a group that is left behind. */
  close(group: LiveGroup): Promise<void>
  /** Tells the controller the group broke under this rank and it waits to be regrouped. */
  parked(cause: unknown): void
  /** A pause came: waits outside the communicator (the parameter servers' answers) are to fail now. */
  interrupt?(): void
  /** The state to continue from, held by the controller for generation `attempt` (with `files`: only those of its files). */
  fetchState(attempt: number, files?: ReadonlyArray<string>): Promise<PeerState>
  log(line: string): void
}

/** How long a parked rank waits to be paused, then resumed, before its operation fails after all. */
const PARK_TIMEOUT_MS = 5 * 60_000

/** How long a request to the parameter servers that failed waits for the pause a lost server brings (serverRequest). */
const SERVER_LOSS_PAUSE_MS = 5_000

interface Deferred<A> {
  readonly promise: Promise<A>
  resolve(a: A): void
}
const deferred = <A>(): Deferred<A> => {
  let resolve!: (a: A) => void
  const promise = new Promise<A>((r) => (resolve = r))
  return { promise, resolve }
}

const within = async <A>(p: Promise<A>, ms: number): Promise<A | "timeout"> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  try {
    return await Promise.race([p, new Promise<"timeout">((r) => (timer = setTimeout(() => r("timeout"), ms)))])
  } finally {
    if (timer) clearTimeout(timer)
  }
}

export type PauseReply = {
  readonly state: "parked" | "unsupported"
  readonly position: Position
  readonly reason: string
  /** ZeRO stage 1: this survivor's shard and replica (RecoverableModel.peerFiles). */
  readonly shards?: Record<string, Uint8Array>
  /** A pipelined model: this survivor's stage (RecoverableModel.stageHandover). */
  readonly stage?: StageHandover
}

type Pausing = { readonly attempt: number; readonly reply: (r: PauseReply) => void }

export class GroupSession {
  readonly #hooks: GroupSessionHooks
  #group: LiveGroup
  #model: RecoverableModel | undefined
  /** Group operations of the model completed in this lineage (since the loop's start). */
  ops = 0
  /** In a step's last operation (operation()'s `last`). */
  #inLast = false
  /** Parked before or under a push applied as it is sent (operation()'s `last: "applied"`), for #rejoin. */
  #appliedPark: "before" | "under" | undefined
  /** What #rejoin made of that push: the step made as the furthest survivor's ("made"), or this rank sends it as that survivor's step ("send"). */
  #appliedAfter: "made" | "send" | undefined
  /** report() calls made in this lineage (a joiner counts from its checkpoint's). */
  reports = 0
  /** Training steps completed since the last report() call (a joiner's skipped ones count). */
  stepsSinceReport = 0
  /** A joiner: the survivors' position it must reach. */
  #join: { readonly to: Position } | undefined
  #pauseRequest: Deferred<Pausing> = deferred()
  #pausing: Pausing | undefined
  /** A grow's pause for a hand-written loop: taken at the first report() where every rank has one. */
  #atReport: Pausing | undefined
  #resumeRequest: Deferred<{ readonly placement: Placement; readonly source: Position }> = deferred()
  #cursor: Position | undefined
  #ended: string | undefined
  /** Why this loop's model cannot be regrouped from peers although it runs (noPeerRecovery). */
  #noPeers: string | undefined
  /** Parked and said so: waiting for resume (a pause asked again is answered at once). */
  #parked = false
  /** The group a regroup resumed this rank into, while it forms (#park): a pause meanwhile gives it up. */
  #forming: AbortController | undefined
  /** The last generation this rank resumed into (a resume asked again is not taken twice). */
  #resumedAttempt = -1
  /** Bumped at every regroup and join: the model compares it to notice a new group or state. */
  generation = 0
  /** Group operations completed since the last report() call (steps and others: Position.opsSinceReport). */
  opsSinceReport = 0
  /** A joiner's state, fetched once (before its join when the model needs it to build itself: joinState). */
  #joinState: Promise<PeerState> | undefined
  /**
   * The furthest survivor's report() calls at the last regroup, when this rank had made fewer: it
   * took that survivor's state at the last operation before a report the survivor made already
   * (the bus went down between the two ranks' ends of that operation). That report's state-parity
   * check ran (or was skipped) there: the survivor does not make it again.
   */
  #sourceReports = 0

  constructor(group: LiveGroup, hooks: GroupSessionHooks, join?: { readonly to: Position }) {
    this.#group = group
    this.#hooks = hooks
    this.#join = join
  }

  get group(): LiveGroup {
    return this.#group
  }

  get placement(): Placement {
    return this.#group.placement
  }

  /** The rank each survivor had before the last regroup (undefined before any). */
  get survivorRanks(): ReadonlyArray<number> | undefined {
    return this.#group.placement.survivorRanks
  }

  /** A joiner's target: the survivors' position (undefined once joined, and for every other rank). */
  get joinTarget(): Position | undefined {
    return this.#join?.to
  }

  /** The prepared model: regroups need it (without one a failure restarts from the checkpoint). */
  attach(model: RecoverableModel): void {
    this.#model = model
  }

  /**
   * The loop trains a model that a regroup cannot carry over (a pipelined model): a pause is
   * refused with `reason`, which the restart from the checkpoint reports, instead of "no model
   * prepared".
   */
  noPeerRecovery(reason: string): void {
    this.#noPeers = reason
  }

  /** This rank's state, for the other members of a regrouped generation (it is the furthest survivor). */
  async snapshot(): Promise<PeerState> {
    if (!this.#model) throw new PeerRecoveryMisaligned({ reason: "no model prepared with ctx.prepareModel()" })
    return { ...(await this.#model.snapshot()), position: this.position() }
  }

  /**
   * The loop resumed from the checkpoint the controller gave it: a joiner counts reports from its
   * position, `reports` (the report() calls made before that checkpoint).
   */
  resumedFromCheckpoint(reports: number): void {
    if (this.#join) this.reports = reports
  }

  /** A joiner's checkpoint request: where the survivors are (their generation, their report() calls), for the checkpoint to join from. */
  joinAt(): { attempt: number; reports: number } | undefined {
    return this.#join ? { attempt: this.placement.attempt, reports: this.#join.to.reports } : undefined
  }

  /**
   * A joiner does not send reports until it has joined: until then its loop replays what the
   * survivors did (and reported) already. Whether it got to the same count is checked at the join.
   */
  skipReport(_index: number): boolean {
    return this.#join !== undefined
  }

  /**
   * Whether report() call `index` is one the furthest survivor of the last regroup made already
   * (this rank took its state just before it): this rank's report goes without a state-parity
   * check, which the survivor, already past it, would not meet.
   */
  reportMadeAlready(index: number): boolean {
    return index < this.#sourceReports
  }

  /** A report() call: steps count from here. */
  reported(): void {
    this.#stepsBeforeReport = this.stepsSinceReport
    this.reports++
    this.stepsSinceReport = 0
    this.opsSinceReport = 0
  }

  /** Inside a report() call (TrainContext.report: from reported() to its return). */
  inReport = false
  #stepsBeforeReport = 0
  /** Where the group broke on mismatched calls, noted where the break was caught and the loop went on (the parity check). */
  #brokeAt: string | undefined

  /** The group broke here (on mismatched calls) though the loop goes on: where() says this place. */
  noteWhere(): void {
    this.#brokeAt ??= this.where()
  }

  /**
   * Where this rank's loop is, in its user's terms, for a group that broke on mismatched calls:
   * "in report() call 2, after 5 training steps since report() call 1", "in training step 6 since
   * the loop's start", "in dp.fit(), epoch 3 step 4 of 12". `idle`: for a rank whose event loop is
   * free while its peers wait for it (its loop awaits something that has not settled).
   */
  where(opts: { readonly idle?: boolean } = {}): string {
    if (this.#brokeAt !== undefined && !opts.idle) return this.#brokeAt
    const since = (n: number) => (n > 0 ? `report() call ${n}` : "the loop's start")
    if (this.inReport) return `in report() call ${this.reports}, after ${this.#stepsBeforeReport} training step(s) since ${since(this.reports - 1)}`
    const p = this.#model?.loopPosition()
    if (p?.inFit) {
      // (after the epoch's last step, in its end: its evaluation, onEpochEnd, a report there)
      return p.stepInEpoch >= p.stepsPerEpoch ? `in dp.fit(), at the end of epoch ${p.epoch} (after its ${p.stepsPerEpoch} steps)` : `in dp.fit(), epoch ${p.epoch} step ${p.stepInEpoch + 1} of ${p.stepsPerEpoch}`
    }
    if (this.#model?.inStep?.()) return `in training step ${this.stepsSinceReport + 1} since ${since(this.reports)}`
    if (opts.idle) return `outside gradwire's calls (no training step, report() or collective), after ${this.stepsSinceReport} training step(s) since ${since(this.reports)}`
    return `outside a training step (a collective of its own, or an evaluation), after ${this.stepsSinceReport} training step(s) since ${since(this.reports)}`
  }

  /** A training step completed (the model calls it after each one). */
  countStep(): void {
    this.stepsSinceReport++
  }

  /**
   * A joiner's trainStep() outside dp.fit(): "skip" a step the survivors made already (nothing
   * computed or exchanged), or, where they are (the same report() calls and steps since), take
   * their state and "run" this step with them. Every other rank runs its steps.
   */
  async replayStep(): Promise<"skip" | "run"> {
    const join = this.#join
    if (!join) return "run"
    const to = join.to
    if (to.inFit) {
      throw new PeerRecoveryMisaligned({
        reason: `this joining rank called trainStep() outside dp.fit(); the survivors are in dp.fit() at epoch ${to.epoch}, step ${to.stepInEpoch} of ${to.stepsPerEpoch}`
      })
    }
    if (this.reports < to.reports || (this.reports === to.reports && this.stepsSinceReport < to.stepsSinceReport)) {
      this.stepsSinceReport++
      return "skip"
    }
    if (this.reports === to.reports && this.stepsSinceReport === to.stepsSinceReport) {
      await this.join()
      return "run"
    }
    throw new PeerRecoveryMisaligned({
      reason:
        `this joining rank got to ${this.reports} report() calls and ${this.stepsSinceReport} steps since the last, ` +
        `past the survivors' ${to.reports} and ${to.stepsSinceReport}`
    })
  }

  /**
   * A joiner's group operation (`step`: a training step, else an epoch sum or an evaluation) in a
   * loop whose joiners take their place by operations (a pipelined model): "skip" one the
   * survivors made already (nothing computed or exchanged), or, where they are (the same report()
   * calls and operations since), take their state and "run" it with them. Every other rank runs.
   */
  async replayOperation(step: boolean): Promise<"skip" | "run"> {
    const join = this.#join
    if (!join) return "run"
    const to = join.to
    const target = to.opsSinceReport ?? 0
    if (this.reports < to.reports || (this.reports === to.reports && this.opsSinceReport < target)) {
      this.opsSinceReport++
      if (step) this.stepsSinceReport++
      return "skip"
    }
    if (this.reports === to.reports && this.opsSinceReport === target) {
      await this.join()
      return "run"
    }
    throw new PeerRecoveryMisaligned({
      reason: `this joining rank got to ${this.reports} report() calls and ${this.opsSinceReport} group operations since the last, past the survivors' ${to.reports} and ${target}`
    })
  }

  /**
   * A joiner's copy of the state it will take at its join (`files` of it, or all), fetched once: a
   * pipelined model builds its stage from its layout (the cut the survivors run) before replaying
   * to them.
   */
  joinState(files?: ReadonlyArray<string>): Promise<PeerState> | undefined {
    if (!this.#join) return undefined
    return (this.#joinState ??= this.#hooks.fetchState(this.placement.attempt, files))
  }

  /** Where the loop is, with this rank's counts; in a step's last operation, as after that step (operation()'s `last`). */
  position(): Position {
    const p = { ...(this.#model?.loopPosition() ?? { inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 }), ...this.#model?.replayLog?.(), ...(this.#model?.fitUsed?.() ? { fitLoop: true } : {}) }
    if (this.#inLast) return { ops: this.ops + 1, reports: this.reports, stepsSinceReport: this.stepsSinceReport + 1, opsSinceReport: this.opsSinceReport + 1, ...p, stepInEpoch: p.stepInEpoch + 1 }
    return { ops: this.ops, reports: this.reports, stepsSinceReport: this.stepsSinceReport, opsSinceReport: this.opsSinceReport, ...p, ...(this.#appliedPark === "before" ? { pushPending: true } : {}) }
  }

  /**
   * After a regroup: where the furthest survivor's loop was (the model moves its epoch cursor
   * there, data-parallel.ts). Taken once.
   */
  takeCursor(): Position | undefined {
    const c = this.#cursor
    this.#cursor = undefined
    return c
  }

  /**
   * A joiner that got to the survivors' position: takes their state, so it continues with them.
   * Called by the model at that point of dp.fit().
   */
  async join(): Promise<void> {
    const join = this.#join
    if (!join) return
    // Inside dp.fit(), at the survivors' epoch and step: report() calls short of theirs are those
    // the loop's callbacks (onStep, onEpochEnd) made in the steps and epochs the replay skipped
    // without calling them (a loop that reports every few steps and checkpoints less often). The
    // joiner counts the survivors' from here, where it had gone back to the checkpoint.
    const skipped = join.to.inFit ? join.to.reports - this.reports : 0
    if (skipped > 0) {
      this.#hooks.log(`rank ${this.placement.rank}: the replay skipped ${skipped} report() call(s) of dp.fit()'s callbacks; counting the survivors' ${join.to.reports}`)
      this.reports = join.to.reports
      this.stepsSinceReport = join.to.stepsSinceReport
    }
    if (this.reports !== join.to.reports) {
      throw new PeerRecoveryMisaligned({
        reason: `${join.to.inFit ? `at epoch ${join.to.epoch} step ${join.to.stepInEpoch}` : "where the survivors are"} this rank had made ${this.reports} report() calls, the survivors ${join.to.reports}`
      })
    }
    if (!this.#model) throw new PeerRecoveryMisaligned({ reason: "no model was prepared with ctx.prepareModel() before dp.fit()" })
    const state = await (this.#joinState ?? this.#hooks.fetchState(this.placement.attempt, this.#model.stateFiles?.()))
    this.#joinState = undefined
    await this.#model.adopt(state)
    this.ops = join.to.ops
    this.opsSinceReport = join.to.opsSinceReport ?? this.opsSinceReport
    this.#join = undefined
    this.generation++
    this.#brokeAt = undefined
    this.#hooks.log(
      `rank ${this.placement.rank}: joined the survivors ${join.to.inFit ? `at epoch ${join.to.epoch}, step ${join.to.stepInEpoch} of ${join.to.stepsPerEpoch}` : `after ${join.to.reports} report() calls and ${join.to.stepsSinceReport} steps`}`
    )
  }

  /**
   * Runs one group operation of the model. If the group breaks under it (or the controller pauses
   * this rank), parks until the controller regroups, then returns `adopted()` (the state taken from
   * the furthest survivor already contains this operation), or `again()` when given (the caller
   * redoes it: an in-place reduction leaves partial sums behind), or runs it again in the new group.
   * `last`: the step's last operation, after this rank's update of the step (ZeRO stage 1's
   * all-gather of the updated shards): a pause waits for the next operation, and a group that
   * breaks under it counts the step as done (position() says so), the regroup completing it from
   * the survivors' updated shards: it returns `adopted()`.
   * `last: "applied"`: the operation's effect is made as it is sent (a gradient pushed to parameter
   * servers in async or SSP mode, which apply it on arrival): a pause parks before it, as before
   * any other, but a group that breaks under it counts the step as done, as under `last`.
   * `background` (with `again`): an operation beside the loop's steps (local SGD's overlapped
   * rounds) never parks: where the group breaks under it or a pause is asked for, it returns
   * `again()` and the loop redoes it in the foreground, parking there at a step a replacement can
   * reach (the loop's clock moves on while a background operation waits).
   */
  async operation<T>(run: (group: LiveGroup) => Promise<T>, adopted: () => T, again?: () => T, last: boolean | "applied" = false, background = false): Promise<T> {
    if (this.#join) {
      throw new PeerRecoveryMisaligned({ reason: "a group operation other than a training step before this joining rank reached the survivors" })
    }
    // A grow's pause held until the loop is back in dp.fit() (#parksInFit): this is there.
    if (this.#atReport && !this.#pausing && !background && (this.#model?.fitUsed?.() ?? false) && this.#model!.loopPosition().inFit) this.#takeAtReport()
    for (;;) {
      // In the background (with `again`): the loop parks where it redoes the operation instead.
      if (this.#pausing && background && again) return again()
      if (this.#pausing && last !== true) {
        // (#rejoin: a push this rank had not sent is dropped where the furthest survivor made its step)
        if ((await this.#parkAt(last === "applied" && !background ? "before" : undefined, undefined)) === "made") return adopted()
      }
      const before = this.ops
      try {
        if (!background) this.#inLast = last !== false
        const r = await run(this.#group)
        this.ops++
        this.opsSinceReport++
        return r
      } catch (e) {
        if (this.#model === undefined || this.#ended !== undefined) throw e
        if (background && again) return again()
        // (#rejoin: a push this rank sent is sent again, as the furthest survivor's step, where that
        // survivor was parked before its own and sends it in the new group)
        const applied = await this.#parkAt(last === "applied" ? "under" : undefined, e)
        if (applied === "send" && again) return again()
        if (this.ops > before || last !== false) return adopted()
        if (again) return again()
      } finally {
        if (!background) this.#inLast = false
      }
    }
  }

  /**
   * A request to the parameter servers beside the steps (rank 0's checkpoint of their state). A
   * server lost under it fails it (at once: no responders, or interrupted by the pause), and the
   * driver's pause follows the server's exit notice: the rank parks here, and once regrouped runs
   * it again, against the new servers. An error with no pause within SERVER_LOSS_PAUSE_MS is the
   * request's own and is thrown. The operation count does not move (the other ranks make no such
   * request).
   */
  async serverRequest<T>(run: () => Promise<T>): Promise<T> {
    for (;;) {
      if (this.#pausing) await this.#park(undefined)
      try {
        return await run()
      } catch (e) {
        if (this.#model === undefined || this.#ended !== undefined) throw e
        if (!this.#pausing && (await within(this.#pauseRequest.promise, SERVER_LOSS_PAUSE_MS)) === "timeout") throw e
        await this.#park(e)
      }
    }
  }

  /**
   * The controller's pause: answered once the loop waits at a group operation. `atReport` (a
   * grow): a hand-written loop in a generation below its size waits at a report() boundary
   * instead (reportBoundary), so that the ranks joining it start where the loop sizes its epochs.
   */
  pause(attempt: number, atReport = false): Promise<PauseReply> {
    return new Promise((resolve) => {
      const refuse = this.#ended ?? this.#noPeers ?? (this.#model === undefined ? "no model prepared with ctx.prepareModel()" : this.#join ? "still joining its group" : undefined)
      if (refuse !== undefined) {
        resolve({ state: "unsupported", position: this.position(), reason: refuse })
        return
      }
      // Asked again (the first request or its reply was lost while the bus came back).
      if (this.#parked) {
        void this.#parkedReply().then(resolve)
        return
      }
      const chain = (first: Pausing): Pausing => ({
        attempt,
        reply: (r) => {
          first.reply(r)
          resolve(r)
        }
      })
      if (this.#pausing) {
        this.#pausing = chain(this.#pausing)
        return
      }
      if (atReport && (this.#parksAtReport() || this.#parksInFit())) {
        this.#atReport = this.#atReport ? chain(this.#atReport) : { attempt, reply: resolve }
        return
      }
      if (this.#atReport) {
        // A pause for a failure while a grow waited for a report: one regroup answers both.
        this.#pausing = chain(this.#atReport)
        this.#atReport = undefined
      } else this.#pausing = { attempt, reply: resolve }
      this.#pauseRequest.resolve(this.#pausing)
      // Whatever the loop is waiting for in the old group will not come: make it fail now. A group
      // still forming (a member died during its handshake) is given up too, so this rank parks at
      // once instead of waiting out the handshake's deadline for the dead member.
      void this.#group.comm.close().catch(() => {})
      this.#forming?.abort(new Error(`paused for regroup ${attempt}`))
      this.#model?.interrupt?.()
      this.#hooks.interrupt?.()
    })
  }

  /** Every report() call is a group operation now (reportBoundary's exchange): PeerRecovery.reportsExchange. */
  get reportsExchange(): boolean {
    return this.#join === undefined && this.#ended === undefined && this.#parksAtReport() && this.#model?.loopPosition().joinLater === undefined
  }

  /**
   * Whether a grow's pause waits for a report() boundary: a hand-written loop (one that never
   * called dp.fit(): every rank of a loop that did has by the time a grow comes, so all decide
   * alike) of a generation below its size.
   */
  #parksAtReport(): boolean {
    const m = this.#model
    return this.placement.belowSize === true && m !== undefined && !(m.fitUsed?.() ?? false) && !m.loopPosition().inFit
  }

  /**
   * Whether a grow's pause waits for the loop's next operation in dp.fit(): a loop that uses
   * dp.fit(), asked between two of its calls (its evaluation, its report()), parks at the next
   * epoch's first step instead, where a joining rank can join it (a replacement joins a dp.fit()
   * loop at a step: parked outside, the survivors would leave it nowhere to join).
   */
  #parksInFit(): boolean {
    const m = this.#model
    return m !== undefined && (m.fitUsed?.() ?? false) && !m.loopPosition().inFit
  }

  /** A grow's pause waiting for a report boundary is answered now (the loop parks here for another reason). */
  #takeAtReport(): void {
    const p = this.#atReport
    if (!p || this.#pausing) return
    this.#atReport = undefined
    this.#pausing = p
    this.#pauseRequest.resolve(p)
  }

  /**
   * After a report() call of a hand-written loop in a generation below its size: the ranks agree
   * (one small all-gather, at the same report on every rank) whether every one of them has been
   * asked to pause for a grow; if so, each parks here, and the new ranks join at this boundary.
   * `gather`: this rank's flag in, every rank's out. Nothing to do otherwise, nor at a report() in
   * the middle of an epoch of a file dataset the loop reads itself (`joinLater`: the ranks read it
   * in lockstep, so they all skip the same reports).
   */
  async reportBoundary(gather: (flag: Float32Array) => Promise<Float32Array>): Promise<void> {
    if (!this.reportsExchange) return
    const mine = this.#atReport ? 1 : 0
    let all = mine
    if (this.placement.worldSize > 1) {
      try {
        all = Math.min(...(await gather(Float32Array.of(mine))))
      } catch (e) {
        // The group broke under it: the loop's next operation parks for the regroup.
        if (groupBroke(e)) return
        throw e
      }
    }
    if (all < 1) return
    this.#takeAtReport()
    await this.#park(undefined)
  }

  /** The controller's resume: the new placement and the position of the furthest survivor. */
  resume(placement: Placement, source: Position): void {
    // Asked again for the same generation (a lost reply): taken once.
    if (placement.attempt <= this.#resumedAttempt) return
    this.#resumedAttempt = placement.attempt
    this.#resumeRequest.resolve({ placement, source })
  }

  /** The loop ended (returned or threw): a pending pause is answered, later ones refused. */
  end(reason: string): void {
    this.#ended = reason
    for (const p of [this.#pausing, this.#atReport]) p?.reply({ state: "unsupported", position: this.position(), reason })
    this.#pausing = undefined
    this.#atReport = undefined
  }

  /** A parked rank's answer: where it is, and what the regroup merges of its state. */
  async #parkedReply(): Promise<PauseReply> {
    const shards = this.#model?.peerFiles?.()
    const stage = await this.#model?.stageHandover?.()
    return { state: "parked", position: this.position(), reason: "", ...(shards ? { shards } : {}), ...(stage ? { stage } : {}) }
  }

  /** #park, telling #rejoin where this rank stands in a push applied as it is sent; returns what #rejoin made of that push. */
  async #parkAt(applied: "before" | "under" | undefined, cause: unknown): Promise<"made" | "send" | undefined> {
    this.#appliedPark = applied
    this.#appliedAfter = undefined
    try {
      await this.#park(cause)
      return this.#appliedAfter
    } finally {
      this.#appliedPark = undefined
      this.#appliedAfter = undefined
    }
  }

  async #park(cause: unknown): Promise<void> {
    // A grow waiting for a report boundary: this park answers it.
    this.#takeAtReport()
    // Parks until the controller regroups; a group that breaks while it forms (a member dies
    // during its handshake, link measurements or probe) parks again for the next regroup.
    for (;;) {
      const resumed = await this.#awaitRegroup(cause)
      const old = this.#group
      await this.#hooks.close(old).catch(() => {})
      // The new generation's placement from here on (what a failure while forming it names).
      this.#group = { ...old, placement: resumed.placement }
      const forming = (this.#forming = new AbortController())
      try {
        const { comm, reducer } = await this.#hooks.build(resumed.placement, forming.signal)
        this.#group = { placement: resumed.placement, comm, reducer }
      } catch (e) {
        if (!groupBroke(e)) throw e
        cause = e
        continue
      } finally {
        this.#forming = undefined
      }
      await this.#rejoin(resumed)
      return
    }
  }

  /** Tells the controller (unless it asked already), answers its pause, and waits for its resume. */
  async #awaitRegroup(cause: unknown): Promise<{ placement: Placement; source: Position }> {
    if (!this.#pausing) this.#hooks.parked(cause)
    const pause = this.#pausing ?? (await within(this.#pauseRequest.promise, PARK_TIMEOUT_MS))
    if (pause === "timeout") throw cause
    const reply = await this.#parkedReply()
    // (a pause asked again while the reply was made is chained onto this.#pausing: answer them all)
    ;(this.#pausing ?? pause).reply(reply)
    this.#parked = true
    const resumed = await within(this.#resumeRequest.promise, PARK_TIMEOUT_MS)
    this.#parked = false
    this.#pausing = undefined
    this.#pauseRequest = deferred()
    if (resumed === "timeout") throw cause ?? new Error("paused for a regroup that never came")
    this.#resumeRequest = deferred()
    return resumed
  }

  /** In the newly formed group: takes the furthest survivor's state and where it is. */
  async #rejoin(resumed: { placement: Placement; source: Position }): Promise<void> {
    // Every member loads the furthest survivor's state, itself included: survivors level with it
    // hold the same values already, but the optimizer rebuilds its derived state (Adam's bias
    // corrections) from what it loads, and a joiner's must match bit for bit.
    const state = await this.#hooks.fetchState(resumed.placement.attempt, this.#model!.stateFiles?.())
    // Whether this rank makes its step in flight in the new group, which its step counter and
    // strategy auto's decision clock count. In a group operation every survivor stands at the same
    // one, and the furthest's position says whether it is redone. On the parameter servers (async,
    // SSP) each rank is at its own step, and a rank behind the furthest survivor does as that
    // survivor: where it was parked before its push, which it sends in the new group, the rank
    // behind sends one as that step (the push it had not sent, or the one it had, again); where it
    // was in its push (its position counts the step made) or in another group operation (auto's
    // decision round before its step), the rank behind takes its state and place, and a push it had
    // not sent is dropped. Otherwise their loops, step counters and decision clocks stand a step
    // apart, which a later move to the all-reduce finds, or a push waits on the servers' SSP bound
    // for ranks that wait in a decision round for it.
    const behind = this.ops < resumed.source.ops
    let redoing = !behind
    if (this.#appliedPark !== undefined) {
      const sends = behind ? resumed.source.pushPending === true : this.#appliedPark === "before"
      this.#appliedAfter = sends ? "send" : "made"
      redoing = sends
    }
    await this.#model!.adopt(state, { redoingStep: redoing })
    if (this.ops < resumed.source.ops) {
      this.#hooks.log(`rank ${resumed.placement.rank}: took the furthest survivor's state (${resumed.source.ops} group operations, ${this.ops} here)`)
      this.ops = resumed.source.ops
      if (resumed.source.opsSinceReport !== undefined) this.opsSinceReport = resumed.source.opsSinceReport
    }
    if (this.reports < resumed.source.reports) {
      this.#hooks.log(`rank ${resumed.placement.rank}: the furthest survivor made report ${this.reports} already (${resumed.source.reports} report() calls, ${this.reports} here); this rank's goes without a parity check`)
      this.#sourceReports = resumed.source.reports
    }
    this.#cursor = resumed.source
    this.generation++
    this.#brokeAt = undefined
    this.#model?.regrouped()
  }
}
