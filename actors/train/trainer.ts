// The Trainer: gradwire's TorchTrainer. fit() validates every config before anything starts
// (options.ts), brings up the cluster (cluster.ts: an embedded nats-server and local agent, or an
// existing cluster), and carries out what the controller (controller.ts, a state machine with no
// I/O) decides: place the group, spawn it (worker-group.ts), restart or resize it, finish. The
// controller actor in this process answers the workers (reports, datasets, the checkpoint to
// resume from); checkpoint bytes travel over NATS and land under storagePath, or in a JetStream
// object store bucket with checkpointConfig.objectStore, so workers never need a shared
// filesystem. The run directory is written by observe/run-recorder.ts.
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { nuid } from "@nats-io/nats-core"
import { Result as R } from "effect"
import { ConfigError } from "../../core/errors.ts"
import { decodeMessage } from "../../core/wire.ts"
import { jobSubjects } from "../../core/subjects.ts"
import { planPlacement, type PlacementPlan } from "../../scheduler/placement.ts"
import { ActorSystem } from "../runtime/system.ts"
import { defineActor, launchActor, type ActorHandle } from "../runtime/actor.ts"
import { silentLogger, stderrLogger } from "../runtime/log.ts"
import { CheckpointStore, readCheckpoint, type CheckpointEntry, type CheckpointStorage } from "./checkpoint-store.ts"
import { ObjectCheckpointStore, isObjectCheckpointUrl, readObjectCheckpoint } from "./object-checkpoint-store.ts"
import { ControllerProtocol, type CheckpointPayload } from "./train-protocol.ts"
import { Controller, type CompletedRound, type Outcome } from "./controller.ts"
import { WorkerGroup } from "./worker-group.ts"
import { joinCluster, startEmbeddedCluster, type ClusterHandle } from "./cluster.ts"
import { resolveTrainerOptions, type Resolved, type TrainerOptions } from "./options.ts"
import { TrainingFailed, type CheckpointInfo, type Result } from "./result.ts"
import { ProgressPrinter } from "./observe/progress.ts"
import { RunRecorder } from "./observe/run-recorder.ts"
import { spanEvent } from "./observe/timeline.ts"

export type { TrainLoop, TrainerCallbacks, TrainerOptions } from "./options.ts"
export { resolveTrainerOptions } from "./options.ts"
export { TrainingFailed, type CheckpointInfo, type Result } from "./result.ts"

/** The all-reduce plan of the run, as the workers' scheduler explained it. */
const writeExplain = async (dir: string, text: string, json: unknown): Promise<void> => {
  await fs.writeFile(path.join(dir, "explain.txt"), `${text}\n`)
  await fs.writeFile(path.join(dir, "explain.json"), `${JSON.stringify(json, null, 2)}\n`)
}

export class Trainer {
  readonly options: TrainerOptions

  constructor(options: TrainerOptions) {
    this.options = options
  }

  /** Runs training to the end (or to an unrecoverable failure, reported in Result.error). */
  async fit(): Promise<Result> {
    const cfg = resolveTrainerOptions(this.options)
    await fs.mkdir(cfg.runDir, { recursive: true })
    const policy = {
      ...(cfg.run.checkpointConfig?.numToKeep !== undefined ? { numToKeep: cfg.run.checkpointConfig.numToKeep } : {}),
      ...(cfg.run.checkpointConfig?.scoreAttribute !== undefined ? { scoreAttribute: cfg.run.checkpointConfig.scoreAttribute } : {}),
      ...(cfg.run.checkpointConfig?.scoreOrder !== undefined ? { scoreOrder: cfg.run.checkpointConfig.scoreOrder } : {})
    }
    // With checkpointConfig.objectStore the checkpoints live in a JetStream bucket, opened once the
    // cluster is up; otherwise under the run directory.
    const bucket = cfg.run.checkpointConfig?.objectStore
    const localStore = bucket === undefined ? await CheckpointStore.open(cfg.runDir, policy) : undefined
    // Fails early on a bad path (a nats-obj:// one is checked once the cluster is joined).
    if (cfg.resumeFrom !== undefined && !isObjectCheckpointUrl(cfg.resumeFrom)) await readCheckpoint(cfg.resumeFrom)
    const recorder = await RunRecorder.open(cfg.runDir, {
      name: cfg.name,
      trainLoopPerWorker: cfg.loop,
      trainLoopConfig: cfg.loopConfig,
      scalingConfig: cfg.scaling,
      runConfig: cfg.run,
      collectiveConfig: cfg.collective,
      cluster: cfg.cluster ? { ...cfg.cluster, password: cfg.cluster.password ? "***" : undefined, token: cfg.cluster.token ? "***" : undefined } : "embedded",
      datasets: Object.fromEntries(Object.entries(cfg.datasets).map(([k, d]) => [k, { size: d.size, featureShape: d.featureShape, numClasses: d.numClasses }])),
      seed: cfg.seed
    }, cfg.run.timeline === true)
    const progress = new ProgressPrinter(cfg.run.progress ?? "auto", cfg.scaling.numWorkers)
    const verbose = cfg.run.verbose === true

    const history: Array<Record<string, unknown>> = []
    const perRank: Array<Array<Record<string, unknown>>> = []
    let resumePath: string | undefined = cfg.resumeFrom
    let saving: Promise<unknown> = Promise.resolve()
    let interrupted = false
    // Assigned once the cluster is up; the controller's listener only fires after that.
    let store!: CheckpointStorage

    const controller = new Controller<CheckpointPayload>(
      { maxFailures: cfg.maxFailures, minWorkers: cfg.scaling.numWorkers, maxWorkers: cfg.scaling.numWorkers },
      (e) => {
        if (e.type === "state") {
          for (const cb of cfg.callbacks) cb.onStateChange?.({ from: e.from, to: e.to, attempt: e.attempt })
          recorder.event({ type: "state", from: e.from, to: e.to, attempt: e.attempt })
        } else {
          completeRound(e.round)
        }
      }
    )

    const completeRound = (round: CompletedRound<CheckpointPayload>): void => {
      const { index, metrics } = round
      history.push(metrics[0])
      perRank.push([...metrics])
      recorder.metrics(index, metrics[0], metrics)
      progress.report(index, metrics[0])
      for (const cb of cfg.callbacks) void Promise.resolve(cb.onReport?.({ index, metrics: metrics[0], perRank: metrics })).catch(() => {})
      const ckpt = round.checkpoint
      if (ckpt) {
        const files = { ...ckpt.files, ...round.aux }
        const t0 = performance.now()
        saving = saving.then(async () => {
          const entry = await store.save({ files, metadata: { ...ckpt.metadata, attempt: round.attempt, round: index } }, metrics[0])
          recorder.trace({ ...spanEvent("checkpoint save", t0, performance.now(), "checkpoints", { path: entry.path, round: index }, "checkpoint"), pid: "driver" })
          for (const cb of cfg.callbacks) await Promise.resolve(cb.onCheckpoint?.({ path: entry.path, metrics: entry.metrics })).catch(() => {})
        }).catch((e: unknown) => {
          process.stderr.write(`gradwire: checkpoint write failed: ${String(e)}\n`)
        })
      }
    }

    // Worker output (embedded cluster: the local agent forwards it here) goes to the terminal and
    // to logs/<worker>.log in the run directory.
    const onOutput = (line: string): void => {
      const m = /^\(([^)]*?)(?: pid=\d+)?(?: node=[^)]*)?\)/.exec(line)
      recorder.log(m ? m[1] : "workers", line)
      progress.line(line)
    }
    const cluster = cfg.cluster ? await joinCluster(cfg.cluster) : await startEmbeddedCluster(
          verbose,
          onOutput,
          cfg.scaling.numWorkers * (cfg.scaling.resourcesPerWorker?.CPU ?? (cfg.scaling.useGpu ? 0 : 1)),
          // The embedded server keeps its JetStream data in the run directory, so a run's object
          // store checkpoints outlive it and a run with the same name resumes from them.
          bucket !== undefined ? path.join(cfg.runDir, "jetstream") : undefined
        )
    const readAt = (p: string): ReturnType<typeof readCheckpoint> =>
      isObjectCheckpointUrl(p) ? readObjectCheckpoint(cluster.nc, p) : readCheckpoint(p)
    try {
      store = localStore ?? (await ObjectCheckpointStore.open(cluster.nc, bucket!, cfg.name, policy, cfg.cluster ? `the NATS server at ${cfg.cluster.address}` : "the embedded nats-server"))
      if (cfg.resumeFrom !== undefined && isObjectCheckpointUrl(cfg.resumeFrom)) await readAt(cfg.resumeFrom)
    } catch (e) {
      await cluster.close().catch(() => {})
      progress.close()
      await recorder.close().catch(() => {})
      throw e
    }
    resumePath ??= store.latest()?.path
    const job = `${cfg.name.slice(0, 100)}-${nuid.next().slice(-8)}`
    const system = new ActorSystem({
      nc: cluster.nc,
      cluster: cluster.clusterName,
      job,
      identity: "driver",
      node: "driver",
      log: verbose ? stderrLogger(`${job}/driver`) : silentLogger
    })
    const group = new WorkerGroup(system)
    let controllerActor: ActorHandle | undefined
    // On a joined cluster the agents run elsewhere and cannot call onOutput: they publish each
    // line of their processes on the job's log subjects, which land in the same logs/ files.
    const logSub = cluster.embedded
      ? undefined
      : cluster.nc.subscribe(jobSubjects(cluster.clusterName, job).logs, {
          callback: (err, msg) => {
            if (err) return
            try {
              const m = decodeMessage(msg.data) as { line?: unknown; name?: unknown; pid?: unknown; node?: unknown }
              const rank = /^w\d+-(\d+)$/.exec(String(m.name))?.[1]
              const label = rank !== undefined ? `worker rank=${rank}` : String(m.name)
              onOutput(`(${label} pid=${String(m.pid)} node=${String(m.node)}) ${String(m.line)}`)
            } catch {
              // a malformed log message is not worth failing a run over
            }
          }
        })

    const onSignal = (signal: NodeJS.Signals): void => {
      interrupted = true
      controller.fail(undefined, { kind: "config", rank: -1, tag: signal, message: `interrupted by ${signal}` })
      void teardown().finally(() => {
        process.removeListener("SIGINT", onSignal)
        process.removeListener("SIGTERM", onSignal)
        process.kill(process.pid, signal)
      })
    }
    let tornDown: Promise<void> | undefined
    const teardown = (): Promise<void> =>
      (tornDown ??= (async () => {
        await group.kill(job, "the run ended")
        await controllerActor?.stop({ drain: false, reason: "run ended" }).catch(() => {})
        // Let the last forwarded log lines arrive before unsubscribing.
        if (logSub) await cluster.nc.flush().catch(() => {})
        logSub?.unsubscribe()
        system.endJob()
        system.close()
        await cluster.close().catch(() => {})
        progress.close()
        await recorder.close()
      })())
    process.on("SIGINT", onSignal)
    process.on("SIGTERM", onSignal)

    const datasetPayload = new Map<string, { x: Float32Array; y: Int32Array; featureShape: number[]; numClasses: number }>()
    for (const [k, d] of Object.entries(cfg.datasets)) {
      datasetPayload.set(k, { x: d.x, y: d.y, featureShape: [...d.featureShape], numClasses: d.numClasses })
    }
    const isCurrent = (attempt: number): boolean => controller.current?.number === attempt && controller.state === "running"

    const controllerDef = defineActor(ControllerProtocol, () => ({
      report: (body) => {
        controller.report(body)
        return null
      },
      dataset: (body) => {
        const d = datasetPayload.get(body.name)
        if (!d) {
          throw new ConfigError({
            field: `getDatasetShard("${body.name}")`,
            reason: `no dataset "${body.name}" was given to the Trainer; it has: ${[...datasetPayload.keys()].join(", ") || "none"}`
          })
        }
        return d
      },
      checkpoint: async () => {
        await saving
        const p = resumePath
        if (!p) return null
        const c = await (store instanceof ObjectCheckpointStore ? store.read(p) : readAt(p))
        return { path: p, metrics: c.metrics, payload: { files: c.files, metadata: c.metadata } }
      },
      progress: (body) => {
        if (!isCurrent(body.attempt)) return
        progress.step(body)
        // The report's compute/communication split: kept whether or not the timeline is on.
        if (body.stepTimes) recorder.stepTimes(body.attempt, body.rank, body.stepTimes)
        for (const cb of cfg.callbacks) cb.onProgress?.(body)
      },
      trace: (body) => {
        if (isCurrent(body.attempt)) recorder.traceEvents(body.rank, body.events)
      },
      explain: (body) => {
        if (!isCurrent(body.attempt)) return
        progress.line(body.summary)
        recorder.event({ type: "explain", summary: body.summary })
        saving = saving.then(() => writeExplain(cfg.runDir, body.text, body.json)).catch(() => {})
      },
      finished: (body) => controller.finished(body),
      failed: (body) => controller.failed(body)
    }))

    let error: TrainingFailed | undefined
    let restarts = 0
    try {
      controllerActor = await launchActor(system, controllerDef, { name: "controller", heartbeat: false })
      for (;;) {
        const plan = await this.#place(cfg, cluster, job)
        const generation = controller.begin(plan.ranks.length)
        const attempt = generation.number
        progress.start(attempt, plan.ranks.length)
        const startFailure = await group.start({
          attempt,
          plan,
          connection: cluster.connection,
          args: {
            controller: "controller",
            loopModule: cfg.loop.module,
            loopExport: cfg.loop.export,
            loopConfig: cfg.loopConfig,
            collective: cfg.collective,
            seed: cfg.seed,
            timeline: cfg.run.timeline === true
          },
          onDown: (rank, down) => controller.workerDown(attempt, rank, down),
          stillMatters: (rank) => !generation.settled && !generation.finished.has(rank)
        })
        if (startFailure) controller.fail(generation, { kind: "died", rank: -1, ...startFailure })
        const outcome: Outcome = await generation.outcome
        if (interrupted) throw new Error("interrupted")
        await group.kill(job, outcome.type === "finished" ? "training finished" : "restarting the group")
        await saving
        const next = controller.next(outcome)
        if (next.action === "finish") break
        if (next.action === "fail") {
          recorder.event({ type: "failure", attempt, failure: next.failure, decision: { action: "fail", reason: next.reason } })
          error = new TrainingFailed(next.failure, attempt + 1, next.reason)
          progress.line(`gradwire: ${error.message}`)
          break
        }
        if (next.cause.type === "failure") {
          const failure = next.cause.failure
          recorder.event({ type: "failure", attempt, failure, decision: { action: "restart", counted: next.counted } })
          restarts++
          progress.line(
            `gradwire: rank ${failure.rank} failed (${failure.tag}: ${failure.message.split("\n")[0]}); ` +
              `restarting the group from ${store.latest() ? store.latest()!.name : "the start"} (restart ${controller.countedFailures}${cfg.maxFailures >= 0 ? ` of ${cfg.maxFailures}` : ""})`
          )
          for (const cb of cfg.callbacks) await Promise.resolve(cb.onRestart?.({ attempt: attempt + 1, failure })).catch(() => {})
        }
        resumePath = store.latest()?.path ?? resumePath
      }
    } finally {
      await saving
      await teardown()
      process.removeListener("SIGINT", onSignal)
      process.removeListener("SIGTERM", onSignal)
    }
    const info = (e: CheckpointEntry): CheckpointInfo => ({ path: e.path, metrics: e.metrics })
    const latest = store.latest()
    await recorder.finish({ title: cfg.name, error: error?.message, restarts, history })
    progress.summary(recorder.dir, history.at(-1), error)
    return {
      metrics: history.at(-1),
      metricsHistory: history,
      metricsPerRank: perRank,
      checkpoint: latest ? info(latest) : undefined,
      bestCheckpoints: store.best().map(info),
      error,
      path: cfg.runDir,
      restarts
    }
  }

  /** Places the workers now, or waits for resources up to scalingConfig.placementTimeoutMs. */
  async #place(cfg: Resolved, cluster: ClusterHandle, job: string): Promise<PlacementPlan> {
    const deadline = Date.now() + (cfg.scaling.placementTimeoutMs ?? 0)
    const request = {
      jobId: job,
      numWorkers: cfg.scaling.numWorkers,
      ...(cfg.scaling.useGpu !== undefined ? { useGpu: cfg.scaling.useGpu } : {}),
      ...(cfg.scaling.resourcesPerWorker !== undefined ? { resourcesPerWorker: cfg.scaling.resourcesPerWorker } : {}),
      ...(cfg.scaling.placementStrategy !== undefined ? { placementStrategy: cfg.scaling.placementStrategy } : {}),
      ...(cfg.scaling.acceleratorType !== undefined ? { acceleratorType: cfg.scaling.acceleratorType } : {}),
      ...(cfg.scaling.nodeLabels !== undefined ? { nodeLabels: cfg.scaling.nodeLabels } : {}),
      ...(cfg.scaling.backend !== undefined ? { backend: cfg.scaling.backend } : {})
    }
    for (;;) {
      const nodes = cluster.view.resources()
      if (nodes.length === 0 && Date.now() < deadline + 3_000) {
        // Agents advertise every 500 ms; give a just-joined cluster a moment to be seen.
        await cluster.view.waitFor((n) => n.some((x) => x.state === "alive"), 3_000).catch(() => undefined)
        if (cluster.view.resources().length === 0) {
          throw new ConfigError({
            field: "cluster",
            reason: `no node agent is alive in cluster "${cluster.clusterName}": start one with \`gradwire start --head\` (or --address)`
          })
        }
        continue
      }
      const planned = planPlacement(request, nodes)
      if (R.isSuccess(planned)) return planned.success
      if (Date.now() >= deadline) throw planned.failure
      await cluster.view.waitFor(() => true, Math.min(1_000, Math.max(50, deadline - Date.now()))).catch(() => undefined)
    }
  }
}
