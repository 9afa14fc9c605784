// The run directory: the resolved config (config.json), metrics history (metrics.jsonl and
// metrics.csv for rank 0, metrics_per_rank.jsonl for every rank), trainer events (events.jsonl),
// per-rank logs (logs/), the timeline (timeline.json, Chrome trace-event format, when enabled) and
// checkpoints (written by the checkpoint store next to these).
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { writeFileAtomic } from "./checkpoint-store.ts"

export interface TraceEvent {
  readonly name: string
  readonly ph: string
  readonly ts: number
  readonly dur?: number
  readonly pid?: number | string
  readonly tid?: number | string
  readonly args?: Record<string, unknown>
}

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
  readonly #origin = performance.now()

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

  /** Driver-side timeline events (timestamps: performance.now() in microseconds). */
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

  async finish(summary: { error?: string; restarts: number; history: ReadonlyArray<Record<string, unknown>> }): Promise<void> {
    const keys = [...new Set(this.#rows.flatMap((r) => Object.keys(r)))]
    const csv = [keys.join(","), ...this.#rows.map((r) => keys.map((k) => csvCell(r[k])).join(","))].join("\n")
    await writeFileAtomic(path.join(this.dir, "metrics.csv"), `${csv}\n`)
    await writeFileAtomic(
      path.join(this.dir, "summary.json"),
      JSON.stringify({ finishedAt: new Date().toISOString(), error: summary.error ?? null, restarts: summary.restarts, reports: summary.history.length, last: summary.history.at(-1) ?? null }, null, 2)
    )
    if (this.#timeline) {
      const ranks = [...new Set(this.#trace.map((e) => e.pid))]
      const meta = ranks.map((pid) => ({ name: "process_name", ph: "M", pid, tid: 0, args: { name: typeof pid === "number" ? `rank ${pid}` : String(pid) } }))
      const base = Math.min(...this.#trace.map((e) => e.ts), this.#origin * 1000)
      const events = this.#trace.map((e) => ({ ...e, ts: e.ts - base }))
      await writeFileAtomic(path.join(this.dir, "timeline.json"), JSON.stringify({ traceEvents: [...meta, ...events], displayTimeUnit: "ms" }))
    }
  }

  async close(): Promise<void> {
    const ends = [this.#metrics, this.#perRank, this.#events, ...this.#logs.values()].map(
      (s) => new Promise<void>((resolve) => s.end(() => resolve()))
    )
    await Promise.all(ends)
  }
}
