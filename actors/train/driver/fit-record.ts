// What one fit() run records as it goes (fit-run.ts carries the run out): its report rounds,
// incidents (a progress line, events.jsonl, report.html), resizes, checkpoint errors, bus outages,
// the explanations behind explain.txt / explain.json, the user's callbacks (a callback that throws
// is an incident, never fatal), the report refreshed while it trains, and the Result at the end.
import * as fs from "node:fs/promises"
import * as path from "node:path"
import type { CheckpointEntry, CheckpointStorage } from "./checkpoint-store.ts"
import type { CompletedRound } from "./controller.ts"
import type { Resolved, TrainerCallbacks } from "./options.ts"
import { PARITY_METRIC, UNPREPARED_HINT, UNPREPARED_METRIC } from "../common/train-protocol.ts"
import type { BusOutage, CheckpointError, CheckpointInfo, Resize, Result } from "./result.ts"
import type { Incident } from "../common/observe/report-html.ts"
import type { ProgressPrinter } from "../common/observe/progress.ts"
import { currentLineage, Lineage, rowMetrics, type RunRecorder, type StepWindow } from "../common/observe/run-recorder.ts"
import type { JobMonitor } from "./job-monitor.ts"
import { firstLine } from "../../../core/errors.ts"

/** report.html, metrics.csv and summary.json are rewritten after report rounds at most this often. */
const REPORT_REFRESH_MIN_MS = 2_000

export type Explained = Record<string, { readonly text: string; readonly json: unknown }>

/** The ranks' "kernels" explanations (keys "kernels.<rank>"), by rank. */
const kernelParts = (parts: Readonly<Explained>) =>
  Object.entries(parts)
    .filter(([k]) => k.startsWith("kernels."))
    .sort(([a], [b]) => Number(a.slice(8)) - Number(b.slice(8)))
    .map(([, v]) => v)

/** The all-reduce plan of the run, (strategy "auto") its strategy and the collective and heartbeat deadlines, as explained last. */
const writeExplain = async (dir: string, parts: Readonly<Explained>): Promise<void> => {
  const alg = parts.algorithm
  const strat = parts.strategy
  const kernels = kernelParts(parts)
  const deadlines = [parts.deadlines, parts.heartbeat].filter((p) => p !== undefined)
  const text = [alg?.text, strat?.text, deadlines.length ? deadlines.map((d) => d.text).join("\n") : undefined, kernels.length ? `backends and kernels:\n${kernels.map((k) => k.text).join("\n")}` : undefined]
    .filter((t) => t !== undefined)
    .join("\n\n")
  // explain.json stays the all-reduce plan's object, with the strategy's choice under "strategy",
  // each rank's backend and kernels under "kernels" and the collective and heartbeat deadlines
  // under "deadlines" and "heartbeat".
  const base = strat ? { ...((alg?.json as object | undefined) ?? {}), strategy: strat.json } : alg?.json
  const withKernels = kernels.length ? { ...((base as object | undefined) ?? {}), kernels: kernels.map((k) => k.json) } : base
  const json = deadlines.length
    ? {
        ...((withKernels as object | undefined) ?? {}),
        ...(parts.deadlines ? { deadlines: parts.deadlines.json } : {}),
        ...(parts.heartbeat ? { heartbeat: parts.heartbeat.json } : {})
      }
    : withKernels
  await fs.writeFile(path.join(dir, "explain.txt"), `${text}\n`)
  await fs.writeFile(path.join(dir, "explain.json"), `${JSON.stringify(json, null, 2)}\n`)
}

/** The Result of a run that stopped before its first generation. */
export const emptyResult = (dir: string): Result => ({
  metrics: undefined,
  metricsHistory: [],
  metricsPerRank: [],
  checkpoint: undefined,
  bestCheckpoints: [],
  path: dir,
  restarts: 0,
  countedFailures: 0,
  resizes: [],
  checkpointErrors: [],
  busOutages: [],
  natsServerRestarts: 0
})

/** Steps each rank must have made since the previous report round for scalingNote to judge them. */
const SCALING_MIN_STEPS = 20

/**
 * Whether a group of `p` workers trains fewer samples a second than one worker would: a step's
 * exchange (the all-reduce, or the servers' push and pull, with the wait for the slowest rank)
 * takes longer than the computation the other p - 1 workers take off one worker (with compute c
 * and exchange m a step, the group trains p x c / (c + m) of one worker's samples a second, one
 * worker's compute scaling with its batch). Means over every rank's steps of `w` (the steps since
 * the previous report round); at least SCALING_MIN_STEPS each. What to say, or undefined.
 */
export const scalingNote = (p: number, w: StepWindow): { readonly text: string; readonly figures: Record<string, number> } | undefined => {
  if (p < 2 || w.n < SCALING_MIN_STEPS * p) return undefined
  const compute = w.compute / w.n
  const exchange = w.comm / w.n
  if (!(compute > 0) || exchange <= (p - 1) * compute) return undefined
  const pace = (p * compute) / (compute + exchange)
  return {
    text:
      `the ${p} workers spend ${exchange.toFixed(1)} ms a step exchanging gradients (with the wait for the slowest rank) against ${compute.toFixed(1)} ms computing: ` +
      `they train about ${Math.round(pace * 100)}% of one worker's samples a second here (a step's computation is short for the gradients it exchanges); ` +
      "a larger batch per worker, fewer workers or gradient compression (collectiveConfig.compression) would pay",
    figures: { workers: p, computeMs: Math.round(compute * 100) / 100, exchangeMs: Math.round(exchange * 100) / 100, ofOneWorker: Math.round(pace * 100) / 100 }
  }
}

export class FitRecord {
  /** The run's report rounds of its current lineage (a round made again after a restart replaces those from it on): rank 0's metrics and every rank's. */
  readonly #rounds = new Lineage<{ readonly rank0: Record<string, unknown>; readonly perRank: ReadonlyArray<Record<string, unknown>> }>()

  /** Rank 0's metrics of each report round of the current lineage. */
  get history(): Array<Record<string, unknown>> {
    return this.#rounds.rows.map((r) => r.rank0)
  }
  /**
   * The run's report number of the current generation's round 0: 0 for a fresh start, the
   * checkpoint's report + 1 for a generation (or a rerun) resuming one; a regroup keeps it
   * (startsAt, as each generation starts).
   */
  #reportBase = 0

  get reportBase(): number {
    return this.#reportBase
  }

  /** A generation starts afresh with its round 0 at report `report`: the rounds from it on are made again. */
  startsAt(report: number): void {
    this.#reportBase = report
    this.recorder.restartAt(report)
  }
  readonly resizes: Resize[] = []
  readonly checkpointErrors: CheckpointError[] = []
  readonly busOutages: BusOutage[] = []
  readonly incidents: Incident[] = []
  natsServerRestarts = 0
  serverRestartedDuringOutage = false
  restarts = 0
  /** The latest explanations by part (the all-reduce plan; strategy "auto"'s choice): explain.txt / explain.json. */
  readonly explained: Explained = {}
  readonly planSummaries: Record<string, string> = {}
  // Watchers in other processes (the dashboard, gradwire jobs/logs) hear about the job through
  // the monitor (set once the cluster is up).
  monitor: JobMonitor | undefined
  #reportAt = 0
  #lastSize: number | undefined
  /** Why the next generation may have another size (the last restart's cause). */
  lastCause: string | undefined
  /** Resolved once the run directory's final files are written (a Ctrl-C waits for it before the process goes). */
  #markWritten!: () => void
  readonly written = new Promise<void>((resolve) => (this.#markWritten = resolve))
  readonly #cfg: Resolved
  readonly recorder: RunRecorder
  readonly progress: ProgressPrinter
  /** The run said whether its workers pay for their exchange (at its second report round; once per run). */
  #scalingSaid = false
  /** The run said that ranks train a model they never prepared (once per run). */
  #unpreparedSaid = false
  /** The run said that a loop ended with accumulated micro-batches no update applied (once per run). */
  #unappliedSaid = false

  /** A rank's loop ended with micro-batches it accumulated and no update applied (said once per run). */
  unappliedAccumulation(rank: number, left: { readonly microBatches: number; readonly samples: number }): void {
    if (this.#unappliedSaid) return
    this.#unappliedSaid = true
    this.incident(
      "accumulation",
      `rank ${rank}'s loop ended with ${left.microBatches} micro-batch(es) (${left.samples} samples) that trainStep(x, y, { accumulate: true }) added and no update applied: ` +
        "their gradients were dropped; end an accumulation with a trainStep without accumulate (dp.fit's accumulationSteps does so at every epoch's end)",
      { type: "unapplied-accumulation", rank, microBatches: left.microBatches, samples: left.samples }
    )
  }

  constructor(cfg: Resolved, recorder: RunRecorder, progress: ProgressPrinter) {
    this.#cfg = cfg
    this.recorder = recorder
    this.progress = progress
  }

  /** Something that happened to the run: a progress line (stderr with progress off), events.jsonl, report.html, summary.json. */
  readonly incident = (kind: Incident["kind"], text: string, event: Record<string, unknown>): void => {
    this.incidents.push({ time: new Date().toISOString(), kind, text })
    this.recorder.event(event)
    this.progress.warn(`gradwire: ${text}`)
    this.monitor?.changed()
  }

  // A user callback that throws is logged and recorded, never dropped and never fatal.
  callbacks(name: string, call: (cb: TrainerCallbacks) => unknown): Promise<void> {
    const failed = (e: unknown): void => {
      const err = e instanceof Error ? e : new Error(String(e))
      this.incident("callback", `callback ${name} threw: ${err.message}`, { type: "callback-error", callback: name, message: err.message, stack: err.stack ?? "" })
    }
    const pending: Array<Promise<unknown>> = []
    for (const cb of this.#cfg.callbacks) {
      try {
        const r = call(cb)
        if (r instanceof Promise) pending.push(r.catch(failed))
      } catch (e) {
        failed(e)
      }
    }
    return Promise.all(pending).then(() => undefined)
  }

  planText(): string | undefined {
    return [this.explained.algorithm?.text, this.explained.strategy?.text].filter((t) => t !== undefined).join("\n\n") || undefined
  }

  /** summary.json's and report.html's view of the run. */
  summary(state: string, failure?: Error) {
    const plan = this.planText()
    return {
      title: this.#cfg.name,
      state,
      ...(failure ? { error: failure.message } : {}),
      restarts: this.restarts,
      history: this.history,
      incidents: this.incidents,
      ...(plan !== undefined ? { plan } : {})
    }
  }

  refreshReport(force: boolean): void {
    if (!force && Date.now() - this.#reportAt < REPORT_REFRESH_MIN_MS) return
    this.#reportAt = Date.now()
    void this.recorder.snapshot(this.summary("running"))
  }

  /** A part of explain.txt / explain.json (said on the progress line and in events.jsonl when it has a summary); the write to queue. */
  explain(part: string, text: string, json: unknown, summary?: string): () => Promise<void> {
    if (summary) {
      this.progress.line(summary)
      this.recorder.event({ type: "explain", summary })
    }
    this.explained[part] = { text, json }
    return () => writeExplain(this.#cfg.runDir, this.explained)
  }

  /** A completed report round: history, metrics.csv, the monitor, the progress line, a parity repair, onReport. */
  round(round: CompletedRound<unknown>): void {
    const { metrics } = round
    const index = this.#reportBase + round.index
    this.#rounds.add(index, { rank0: metrics[0], perRank: [...metrics] })
    const steps = this.recorder.metrics(index, metrics[0], metrics, round.attempt)
    this.monitor?.report(index, round.attempt, metrics[0], metrics)
    this.refreshReport(false)
    this.progress.report(index, metrics[0])
    if (!this.#scalingSaid && round.attempt === 0 && round.index >= 1) {
      // (from the second round: the first holds the warm-up and the all-reduce's tuning calls)
      this.#scalingSaid = true
      const note = scalingNote(metrics.length, steps)
      if (note !== undefined) {
        this.progress.line(`gradwire: ${note.text}`)
        this.recorder.event({ type: "scaling", round: index, ...note.figures })
      }
    }
    const repaired = metrics[0]?.[PARITY_METRIC]
    if (typeof repaired === "number" && repaired > 0) {
      const ranks = String(metrics[0]?.[`${PARITY_METRIC}_ranks`] ?? "").split(" ").map(Number)
      this.incident("parity", `report round ${index}: the weights or optimizer state of rank(s) ${ranks.join(", ")} differed from rank 0's; they took rank 0's (a bit flip, or the loop changing weights outside dp.trainStep / dp.fit on some ranks: optimizer.minimize, setWeights or assign)`, {
        type: "parity-repair",
        attempt: round.attempt,
        round: index,
        ranks
      })
    }
    // Ranks that trained a model they never prepared: said once per run (the first round it shows).
    const unprepared = metrics.flatMap((m, rank) => (typeof m?.[UNPREPARED_METRIC] === "number" ? [{ rank, n: m[UNPREPARED_METRIC] as number }] : []))
    if (unprepared.length > 0 && !this.#unpreparedSaid) {
      this.#unpreparedSaid = true
      const n = unprepared.reduce((s, u) => s + u.n, 0)
      this.incident("unprepared", `report round ${index}: rank(s) ${unprepared.map((u) => u.rank).join(", ")} made ${UNPREPARED_HINT(n)}`, {
        type: "unprepared-training",
        attempt: round.attempt,
        round: index,
        ranks: unprepared.map((u) => u.rank),
        updates: n
      })
    }
    void this.callbacks("onReport", (cb) => cb.onReport?.({ index, metrics: metrics[0], perRank: metrics }))
  }

  /**
   * A rerun resuming its checkpoint of report `upTo - 1`: the earlier fit()'s rounds 0..upTo-1 (the
   * current lineage of metrics.jsonl and metrics_per_rank.jsonl) come first in the history, the
   * Result, metrics.csv and report.html.
   */
  seed(rows: ReadonlyArray<Record<string, unknown>>, perRank: ReadonlyArray<{ readonly report: number; readonly ranks: ReadonlyArray<Record<string, unknown>> }>, upTo: number): void {
    const earlier = currentLineage(rows, (r) => Number(r.report)).filter((r) => Number(r.report) < upTo)
    const ranksOf = new Map(currentLineage(perRank, (r) => r.report).map((r) => [r.report, r.ranks]))
    for (const r of earlier) {
      const m = rowMetrics(r)
      this.#rounds.add(Number(r.report), { rank0: m, perRank: [...(ranksOf.get(Number(r.report)) ?? [m])] })
    }
    this.recorder.seed(earlier)
  }

  /** A checkpoint that could not be written: training goes on. */
  checkpointFailed(index: number, attempts: number, message: string): void {
    this.checkpointErrors.push({ time: new Date().toISOString(), round: index, message, attempts })
    this.incident("checkpoint", `the checkpoint of report round ${index} could not be written (${attempts} attempt(s)): ${firstLine(message)}; training goes on`, {
      type: "checkpoint-error",
      round: index,
      attempts,
      message
    })
  }

  /** A report round's checkpoint left unwritten because it cannot be resumed from (`why`); the previous one stays the latest. */
  checkpointSkipped(index: number, why: string): void {
    this.incident("checkpoint", `the checkpoint of report round ${index} is not written: ${why}; the previous one stays the latest, and training goes on`, {
      type: "checkpoint-skipped",
      round: index,
      reason: why
    })
  }

  /** A generation of another size than the last one: a resize (elastic shrink or growth). */
  noteSize(attempt: number, size: number): void {
    if (this.#lastSize !== undefined && size !== this.#lastSize) {
      const resize: Resize = { time: new Date().toISOString(), attempt, from: this.#lastSize, to: size, reason: this.lastCause ?? "capacity changed" }
      this.resizes.push(resize)
      this.incident("resize", `the group ${resize.to > resize.from ? "grows" : "shrinks"} from ${resize.from} to ${resize.to} workers (${resize.reason})`, { type: "resize", ...resize })
    }
    this.#lastSize = size
  }

  /**
   * A fixed-size group that lost a worker and ended before its replacement joined: said (once the
   * training ended well, before the run's files close), where the resizes alone (3 -> 2, no way
   * back) had been the only sign.
   */
  finishedShortHanded(): void {
    const size = this.#lastSize
    if (size === undefined || this.#cfg.minWorkers !== this.#cfg.maxWorkers || size >= this.#cfg.maxWorkers) return
    const since = this.resizes.at(-1)
    this.incident(
      "resize",
      `the run finished short-handed, with ${size} of its ${this.#cfg.maxWorkers} workers${since ? ` since ${since.time} (${since.reason})` : ""}: ` +
        "the replacement was not ready before the training ended (a longer run, or failureConfig.spares, has it join)",
      { type: "finished-short-handed", workers: size, of: this.#cfg.maxWorkers }
    )
  }

  /** The run directory's final files, the summary line, and the Result. */
  async result(store: CheckpointStorage, state: string, error: Error | undefined, countedFailures: number): Promise<Result> {
    const where = store.location
    const info = (e: CheckpointEntry): CheckpointInfo => ({ path: e.path, metrics: e.metrics, ...(where ? { objectStore: where } : {}) })
    const latest = store.latest()
    try {
      await this.recorder.finish(this.summary(state, error))
    } finally {
      this.#markWritten()
    }
    this.progress.summary(this.recorder.dir, this.history.at(-1), error, latest?.path)
    return {
      metrics: this.history.at(-1),
      metricsHistory: this.history,
      metricsPerRank: this.#rounds.rows.map((r) => [...r.perRank]),
      checkpoint: latest ? info(latest) : undefined,
      bestCheckpoints: store.best().map(info),
      path: this.#cfg.runDir,
      restarts: this.restarts,
      countedFailures,
      resizes: this.resizes,
      checkpointErrors: this.checkpointErrors,
      busOutages: this.busOutages,
      natsServerRestarts: this.natsServerRestarts
    }
  }
}
