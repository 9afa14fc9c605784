// The dashboard's /metrics: what the live cluster view holds, as Prometheus metric families. Per
// node its resources (total and used) and liveness; per job its state, attempt, size, restarts,
// resizes, reports and last metrics; per rank of a job its steps, samples, throughput, step time
// in parts (compute, communication, waiting) and the bytes on its collective connections.
// Counters are totals over the job, every attempt included, so they never go down while a job runs.
import { renderExposition, type MetricFamily, type Sample } from "../observe/prometheus.ts"
import type { LiveCluster } from "./live-cluster.ts"

const family = (name: string, type: MetricFamily["type"], help: string, samples: Sample[]): MetricFamily => ({ name, type, help, samples })

/** Metric names in labels: anything else than letters, digits and "_" becomes "_". */
const safe = (s: string): string => s.replace(/[^A-Za-z0-9_]/g, "_")

export const clusterMetrics = (live: LiveCluster): string => {
  const cluster = live.cluster
  const nodes = live.nodes?.nodes ?? []
  const n = (labels: Record<string, string>) => ({ cluster, ...labels })
  const nodeUp: Sample[] = []
  const resTotal: Sample[] = []
  const resUsed: Sample[] = []
  const actors: Sample[] = []
  const seen: Sample[] = []
  for (const node of nodes) {
    nodeUp.push({ labels: n({ node: node.nodeId, host: node.hostname, head: String(node.head), backends: node.backends.join(",") }), value: node.state === "alive" ? 1 : 0 })
    for (const [k, v] of Object.entries(node.resources.total)) resTotal.push({ labels: n({ node: node.nodeId, resource: k }), value: v })
    for (const [k, v] of Object.entries(node.resources.used)) resUsed.push({ labels: n({ node: node.nodeId, resource: k }), value: v })
    actors.push({ labels: n({ node: node.nodeId }), value: node.processes.length })
    seen.push({ labels: n({ node: node.nodeId }), value: node.lastSeenMsAgo / 1000 })
  }
  const jobInfo: Sample[] = []
  const jobState: Sample[] = []
  const jobUp: Sample[] = []
  const attempt: Sample[] = []
  const worldSize: Sample[] = []
  const restarts: Sample[] = []
  const failures: Sample[] = []
  const resizes: Sample[] = []
  const reports: Sample[] = []
  const checkpoints: Sample[] = []
  const started: Sample[] = []
  const metric: Sample[] = []
  const steps: Sample[] = []
  const samples: Sample[] = []
  const rate: Sample[] = []
  const stepSeconds: Sample[] = []
  const stepSecondsTotal: Sample[] = []
  const bytes: Sample[] = []
  const loss: Sample[] = []
  const epoch: Sample[] = []
  for (const v of live.jobs.values()) {
    const s = v.snapshot
    const j = { cluster, job: s.job, name: s.name }
    jobInfo.push({ labels: { ...j, strategy: s.strategy.strategy, algorithm: s.strategy.algorithm, compression: s.strategy.compression, driver_host: s.driver.host }, value: 1 })
    jobState.push({ labels: { ...j, state: s.lost ? "lost" : s.state }, value: 1 })
    jobUp.push({ labels: j, value: s.live && !s.lost && (s.state === "running" || s.state === "scheduling" || s.state === "starting" || s.state === "restarting" || s.state === "resizing") ? 1 : 0 })
    attempt.push({ labels: j, value: s.attempt })
    worldSize.push({ labels: j, value: s.worldSize })
    restarts.push({ labels: j, value: s.restarts })
    failures.push({ labels: j, value: s.countedFailures })
    resizes.push({ labels: j, value: s.resizes.length })
    reports.push({ labels: j, value: s.reports })
    checkpoints.push({ labels: j, value: s.checkpoints.count })
    started.push({ labels: j, value: s.startedAt / 1000 })
    for (const [k, val] of Object.entries(s.lastMetrics ?? {})) if (typeof val === "number" && Number.isFinite(val)) metric.push({ labels: { ...j, metric: safe(k) }, value: val })
    for (const r of s.ranks) {
      const rl = { ...j, rank: String(r.rank), node: r.node ?? "" }
      steps.push({ labels: rl, value: r.steps })
      samples.push({ labels: rl, value: r.samples })
      rate.push({ labels: rl, value: r.samplesPerSec })
      loss.push({ labels: rl, value: r.loss })
      epoch.push({ labels: rl, value: r.epoch })
      for (const [part, mean, total] of [
        ["compute", r.computeMs, r.computeMsTotal],
        ["communication", r.commMs, r.commMsTotal],
        ["waiting", r.waitMs, r.waitMsTotal]
      ] as const) {
        stepSeconds.push({ labels: { ...rl, part }, value: mean / 1000 })
        stepSecondsTotal.push({ labels: { ...rl, part }, value: total / 1000 })
      }
      bytes.push({ labels: { ...rl, collective: "gradients", direction: "sent" }, value: r.bytesSent })
      bytes.push({ labels: { ...rl, collective: "gradients", direction: "received" }, value: r.bytesReceived })
    }
  }
  return renderExposition([
    family("gradwire_node_up", "gauge", "1 when the node's agent is alive (heard from within its deadline), else 0.", nodeUp),
    family("gradwire_node_resource_total", "gauge", "Resources the node advertises (CPU, GPU, memory bytes, custom).", resTotal),
    family("gradwire_node_resource_used", "gauge", "Resources held by the actor processes the node runs.", resUsed),
    family("gradwire_node_actor_processes", "gauge", "Actor processes (workers, servers) the node's agent runs.", actors),
    family("gradwire_node_last_seen_seconds", "gauge", "Seconds since the node's agent was last heard from.", seen),
    family("gradwire_job_info", "gauge", "A training job: its strategy, all-reduce algorithm and compression as configured.", jobInfo),
    family("gradwire_job_state", "gauge", "1 for the job's current state (starting, scheduling, running, restarting, resizing, finished, failed, interrupted, lost).", jobState),
    family("gradwire_job_up", "gauge", "1 while the job's driver is alive and the job has not ended.", jobUp),
    family("gradwire_job_attempt", "gauge", "The job's current generation (0 for the first; each restart, regroup or resize adds one).", attempt),
    family("gradwire_job_world_size", "gauge", "Workers in the job's current generation.", worldSize),
    family("gradwire_job_restarts_total", "counter", "Restarts and regroups of the job's worker group, after failures of the job and of the infrastructure.", restarts),
    family("gradwire_job_counted_failures_total", "counter", "Failures that used failureConfig.maxFailures.", failures),
    family("gradwire_job_resizes_total", "counter", "Size changes of the job's elastic group.", resizes),
    family("gradwire_job_reports_total", "counter", "Completed report rounds of the job.", reports),
    family("gradwire_job_checkpoints_total", "counter", "Checkpoints of the job kept now.", checkpoints),
    family("gradwire_job_start_time_seconds", "gauge", "When the job started, in seconds since the Unix epoch.", started),
    family("gradwire_job_metric", "gauge", "Rank 0's last reported value of each numeric metric.", metric),
    family("gradwire_rank_steps_total", "counter", "Training steps the rank took, over every attempt.", steps),
    family("gradwire_rank_samples_total", "counter", "Samples the rank trained on, over every attempt.", samples),
    family("gradwire_rank_samples_per_second", "gauge", "The rank's recent throughput.", rate),
    family("gradwire_rank_step_seconds", "gauge", "Mean seconds per recent step, by part: compute (forward/backward and apply), communication (gradient exchange), waiting (between steps).", stepSeconds),
    family("gradwire_rank_step_seconds_total", "counter", "Seconds spent in steps, by part (as gradwire_rank_step_seconds).", stepSecondsTotal),
    family("gradwire_rank_collective_bytes_total", "counter", "Bytes on the rank's collective connections, by direction.", bytes),
    family("gradwire_rank_loss", "gauge", "The rank's loss at its last step.", loss),
    family("gradwire_rank_epoch", "gauge", "The epoch the rank is in.", epoch)
  ])
}
