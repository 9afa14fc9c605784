// Pipeline schedules: the order in which each stage runs the forward (F) and backward (B) passes of
// a batch's micro-batches, and a simulator that says what a schedule costs.
//
// GPipe: every stage runs all m forwards, then all m backwards; a stage holds the inputs of all m
// micro-batches at once. 1F1B (PipeDream-Flush, as Megatron-LM runs it): stage s runs
// min(S - s - 1, m) forwards to fill the pipeline, then alternates one forward and one backward,
// then drains the backwards; it holds at most S - s micro-batches, so activation memory no longer
// grows with m. Both end with one optimizer step per batch (a flush), so both compute exactly the
// batch's gradient; with equal stages both idle (S - 1) / (m + S - 1) of the time (the bubble).
// Backwards run in micro-batch order on every stage, so each link between neighbours carries its
// activations in order one way and its gradients in order the other way.

export type ScheduleName = "gpipe" | "1f1b"

export const scheduleNames: ReadonlyArray<ScheduleName> = ["gpipe", "1f1b"]

export interface PipeOp {
  readonly kind: "F" | "B"
  readonly micro: number
}

/** Stage `stage`'s ops for a batch of `micro` micro-batches in a pipeline of `stages`. */
export const stageOps = (schedule: ScheduleName, stage: number, stages: number, micro: number): PipeOp[] => {
  const F = (i: number): PipeOp => ({ kind: "F", micro: i })
  const B = (i: number): PipeOp => ({ kind: "B", micro: i })
  const ops: PipeOp[] = []
  if (schedule === "gpipe") {
    for (let i = 0; i < micro; i++) ops.push(F(i))
    for (let i = 0; i < micro; i++) ops.push(B(i))
    return ops
  }
  const warm = Math.min(stages - stage - 1, micro)
  for (let i = 0; i < warm; i++) ops.push(F(i))
  for (let i = 0; i < micro - warm; i++) {
    ops.push(F(warm + i))
    ops.push(B(i))
  }
  for (let i = micro - warm; i < micro; i++) ops.push(B(i))
  return ops
}

/** The idle share of an ideal pipeline with equal stages: (S - 1) / (m + S - 1). */
export const bubbleFraction = (stages: number, micro: number): number => (stages - 1) / (micro + stages - 1)

/** Most micro-batches a stage holds inputs of at once (forwarded, not yet backwarded). */
export const peakInFlight = (ops: ReadonlyArray<PipeOp>): number => {
  let live = 0
  let peak = 0
  for (const op of ops) {
    live += op.kind === "F" ? 1 : -1
    peak = Math.max(peak, live)
  }
  return peak
}

export interface SimulatedPipeline {
  /** Time from the first op to the last. */
  readonly makespan: number
  /** Per stage: time spent computing. */
  readonly busy: ReadonlyArray<number>
  /** Per stage: 1 - busy / makespan. */
  readonly bubble: ReadonlyArray<number>
  /** Mean of the stages' bubbles. */
  readonly meanBubble: number
  /** Per stage: peakInFlight of its ops. */
  readonly peakInFlight: ReadonlyArray<number>
}

/**
 * Runs the schedule on paper: each stage does its ops in order, an F needs the previous stage's F
 * of the same micro-batch, a B the next stage's B of it (and its own F); `forward[s]`, `backward[s]`
 * are stage s's op times (one number: the same for every stage), `latency` the time a message
 * takes between stages. Throws on a schedule that deadlocks.
 */
export const simulate = (
  schedule: ScheduleName,
  stages: number,
  micro: number,
  cost: { readonly forward: number | ReadonlyArray<number>; readonly backward: number | ReadonlyArray<number>; readonly latency?: number } = { forward: 1, backward: 2 }
): SimulatedPipeline => {
  const at = (v: number | ReadonlyArray<number>, s: number): number => (typeof v === "number" ? v : v[s])
  const lat = cost.latency ?? 0
  const ops = Array.from({ length: stages }, (_, s) => stageOps(schedule, s, stages, micro))
  const fDone = Array.from({ length: stages }, () => new Array<number>(micro).fill(NaN))
  const bDone = Array.from({ length: stages }, () => new Array<number>(micro).fill(NaN))
  const next = new Array<number>(stages).fill(0)
  const free = new Array<number>(stages).fill(0)
  const busy = new Array<number>(stages).fill(0)
  let left = stages * micro * 2
  while (left > 0) {
    let progressed = false
    for (let s = 0; s < stages; s++) {
      while (next[s] < ops[s].length) {
        const op = ops[s][next[s]]
        let ready: number
        if (op.kind === "F") {
          if (s === 0) ready = 0
          else if (Number.isNaN(fDone[s - 1][op.micro])) break
          else ready = fDone[s - 1][op.micro] + lat
        } else {
          if (Number.isNaN(fDone[s][op.micro])) break
          if (s === stages - 1) ready = fDone[s][op.micro]
          else if (Number.isNaN(bDone[s + 1][op.micro])) break
          else ready = bDone[s + 1][op.micro] + lat
        }
        const d = op.kind === "F" ? at(cost.forward, s) : at(cost.backward, s)
        const start = Math.max(free[s], ready)
        free[s] = start + d
        busy[s] += d
        ;(op.kind === "F" ? fDone : bDone)[s][op.micro] = free[s]
        next[s]++
        left--
        progressed = true
      }
    }
    if (!progressed) throw new Error(`schedule ${schedule} deadlocks with ${stages} stages and ${micro} micro-batches`)
  }
  const makespan = Math.max(...free)
  const bubble = busy.map((b) => 1 - b / makespan)
  return {
    makespan,
    busy,
    bubble,
    meanBubble: bubble.reduce((a, b) => a + b, 0) / stages,
    peakInFlight: ops.map(peakInFlight)
  }
}

/**
 * Sizes of `micro` micro-batches of a batch of `batch` rows: as equal as they can be, the first
 * (batch mod micro) one row larger. Fewer micro-batches when the batch has fewer rows.
 */
export const microBatchSizes = (batch: number, micro: number): number[] => {
  const m = Math.max(1, Math.min(micro, batch))
  const base = Math.floor(batch / m)
  const extra = batch % m
  return Array.from({ length: m }, (_, i) => base + (i < extra ? 1 : 0))
}
