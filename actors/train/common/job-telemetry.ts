// What a job's driver says about the job on the bus, for people watching it from other processes
// (`gradwire dashboard`, `gradwire jobs`, `gradwire logs`, Prometheus through the dashboard):
// its state (published about once a second and kept in a JetStream KV bucket, so ended jobs stay
// listed), its live curves (per-rank step progress and report rounds, batched), and answers to
// requests for its history and its workers' log tails. JSON rather than msgpack: these are small,
// and `nats sub` / `nats kv get` show them as they are.
import type { Incident } from "./observe/report-html.ts"

export type JobState = "starting" | "scheduling" | "running" | "restarting" | "resizing" | "finished" | "failed" | "interrupted"

/** Ended jobs stay in the jobs KV bucket this long, and at most this many (the oldest go first). */
export const JOBS_KEPT_MS = 7 * 24 * 3600_000
export const JOBS_KEPT = 1_000

export const ENDED_STATES: ReadonlySet<JobState> = new Set(["finished", "failed", "interrupted"])

/** A rank's live figures: the latest step, recent rates, and totals over the whole job (every attempt). */
export interface RankStats {
  readonly rank: number
  readonly actor?: string
  readonly node?: string
  readonly pid?: number
  readonly attempt: number
  readonly epoch: number
  readonly step: number
  readonly stepsPerEpoch: number
  readonly loss: number
  /** Recent samples per second (smoothed). */
  readonly samplesPerSec: number
  /** Recent milliseconds per step (each progress message's mean, smoothed over messages). */
  readonly computeMs: number
  readonly commMs: number
  readonly waitMs: number
  /** Totals over the job. */
  readonly steps: number
  readonly samples: number
  readonly computeMsTotal: number
  readonly commMsTotal: number
  readonly waitMsTotal: number
  /** Bytes on the rank's collective connections (gradients, control), sent and received, over the job. */
  readonly bytesSent: number
  readonly bytesReceived: number
  readonly updatedAt: number
}

export interface JobCheckpoint {
  readonly path: string
  readonly metrics: Record<string, unknown>
}

export interface JobSnapshot {
  readonly v: 1
  readonly job: string
  readonly name: string
  readonly cluster: string
  readonly state: JobState
  readonly startedAt: number
  readonly updatedAt: number
  readonly endedAt?: number
  readonly error?: string
  readonly attempt: number
  readonly worldSize: number
  readonly minWorkers: number
  readonly maxWorkers: number
  readonly restarts: number
  readonly countedFailures: number
  readonly resizes: ReadonlyArray<{ readonly time: string; readonly attempt: number; readonly from: number; readonly to: number; readonly reason: string }>
  /** The configured strategy: all-reduce algorithm and compression as asked ("auto": see plan). */
  readonly strategy: { readonly strategy: string; readonly algorithm: string; readonly compression: string; readonly zeroStage: number }
  /** The all-reduce plan (and strategy "auto"'s choice) as the workers explained it: explain.txt / explain.json. */
  readonly plan?: { readonly summary: string; readonly text: string; readonly json: unknown }
  readonly reports: number
  /** Rank 0's last report (numbers and strings). */
  readonly lastMetrics?: Record<string, unknown>
  readonly checkpoints: { readonly count: number; readonly latest?: JobCheckpoint; readonly best?: JobCheckpoint }
  /** The last few restarts, resizes, outages and errors. */
  readonly incidents: ReadonlyArray<Incident>
  readonly ranks: ReadonlyArray<RankStats>
  readonly runDir: string
  readonly driver: { readonly host: string; readonly pid: number }
  /** The NATS server(s), without credentials. */
  readonly address: string
  /** The dashboard this driver serves (runConfig.dashboard). */
  readonly dashboard?: string
}

/** One progress message of a rank, as a point of its live curves. */
export interface ProgressPoint {
  readonly rank: number
  readonly attempt: number
  /** Wall-clock ms. */
  readonly t: number
  readonly epoch: number
  readonly step: number
  readonly loss: number
  readonly samplesPerSec: number
  readonly computeMs: number
  readonly commMs: number
  readonly waitMs: number
}

/** A completed report round: rank 0's metrics and every rank's (numbers only). */
export interface ReportRound {
  readonly index: number
  readonly t: number
  readonly attempt: number
  readonly metrics: Record<string, number>
  readonly perRank: ReadonlyArray<Record<string, number>>
}

/** What the driver publishes on jobTelemetry, a few times a second while the job trains. */
export interface Telemetry {
  readonly job: string
  readonly points: ReadonlyArray<ProgressPoint>
  readonly reports: ReadonlyArray<ReportRound>
}

/** A line of a worker's output. */
export interface LogLine {
  readonly t: number
  readonly actor: string
  readonly rank?: number
  readonly node: string
  readonly pid: number
  readonly stream: string
  readonly line: string
}

export type JobQuery = { readonly what: "history" } | { readonly what: "logs"; readonly rank?: number; readonly lines?: number }

export interface JobHistory {
  readonly snapshot: JobSnapshot
  readonly points: ReadonlyArray<ProgressPoint>
  readonly reports: ReadonlyArray<ReportRound>
}

const enc = new TextEncoder()
const dec = new TextDecoder()

export const encodeJson = (value: unknown): Uint8Array => enc.encode(JSON.stringify(value))

/** Parses a JSON message; undefined when it is not JSON (a malformed message is never fatal here). */
export const decodeJson = <A>(bytes: Uint8Array): A | undefined => {
  try {
    return JSON.parse(dec.decode(bytes)) as A
  } catch {
    return undefined
  }
}

export const isSnapshot = (v: unknown): v is JobSnapshot =>
  typeof v === "object" && v !== null && (v as JobSnapshot).v === 1 && typeof (v as JobSnapshot).job === "string" && typeof (v as JobSnapshot).state === "string"

/** Numbers only: what curves and Prometheus can use of a metrics record. */
export const numericMetrics = (m: Record<string, unknown> | undefined): Record<string, number> => {
  const out: Record<string, number> = {}
  for (const [k, v] of Object.entries(m ?? {})) if (typeof v === "number" && Number.isFinite(v)) out[k] = v
  return out
}

/** The rank a worker actor's name stands for in its first generation ("w<generation>-<rank>"). */
export const rankOfActor = (actor: string): number | undefined => {
  const m = /^w\d+-(\d+)$/.exec(actor)
  return m ? Number(m[1]) : undefined
}
