// The dashboard's /metrics: what the live cluster view holds, as Prometheus metrics in a registry
// of prom-client's, one per dashboard (never prom-client's global one, which a user's own code may
// fill). Per node its resources (capacity and used) and liveness; per job its state, attempt, size,
// restarts, resizes, reports, checkpoints and last metrics; per rank of a job its steps, samples,
// throughput, step time in parts (compute, communication, waiting) and the bytes on its collective
// connections. Every value is read from the live view when scraped (each metric's collect), so
// nothing here keeps state of its own. Counters are totals over the job, every attempt included,
// so they never go down while a job runs. Beside them, this process's own metrics (CPU, memory,
// event loop lag, GC, handles) from prom-client's default collectors.
import { Counter, Gauge, Registry, collectDefaultMetrics } from "prom-client"
import type { JobSnapshot } from "../common/job-telemetry.ts"
import type { LiveCluster } from "./live-cluster.ts"

type Labels = Record<string, string>

interface Sample {
  readonly labels: Labels
  readonly value: number
}

interface Family {
  readonly name: string
  readonly type: "gauge" | "counter"
  readonly help: string
  readonly labelNames: ReadonlyArray<string>
  readonly samples: (live: LiveCluster) => Sample[]
}

/** Metric names in labels: anything else than letters, digits and "_" becomes "_". */
const safe = (s: string): string => s.replace(/[^A-Za-z0-9_]/g, "_")

const NODE = ["cluster", "node"] as const
const JOB = ["cluster", "job", "name"] as const
const RANK = [...JOB, "rank", "node"] as const

const nodesOf = (live: LiveCluster) => (live.nodes?.nodes ?? []).map((node) => ({ node, labels: { cluster: live.cluster, node: node.nodeId } }))

const jobsOf = (live: LiveCluster): Array<{ s: JobSnapshot & { live?: boolean; lost?: boolean }; labels: Labels }> =>
  [...live.jobs.values()].map((v) => ({ s: v.snapshot, labels: { cluster: live.cluster, job: v.snapshot.job, name: v.snapshot.name } }))

const ranksOf = (live: LiveCluster) =>
  jobsOf(live).flatMap(({ s, labels }) => s.ranks.map((r) => ({ r, labels: { ...labels, rank: String(r.rank), node: r.node ?? "" } })))

const perJob = (value: (s: JobSnapshot) => number) => (live: LiveCluster) => jobsOf(live).map(({ s, labels }) => ({ labels, value: value(s) }))

const ACTIVE = new Set(["running", "scheduling", "starting", "restarting", "resizing"])

const PARTS = [
  ["compute", "computeMs", "computeMsTotal"],
  ["communication", "commMs", "commMsTotal"],
  ["waiting", "waitMs", "waitMsTotal"]
] as const

const FAMILIES: ReadonlyArray<Family> = [
  {
    name: "gradwire_node_up",
    type: "gauge",
    help: "1 when the node's agent is alive (heard from within its deadline), else 0.",
    labelNames: [...NODE, "host", "head", "backends"],
    samples: (live) =>
      nodesOf(live).map(({ node, labels }) => ({
        labels: { ...labels, host: node.hostname, head: String(node.head), backends: node.backends.join(",") },
        value: node.state === "alive" ? 1 : 0
      }))
  },
  {
    name: "gradwire_node_resource_capacity",
    type: "gauge",
    help: "Resources the node advertises (CPU, GPU, memory bytes, custom).",
    labelNames: [...NODE, "resource"],
    samples: (live) => nodesOf(live).flatMap(({ node, labels }) => Object.entries(node.resources.total).map(([resource, value]) => ({ labels: { ...labels, resource }, value })))
  },
  {
    name: "gradwire_node_resource_used",
    type: "gauge",
    help: "Resources held by the actor processes the node runs.",
    labelNames: [...NODE, "resource"],
    samples: (live) => nodesOf(live).flatMap(({ node, labels }) => Object.entries(node.resources.used).map(([resource, value]) => ({ labels: { ...labels, resource }, value })))
  },
  {
    name: "gradwire_node_actor_processes",
    type: "gauge",
    help: "Actor processes (workers, servers) the node's agent runs.",
    labelNames: NODE,
    samples: (live) => nodesOf(live).map(({ node, labels }) => ({ labels, value: node.processes.length }))
  },
  {
    name: "gradwire_node_last_seen_seconds",
    type: "gauge",
    help: "Seconds since the node's agent was last heard from.",
    labelNames: NODE,
    samples: (live) => nodesOf(live).map(({ node, labels }) => ({ labels, value: node.lastSeenMsAgo / 1000 }))
  },
  {
    name: "gradwire_job_info",
    type: "gauge",
    help: "A training job: its strategy, all-reduce algorithm and compression as configured.",
    labelNames: [...JOB, "strategy", "algorithm", "compression", "driver_host"],
    samples: (live) =>
      jobsOf(live).map(({ s, labels }) => ({
        labels: { ...labels, strategy: s.strategy.strategy, algorithm: s.strategy.algorithm, compression: s.strategy.compression, driver_host: s.driver.host },
        value: 1
      }))
  },
  {
    name: "gradwire_job_state",
    type: "gauge",
    help: "1 for the job's current state (starting, scheduling, running, restarting, resizing, finished, failed, interrupted, lost).",
    labelNames: [...JOB, "state"],
    samples: (live) => jobsOf(live).map(({ s, labels }) => ({ labels: { ...labels, state: s.lost ? "lost" : s.state }, value: 1 }))
  },
  {
    name: "gradwire_job_up",
    type: "gauge",
    help: "1 while the job's driver is alive and the job has not ended.",
    labelNames: JOB,
    samples: (live) => jobsOf(live).map(({ s, labels }) => ({ labels, value: s.live && !s.lost && ACTIVE.has(s.state) ? 1 : 0 }))
  },
  {
    name: "gradwire_job_attempt",
    type: "gauge",
    help: "The job's current generation (0 for the first; each restart, regroup or resize adds one).",
    labelNames: JOB,
    samples: perJob((s) => s.attempt)
  },
  { name: "gradwire_job_world_size", type: "gauge", help: "Workers in the job's current generation.", labelNames: JOB, samples: perJob((s) => s.worldSize) },
  {
    name: "gradwire_job_restarts_total",
    type: "counter",
    help: "Restarts and regroups of the job's worker group, after failures of the job and of the infrastructure.",
    labelNames: JOB,
    samples: perJob((s) => s.restarts)
  },
  { name: "gradwire_job_counted_failures_total", type: "counter", help: "Failures that used failureConfig.maxFailures.", labelNames: JOB, samples: perJob((s) => s.countedFailures) },
  { name: "gradwire_job_resizes_total", type: "counter", help: "Size changes of the job's elastic group.", labelNames: JOB, samples: perJob((s) => s.resizes.length) },
  { name: "gradwire_job_reports_total", type: "counter", help: "Completed report rounds of the job.", labelNames: JOB, samples: perJob((s) => s.reports) },
  // A gauge: pruning to checkpointConfig.numToKeep lowers it, which a counter must never do.
  { name: "gradwire_job_checkpoints", type: "gauge", help: "Checkpoints of the job kept now.", labelNames: JOB, samples: perJob((s) => s.checkpoints.count) },
  { name: "gradwire_job_start_time_seconds", type: "gauge", help: "When the job started, in seconds since the Unix epoch.", labelNames: JOB, samples: perJob((s) => s.startedAt / 1000) },
  {
    name: "gradwire_job_metric",
    type: "gauge",
    help: "Rank 0's last reported value of each numeric metric.",
    labelNames: [...JOB, "metric"],
    samples: (live) =>
      jobsOf(live).flatMap(({ s, labels }) =>
        Object.entries(s.lastMetrics ?? {}).flatMap(([k, value]) => (typeof value === "number" && Number.isFinite(value) ? [{ labels: { ...labels, metric: safe(k) }, value }] : []))
      )
  },
  { name: "gradwire_rank_steps_total", type: "counter", help: "Training steps the rank took, over every attempt.", labelNames: RANK, samples: (live) => ranksOf(live).map(({ r, labels }) => ({ labels, value: r.steps })) },
  {
    name: "gradwire_rank_samples_total",
    type: "counter",
    help: "Samples the rank trained on, over every attempt.",
    labelNames: RANK,
    samples: (live) => ranksOf(live).map(({ r, labels }) => ({ labels, value: r.samples }))
  },
  { name: "gradwire_rank_samples_per_second", type: "gauge", help: "The rank's recent throughput.", labelNames: RANK, samples: (live) => ranksOf(live).map(({ r, labels }) => ({ labels, value: r.samplesPerSec })) },
  {
    name: "gradwire_rank_step_seconds",
    type: "gauge",
    help: "Mean seconds per recent step, by part: compute (forward/backward and apply), communication (gradient exchange), waiting (between steps).",
    labelNames: [...RANK, "part"],
    samples: (live) => ranksOf(live).flatMap(({ r, labels }) => PARTS.map(([part, mean]) => ({ labels: { ...labels, part }, value: r[mean] / 1000 })))
  },
  {
    name: "gradwire_rank_step_seconds_total",
    type: "counter",
    help: "Seconds spent in steps, by part (as gradwire_rank_step_seconds).",
    labelNames: [...RANK, "part"],
    samples: (live) => ranksOf(live).flatMap(({ r, labels }) => PARTS.map(([part, , total]) => ({ labels: { ...labels, part }, value: r[total] / 1000 })))
  },
  {
    name: "gradwire_rank_collective_bytes_total",
    type: "counter",
    help: "Bytes on the rank's collective connections, by direction.",
    labelNames: [...RANK, "collective", "direction"],
    samples: (live) =>
      ranksOf(live).flatMap(({ r, labels }) => [
        { labels: { ...labels, collective: "gradients", direction: "sent" }, value: r.bytesSent },
        { labels: { ...labels, collective: "gradients", direction: "received" }, value: r.bytesReceived }
      ])
  },
  { name: "gradwire_rank_loss", type: "gauge", help: "The rank's loss at its last step.", labelNames: RANK, samples: (live) => ranksOf(live).map(({ r, labels }) => ({ labels, value: r.loss })) },
  { name: "gradwire_rank_epoch", type: "gauge", help: "The epoch the rank is in.", labelNames: RANK, samples: (live) => ranksOf(live).map(({ r, labels }) => ({ labels, value: r.epoch })) }
]

/**
 * The default collectors of this process, made once: each keeps an event-loop delay monitor and a
 * GC observer running, so one set per dashboard would pile them up in a process that starts
 * several. prom-client's three `nodejs_active_*_total` gauges are left out: a gauge named like a
 * counter (Prometheus' linter flags them), and each is the sum of `nodejs_active_*` over its `type`.
 */
let processMetrics: Registry | undefined
const processRegistry = (): Registry => {
  if (!processMetrics) {
    processMetrics = new Registry()
    collectDefaultMetrics({ register: processMetrics })
    for (const name of ["nodejs_active_handles_total", "nodejs_active_requests_total", "nodejs_active_resources_total"]) processMetrics.removeSingleMetric(name)
  }
  return processMetrics
}

/**
 * A registry of the live cluster's metrics and this process's: `await registry.metrics()` is the
 * exposition text, `registry.contentType` its Content-Type. Values that are not numbers (a field
 * an older driver does not send), and counters that are negative or not finite, are left out.
 */
export const clusterRegistry = (live: LiveCluster): Registry => {
  const registry = new Registry()
  for (const f of FAMILIES) {
    const config = { name: f.name, help: f.help, labelNames: f.labelNames, registers: [registry] }
    if (f.type === "gauge") {
      new Gauge({
        ...config,
        collect() {
          this.reset()
          for (const s of f.samples(live)) if (typeof s.value === "number") this.set(s.labels, s.value)
        }
      })
    } else {
      new Counter({
        ...config,
        collect() {
          this.reset()
          for (const s of f.samples(live)) if (Number.isFinite(s.value) && s.value >= 0) this.inc(s.labels, s.value)
        }
      })
    }
  }
  return Registry.merge([registry, processRegistry()])
}
