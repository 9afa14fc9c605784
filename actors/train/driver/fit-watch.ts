// What watches one fit() run from the driver, apart from the run's steps (fit-run.ts): the
// embedded nats-server's exits and restarts as incidents, the job on the bus (job-monitor.ts), the
// run's dashboard, the driver's own NATS connection, and the agents' log lines on a joined
// cluster. Each is a function of what it needs; fit-run.ts starts them in open() and stops them
// when the run ends.
import { NatsUnavailable, firstLine } from "../../../core/errors.ts"
import { watchBus, type BusMonitor } from "../../../core/bus-monitor.ts"
import { hasCredentials } from "../../../core/connection-spec.ts"
import { decodeMessage } from "../../../core/wire.ts"
import { jobSubjects } from "../../../core/subjects.ts"
import type { NatsSupervisionEvents } from "../../../core/nats-supervisor.ts"
import type { CheckpointPayload } from "../common/train-protocol.ts"
import type { ProgressPrinter } from "../common/observe/progress.ts"
import type { JobState } from "../common/job-telemetry.ts"
import { startDashboard, type Dashboard } from "../dashboard/server.ts"
import type { CheckpointStorage } from "./checkpoint-store.ts"
import type { ClusterHandle } from "./cluster.ts"
import type { Controller } from "./controller.ts"
import type { FitRecord } from "./fit-record.ts"
import { JobMonitor } from "./job-monitor.ts"
import type { Resolved } from "./options.ts"
import type { WorkerGroup } from "./worker-group.ts"
import type { ClusterView } from "../../../scheduler/cluster-view.ts"

/** An agent's exit notice this recent (before a death is weighed) shows its node alive. */
const AGENT_HEARD_MS = 2_000

/** The embedded nats-server's exits, restarts and failed restarts, as the run's incidents. */
export const embeddedServerEvents = (record: FitRecord): NatsSupervisionEvents => ({
  onExit: (x) => {
    record.serverRestartedDuringOutage = true
    record.incident("nats-server", `the embedded nats-server (pid ${x.pid}) exited; restarting it on the same port`, { type: "nats-server-exit", pid: x.pid })
  },
  onRestart: (x) => {
    record.natsServerRestarts = x.restarts
    record.incident("nats-server", `the embedded nats-server is back (pid ${x.pid}, ${x.downMs} ms after it exited)`, {
      type: "nats-server-restart",
      pid: x.pid,
      downMs: x.downMs,
      restarts: x.restarts
    })
  },
  onRestartFailed: (x) => {
    const message = x.error instanceof Error ? x.error.message : String(x.error)
    record.incident("nats-server", `restarting the embedded nats-server failed (attempt ${x.attempt + 1}): ${firstLine(message)}`, {
      type: "nats-server-restart-failed",
      attempt: x.attempt,
      message
    })
  }
})

/** What the job monitor reads the run's facts from. */
export interface MonitoredRun {
  readonly cfg: Resolved
  readonly cluster: ClusterHandle
  readonly job: string
  readonly controller: Controller<CheckpointPayload>
  readonly record: FitRecord
  readonly store: () => CheckpointStorage
  readonly group: () => WorkerGroup
  readonly state: () => JobState
}

/** The job on the bus, for the dashboard and `gradwire jobs` / `gradwire logs` (job-monitor.ts). */
export const startJobMonitor = (run: MonitoredRun): JobMonitor => {
  const { cfg, cluster, controller, record } = run
  return JobMonitor.start({
    nc: cluster.nc,
    cluster: cluster.clusterName,
    job: run.job,
    name: cfg.name,
    runDir: cfg.runDir,
    address: cluster.address,
    minWorkers: cfg.minWorkers,
    maxWorkers: cfg.maxWorkers,
    strategy: {
      strategy: cfg.collective.strategy ?? "allreduce",
      algorithm: cfg.collective.algorithm,
      compression: typeof cfg.collective.compression === "string" ? cfg.collective.compression : JSON.stringify(cfg.collective.compression),
      zeroStage: cfg.collective.zeroStage ?? 0
    },
    facts: () => {
      const store = run.store()
      const latest = store.latest()
      const best = store.best()[0]
      const plan = record.planText()
      return {
        state: run.state(),
        attempt: controller.attempt,
        worldSize: controller.current?.worldSize ?? 0,
        restarts: record.restarts,
        countedFailures: controller.countedFailures,
        resizes: record.resizes,
        incidents: record.incidents,
        reports: record.history.length,
        lastMetrics: record.history.at(-1),
        checkpoints: {
          count: store.list().length,
          ...(latest ? { latest: { path: latest.path, metrics: latest.metrics } } : {}),
          ...(best ? { best: { path: best.path, metrics: best.metrics } } : {})
        },
        ...(plan !== undefined ? { plan: { summary: Object.values(record.planSummaries).join("; "), text: plan, json: record.explained.algorithm?.json ?? null } } : {}),
        members: [...run.group().members].map(([rank, w]) => ({ rank, actor: w.name, node: w.node, pid: w.pid }))
      }
    }
  })
}

/**
 * The run's dashboard (runConfig.dashboard), its address said on the progress line; undefined when
 * it could not start (a taken port costs the run its dashboard, not its training).
 */
export const startRunDashboard = async (
  cluster: ClusterHandle,
  d: { readonly host?: string; readonly port?: number; readonly token?: string },
  record: FitRecord,
  progress: ProgressPrinter
): Promise<Dashboard | undefined> => {
  try {
    const dashboard = await startDashboard({
      nc: cluster.nc,
      cluster: cluster.clusterName,
      address: cluster.address,
      // A cluster with credentials gets a token. The embedded one's credential is the run's own
      // (made up to keep other local users off its bus): its loopback dashboard stays as it was.
      requireToken: !cluster.embedded && hasCredentials(cluster.connection),
      ...(d.host !== undefined ? { host: d.host } : {}),
      ...(d.port !== undefined ? { port: d.port } : {}),
      ...(d.token !== undefined ? { token: d.token } : {})
    })
    if (record.monitor) record.monitor.dashboard = dashboard.baseUrl
    const line = `gradwire: dashboard at ${dashboard.url} (Prometheus: ${dashboard.baseUrl}/metrics)`
    if (progress.mode === "off") console.log(line)
    else progress.line(line)
    return dashboard
  } catch (e) {
    progress.warn(`gradwire: no dashboard: ${(e as Error).message}`)
    return undefined
  }
}

/**
 * The driver's connection: an outage fails the running generation at once (its collectives abort
 * anyway), the group restarts once the bus is back, and an outage longer than natsOutageTimeoutMs
 * ends the run with NatsUnavailable (through `abort`).
 */
export const watchDriverBus = (
  cfg: Resolved,
  cluster: ClusterHandle,
  controller: Controller<CheckpointPayload>,
  record: FitRecord,
  abort: (e: Error) => void
): BusMonitor =>
  watchBus(cluster.nc, {
    timeoutMs: cfg.natsOutageTimeoutMs,
    onDown: (o) => {
      record.incident("bus", `lost the NATS connection to ${cluster.where}; waiting up to ${cfg.natsOutageTimeoutMs / 1000} s for it to come back`, {
        type: "bus-down",
        server: o.server
      })
      controller.fail(controller.current, { kind: "bus", rank: -1, tag: "NatsDisconnected", message: `the driver lost its NATS connection to ${cluster.where}` })
    },
    onUp: (o) => {
      record.busOutages.push({ time: new Date(o.since).toISOString(), server: o.server, ms: o.ms, serverRestarted: record.serverRestartedDuringOutage })
      record.serverRestartedDuringOutage = false
      record.incident("bus", `the NATS connection is back after ${(o.ms / 1000).toFixed(1)} s`, { type: "bus-up", server: o.server, ms: o.ms })
    },
    onExpired: (o) => {
      record.busOutages.push({ time: new Date(o.since).toISOString(), server: o.server, ms: o.ms, serverRestarted: record.serverRestartedDuringOutage })
      record.recorder.event({ type: "bus-expired", server: o.server, ms: o.ms })
      abort(new NatsUnavailable({ servers: cluster.where, outageMs: o.ms, timeoutMs: cfg.natsOutageTimeoutMs, hint: cluster.outageHint }))
    }
  })

/**
 * On a joined cluster the agents run elsewhere and cannot call the run's output callback: they
 * publish each line of their processes on the job's log subjects, which land in the same logs/
 * files. Undefined on the embedded cluster (its agent calls the callback itself).
 */
export const forwardJobLogs = (cluster: ClusterHandle, job: string, output: (line: string) => void): { unsubscribe(): void } | undefined => {
  if (cluster.embedded) return undefined
  return cluster.nc.subscribe(jobSubjects(cluster.clusterName, job).logs, {
    callback: (err, msg) => {
      if (err) return
      try {
        const m = decodeMessage(msg.data) as { line?: unknown; name?: unknown; pid?: unknown; node?: unknown }
        const rank = /^w\d+-(\d+)$/.exec(String(m.name))?.[1]
        const label = rank !== undefined ? `worker rank=${rank}` : String(m.name)
        output(`(${label} pid=${String(m.pid)} node=${String(m.node)}) ${String(m.line)}`)
      } catch {
        // a malformed log message is not worth failing a run over
      }
    }
  })
}

/**
 * Waits until each node has news since the call: a heartbeat, its agent's notice of a process's
 * exit around now (a worker's kill -9 comes that way; `agentHeard` holds when each node's agent
 * last sent one), or it is no longer alive. Checked every 50 ms: heartbeats and deaths come through
 * the view, exit notices beside it. Bounded by the view's death deadline plus a second.
 */
export const nodeNews = async (view: ClusterView, nodes: ReadonlyArray<string>, agentHeard: ReadonlyMap<string, number>): Promise<void> => {
  const at = Date.now()
  const agentSpoke = (node: string): boolean => (agentHeard.get(node) ?? 0) > at - AGENT_HEARD_MS
  const known = (): boolean =>
    nodes.every((node) => {
      const n = view.get(node)
      return n === undefined || n.state !== "alive" || n.lastSeenAt > at || agentSpoke(node)
    })
  const until = at + view.deadAfterMs + 1_000
  while (!known() && Date.now() < until) await new Promise((r) => setTimeout(r, 50))
}
