// The timeline's vocabulary: Chrome trace-event records (the format Perfetto and chrome://tracing
// open) and the clock they use. Workers and the driver are separate processes, often on separate
// machines, so a per-process performance.now() cannot be compared across them; every timestamp is
// wall-clock microseconds (performance.timeOrigin + performance.now()), rounded to whole
// microseconds. Rounding start and end separately (dur = end - start) keeps containment exact:
// a child that lies inside its parent in milliseconds still lies inside it after rounding.

export interface TraceEvent {
  readonly name: string
  readonly ph: string
  readonly ts: number
  readonly dur?: number
  readonly pid?: number | string
  readonly tid?: number | string
  readonly cat?: string
  readonly args?: Record<string, unknown>
}

/** Wall-clock microseconds of a performance.now() reading of this process. */
export const wallMicros = (perfMs: number): number => Math.round((performance.timeOrigin + perfMs) * 1000)

/** A complete ("X") event from two performance.now() readings. */
export const spanEvent = (
  name: string,
  startMs: number,
  endMs: number,
  tid: number | string,
  args?: Record<string, unknown>,
  cat = "train"
): TraceEvent => {
  const ts = wallMicros(startMs)
  return { name, cat, ph: "X", ts, dur: Math.max(0, wallMicros(endMs) - ts), tid, ...(args ? { args } : {}) }
}

/**
 * Threads ("tid") of a rank's row: the training step and its phases on one, each bucket of the
 * gradient reduction on its own (buckets of one step overlap in time, and overlapping events on
 * one thread do not render), waits outside the step (report, checkpoint hand-over, epoch-end
 * collectives) on another.
 */
export const TID_STEP = 0
export const TID_WAITS = 1
export const tidOfBucket = (bucket: number): number => 10 + bucket

export const threadName = (tid: number | string): string =>
  tid === TID_STEP ? "step" : tid === TID_WAITS ? "waits" : typeof tid === "number" && tid >= 10 ? `bucket ${tid - 10}` : String(tid)
