// Reading jobs from the bus, for `gradwire jobs`, `gradwire logs` and the dashboard: the running
// ones answer themselves (their drivers, on jobsQuery), ended and lost ones come from the
// cluster's jobs KV bucket (when its NATS has JetStream). A job whose driver stopped answering
// while its last recorded state was not an end is "lost" (the driver was killed or cut off).
import type { NatsConnection } from "@nats-io/nats-core"
import { openKvBucket } from "../../../core/jetstream-kv.ts"
import { clusterSubjects, jobSubjects } from "../../../core/subjects.ts"
import { decodeMessage } from "../../../core/wire.ts"
import { JOBS_KEPT_MS } from "../common/job-telemetry.ts"
import {
  ENDED_STATES,
  decodeJson,
  encodeJson,
  isSnapshot,
  rankOfActor,
  type JobHistory,
  type JobSnapshot,
  type LogLine
} from "../common/job-telemetry.ts"

/** A job as listed: its last known state, and whether its driver answered now. */
export type ListedJob = JobSnapshot & {
  /** The driver answered (the job runs, or has just ended). */
  readonly live: boolean
  /** Not ended, but its driver did not answer: killed, or cut off from the bus. */
  readonly lost: boolean
}

/** A driver publishes every second: one silent this long is not there. */
export const DRIVER_SILENT_MS = 10_000

export const markLiveness = (s: JobSnapshot, live: boolean, now = Date.now()): ListedJob => ({
  ...s,
  live,
  lost: !live && !ENDED_STATES.has(s.state) && now - s.updatedAt > DRIVER_SILENT_MS
})

/** The state of every job the running drivers report, within about `timeoutMs`. */
export const queryLiveJobs = async (nc: NatsConnection, cluster: string, timeoutMs = 1_000): Promise<JobSnapshot[]> => {
  const out: JobSnapshot[] = []
  try {
    const replies = await nc.requestMany(clusterSubjects(cluster).jobsQuery, new Uint8Array(0), { maxWait: timeoutMs, strategy: "stall", stall: 300 })
    for await (const msg of replies) {
      const s = decodeJson<unknown>(msg.data)
      if (isSnapshot(s)) out.push(s)
    }
  } catch {
    // no responders: no running driver
  }
  return out
}

/** Every job the cluster's KV bucket keeps (recent ones, running or ended); empty without JetStream. */
export const storedJobs = async (nc: NatsConnection, cluster: string, timeoutMs = 2_000): Promise<JobSnapshot[]> => {
  // Reading makes nothing: no bucket yet means no job ever recorded one.
  const kv = await openKvBucket(nc, clusterSubjects(cluster).jobsBucket, { maxAgeMs: JOBS_KEPT_MS, timeoutMs, create: false }).catch(() => undefined)
  if (!kv) return []
  const keys = await kv.keys().catch(() => [] as string[])
  const values = await Promise.all(keys.map((k) => kv.get(k).catch(() => undefined)))
  return values.map((v) => (v ? decodeJson<unknown>(v) : undefined)).filter(isSnapshot)
}

/** Running and recent jobs, newest first. */
export const listJobs = async (nc: NatsConnection, cluster: string, timeoutMs = 1_000): Promise<ListedJob[]> => {
  const [live, stored] = await Promise.all([queryLiveJobs(nc, cluster, timeoutMs), storedJobs(nc, cluster)])
  const byJob = new Map<string, ListedJob>()
  for (const s of stored) byJob.set(s.job, markLiveness(s, false))
  for (const s of live) byJob.set(s.job, markLiveness(s, true))
  return [...byJob.values()].sort((a, b) => b.startedAt - a.startedAt)
}

/** The job `query` names: its id, else the newest job of that name, else the one job whose id starts with it. */
export const findJob = <J extends JobSnapshot>(jobs: ReadonlyArray<J>, query: string): J | undefined => {
  const exact = jobs.find((j) => j.job === query)
  if (exact) return exact
  const named = jobs.filter((j) => j.name === query).sort((a, b) => b.startedAt - a.startedAt)
  if (named.length) return named[0]
  const prefixed = jobs.filter((j) => j.job.startsWith(query))
  return prefixed.length === 1 ? prefixed[0] : undefined
}

/** The job's history (curves, report rounds) from its driver; undefined when it does not answer. */
export const fetchJobHistory = async (nc: NatsConnection, cluster: string, job: string, timeoutMs = 3_000): Promise<JobHistory | undefined> => {
  try {
    const msg = await nc.request(clusterSubjects(cluster).jobQuery(job), encodeJson({ what: "history" }), { timeout: timeoutMs })
    const h = decodeJson<JobHistory>(msg.data)
    return h && isSnapshot(h.snapshot) ? h : undefined
  } catch {
    return undefined
  }
}

/** The tail of the job's worker output (of rank `rank`, or all) from its driver; undefined when it does not answer. */
export const fetchJobLogs = async (
  nc: NatsConnection,
  cluster: string,
  job: string,
  options: { readonly rank?: number; readonly lines?: number; readonly timeoutMs?: number } = {}
): Promise<LogLine[] | undefined> => {
  try {
    const body = { what: "logs", ...(options.rank !== undefined ? { rank: options.rank } : {}), lines: options.lines ?? 200 }
    const msg = await nc.request(clusterSubjects(cluster).jobQuery(job), encodeJson(body), { timeout: options.timeoutMs ?? 3_000 })
    return decodeJson<{ lines: LogLine[] }>(msg.data)?.lines
  } catch {
    return undefined
  }
}

/** A log message as agents publish it (node/agent.ts) turned into a LogLine. */
export const logLineOf = (data: Uint8Array, rankOf: (actor: string) => number | undefined = rankOfActor): LogLine | undefined => {
  try {
    const m = decodeMessage(data) as { stream?: unknown; line?: unknown; name?: unknown; pid?: unknown; node?: unknown }
    if (typeof m?.line !== "string" || typeof m.name !== "string") return undefined
    const rank = rankOf(m.name)
    return { t: Date.now(), actor: m.name, node: String(m.node ?? ""), pid: Number(m.pid ?? -1), stream: String(m.stream ?? "stdout"), line: m.line, ...(rank !== undefined ? { rank } : {}) }
  } catch {
    return undefined
  }
}

/**
 * Streams the job's worker output as agents publish it (from whichever node runs each worker),
 * until `stop()` or the job ends (its driver publishes an ended state, or goes silent).
 */
export const followJobLogs = (
  nc: NatsConnection,
  cluster: string,
  job: string,
  onLine: (line: LogLine) => void,
  options: { readonly rank?: number } = {}
): { stop(): void; readonly ended: Promise<JobSnapshot | undefined> } => {
  let rankOf = rankOfActor
  let resolveEnded!: (s: JobSnapshot | undefined) => void
  const ended = new Promise<JobSnapshot | undefined>((r) => (resolveEnded = r))
  const logs = nc.subscribe(jobSubjects(cluster, job).logs, {
    callback: (err, msg) => {
      if (err) return
      const l = logLineOf(msg.data, rankOf)
      if (l && (options.rank === undefined || l.rank === options.rank)) onLine(l)
    }
  })
  let lastHeard = Date.now()
  const state = nc.subscribe(clusterSubjects(cluster).jobState(job), {
    callback: (err, msg) => {
      if (err) return
      const s = decodeJson<unknown>(msg.data)
      if (!isSnapshot(s)) return
      lastHeard = Date.now()
      // Ranks move after a regroup: the current members say who is who.
      const members = new Map(s.ranks.filter((r) => r.actor).map((r) => [r.actor as string, r.rank]))
      rankOf = (actor) => members.get(actor) ?? rankOfActor(actor)
      if (ENDED_STATES.has(s.state)) finish(s)
    }
  })
  const silence = setInterval(() => {
    if (Date.now() - lastHeard > DRIVER_SILENT_MS) finish(undefined)
  }, 1_000)
  silence.unref?.()
  let done = false
  const finish = (s: JobSnapshot | undefined): void => {
    if (done) return
    done = true
    clearInterval(silence)
    // Lines published just before the end are still on their way.
    void nc
      .flush()
      .catch(() => {})
      .then(() => {
        logs.unsubscribe()
        state.unsubscribe()
        resolveEnded(s)
      })
  }
  return { stop: () => finish(undefined), ended }
}

const fmtDuration = (ms: number): string => {
  const s = Math.max(0, Math.round(ms / 1000))
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`
}

/**
 * The LOSS column: the loss the loop last reported (rank 0's report(), what the Result's metrics
 * hold), else rank 0's loss at its latest step (a job that has not reported yet); "-" without either.
 * A step's loss is one batch's, which can be far from the reported one (a last batch of two rows).
 */
export const lossOf = (j: Pick<JobSnapshot, "lastMetrics" | "ranks">): string => {
  const reported = j.lastMetrics?.loss
  if (typeof reported === "number" && Number.isFinite(reported)) return reported.toPrecision(4)
  const r0 = j.ranks.find((r) => r.rank === 0)
  return r0 && Number.isFinite(r0.loss) ? `${r0.loss.toPrecision(4)} (step)` : "-"
}

/** The table `gradwire jobs` prints. */
export const formatJobsTable = (cluster: string, address: string, jobs: ReadonlyArray<ListedJob>, now = Date.now()): string => {
  if (jobs.length === 0) return `cluster "${cluster}" at ${address}: no running or recent jobs`
  const header = ["JOB", "NAME", "STATE", "ATTEMPT", "WORKERS", "RESTARTS", "RESIZES", "PROGRESS", "LOSS", "SAMPLES/S", "STARTED", "DURATION", "DRIVER"]
  const rows = jobs.map((j) => {
    const r0 = j.ranks.find((r) => r.rank === 0)
    const rate = j.ranks.reduce((n, r) => n + (r.samplesPerSec || 0), 0)
    // (a job whose driver did not answer, lost or not yet: up to when it was last heard of)
    const end = j.endedAt ?? (j.live ? now : j.updatedAt)
    return [
      j.job,
      j.name,
      j.lost ? "lost" : j.state,
      String(j.attempt),
      `${j.worldSize}${j.minWorkers !== j.maxWorkers ? ` (${j.minWorkers}..${j.maxWorkers})` : ""}`,
      String(j.restarts),
      String(j.resizes.length),
      r0 ? `epoch ${r0.epoch} step ${r0.step + 1}${r0.stepsPerEpoch ? `/${r0.stepsPerEpoch}` : ""}, ${j.reports} reports` : `${j.reports} reports`,
      lossOf(j),
      rate > 0 && !j.endedAt ? String(Math.round(rate)) : "-",
      new Date(j.startedAt).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z"),
      fmtDuration(end - j.startedAt),
      `${j.driver.host}:${j.driver.pid}`
    ]
  })
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)))
  const line = (cells: string[]): string => cells.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd()
  const notes = jobs.filter((j) => j.lost).map((j) => `${j.job}: its driver (${j.driver.host} pid ${j.driver.pid}) stopped answering ${fmtDuration(now - j.updatedAt)} ago; its run directory: ${j.runDir}`)
  const failed = jobs.filter((j) => j.state === "failed" && j.error).map((j) => `${j.job}: ${j.error!.split("\n")[0]}`)
  return [`cluster "${cluster}" at ${address}: ${jobs.filter((j) => j.live && !ENDED_STATES.has(j.state)).length} running, ${jobs.length} listed`, "", line(header), ...rows.map(line), ...(notes.length || failed.length ? ["", ...notes, ...failed] : [])].join("\n")
}

/** A log line as `gradwire logs` prints it: as the agents' own log prefixes them. */
export const formatLogLine = (l: LogLine): string => `(${l.rank !== undefined ? `worker rank=${l.rank}` : l.actor} pid=${l.pid} node=${l.node}) ${l.line}`
