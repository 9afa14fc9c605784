// Live progress in the driver's terminal: a per-epoch bar with ETA, throughput (samples/s of every
// rank over the epoch so far; a loop without epochs, over 10 s spans), loss and straggler hints on
// a TTY, epochs numbered as the loop's own and metrics.jsonl's (the first is epoch 0); plain lines
// with no control codes when stdout is not a TTY or CI is set (logs stay readable). With progress
// off, only the workers' own output (a loop's console.log, as Ray's log_to_driver) and the run's
// warnings (a callback that threw, a failed checkpoint, a model trained unprepared, ..., on
// stderr) still print, as Keras's verbose=0 still lets Python's warnings through.
import * as settings from "../../../../core/settings.ts"
import { bigintAsDigits } from "./run-recorder.ts"

interface RankProgress {
  epoch: number
  step: number
  stepsPerEpoch: number
  samples: number
  loss: number
  /** The rank's mean loss over its epoch so far, where it had samples. */
  meanLoss?: number
  computeMs: number
  at: number
  /** Smoothed seconds per step. */
  secPerStep: number
  /**
   * The rank's span this point was counted in (its epoch in dp.fit(), else a RATE_WINDOW_MS window
   * of the generation), from its first point there (time, samples): the baseline.
   */
  seg: { readonly key: number; readonly t0: number; readonly s0: number }
  /** The rank's latest completed spans, oldest first: samples and milliseconds, each from its first point to its last. */
  done: ReadonlyArray<{ readonly samples: number; readonly ms: number }>
  /** samples/s over its current span (with the spans before it while that is short), where known. */
  rate: number | undefined
}

/** Completed spans a rank keeps for its rate while its current span is short. */
const SPANS_KEPT = 8

/** gradwire's own files (its source or its dist/ folder): frames there are not the user's. */
const OWN_ROOT = new URL("../../../../", import.meta.url).href

/**
 * The frames of a worker's stack that are in the user's code (not gradwire's, a package's or
 * Node's), at most `max`: where a training loop threw, as `at trainLoop (file:///.../train.ts:14:8)`.
 */
export const loopFrames = (stack: string, max = 3): string[] =>
  stack
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l.startsWith("at ") && !l.includes(OWN_ROOT) && !l.includes("/node_modules/") && !/\(node:|at node:|<anonymous>/.test(l))
    .slice(0, max)

/**
 * The line a run that starts from a checkpoint prints first: the one it was given
 * (resumeFromCheckpoint), or its own latest, where a run of the same name and storage path left
 * checkpoints (as Ray's restore: a rerun goes on rather than starting afresh).
 */
export const resumeLine = (name: string, checkpoint: string, given: boolean): string =>
  given
    ? `gradwire: starting from the checkpoint ${checkpoint}`
    : `gradwire: run "${name}" has checkpoints already: resuming from its latest, ${checkpoint} (another name or storagePath starts afresh)`

/** A value of a config as config.json holds it (a bigint as its digits), for comparing and saying. */
const asJson = (v: unknown): string | undefined => JSON.stringify(v, bigintAsDigits)

/**
 * What changed between the trainLoopConfig a run's checkpoints were made with (`before`, from its
 * config.json) and the one it runs with now: "lr 0.05 (was 0.1)", one entry per top-level key.
 */
export const configChanges = (before: unknown, now: unknown): string[] => {
  if (asJson(before) === asJson(now)) return []
  const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)
  if (!isRecord(before) || !isRecord(now)) return [`${asJson(now) ?? "undefined"} (was ${asJson(before) ?? "undefined"})`]
  const keys = [...new Set([...Object.keys(before), ...Object.keys(now)])]
  return keys
    .filter((k) => asJson(before[k]) !== asJson(now[k]))
    .map((k) => (k in now ? `${k} ${asJson(now[k])}${k in before ? ` (was ${asJson(before[k])})` : " (new)"}` : `${k} (gone, was ${asJson(before[k])})`))
}

/**
 * The warning a run that resumes from its own latest checkpoint gives when its trainLoopConfig is
 * not the one its checkpoints were made with (a rerun of a finished run with a new learning rate or
 * more epochs): what changed, and how to start afresh instead.
 */
export const changedConfigLine = (name: string, changes: ReadonlyArray<string>): string =>
  `gradwire: run "${name}" goes on from its own checkpoint with another trainLoopConfig than it was made with: ${changes.join(", ")}; ` +
  "the loop gets the new one from where the checkpoint left off (a finished run trains no further unless its epochs were raised); another name or storagePath starts afresh"

/** A loop without epochs (hand-written trainStep): its line's samples/s is over spans this long. */
const RATE_WINDOW_MS = 10_000
/** A rank's span shorter than this is counted with its spans before it (too few points to tell). */
const MIN_SPAN_MS = 500

const fmt = (v: unknown): string => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v))

export class ProgressPrinter {
  readonly mode: "bar" | "lines" | "off"
  readonly #ranks = new Map<number, RankProgress>()
  readonly #out: NodeJS.WriteStream
  readonly #err: Pick<NodeJS.WriteStream, "write">
  #barShown = false
  #lastLine = -Infinity
  #genStart = 0
  #worldSize: number

  constructor(setting: boolean | "auto", worldSize: number, out: NodeJS.WriteStream = process.stdout, err: Pick<NodeJS.WriteStream, "write"> = process.stderr) {
    this.#out = out
    this.#err = err
    this.#worldSize = worldSize
    const ci = settings.ci.read()
    this.mode = setting === false ? "off" : out.isTTY && !ci ? "bar" : "lines"
  }

  start(attempt: number, worldSize: number): void {
    // A rank's first point of a generation is its baseline: its samples count from there (a
    // survivor's count since its process started is not this generation's).
    this.#ranks.clear()
    this.#genStart = performance.now()
    this.#worldSize = worldSize
    // (numbered as ctx.attempt and events.jsonl number it: the first is attempt 0)
    if (attempt > 0) this.line(`gradwire: attempt ${attempt} with ${worldSize} workers`)
  }

  /** A rank's progress; `meanLoss` (the mean over its epoch so far) is shown when given, else the step's `loss`. */
  step(p: { rank: number; epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number; meanLoss?: number; computeMs: number }): void {
    if (this.mode === "off") return
    const now = performance.now()
    const prev = this.#ranks.get(p.rank)
    const dt = prev && prev.epoch === p.epoch && p.step > prev.step ? (now - prev.at) / 1000 / (p.step - prev.step) : undefined
    const secPerStep = dt === undefined ? (prev?.secPerStep ?? 0) : prev && prev.secPerStep > 0 ? 0.7 * prev.secPerStep + 0.3 * dt : dt
    this.#ranks.set(p.rank, { ...p, at: now, secPerStep, ...this.#count(p, prev, now) })
    // every rank's rate (a rank not heard in this generation yet adds none)
    const rateNow = [...this.#ranks.values()].reduce((n, r) => n + (r.rate ?? 0), 0)
    if (p.rank !== 0) return
    const pct = p.stepsPerEpoch > 0 ? (p.step + 1) / p.stepsPerEpoch : 0
    const left = Math.max(0, p.stepsPerEpoch - p.step - 1)
    // (no step timed yet, the run's first: an ETA of 0 s would be a guess)
    const eta = left === 0 ? "0.0s" : secPerStep > 0 ? `${(secPerStep * left).toFixed(1)}s` : "-"
    const hint = this.stragglers()
    // Rank 0 without rows (the heterogeneity-aware batcher left it out) has no loss of its own: another rank's.
    const loss = p.meanLoss ?? (Number.isNaN(p.loss) ? [...this.#ranks.values()].find((r) => r.meanLoss !== undefined && r.epoch === p.epoch)?.meanLoss : undefined) ?? p.loss
    const rate = `${rateNow > 0 ? `${Math.round(rateNow)} samples/s  ` : ""}loss ${fmt(loss)}`
    // A hand-written trainStep loop has no epoch length (nor epochs): its steps are counted, no bar or ETA.
    const text =
      (p.stepsPerEpoch > 0
        ? `epoch ${p.epoch} ${this.mode === "bar" ? `[${"#".repeat(Math.round(pct * 24)).padEnd(24, ".")}] ` : ""}` +
          `${String(p.step + 1).padStart(4)}/${p.stepsPerEpoch} ${(pct * 100).toFixed(0).padStart(3)}%  ${rate}  ETA ${eta}`
        : `step ${String(p.step + 1).padStart(5)}  ${rate}`) + (hint ? `  | ${hint}` : "")
    if (this.mode === "bar") {
      this.#out.write(`\r\x1b[2K${text}`)
      this.#barShown = true
    } else if (now - this.#lastLine > 2_000 || p.step + 1 === p.stepsPerEpoch) {
      this.#lastLine = now
      this.#out.write(`${text}\n`)
    }
  }

  /**
   * A rank's span and its rate there: samples/s over its epoch so far (dp.fit()), or its current
   * RATE_WINDOW_MS window (a loop without epochs), with its spans before while that is shorter
   * than MIN_SPAN_MS (an epoch of 0.4 s has two or three points). A rank's first point in an epoch
   * is its baseline there (what it trained before, an evaluation's pause included, is not the
   * epoch's; the worker sends its epoch's first step for that); a window of a loop without epochs
   * goes on from the rank's previous point. The first point of a generation is a baseline too (a
   * survivor's samples since its process started are not this generation's).
   */
  #count(p: { readonly epoch: number; readonly stepsPerEpoch: number; readonly samples: number }, prev: RankProgress | undefined, now: number): Pick<RankProgress, "seg" | "done" | "rate"> {
    const key = p.stepsPerEpoch > 0 ? p.epoch : Math.floor((now - this.#genStart) / RATE_WINDOW_MS)
    let seg = prev?.seg ?? { key, t0: now, s0: p.samples }
    let done = prev?.done ?? []
    if (prev !== undefined && key !== seg.key) {
      const ms = prev.at - seg.t0
      if (ms > 0) done = [...done, { samples: Math.max(0, prev.samples - seg.s0), ms }].slice(-SPANS_KEPT)
      seg = p.stepsPerEpoch > 0 ? { key, t0: now, s0: p.samples } : { key, t0: prev.at, s0: prev.samples }
    }
    let samples = Math.max(0, p.samples - seg.s0)
    let ms = now - seg.t0
    for (let i = done.length - 1; i >= 0 && ms < MIN_SPAN_MS; i--) {
      samples += done[i]!.samples
      ms += done[i]!.ms
    }
    return { seg, done, rate: ms > 0 ? (samples / ms) * 1000 : undefined }
  }

  /** "rank 2 1.8x slower" for ranks whose step time is well above the median. */
  stragglers(): string {
    const times = [...this.#ranks.entries()].filter(([, r]) => r.secPerStep > 0)
    if (times.length < 2) return ""
    const sorted = times.map(([, r]) => r.secPerStep).sort((a, b) => a - b)
    const median = sorted[Math.floor(sorted.length / 2)]
    const slow = times.filter(([, r]) => r.secPerStep > 1.3 * median).map(([rank, r]) => `rank ${rank} ${(r.secPerStep / median).toFixed(1)}x slower`)
    return slow.length ? `stragglers: ${slow.join(", ")}` : ""
  }

  report(index: number, metrics: Record<string, unknown>): void {
    if (this.mode === "off") return
    const parts = Object.entries(metrics)
      .filter(([, v]) => typeof v === "number" || typeof v === "string")
      .map(([k, v]) => `${k}=${fmt(v)}`)
    this.line(`report ${index}: ${parts.join("  ")}`)
  }

  line(text: string): void {
    if (this.mode === "off") return
    if (this.#barShown) {
      this.#out.write("\r\x1b[2K")
      this.#barShown = false
    }
    this.#out.write(`${text}\n`)
  }

  /** Something the run should not keep quiet about: a line with progress on, stderr with it off. */
  warn(text: string): void {
    if (this.mode === "off") this.#err.write(`${text}\n`)
    else this.line(text)
  }

  /** A line of a worker's own output: printed with progress off too. */
  output(text: string): void {
    if (this.mode === "off") this.#out.write(`${text}\n`)
    else this.line(text)
  }

  /** The run's last lines: how it ended, and its run directory. `checkpoint`: the latest checkpoint the Result gives (also one an earlier run of the same name left). */
  summary(dir: string, last: Record<string, unknown> | undefined, error: Error | undefined, checkpoint?: string): void {
    if (this.mode === "off") return
    if (error && (error as { _tag?: unknown })._tag === "Interrupted") this.line(`gradwire: run interrupted: ${error.message}`)
    else if (error) {
      this.line(`gradwire: run failed: ${error.message}`)
      // where a worker's loop threw (TrainingFailed's remoteStack), in the user's code
      const stack = (error as { remoteStack?: unknown }).remoteStack
      for (const f of typeof stack === "string" ? loopFrames(stack) : []) this.line(`gradwire:     ${f}`)
    }
    else if (last) this.line(`gradwire: finished. last metrics: ${Object.entries(last).map(([k, v]) => `${k}=${fmt(v)}`).join("  ")}`)
    else if (checkpoint !== undefined) {
      // A rerun whose loop resumed past its last epoch reports nothing: its Result still has the checkpoint it resumed from.
      this.line(`gradwire: finished, with no report() call from the loop in this run: the Result has no metrics; its checkpoint is the latest one, ${checkpoint}`)
    } else this.line("gradwire: finished, with no report() call from the loop: the Result has no metrics and no checkpoint (a loop keeps them with ctx.report(metrics, { checkpoint }))")
    this.line(`gradwire: run directory: ${dir}`)
    void this.#worldSize
  }

  close(): void {
    if (this.#barShown) {
      this.#out.write("\n")
      this.#barShown = false
    }
  }
}
