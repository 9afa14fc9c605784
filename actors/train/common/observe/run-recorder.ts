// The run directory: the resolved config (config.json), metrics history (metrics.jsonl and
// metrics.csv for rank 0, metrics_per_rank.jsonl for every rank), trainer events (events.jsonl),
// per-rank logs (logs/), TensorBoard scalars (events.out.tfevents.*), the timeline (timeline.json,
// Chrome trace-event format, when enabled), the HTML report (report.html) and checkpoints (written
// by the checkpoint store next to these). report.html, metrics.csv and summary.json are written
// while the run goes on (snapshot(), which the trainer calls as it trains) and once more at its end
// (finish(), also after a failure or an interrupt), so the directory is complete whatever happens.
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { writeFileAtomic } from "../../../../core/atomic-file.ts"
import { renderReport, type Incident, type StepTime } from "./report-html.ts"
import { TensorBoardWriter } from "./tensorboard.ts"
import { threadName, type TraceEvent } from "./timeline.ts"

/**
 * A run's current lineage, built row by row in the order rows were written, each with its report
 * number: a row of report n supersedes every earlier row of report n or later (a restart from a
 * checkpoint, or a rerun resuming one, makes those rounds again). What is kept counts 0, 1, 2, ...
 * up to the latest round, once each: the rounds the final weights descend from. The one place
 * this rule is written: the driver's history (fit-record.ts), metrics.csv and report.html (the
 * recorder) and loadResult (result-files.ts) all keep their rows in one.
 */
export class Lineage<R> {
  readonly #rows: R[] = []
  readonly #reports: number[] = []

  /** The rows kept, oldest first (the live list: it changes as rows are added). */
  get rows(): ReadonlyArray<R> {
    return this.#rows
  }

  add(report: number, row: R): void {
    while (this.#reports.length > 0 && this.#reports.at(-1)! >= report) {
      this.#reports.pop()
      this.#rows.pop()
    }
    this.#reports.push(report)
    this.#rows.push(row)
  }
}

/** A metrics.jsonl row's loop metrics: the row without the report number and time RunRecorder.metrics writes beside them. */
export const rowMetrics = (row: Record<string, unknown>): Record<string, unknown> => {
  const { report: _report, time: _time, ...m } = row
  return m
}

/** The current lineage of `rows` (in the order they were written), by each one's report number. */
export const currentLineage = <R>(rows: ReadonlyArray<R>, reportOf: (row: R) => number): R[] => {
  const lineage = new Lineage<R>()
  for (const r of rows) lineage.add(reportOf(r), r)
  return [...lineage.rows]
}

/** A JSON.stringify replacer writing a bigint as its digits, as config.json holds a run's config (progress.ts compares with it). */
export const bigintAsDigits = (_key: string, v: unknown): unknown => (typeof v === "bigint" ? v.toString() : v)

export type { TraceEvent } from "./timeline.ts"

/** Step times kept per rank for the report; past this many in total, every other one is dropped (the report bins them anyway). */
const MAX_STEP_TIMES = 200_000
/** Throughput points kept per rank (thinned the same way). */
const MAX_RATE_POINTS = 4_000

/** The attempt report.html gives the rows an earlier fit() of the run made (a rerun resuming it): its marker says "resumed". */
export const EARLIER_RUN = -1

const csvCell = (v: unknown): string => {
  const s = v === undefined || v === null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v)
  return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s
}

/** The ranks' steps since the previous report round: their summed compute, communication and waiting, ms, and how many steps (every rank's). */
export interface StepWindow {
  compute: number
  comm: number
  wait: number
  n: number
}

/** What the report and summary.json say about the run, besides what the recorder collected itself. */
export interface RunSummary {
  readonly title: string
  /** "running" for a snapshot; "finished", "failed" or "interrupted" at the end. */
  readonly state?: string
  readonly error?: string
  readonly restarts: number
  readonly history: ReadonlyArray<Record<string, unknown>>
  readonly incidents?: ReadonlyArray<Incident>
  /** explain.txt's text. */
  readonly plan?: string
}

export class RunRecorder {
  readonly dir: string
  readonly startedAt = new Date()
  readonly #timeline: boolean
  readonly #metrics: fs.WriteStream
  readonly #perRank: fs.WriteStream
  readonly #events: fs.WriteStream
  readonly #logs = new Map<string, fs.WriteStream>()
  readonly #trace: TraceEvent[] = []
  /** metrics.csv's rows and report.html's attempt of each, of the current lineage. */
  readonly #rows = new Lineage<{ readonly row: Record<string, unknown>; readonly attempt: number }>()
  #steps: StepTime[] = []
  readonly #rates = new Map<number, { samples: number; at: number; points: Array<[number, number | null]> }>()
  /** Samples every rank trained since the last report round, and since when (TensorBoard's samples_per_sec). */
  #reportSpan: { readonly at: number; samples: number } | undefined
  /** Each rank's latest sample count heard. */
  readonly #lastSamples = new Map<number, number>()
  /** Step-time sums since the last report, for TensorBoard. */
  #window: StepWindow = { compute: 0, comm: 0, wait: 0, n: 0 }
  #tb: TensorBoardWriter | undefined
  /** Report writes one after the other; none after the final one. */
  #writing: Promise<void> = Promise.resolve()
  #finished = false

  private constructor(dir: string, timeline: boolean) {
    this.dir = dir
    this.#timeline = timeline
    this.#metrics = fs.createWriteStream(path.join(dir, "metrics.jsonl"), { flags: "a" })
    this.#perRank = fs.createWriteStream(path.join(dir, "metrics_per_rank.jsonl"), { flags: "a" })
    this.#events = fs.createWriteStream(path.join(dir, "events.jsonl"), { flags: "a" })
    try {
      this.#tb = new TensorBoardWriter(dir)
    } catch {
      // no TensorBoard file (an unwritable directory fails elsewhere, loudly)
    }
  }

  static async open(dir: string, config: unknown, timeline: boolean): Promise<RunRecorder> {
    await fsp.mkdir(path.join(dir, "logs"), { recursive: true })
    // (a bigint in trainLoopConfig, which the workers get as one, is written as its digits)
    await writeFileAtomic(path.join(dir, "config.json"), JSON.stringify(config, bigintAsDigits, 2))
    return new RunRecorder(dir, timeline)
  }

  get timelineEnabled(): boolean {
    return this.#timeline
  }

  /** The TensorBoard event file, when one could be opened. */
  get tensorboardFile(): string | undefined {
    return this.#tb?.file
  }

  /**
   * A rerun resuming its checkpoint of report `n - 1`: the earlier fit()'s rows of reports 0..n-1
   * (metrics.jsonl's current lineage), shown in metrics.csv and report.html before this run's.
   */
  seed(rows: ReadonlyArray<Record<string, unknown>>): void {
    for (const row of rows) this.#rows.add(Number(row.report), { row, attempt: EARLIER_RUN })
  }

  /**
   * A generation starts afresh at report `index` (a restart from a checkpoint, or a rerun resuming
   * one): the rounds from `index` on are made again, so TensorBoard drops its earlier points of
   * them (metrics.csv and report.html drop the earlier rows as the new ones come).
   */
  restartAt(index: number): void {
    this.#tb?.restartAt(index)
  }

  /**
   * Report round `index` (the run's report number) completed. metrics.jsonl gets every row;
   * metrics.csv and report.html the current lineage (a round made again after a restart replaces
   * the rows from it on).
   */
  metrics(index: number, rank0: Record<string, unknown>, perRank: ReadonlyArray<Record<string, unknown>>, attempt = 0): StepWindow {
    // (a loop cannot report a metric named "report" or "time": train-context.ts; the attempt that made the
    // round is in metrics_per_rank.jsonl, whose metrics sit under `ranks`, as a loop may report its own)
    const row = { report: index, time: new Date().toISOString(), ...rank0 }
    this.#rows.add(index, { row, attempt })
    this.#metrics.write(`${JSON.stringify(row)}\n`)
    this.#perRank.write(`${JSON.stringify({ report: index, attempt, ranks: perRank })}\n`)
    const w = this.#window
    const rate = this.#rateSinceLastReport()
    this.#tb?.scalars(index, rank0)
    this.#tb?.scalars(
      index,
      {
        samples_per_sec: rate,
        ...(w.n > 0 ? { "step_ms/compute": w.compute / w.n, "step_ms/communication": w.comm / w.n, "step_ms/waiting": w.wait / w.n } : {}),
        world_size: perRank.length
      },
      "gradwire/"
    )
    this.#window = { compute: 0, comm: 0, wait: 0, n: 0 }
    return w
  }

  event(e: Record<string, unknown>): void {
    this.#events.write(`${JSON.stringify({ time: new Date().toISOString(), ...e })}\n`)
  }

  /** A line of a worker's output, kept in logs/<prefix>.log. */
  log(source: string, line: string): void {
    const name = source.replace(/[^A-Za-z0-9_=-]+/g, "_").slice(0, 80) || "worker"
    let s = this.#logs.get(name)
    if (!s) {
      s = fs.createWriteStream(path.join(this.dir, "logs", `${name}.log`), { flags: "a" })
      this.#logs.set(name, s)
    }
    s.write(`${line}\n`)
  }

  /** Per-step compute/communication/waiting times of a rank (from its progress messages), for the report. */
  stepTimes(attempt: number, rank: number, times: ReadonlyArray<ReadonlyArray<number>>): void {
    for (const t of times) {
      const [step, fb, comm, apply, wait] = t
      if (typeof step !== "number") continue
      const s = { attempt, rank, step, computeMs: (fb ?? 0) + (apply ?? 0), commMs: comm ?? 0, waitMs: wait ?? 0 }
      this.#steps.push(s)
      this.#window.compute += s.computeMs
      this.#window.comm += s.commMs
      this.#window.wait += s.waitMs
      this.#window.n++
    }
    // Bounded memory on very long runs: thin out evenly rather than dropping the end.
    if (this.#steps.length > MAX_STEP_TIMES) this.#steps = this.#steps.filter((_, i) => i % 2 === 0)
  }

  /**
   * Samples/s of every rank between the last report round (or the first progress heard) and now:
   * TensorBoard's gradwire/samples_per_sec for a round, a figure over the round's whole span
   * (its evaluation and checkpoint included), not one rank's latest instant.
   */
  #rateSinceLastReport(now = Date.now()): number {
    const span = this.#reportSpan
    if (span === undefined) return 0
    this.#reportSpan = { at: now, samples: 0 }
    return now - span.at > 0 ? (span.samples / (now - span.at)) * 1000 : 0
  }

  /** A rank's progress: samples it trained on so far in this attempt (a drop means a new process). Gives the throughput curve. */
  progress(rank: number, samples: number, now = Date.now()): void {
    // Every rank's samples since the last report round: a count that dropped is another process
    // (a restart, a joiner), counted from 0; the first progress heard starts the first span.
    this.#reportSpan ??= { at: now, samples: 0 }
    const seen = this.#lastSamples.get(rank)
    this.#reportSpan.samples += seen === undefined ? 0 : samples >= seen ? samples - seen : samples
    this.#lastSamples.set(rank, samples)
    const r = this.#rates.get(rank)
    if (!r) {
      this.#rates.set(rank, { samples, at: now, points: [] })
      return
    }
    const dt = (now - r.at) / 1000
    if (samples < r.samples) {
      // Another process took the rank (a restart): the curve breaks there.
      if (r.points.length) r.points.push([(now - this.startedAt.getTime()) / 1000, null])
      r.samples = samples
      r.at = now
      return
    }
    if (dt < 0.2) return
    r.points.push([(now - this.startedAt.getTime()) / 1000, (samples - r.samples) / dt])
    r.samples = samples
    r.at = now
    if (r.points.length > MAX_RATE_POINTS) r.points = r.points.filter((_, i) => i % 2 === 0)
  }

  /** Driver-side timeline events (timestamps: wall-clock microseconds, see timeline.ts). */
  trace(e: TraceEvent): void {
    if (this.#timeline) this.#trace.push(e)
  }

  /** A worker's timeline events; each rank is one "process" row of the trace. */
  traceEvents(rank: number, events: ReadonlyArray<unknown>): void {
    if (!this.#timeline) return
    for (const e of events) {
      const ev = e as TraceEvent
      if (typeof ev?.name !== "string" || typeof ev.ts !== "number") continue
      this.#trace.push({ ...ev, pid: rank, tid: ev.tid ?? 0 })
    }
  }

  /** Links of the report: the run directory's files, relative to it. */
  #links(): Array<{ href: string; text: string }> {
    const out = [
      { href: "metrics.csv", text: "metrics.csv" },
      { href: "metrics_per_rank.jsonl", text: "metrics_per_rank.jsonl" },
      { href: "events.jsonl", text: "events.jsonl" },
      { href: "summary.json", text: "summary.json" },
      { href: "config.json", text: "config.json" }
    ]
    if (fs.existsSync(path.join(this.dir, "explain.txt"))) out.push({ href: "explain.txt", text: "explain.txt" })
    if (this.#timeline) out.push({ href: "timeline.json", text: "timeline.json (open in ui.perfetto.dev)" })
    for (const name of [...this.#logs.keys()].sort()) out.push({ href: `logs/${encodeURIComponent(name)}.log`, text: `logs/${name}.log` })
    return out
  }

  #throughput(): Array<{ rank: number; points: Array<readonly [number, number | null]> }> {
    return [...this.#rates.entries()].sort(([a], [b]) => a - b).map(([rank, r]) => ({ rank, points: r.points }))
  }

  async #write(summary: RunSummary, final: boolean): Promise<void> {
    const rows = this.#rows.rows.map((r) => r.row)
    const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))]
    const csv = [keys.join(","), ...rows.map((r) => keys.map((k) => csvCell(r[k])).join(","))].join("\n")
    const at = new Date().toISOString()
    const state = summary.state ?? (final ? (summary.error ? "failed" : "finished") : "running")
    await writeFileAtomic(path.join(this.dir, "metrics.csv"), `${csv}\n`)
    await writeFileAtomic(
      path.join(this.dir, "summary.json"),
      JSON.stringify(
        {
          state,
          startedAt: this.startedAt.toISOString(),
          ...(final ? { finishedAt: at } : { updatedAt: at }),
          error: summary.error ?? null,
          restarts: summary.restarts,
          reports: summary.history.length,
          last: summary.history.at(-1) ?? null,
          incidents: summary.incidents ?? []
        },
        null,
        2
      )
    )
    await writeFileAtomic(
      path.join(this.dir, "report.html"),
      renderReport({
        title: summary.title,
        finishedAt: at,
        state,
        startedAt: this.startedAt.toISOString(),
        error: summary.error,
        restarts: summary.restarts,
        history: summary.history,
        attempts: this.#rows.rows.map((r) => r.attempt),
        steps: this.#steps,
        throughput: this.#throughput(),
        links: this.#links(),
        ...(summary.plan ? { plan: summary.plan } : {}),
        ...(summary.incidents ? { incidents: summary.incidents } : {})
      })
    )
  }

  /** report.html, metrics.csv and summary.json as they stand, while the run goes on (never after finish). */
  snapshot(summary: RunSummary): Promise<void> {
    if (this.#finished) return this.#writing
    this.#writing = this.#writing.then(() => (this.#finished ? undefined : this.#write(summary, false))).catch(() => {})
    return this.#writing
  }

  /** The final report.html, metrics.csv, summary.json and timeline.json; later snapshots write nothing. */
  async finish(summary: RunSummary): Promise<void> {
    this.#finished = true
    const done = this.#writing.then(async () => {
      await this.#write(summary, true)
      if (this.#timeline) await writeFileAtomic(path.join(this.dir, "timeline.json"), this.#timelineJson())
    })
    this.#writing = done.catch(() => {})
    await done
  }

  /** The trace with process/thread names, timestamps shifted so the run starts near 0 (same shift everywhere, so nesting holds). */
  #timelineJson(): string {
    let base = Infinity
    for (const e of this.#trace) if (e.ts < base) base = e.ts
    if (!Number.isFinite(base)) base = 0
    const threads = new Map<string, { pid: number | string; tid: number | string }>()
    for (const e of this.#trace) threads.set(`${e.pid}/${e.tid}`, { pid: e.pid ?? 0, tid: e.tid ?? 0 })
    const pids = [...new Set([...threads.values()].map((t) => t.pid))]
    const meta: TraceEvent[] = [
      ...pids.map((pid) => ({ name: "process_name", ph: "M", ts: 0, pid, tid: 0, args: { name: typeof pid === "number" ? `rank ${pid}` : String(pid) } })),
      // Ranks first, in order, then the driver.
      ...pids.map((pid) => ({ name: "process_sort_index", ph: "M", ts: 0, pid, tid: 0, args: { sort_index: typeof pid === "number" ? pid : 1_000_000 } })),
      ...[...threads.values()].map(({ pid, tid }) => ({ name: "thread_name", ph: "M", ts: 0, pid, tid, args: { name: threadName(tid) } }))
    ]
    const events = this.#trace.map((e) => ({ ...e, ts: e.ts - base }))
    return JSON.stringify({ traceEvents: [...meta, ...events], displayTimeUnit: "ms", otherData: { timeOriginMicros: base } })
  }

  async close(): Promise<void> {
    this.#tb?.close()
    const ends = [this.#metrics, this.#perRank, this.#events, ...this.#logs.values()].map(
      (s) => new Promise<void>((resolve) => s.end(() => resolve()))
    )
    await Promise.all(ends)
  }
}
