// The driver's side of job-telemetry.ts: keeps the job's live figures (per-rank progress, report
// rounds, the tail of every worker's output) and says them on the bus: the state about once a
// second (and into the cluster's jobs KV bucket when its NATS has JetStream, so `gradwire jobs`
// lists the job after the driver is gone), the curves in batches, and answers to history and log
// requests. It reads the trainer's own state through `facts` when it publishes, so the trainer
// only tells it what it cannot read back: progress messages, report rounds, and "something changed".
import * as os from "node:os"
import type { NatsConnection, Subscription } from "@nats-io/nats-core"
import { openKvBucket, type KvBucket } from "../../../core/jetstream-kv.ts"
import { clusterSubjects, jobSubjects } from "../../../core/subjects.ts"
import { decodeMessage } from "../../../core/wire.ts"
import type { Incident } from "../common/observe/report-html.ts"
import {
  ENDED_STATES,
  JOBS_KEPT,
  JOBS_KEPT_MS,
  decodeJson,
  encodeJson,
  numericMetrics,
  rankOfActor,
  type JobCheckpoint,
  type JobHistory,
  type JobQuery,
  type JobSnapshot,
  type JobState,
  type LogLine,
  type ProgressPoint,
  type RankStats,
  type ReportRound
} from "../common/job-telemetry.ts"

/**
 * The state is published this often, and into the KV bucket as often (at once when its state
 * changed): what `gradwire jobs` lists of a driver that was killed is at most this old.
 */
const PUBLISH_EVERY_MS = 1_000
const KV_EVERY_MS = PUBLISH_EVERY_MS
/** "Something changed" publishes the state at once, but at most this often. */
const CHANGED_EVERY_MS = 250
/** Curves are batched for this long. */
const TELEMETRY_EVERY_MS = 500
/** Points kept per rank for late joiners (older ones are thinned out, every other one dropped). */
const POINTS_PER_RANK = 1_500
const REPORTS_KEPT = 2_000
const LOG_LINES_PER_ACTOR = 1_000
const LOG_LINE_CHARS = 4_000
const INCIDENTS_SHOWN = 30
/** A history answer larger than this is thinned until it fits (a default nats-server takes 1 MiB). */
const MAX_REPLY_BYTES = 900 * 1024

/** What the trainer knows, read each time the state is published. */
export interface JobFacts {
  readonly state: JobState
  readonly attempt: number
  readonly worldSize: number
  readonly restarts: number
  readonly countedFailures: number
  readonly resizes: JobSnapshot["resizes"]
  readonly incidents: ReadonlyArray<Incident>
  readonly reports: number
  readonly lastMetrics: Record<string, unknown> | undefined
  readonly checkpoints: { readonly count: number; readonly latest?: JobCheckpoint; readonly best?: JobCheckpoint }
  readonly plan?: JobSnapshot["plan"]
  /** The current generation's workers. */
  readonly members: ReadonlyArray<{ readonly rank: number; readonly actor: string; readonly node: string; readonly pid: number }>
  readonly error?: string
}

export interface JobMonitorOptions {
  readonly nc: NatsConnection
  readonly cluster: string
  readonly job: string
  readonly name: string
  readonly runDir: string
  readonly address: string
  readonly minWorkers: number
  readonly maxWorkers: number
  readonly strategy: JobSnapshot["strategy"]
  readonly facts: () => JobFacts
}

/** The body of a worker's progress message (train-protocol.ts). */
export interface ProgressBody {
  readonly attempt: number
  readonly rank: number
  readonly epoch: number
  readonly step: number
  readonly stepsPerEpoch: number
  readonly samples: number
  readonly loss: number
  readonly stepTimes?: ReadonlyArray<ReadonlyArray<number>>
  readonly bytesSent?: number
  readonly bytesReceived?: number
}

interface RankAcc {
  stats: RankStats
  lastSamples: number
  lastAt: number
  lastSent: number
  lastReceived: number
  /** The worker that last was this rank (kept once the group is gone: an ended job's ranks still name their node). */
  member?: Omit<JobFacts["members"][number], "rank">
}

/** Recent means per step, smoothed over progress messages (one message's few steps are noisy). */
const smooth = (prev: number | undefined, now: number | undefined): number =>
  now === undefined ? (prev ?? 0) : prev === undefined ? now : 0.6 * prev + 0.4 * now

const printable = (m: Record<string, unknown> | undefined): Record<string, unknown> | undefined => {
  if (!m) return undefined
  const out: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(m)) if ((typeof v === "number" && Number.isFinite(v)) || (typeof v === "string" && v.length <= 200)) out[k] = v
  return out
}

export class JobMonitor {
  readonly #o: JobMonitorOptions
  readonly #subjects: ReturnType<typeof clusterSubjects>
  readonly #startedAt = Date.now()
  readonly #ranks = new Map<number, RankAcc>()
  readonly #points = new Map<number, ProgressPoint[]>()
  #reports: ReportRound[] = []
  #pendingPoints: ProgressPoint[] = []
  #pendingReports: ReportRound[] = []
  readonly #logs = new Map<string, LogLine[]>()
  readonly #subs: Subscription[] = []
  readonly #timers: Array<ReturnType<typeof setInterval>> = []
  #kv: KvBucket | undefined
  #kvWriting: Promise<void> = Promise.resolve()
  #kvAt = 0
  #kvState: JobState | undefined
  #dashboard: string | undefined
  #final: { state: JobState; error?: string; endedAt: number } | undefined
  #soon: ReturnType<typeof setTimeout> | undefined
  #publishedAt = 0
  #closed = false

  private constructor(o: JobMonitorOptions) {
    this.#o = o
    this.#subjects = clusterSubjects(o.cluster)
  }

  /** Starts publishing; the KV bucket is opened in the background (a server without JetStream has none). */
  static start(o: JobMonitorOptions): JobMonitor {
    const m = new JobMonitor(o)
    m.#listen()
    void openKvBucket(o.nc, m.#subjects.jobsBucket, { maxAgeMs: JOBS_KEPT_MS, maxValues: JOBS_KEPT })
      .then((kv) => {
        m.#kv = kv
        if (kv) m.#putKv(true)
      })
      .catch(() => {})
    m.#timers.push(setInterval(() => m.#publish(), PUBLISH_EVERY_MS))
    m.#timers.push(setInterval(() => m.#flushTelemetry(), TELEMETRY_EVERY_MS))
    for (const t of m.#timers) t.unref?.()
    m.#publish()
    return m
  }

  set dashboard(url: string | undefined) {
    this.#dashboard = url
    this.changed()
  }

  #listen(): void {
    const { nc, cluster, job } = this.#o
    const reply = (msg: { respond(data: Uint8Array): boolean }, value: unknown): void => {
      try {
        msg.respond(encodeJson(value))
      } catch {
        // the asker went away
      }
    }
    this.#subs.push(
      nc.subscribe(this.#subjects.jobsQuery, { callback: (err, msg) => void (err || reply(msg, this.snapshot())) }),
      nc.subscribe(this.#subjects.jobQuery(job), {
        callback: (err, msg) => {
          if (err) return
          const q = decodeJson<JobQuery>(msg.data) ?? { what: "history" }
          reply(msg, q.what === "logs" ? { lines: this.logTail(q.rank, q.lines) } : this.history())
        }
      }),
      // Agents publish every line of the job's processes here, wherever they run.
      nc.subscribe(jobSubjects(cluster, job).logs, {
        callback: (err, msg) => {
          if (err) return
          try {
            const m = decodeMessage(msg.data) as { stream?: unknown; line?: unknown; name?: unknown; pid?: unknown; node?: unknown }
            this.log({ actor: String(m.name), node: String(m.node), pid: Number(m.pid), stream: String(m.stream ?? "stdout"), line: String(m.line) })
          } catch {
            // not a log line
          }
        }
      })
    )
  }

  /** A line of a worker's output (also fed by the agents' log subjects). */
  log(l: Omit<LogLine, "t" | "rank">): void {
    const member = this.#o.facts().members.find((m) => m.actor === l.actor)
    const rank = member?.rank ?? rankOfActor(l.actor)
    const line: LogLine = { ...l, t: Date.now(), ...(rank !== undefined ? { rank } : {}), line: l.line.slice(0, LOG_LINE_CHARS) }
    let tail = this.#logs.get(l.actor)
    if (!tail) this.#logs.set(l.actor, (tail = []))
    tail.push(line)
    if (tail.length > LOG_LINES_PER_ACTOR) tail.splice(0, tail.length - LOG_LINES_PER_ACTOR)
  }

  /** The last `lines` lines (default 200) of every worker, or of those that are (or were first) rank `rank`, oldest first. */
  logTail(rank?: number, lines = 200): LogLine[] {
    const all = [...this.#logs.values()].flat().filter((l) => rank === undefined || l.rank === rank)
    all.sort((a, b) => a.t - b.t)
    return all.slice(-Math.max(1, lines))
  }

  progress(body: ProgressBody): void {
    const now = Date.now()
    const prev = this.#ranks.get(body.rank)
    const times = body.stepTimes ?? []
    let compute = 0
    let comm = 0
    let wait = 0
    for (const t of times) {
      compute += (t[1] ?? 0) + (t[3] ?? 0)
      comm += t[2] ?? 0
      wait += t[4] ?? 0
    }
    const n = times.length
    // samples is per worker process and attempt: a drop means another process (or a restart).
    const samplesDelta = prev && body.samples >= prev.lastSamples ? body.samples - prev.lastSamples : body.samples
    const dt = prev ? (now - prev.lastAt) / 1000 : 0
    const rate = dt > 0.05 ? samplesDelta / dt : (prev?.stats.samplesPerSec ?? 0)
    const smoothed = prev && prev.stats.samplesPerSec > 0 ? 0.5 * prev.stats.samplesPerSec + 0.5 * rate : rate
    const sent = body.bytesSent ?? prev?.lastSent ?? 0
    const received = body.bytesReceived ?? prev?.lastReceived ?? 0
    const sentDelta = prev && sent >= prev.lastSent ? sent - prev.lastSent : sent
    const receivedDelta = prev && received >= prev.lastReceived ? received - prev.lastReceived : received
    const p = prev?.stats
    const stats: RankStats = {
      rank: body.rank,
      attempt: body.attempt,
      epoch: body.epoch,
      step: body.step,
      stepsPerEpoch: body.stepsPerEpoch,
      loss: body.loss,
      samplesPerSec: smoothed,
      computeMs: smooth(p?.computeMs, n ? compute / n : undefined),
      commMs: smooth(p?.commMs, n ? comm / n : undefined),
      waitMs: smooth(p?.waitMs, n ? wait / n : undefined),
      steps: (p?.steps ?? 0) + n,
      samples: (p?.samples ?? 0) + samplesDelta,
      computeMsTotal: (p?.computeMsTotal ?? 0) + compute,
      commMsTotal: (p?.commMsTotal ?? 0) + comm,
      waitMsTotal: (p?.waitMsTotal ?? 0) + wait,
      bytesSent: (p?.bytesSent ?? 0) + sentDelta,
      bytesReceived: (p?.bytesReceived ?? 0) + receivedDelta,
      updatedAt: now
    }
    this.#ranks.set(body.rank, { stats, lastSamples: body.samples, lastAt: now, lastSent: sent, lastReceived: received, ...(prev?.member ? { member: prev.member } : {}) })
    const point: ProgressPoint = {
      rank: body.rank,
      attempt: body.attempt,
      t: now,
      epoch: body.epoch,
      step: body.step,
      loss: body.loss,
      samplesPerSec: smoothed,
      computeMs: stats.computeMs,
      commMs: stats.commMs,
      waitMs: stats.waitMs
    }
    this.#pendingPoints.push(point)
    let kept = this.#points.get(body.rank)
    if (!kept) this.#points.set(body.rank, (kept = []))
    kept.push(point)
    if (kept.length > POINTS_PER_RANK) this.#points.set(body.rank, kept.filter((_, i) => i % 2 === 0 || i === kept!.length - 1))
  }

  report(index: number, attempt: number, rank0: Record<string, unknown>, perRank: ReadonlyArray<Record<string, unknown>>): void {
    const round: ReportRound = { index, t: Date.now(), attempt, metrics: numericMetrics(rank0), perRank: perRank.map(numericMetrics) }
    this.#reports.push(round)
    if (this.#reports.length > REPORTS_KEPT) this.#reports = this.#reports.filter((_, i) => i % 2 === 0 || i === this.#reports.length - 1)
    this.#pendingReports.push(round)
    this.changed()
  }

  /** Publishes the state soon: at the next tick, or (coalesced) CHANGED_EVERY_MS after the last publish. */
  changed(): void {
    if (this.#closed || this.#soon) return
    this.#soon = setTimeout(() => {
      this.#soon = undefined
      this.#publish()
    }, Math.max(0, this.#publishedAt + CHANGED_EVERY_MS - Date.now()))
  }

  snapshot(): JobSnapshot {
    const f = this.#o.facts()
    const final = this.#final
    const members = new Map(f.members.map((m) => [m.rank, m]))
    const ranks = [...this.#ranks.values()]
      .filter((acc) => acc.stats.rank < Math.max(f.worldSize, 1) || final)
      .sort((a, b) => a.stats.rank - b.stats.rank)
      .map((acc) => {
        const m = members.get(acc.stats.rank)
        if (m) acc.member = { actor: m.actor, node: m.node, pid: m.pid }
        const kept = acc.member
        return kept ? { ...acc.stats, ...kept } : acc.stats
      })
    const error = final?.error ?? f.error
    return {
      v: 1,
      job: this.#o.job,
      name: this.#o.name,
      cluster: this.#o.cluster,
      state: final?.state ?? f.state,
      startedAt: this.#startedAt,
      updatedAt: Date.now(),
      ...(final ? { endedAt: final.endedAt } : {}),
      ...(error !== undefined ? { error } : {}),
      attempt: f.attempt,
      worldSize: f.worldSize,
      minWorkers: this.#o.minWorkers,
      maxWorkers: this.#o.maxWorkers,
      restarts: f.restarts,
      countedFailures: f.countedFailures,
      resizes: f.resizes,
      strategy: this.#o.strategy,
      ...(f.plan ? { plan: f.plan } : {}),
      reports: f.reports,
      ...(f.lastMetrics ? { lastMetrics: printable(f.lastMetrics) } : {}),
      checkpoints: f.checkpoints,
      incidents: f.incidents.slice(-INCIDENTS_SHOWN),
      ranks,
      runDir: this.#o.runDir,
      driver: { host: os.hostname(), pid: process.pid },
      address: this.#o.address,
      ...(this.#dashboard ? { dashboard: this.#dashboard } : {})
    }
  }

  history(): JobHistory {
    const snapshot = this.snapshot()
    let points = [...this.#points.values()].flat().sort((a, b) => a.t - b.t)
    let reports = this.#reports
    // Keep the answer under the server's max_payload: thin evenly until it fits.
    for (let i = 0; i < 8; i++) {
      const size = encodeJson({ snapshot, points, reports }).byteLength
      if (size <= MAX_REPLY_BYTES) break
      points = points.filter((_, j) => j % 2 === 0)
      if (i > 2) reports = reports.filter((_, j) => j % 2 === 0 || j === reports.length - 1)
    }
    return { snapshot, points, reports }
  }

  #publish(): void {
    if (this.#closed && !this.#final) return
    this.#publishedAt = Date.now()
    const snap = this.snapshot()
    try {
      this.#o.nc.publish(this.#subjects.jobState(this.#o.job), encodeJson(snap))
    } catch {
      // the connection is closing or reconnecting: the next tick says it again
    }
    this.#putKv(snap.state !== this.#kvState, snap)
  }

  #putKv(force: boolean, snap?: JobSnapshot): void {
    const kv = this.#kv
    if (!kv) return
    const now = Date.now()
    // (half the period: the timer's ticks come a little early or late)
    if (!force && now - this.#kvAt < KV_EVERY_MS / 2) return
    this.#kvAt = now
    const s = snap ?? this.snapshot()
    this.#kvState = s.state
    // One write at a time; a failed one is retried by the next tick.
    this.#kvWriting = this.#kvWriting
      .then(() => kv.put(this.#o.job, encodeJson(s)))
      .catch(() => {
        this.#kvAt = 0
        this.#kvState = undefined
      })
  }

  #flushTelemetry(): void {
    if (this.#pendingPoints.length === 0 && this.#pendingReports.length === 0) return
    const body = { job: this.#o.job, points: this.#pendingPoints.splice(0), reports: this.#pendingReports.splice(0) }
    try {
      this.#o.nc.publish(this.#subjects.jobTelemetry(this.#o.job), encodeJson(body))
    } catch {
      // closing
    }
  }

  /** The job ended: its last state goes out (and into the bucket, within `timeoutMs`), and nothing more. */
  async close(final: { state: JobState; error?: string }, timeoutMs = 3_000): Promise<void> {
    if (this.#closed) return
    if (!ENDED_STATES.has(final.state)) throw new Error(`a job ends as finished, failed or interrupted, not ${final.state}`)
    this.#final = { ...final, endedAt: Date.now() }
    for (const t of this.#timers) clearInterval(t)
    if (this.#soon) clearTimeout(this.#soon)
    this.#flushTelemetry()
    this.#publish()
    this.#closed = true
    const kv = this.#kv
    const last = this.snapshot()
    const written = kv ? this.#kvWriting.then(() => kv.put(this.#o.job, encodeJson(last))).catch(() => {}) : Promise.resolve()
    let timer: ReturnType<typeof setTimeout> | undefined
    await Promise.race([written, new Promise<void>((r) => (timer = setTimeout(r, timeoutMs)))])
    clearTimeout(timer)
    await this.#o.nc.flush().catch(() => {})
    for (const s of this.#subs) s.unsubscribe()
  }
}
