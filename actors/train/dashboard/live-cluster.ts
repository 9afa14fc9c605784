// What the dashboard knows, fed live from the bus: the cluster's nodes (asked every few seconds,
// as `gradwire status` does), every job's state (drivers publish it each second; ended jobs come
// from the jobs KV bucket), its curves (telemetry batches, and the history a running driver hands
// over when the dashboard first sees its job), and the tail of every worker's output (agents
// publish each line). Listeners get each change as it lands; the HTTP server turns them into
// server-sent events.
import type { NatsConnection, Subscription } from "@nats-io/nats-core"
import { clusterSubjects } from "../../../core/subjects.ts"
import { queryCluster, type ClusterReport } from "../../node/cluster-status.ts"
import { decodeJson, ENDED_STATES, isSnapshot, rankOfActor, type JobSnapshot, type LogLine, type ProgressPoint, type ReportRound, type Telemetry } from "../common/job-telemetry.ts"
import { fetchJobHistory, fetchJobLogs, logLineOf, markLiveness, queryLiveJobs, storedJobs, type ListedJob } from "./jobs-client.ts"

const POINTS_PER_RANK = 2_000
const REPORTS_KEPT = 2_000
const LOG_LINES_PER_JOB = 2_000
/** Jobs shown at most (the newest). */
const JOBS_SHOWN = 50

export interface JobView {
  snapshot: ListedJob
  heardAt: number
  points: Map<number, ProgressPoint[]>
  reports: ReportRound[]
  logs: LogLine[]
}

export type LiveEvent =
  | { readonly type: "nodes"; readonly nodes: ClusterReport }
  | { readonly type: "job"; readonly snapshot: ListedJob }
  | { readonly type: "tm"; readonly job: string; readonly points: ReadonlyArray<ProgressPoint>; readonly reports: ReadonlyArray<ReportRound> }
  | { readonly type: "log"; readonly job: string; readonly lines: ReadonlyArray<LogLine> }

/** The job a log subject belongs to: gw.<cluster>.<job>.log.<actor>. */
const jobOfLogSubject = (subject: string): string | undefined => subject.split(".")[2]

export class LiveCluster {
  readonly cluster: string
  readonly address: string
  readonly #nc: NatsConnection
  readonly #subs: Subscription[] = []
  readonly #listeners = new Set<(e: LiveEvent) => void>()
  readonly jobs = new Map<string, JobView>()
  nodes: ClusterReport | undefined
  #timers: Array<ReturnType<typeof setInterval>> = []
  #pendingLogs = new Map<string, LogLine[]>()
  /** Jobs whose history was asked for (once each), and the asking. */
  readonly #asked = new Map<string, Promise<void>>()
  #closed = false

  private constructor(nc: NatsConnection, cluster: string, address: string) {
    this.#nc = nc
    this.cluster = cluster
    this.address = address
  }

  static async open(o: { readonly nc: NatsConnection; readonly cluster: string; readonly address: string; readonly nodesEveryMs?: number }): Promise<LiveCluster> {
    const c = new LiveCluster(o.nc, o.cluster, o.address)
    c.#subscribe()
    await Promise.all([c.#refreshNodes(), c.#loadJobs()])
    c.#timers.push(setInterval(() => void c.#refreshNodes(), o.nodesEveryMs ?? 2_000))
    // Liveness: a running job whose driver went silent turns "lost"; log lines go out in batches.
    c.#timers.push(
      setInterval(() => {
        c.#flushLogs()
        for (const v of c.jobs.values()) {
          const before = v.snapshot.lost
          v.snapshot = markLiveness(v.snapshot, Date.now() - v.heardAt < 5_000)
          if (v.snapshot.lost !== before) c.#emit({ type: "job", snapshot: v.snapshot })
        }
      }, 250)
    )
    for (const t of c.#timers) t.unref?.()
    return c
  }

  on(listener: (e: LiveEvent) => void): () => void {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }

  #emit(e: LiveEvent): void {
    for (const l of this.#listeners) {
      try {
        l(e)
      } catch {
        // a listener's bug is its own
      }
    }
  }

  #subscribe(): void {
    const s = clusterSubjects(this.cluster)
    this.#subs.push(
      this.#nc.subscribe(s.jobStates, {
        callback: (err, msg) => {
          if (err) return
          const snap = decodeJson<unknown>(msg.data)
          if (isSnapshot(snap)) this.#onSnapshot(snap, true)
        }
      }),
      this.#nc.subscribe(s.jobTelemetries, {
        callback: (err, msg) => {
          if (err) return
          const tm = decodeJson<Telemetry>(msg.data)
          if (!tm || typeof tm.job !== "string") return
          const v = this.jobs.get(tm.job)
          if (!v) return
          this.#addPoints(v, tm.points ?? [])
          this.#addReports(v, tm.reports ?? [])
          this.#emit({ type: "tm", job: tm.job, points: tm.points ?? [], reports: tm.reports ?? [] })
        }
      }),
      this.#nc.subscribe(s.allJobLogs, {
        callback: (err, msg) => {
          if (err) return
          const job = jobOfLogSubject(msg.subject)
          const v = job !== undefined ? this.jobs.get(job) : undefined
          if (!v || job === undefined) return
          const members = new Map(v.snapshot.ranks.filter((r) => r.actor).map((r) => [r.actor as string, r.rank]))
          const line = logLineOf(msg.data, (a) => members.get(a) ?? rankOfActor(a))
          if (!line) return
          this.#addLogs(v, [line])
          let pending = this.#pendingLogs.get(job)
          if (!pending) this.#pendingLogs.set(job, (pending = []))
          pending.push(line)
        }
      })
    )
  }

  #flushLogs(): void {
    for (const [job, lines] of this.#pendingLogs) this.#emit({ type: "log", job, lines })
    this.#pendingLogs.clear()
  }

  #onSnapshot(snap: JobSnapshot, live: boolean): JobView {
    let v = this.jobs.get(snap.job)
    const listed = markLiveness(snap, live)
    if (!v) {
      v = { snapshot: listed, heardAt: live ? Date.now() : 0, points: new Map(), reports: [], logs: [] }
      this.jobs.set(snap.job, v)
      this.#trim()
    } else {
      // An older stored state never replaces a newer one heard from the driver.
      if (!live && snap.updatedAt < v.snapshot.updatedAt) return v
      v.snapshot = listed
      if (live) v.heardAt = Date.now()
    }
    // A running job heard from for the first time: its curves so far (asked once).
    if (live && !ENDED_STATES.has(snap.state)) void this.#catchUp(v)
    this.#emit({ type: "job", snapshot: v.snapshot })
    return v
  }

  #trim(): void {
    if (this.jobs.size <= JOBS_SHOWN) return
    const oldest = [...this.jobs.values()].sort((a, b) => a.snapshot.startedAt - b.snapshot.startedAt)
    for (const v of oldest.slice(0, this.jobs.size - JOBS_SHOWN)) this.jobs.delete(v.snapshot.job)
  }

  /** A running job first seen now: its curves so far and its workers' recent output, from its driver. */
  #catchUp(v: JobView): Promise<void> {
    const job = v.snapshot.job
    let asking = this.#asked.get(job)
    if (!asking) this.#asked.set(job, (asking = this.#fetchHistory(v)))
    return asking
  }

  async #fetchHistory(v: JobView): Promise<void> {
    const job = v.snapshot.job
    const [history, logs] = await Promise.all([fetchJobHistory(this.#nc, this.cluster, job), fetchJobLogs(this.#nc, this.cluster, job, { lines: 500 })])
    if (this.#closed) return
    if (history) {
      // Points that arrived live meanwhile are newer than the history's: keep both, in time order.
      const live = [...v.points.values()].flat()
      v.points = new Map()
      this.#addPoints(v, [...history.points, ...live].sort((a, b) => a.t - b.t))
      const seen = new Set(v.reports.map((r) => r.index))
      v.reports = [...history.reports.filter((r) => !seen.has(r.index)), ...v.reports].sort((a, b) => a.index - b.index)
      this.#emit({ type: "tm", job, points: history.points, reports: history.reports })
    }
    if (logs && logs.length) {
      const since = v.logs[0]?.t ?? Infinity
      v.logs = [...logs.filter((l) => l.t < since), ...v.logs]
      this.#emit({ type: "log", job, lines: logs })
    }
  }

  #addPoints(v: JobView, points: ReadonlyArray<ProgressPoint>): void {
    for (const p of points) {
      let list = v.points.get(p.rank)
      if (!list) v.points.set(p.rank, (list = []))
      list.push(p)
      if (list.length > POINTS_PER_RANK) v.points.set(p.rank, list.filter((_, i) => i % 2 === 0 || i === list!.length - 1))
    }
  }

  #addReports(v: JobView, reports: ReadonlyArray<ReportRound>): void {
    v.reports.push(...reports)
    if (v.reports.length > REPORTS_KEPT) v.reports = v.reports.filter((_, i) => i % 2 === 0 || i === v.reports.length - 1)
  }

  #addLogs(v: JobView, lines: ReadonlyArray<LogLine>): void {
    v.logs.push(...lines)
    if (v.logs.length > LOG_LINES_PER_JOB) v.logs.splice(0, v.logs.length - LOG_LINES_PER_JOB)
  }

  async #loadJobs(): Promise<void> {
    const [stored, live] = await Promise.all([storedJobs(this.#nc, this.cluster), queryLiveJobs(this.#nc, this.cluster)])
    for (const s of stored) this.#onSnapshot(s, false)
    await Promise.all(live.map((s) => this.#catchUp(this.#onSnapshot(s, true))))
  }

  async #refreshNodes(): Promise<void> {
    if (this.#closed) return
    try {
      this.nodes = await queryCluster(this.#nc, this.cluster, this.address, 1_000)
      this.#emit({ type: "nodes", nodes: this.nodes })
    } catch {
      // the bus is away: the next round asks again
    }
  }

  /** Everything, for a page that just connected (curves thinned to `pointsPerRank`). */
  state(pointsPerRank = 1_000): {
    cluster: string
    address: string
    nodes: ClusterReport | undefined
    jobs: Array<{ snapshot: ListedJob; points: ProgressPoint[]; reports: ReportRound[]; logs: LogLine[] }>
  } {
    const jobs = [...this.jobs.values()]
      .sort((a, b) => b.snapshot.startedAt - a.snapshot.startedAt)
      .map((v) => ({
        snapshot: v.snapshot,
        points: [...v.points.values()].flatMap((list) => {
          if (list.length <= pointsPerRank) return list
          const every = Math.ceil(list.length / pointsPerRank)
          return list.filter((_, i) => i % every === 0 || i === list.length - 1)
        }),
        reports: v.reports,
        logs: v.logs.slice(-500)
      }))
    return { cluster: this.cluster, address: this.address, nodes: this.nodes, jobs }
  }

  close(): void {
    this.#closed = true
    for (const t of this.#timers) clearInterval(t)
    for (const s of this.#subs) s.unsubscribe()
    this.#listeners.clear()
  }
}
