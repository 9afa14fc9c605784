// The Trainer: gradwire's TorchTrainer. fit() validates every config before anything starts
// (options.ts), brings up the cluster (cluster.ts: an embedded nats-server and local agent, or an
// existing cluster), and carries out what the controller (controller.ts, a state machine with no
// I/O) decides, through the steps of the run (fit-run.ts): place the group, start it
// (worker-group.ts), watch it, then finish, regroup the survivors (regroup.ts) or restart from the
// checkpoint. The controller actor in this process answers the workers (reports, datasets, the
// checkpoint to resume from); checkpoint bytes travel over NATS and land under storagePath, or in
// a JetStream object store bucket with checkpointConfig.objectStore, so workers never need a
// shared filesystem. The run directory is written by observe/run-recorder.ts.
import * as R from "effect/Result"
import { ConfigError, firstLine } from "../../../core/errors.ts"
import { PLACEMENT_TIMEOUT_MS } from "../../../core/defaults.ts"
import { PlacementInfeasible, type PlacementPlan } from "../../../scheduler/placement.ts"
import { describeBackends } from "../../../scheduler/gpu-backend.ts"
import type { CheckpointPayload } from "../common/train-protocol.ts"
import type { Generation } from "./controller.ts"
import { idle, planLargest } from "./elastic.ts"
import { checkLoopModule, resolveTrainerOptions, type TrainerOptions } from "./options.ts"
import type { Result } from "./result.ts"
import { FitRun } from "./fit-run.ts"
import { claimRunDir } from "./run-dir.ts"
import { locateLoopFunction } from "./loop-function.ts"

export type { TrainerCallbacks, TrainerOptions } from "./options.ts"
export { resolveTrainerOptions } from "./options.ts"
export { Interrupted, TrainingFailed, resultOf, type CheckpointInfo, type FitError, type Result } from "./result.ts"

/** While waiting for capacity, what it waits for is printed this often. */
const PLACEMENT_NOTICE_EVERY_MS = 10_000

export class Trainer {
  readonly options: TrainerOptions
  /** The last "workers: <backend> on <node> ..." line printed (printed again only when it changes). */
  #backendLine: string | undefined

  constructor(options: TrainerOptions) {
    this.options = options
  }

  /**
   * Runs training to the end and resolves with its Result. Rejects with a ConfigError when the
   * options are invalid (nothing started, no result), and otherwise with a typed error that
   * carries the partial Result as `error.result`: TrainingFailed (a failure of the job that the
   * failure policy did not retry), NatsUnavailable (the bus stayed away past
   * failureConfig.natsOutageTimeoutMs), PlacementInfeasible (no room for the group within
   * scalingConfig.placementTimeoutMs), Interrupted (SIGINT/SIGTERM).
   */
  async fit(): Promise<Result> {
    // A loop given as the function itself (as Ray Train's): the module that exports it.
    const loop = (this.options as { trainLoopPerWorker?: unknown } | undefined)?.trainLoopPerWorker
    const options = typeof loop === "function" ? { ...this.options, trainLoopPerWorker: await locateLoopFunction(loop as (...args: never[]) => unknown) } : this.options
    const resolved = resolveTrainerOptions(options)
    checkLoopModule(options, resolved)
    const claim = await claimRunDir(resolved, (options as TrainerOptions).runConfig?.name !== undefined)
    // The run directory is this fit's until its last file is written (result() writes the summary).
    try {
      const run = await FitRun.open(claim.cfg)
      try {
        await run.launch()
        // The survivors of the last generation and their replacements, when they run already.
        let regrouped: Generation<CheckpointPayload> | undefined
        for (let first = true; ; first = false) {
          const generation = regrouped ?? (await run.start(await this.#place(run, first)))
          regrouped = undefined
          const outcome = await run.watch(generation)
          // The controller decides: finish, fail, or restart (from the surviving peers or the checkpoint).
          const next = run.controller.next(outcome)
          if (next.action !== "restart") {
            await run.finish(next, generation.number)
            break
          }
          const recovery = await run.restarting(next, generation.number)
          if (recovery.from === "peers") regrouped = await run.regroup(next)
          if (!regrouped) await run.restart(next, generation.number)
        }
      } catch (e) {
        run.failed(e as Error)
      } finally {
        await run.close()
      }
      return await run.result()
    } finally {
      await claim.release()
    }
  }

  /**
   * Place: the largest size within the controller's bounds (run.bounds) that fits now, or waits
   * for room up to scalingConfig.placementTimeoutMs (default 60 s), saying what it waits for. A
   * first placement the cluster could not hold even when idle fails at once unless a timeout was
   * given. Waits for the bus first (the group is spawned through the agents).
   */
  async #place(run: FitRun, first: boolean): Promise<PlacementPlan> {
    await run.waitForBus()
    const { cfg, cluster, request, bounds, progress } = run
    // Waits on the cluster view; a timeout just means "look again", the run's abort ends the wait.
    const settle = (p: Promise<unknown>): Promise<void> =>
      run.race(p).then(
        () => undefined,
        (e: unknown) => {
          if (e === run.abortError) throw e
        }
      )
    const explicit = cfg.scaling.placementTimeoutMs
    const timeoutMs = explicit ?? PLACEMENT_TIMEOUT_MS
    const deadline = Date.now() + timeoutMs
    let noticeAt = 0
    for (;;) {
      const nodes = cluster.view.resources()
      if (nodes.length === 0) {
        // Agents advertise every 500 ms; give a just-joined cluster a moment to be seen.
        await settle(cluster.view.waitFor((n) => n.some((x) => x.state === "alive"), first ? 3_000 : Math.max(50, deadline - Date.now())))
        if (cluster.view.resources().length > 0) continue
        if (first || Date.now() >= deadline) {
          throw new ConfigError({
            field: "cluster",
            reason: `no node agent is alive in cluster "${cluster.clusterName}": start one with \`gradwire start --head\` (or --address)`
          })
        }
        continue
      }
      const planned = planLargest(request, bounds, nodes)
      if (R.isSuccess(planned)) {
        // Which backend each rank runs, and why: said at start, and again when a new placement changes it.
        const line = describeBackends(planned.success.ranks, cfg.scaling.backend ?? "auto", cfg.scaling.useGpu ?? false, nodes)
        if (line !== this.#backendLine) progress.line(`gradwire: ${line}`)
        this.#backendLine = line
        return planned.success
      }
      const failure = planned.failure
      if (!(failure instanceof PlacementInfeasible)) throw failure
      if (first && explicit === undefined && R.isFailure(planLargest(request, bounds, idle(nodes)))) throw failure
      const now = Date.now()
      if (now >= deadline) throw failure
      if (now >= noticeAt) {
        noticeAt = now + PLACEMENT_NOTICE_EVERY_MS
        progress.warn(`gradwire: waiting up to ${Math.ceil((deadline - now) / 1000)} s for room: ${firstLine(failure.message)}`)
      }
      await cluster.view.nextChange(Math.min(1_000, Math.max(50, deadline - now)))
    }
  }
}
