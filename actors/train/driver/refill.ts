// Refilling a short group without stopping it. After a failure the survivors go on short-handed
// (regroup.ts), and an elastic group may run below its max when room comes back. Replacements
// start here in the background as standby workers (WorkerGroup.standby: spawned, engine loaded,
// connections open, loop imported, in no group); once they are prepared the controller ends the
// running generation with a resize (Controller.refill) and the regroup lets them in at the
// survivors' next group operation, with the furthest survivor's state. The survivors never wait
// for a process to start: a refill costs a regroup, not a cold start (a hand-written loop's ranks
// let them in at a report() call, where the loop sizes its epochs). Groups that cannot run
// short-handed (elastic ones that started small, checkpoint recovery) grow at the next report
// round with a checkpoint instead (watch).
import * as R from "effect/Result"
import { firstLine } from "../../../core/errors.ts"
import type { PlacementRequest } from "../../../scheduler/placement.ts"
import type { CheckpointPayload } from "../common/train-protocol.ts"
import type { Controller, Generation } from "./controller.ts"
import { isEndState } from "./failure-policy.ts"
import { growTo, planLargest, releasingJob } from "./elastic.ts"
import { joinersRequest, layoutOf, type GroupArgs, type Standby, type WorkerGroup } from "./worker-group.ts"
import type { ClusterHandle } from "./cluster.ts"

/** After standby workers could not start, the next try waits this long. */
const RETRY_AFTER_FAILURE_MS = 5_000

/**
 * Whether a standby's failure was a start that did not finish in time (the agent's readiness
 * deadline, or its prepare's): on cores that other work keeps busy at the normal priority, a
 * process on SCHED_IDLE gets next to nothing, and the 3 s limit it keeps on its own lowering does
 * not bound that (beside two busy loops on two cores none was ready within 60 s): every
 * replacement started so would time out in turn.
 */
export const startTimedOut = (failure: { readonly tag: string; readonly message: string }): boolean =>
  /not ready within|timed? ?out/i.test(failure.message) || /timeout/i.test(failure.tag)

/**
 * Spares alone (the group at its size) start only once a generation has run this long: a spare
 * taken by a regroup is replaced after the replacement has joined and the group steps again, not
 * while the replacement replays and takes its state (a process start competes for the cores).
 */
const SPARE_TOPUP_AFTER_MS = 2_000

export interface RefillContext {
  readonly controller: Controller<CheckpointPayload>
  readonly group: WorkerGroup
  readonly cluster: ClusterHandle
  readonly request: Omit<PlacementRequest, "numWorkers">
  readonly groupArgs: () => GroupArgs
  /** The size to refill to (numWorkers; elastic: max). */
  readonly max: number
  /** failureConfig.spares: standby workers kept ready beside a whole group. */
  readonly spares: number
  readonly job: string
  /** A line on the console (the progress printer). */
  readonly line: (text: string) => void
  /** An event in events.jsonl. */
  readonly event: (e: Record<string, unknown>) => void
}

export class Refill {
  readonly #x: RefillContext
  /** Prepared standby workers not yet let in. */
  #ready: Standby[] = []
  /**
   * Standby workers being started, not yet ready: counted as on their way, so that a second failure
   * while they start starts the worker it adds at once instead of after them.
   */
  #starting = 0
  #retryAt = 0
  /**
   * Whether standby workers start lowered (core/priority.ts: the lowest CPU priority while they
   * prepare). Off for the rest of the job once one timed out so (startTimedOut).
   */
  #lowered = true
  /** The last regrouped generation, when it may run short-handed until standby workers refill it. */
  #refillable: Generation<CheckpointPayload> | undefined
  #joinsAtReport = false
  /** When the generation watched now started to be watched. */
  #watchedSince = 0

  constructor(x: RefillContext) {
    this.#x = x
  }

  /** The prepared standby workers still alive. */
  #alive(): Standby[] {
    return (this.#ready = this.#ready.filter((w) => this.#x.group.holds(w.actor)))
  }

  /** How many prepared standby workers are ready now. */
  get ready(): number {
    return this.#alive().length
  }

  /** A regroup formed `g`: it may run below its size until standby workers refill it, at a step (or, a hand-written loop's, at a report() call). */
  formed(g: Generation<CheckpointPayload>, joinsAtReport = false): void {
    this.#refillable = g
    this.#joinsAtReport = joinsAtReport
  }

  /** Up to `n` prepared standby workers, for a regroup: it owns them from then on. */
  take(n: number): Standby[] {
    return this.#alive().splice(0, Math.max(0, n))
  }

  /**
   * Watches generation `g`: keeps `spares` standby workers ready beside it, and while it runs below
   * the size to refill to: one a regroup left short-handed (formed: a regrouped generation) is
   * refilled with standby workers at once; an elastic group that started small
   * or recovers from the checkpoint grows at the next report round
   * that leaves a checkpoint (Controller.capacity). Returns what stops watching.
   */
  watch(g: Generation<CheckpointPayload>): () => void {
    const { controller, cluster, max, spares } = this.#x
    const refillable = this.#refillable === g
    const short = g.worldSize < max
    const grows = short && !refillable && controller.elastic
    if (!(short && refillable) && !grows && spares === 0) return () => {}
    this.#watchedSince = Date.now()
    const check = (): void => {
      this.check(g)
      if (!grows || controller.state !== "running") return
      const size = growTo(this.#x.request, g.worldSize, max, releasingJob(cluster.view.alive().map((n) => n.ad), this.#x.job))
      if (size === undefined || size === controller.pendingResize?.size) return
      controller.capacity(size, `the cluster has room for ${size} workers`)
      this.#x.line(`gradwire: the cluster has room for ${size} workers (running ${g.worldSize}); growing at the next checkpoint`)
    }
    const off = cluster.view.onEvent((e) => {
      if (e.type === "node-joined" || e.type === "node-back") check()
    })
    const timer = setInterval(check, refillable || spares > 0 ? 500 : 2_000)
    timer.unref?.()
    check()
    return () => {
      off()
      clearInterval(timer)
    }
  }

  /**
   * For the running generation `g` (at its start, when a node joins, and every 500 ms): when a
   * regroup left it short-handed and standby workers are ready, asks the controller to let them in
   * now; otherwise starts standby workers where there is room, up to what it lacks (when it may
   * run short-handed) plus the spares.
   */
  check(g: Generation<CheckpointPayload>): void {
    const { controller, max, spares } = this.#x
    if (controller.state !== "running" || g.settled || controller.current !== g) return
    const ready = this.#alive().length
    const lacking = this.#refillable === g ? Math.max(0, max - g.worldSize) : 0
    if (lacking > 0 && ready > 0) {
      const joining = Math.min(ready, lacking)
      if (controller.refill(g, g.worldSize + joining, `${joining} replacement worker(s) ready`)) {
        this.#x.line(`gradwire: ${joining} replacement worker(s) ready; growing the group from ${g.worldSize} to ${g.worldSize + joining} ${this.#joinsAtReport ? "at the loop's next report() call" : "at the next step"}`)
      }
      return
    }
    if (Date.now() < this.#retryAt) return
    const missing = lacking + spares - ready - this.#starting
    if (missing > 0 && lacking === 0 && Date.now() - this.#watchedSince < SPARE_TOPUP_AFTER_MS) return
    if (missing > 0) this.#start(g, missing, lacking > 0 ? "replacement" : "spare")
  }

  #start(g: Generation<CheckpointPayload>, count: number, what: string): void {
    const { group, cluster, request } = this.#x
    const planned = planLargest(joinersRequest(request), { min: 1, max: count }, cluster.view.resources())
    if (!R.isSuccess(planned)) return
    const plan = planned.success
    const running = [...group.members.entries()].sort((a, b) => a[0] - b[0]).map(([, w]) => w.node)
    const nodes = [...running, ...plan.ranks.map((r) => r.nodeId)]
    const layout = layoutOf(nodes)
    const worldSize = nodes.length
    // Provisional places (the admission gives the real ones): the ranks after the running workers'.
    const spawns = plan.ranks.map((r, j) => {
      const rank = running.length + j
      return {
        placement: { attempt: g.number, rank, worldSize, ...layout[rank]!, nodes, group: "standby" },
        nodeId: r.nodeId,
        backend: r.backend,
        gpuIndices: r.gpuIndices,
        cudaVisibleDevices: r.cudaVisibleDevices,
        resources: r.resources
      }
    })
    this.#starting += spawns.length
    const t0 = performance.now()
    const lowered = this.#lowered
    this.#x.event({ type: "standby-start", attempt: g.number, workers: spawns.length, for: what, nodes: spawns.map((s) => s.nodeId), ...(lowered ? {} : { lowered: false }) })
    void group
      .standby(spawns, this.#x.groupArgs(), lowered)
      .then((r) => {
        this.#starting -= spawns.length
        const state = this.#x.controller.state
        if (isEndState(state)) return
        if ("tag" in r) {
          this.#retryAt = Date.now() + RETRY_AFTER_FAILURE_MS
          // Lowered, it did not start in time: the cores are not idle enough for a lowered start,
          // and the group would stay short-handed. The next ones start at the workers' priority.
          const raise = lowered && startTimedOut(r)
          if (raise) this.#lowered = false
          this.#x.line(
            `gradwire: standby worker(s) could not start (${r.tag}: ${firstLine(r.message)}); trying again in ${RETRY_AFTER_FAILURE_MS / 1000} s` +
              (raise ? ", at the workers' CPU priority (the cores were too busy for a start at the lowest one)" : "")
          )
          this.#x.event({ type: "standby-failed", attempt: g.number, tag: r.tag, message: r.message, ...(raise ? { next: "not lowered" } : {}) })
          return
        }
        this.#ready.push(...r)
        const warmed = r.flatMap((w) => (w.warmUp ? [w.warmUp] : []))
        this.#x.event({
          type: "standby-ready",
          attempt: g.number,
          workers: r.length,
          ms: Math.round(performance.now() - t0),
          // Each one's warm-up (steps, ms) within that time, where it did one (GRADWIRE_STANDBY_WARM_UP_STEPS, GRADWIRE_STANDBY_WARM_UP_MS).
          ...(warmed.length ? { warmUp: warmed } : {})
        })
        const current = this.#x.controller.current
        if (current) this.check(current)
      })
      .catch(() => {
        this.#starting -= spawns.length
        this.#retryAt = Date.now() + RETRY_AFTER_FAILURE_MS
      })
  }
}
