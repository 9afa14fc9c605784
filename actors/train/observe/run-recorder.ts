// The run directory: the resolved config (config.json), metrics history (metrics.jsonl and
// metrics.csv for rank 0, metrics_per_rank.jsonl for every rank), trainer events (events.jsonl),
// per-rank logs (logs/), the timeline (timeline.json, Chrome trace-event format, when enabled),
// the HTML report (report.html) and checkpoints (written by the checkpoint store next to these).
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { writeFileAtomic } from "../../../core/atomic-file.ts"
import { renderReport, type Incident, type StepTime } from "./report-html.ts"
import { threadName, type TraceEvent } from "./timeline.ts"

export type { TraceEvent } from "./timeline.ts"

/** Step times kept per rank for the report; past this many in total, every other one is dropped (the report bins them anyway). */
const MAX_STEP_TIMES = 200_000

const csvCell = (v: unknown): string => {
  const s = v === undefined || v === null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v)
  return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s
}

export class RunRecorder {
  readonly dir: string
  readonly #timeline: boolean
  readonly #metrics: fs.WriteStream
  readonly #perRank: fs.WriteStream
  readonly #events: fs.WriteStream
  readonly #logs = new Map<string, fs.WriteStream>()
  readonly #trace: TraceEvent[] = []
  readonly #rows: Array<Record<string, unknown>> = []
  #steps: StepTime[] = []

  private constructor(dir: string, timeline: boolean) {
    this.dir = dir
    this.#timeline = timeline
    this.#metrics = fs.createWriteStream(path.join(dir, "metrics.jsonl"), { flags: "a" })
    this.#perRank = fs.createWriteStream(path.join(dir, "metrics_per_rank.jsonl"), { flags: "a" })
    this.#events = fs.createWriteStream(path.join(dir, "events.jsonl"), { flags: "a" })
  }

  static async open(dir: string, config: unknown, timeline: boolean): Promise<RunRecorder> {
    await fsp.mkdir(path.join(dir, "logs"), { recursive: true })
    await writeFileAtomic(path.join(dir, "config.json"), JSON.stringify(config, null, 2))
    return new RunRecorder(dir, timeline)
  }

  get timelineEnabled(): boolean {
    return this.#timeline
  }

  metrics(index: number, rank0: Record<string, unknown>, perRank: ReadonlyArray<Record<string, unknown>>): void {
    const row = { report: index, time: new Date().toISOString(), ...rank0 }
    this.#rows.push(row)
    this.#metrics.write(`${JSON.stringify(row)}\n`)
    this.#perRank.write(`${JSON.stringify({ report: index, ranks: perRank })}\n`)
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

  /** Per-step compute/communication times of a rank (from its progress messages), for the report. */
  stepTimes(attempt: number, rank: number, times: ReadonlyArray<ReadonlyArray<number>>): void {
    for (const t of times) {
      const [step, fb, comm, apply] = t
      if (typeof step !== "number") continue
      this.#steps.push({ attempt, rank, step, computeMs: (fb ?? 0) + (apply ?? 0), commMs: comm ?? 0 })
    }
    // Bounded memory on very long runs: thin out evenly rather than dropping the end.
    if (this.#steps.length > MAX_STEP_TIMES) this.#steps = this.#steps.filter((_, i) => i % 2 === 0)
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

  async finish(summary: {
    title: string
    error?: string
    restarts: number
    history: ReadonlyArray<Record<string, unknown>>
    incidents?: ReadonlyArray<Incident>
  }): Promise<void> {
    const keys = [...new Set(this.#rows.flatMap((r) => Object.keys(r)))]
    const csv = [keys.join(","), ...this.#rows.map((r) => keys.map((k) => csvCell(r[k])).join(","))].join("\n")
    const finishedAt = new Date().toISOString()
    await writeFileAtomic(path.join(this.dir, "metrics.csv"), `${csv}\n`)
    await writeFileAtomic(
      path.join(this.dir, "summary.json"),
      JSON.stringify(
        {
          finishedAt,
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
        finishedAt,
        error: summary.error,
        restarts: summary.restarts,
        history: summary.history,
        steps: this.#steps,
        ...(summary.incidents ? { incidents: summary.incidents } : {})
      })
    )
    if (this.#timeline) await writeFileAtomic(path.join(this.dir, "timeline.json"), this.#timelineJson())
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
    const ends = [this.#metrics, this.#perRank, this.#events, ...this.#logs.values()].map(
      (s) => new Promise<void>((resolve) => s.end(() => resolve()))
    )
    await Promise.all(ends)
  }
}
