// Cutting a model's layers into pipeline stages: consecutive groups of partition units (a layer, or
// in a functional graph the run of layers between two points where one tensor carries everything
// forward), balanced so the slowest stage is as fast as it can be.
//
// The cost of a stage is its units' measured compute (forward + backward of one micro-batch)
// divided by the relative speed of the worker that runs it, so on mixed hardware a faster worker
// takes more layers (HetPipe's idea). Parameter memory is a limit (no stage may hold more than
// `memoryLimitBytes` of weights, gradients and optimizer state) and the tie-break: among cuts as
// fast as each other, the one whose largest stage holds the fewest bytes. Exact: dynamic
// programming over (stage, first units), O(stages x units^2), which for models of up to a few
// thousand units is nothing next to a training step.
import { ConfigError } from "../../../../core/errors.ts"

/** What one partition unit costs. */
export interface UnitCost {
  /** Forward + backward of one micro-batch, ms (or any unit, the same for every unit). */
  readonly computeMs: number
  /** Bytes of its trainable weights. */
  readonly paramBytes: number
}

/** How to balance: by measured compute (default), by parameter bytes, by unit count, or given counts. */
export type BalanceBy = "compute" | "memory" | "uniform" | ReadonlyArray<number>

export interface PartitionRequest {
  readonly costs: ReadonlyArray<UnitCost>
  readonly stages: number
  readonly balance?: BalanceBy
  /** Relative speed of the worker of each stage (2 = twice as fast). Default all 1. */
  readonly speeds?: ReadonlyArray<number>
  /** Most bytes a stage may hold: its units' paramBytes times `bytesPerParamByte`. */
  readonly memoryLimitBytes?: number
  /** Weights + gradients + optimizer state per weight byte (4 for Adam: w, g, m, v). Default 4. */
  readonly bytesPerParamByte?: number
}

export interface Partition {
  /** Stage s holds units [bounds[s], bounds[s+1]); bounds[0] = 0, bounds[stages] = units. */
  readonly bounds: ReadonlyArray<number>
  /** Each stage's compute divided by its worker's speed. */
  readonly stageMs: ReadonlyArray<number>
  /** Each stage's bytes (paramBytes x bytesPerParamByte). */
  readonly stageBytes: ReadonlyArray<number>
  /** The slowest stage over the mean stage: 1 is perfect balance. */
  readonly imbalance: number
}

const FIELD = "preparePipeline.balance"

const check = (req: PartitionRequest): void => {
  const { costs, stages } = req
  if (!Number.isInteger(stages) || stages < 1) throw new ConfigError({ field: "preparePipeline.stages", reason: `must be an integer >= 1, got ${stages}` })
  if (costs.length < stages) {
    throw new ConfigError({
      field: "preparePipeline.stages",
      reason: `the model has ${costs.length} unit(s) it can be cut between (layers, or runs of layers one tensor leaves), fewer than ${stages} stages: use at most ${costs.length} stages`
    })
  }
  for (const [i, c] of costs.entries()) {
    if (!(c.computeMs >= 0) || !Number.isFinite(c.computeMs) || !(c.paramBytes >= 0)) {
      throw new ConfigError({ field: FIELD, reason: `unit ${i} has cost ${JSON.stringify(c)}: compute and bytes must be finite numbers >= 0` })
    }
  }
  if (req.speeds !== undefined) {
    if (req.speeds.length !== stages || req.speeds.some((s) => !(s > 0) || !Number.isFinite(s))) {
      throw new ConfigError({ field: "preparePipeline.speeds", reason: `needs one positive speed per stage (${stages}), got [${req.speeds.join(", ")}]` })
    }
  }
}

/** Explicit unit counts per stage: checked, turned into bounds. */
const fromCounts = (counts: ReadonlyArray<number>, units: number, stages: number): number[] => {
  if (counts.length !== stages || counts.some((c) => !Number.isInteger(c) || c < 1) || counts.reduce((a, b) => a + b, 0) !== units) {
    throw new ConfigError({
      field: FIELD,
      reason: `explicit counts must be ${stages} integers >= 1 that add up to the model's ${units} unit(s), got [${counts.join(", ")}]`
    })
  }
  const bounds = [0]
  for (const c of counts) bounds.push(bounds.at(-1)! + c)
  return bounds
}

/** Partitions `costs` into `stages` consecutive groups (see the module comment). */
export const partitionUnits = (req: PartitionRequest): Partition => {
  check(req)
  const { costs, stages } = req
  const L = costs.length
  const speeds = req.speeds ?? new Array<number>(stages).fill(1)
  const perByte = req.bytesPerParamByte ?? 4
  const balance = req.balance ?? "compute"
  const weight = (u: UnitCost): number => (balance === "memory" ? u.paramBytes : balance === "uniform" ? 1 : u.computeMs)
  const prefW = [0]
  const prefB = [0]
  const prefC = [0]
  for (const c of costs) {
    prefW.push(prefW.at(-1)! + weight(c))
    prefB.push(prefB.at(-1)! + c.paramBytes * perByte)
    prefC.push(prefC.at(-1)! + c.computeMs)
  }
  const limit = req.memoryLimitBytes ?? Infinity
  let bounds: number[]
  if (Array.isArray(balance)) {
    bounds = fromCounts(balance as ReadonlyArray<number>, L, stages)
  } else {
    // best[s][i]: the best (max time, max bytes) of units [0, i) in stages [0, s]; from[s][i] its cut.
    const time = new Array<Float64Array>(stages)
    const bytes = new Array<Float64Array>(stages)
    const from = new Array<Int32Array>(stages)
    for (let s = 0; s < stages; s++) {
      time[s] = new Float64Array(L + 1).fill(Infinity)
      bytes[s] = new Float64Array(L + 1).fill(Infinity)
      from[s] = new Int32Array(L + 1).fill(-1)
      // stage s ends at unit i (exclusive); it needs s units before it and leaves stages-1-s for after
      for (let i = s + 1; i <= L - (stages - 1 - s); i++) {
        for (let j = s; j < i; j++) {
          const b = prefB[i] - prefB[j]
          if (b > limit) continue
          const t = (prefW[i] - prefW[j]) / speeds[s]
          const prevT = s === 0 ? (j === 0 ? 0 : Infinity) : time[s - 1][j]
          const prevB = s === 0 ? (j === 0 ? 0 : Infinity) : bytes[s - 1][j]
          if (prevT === Infinity) continue
          const mt = Math.max(prevT, t)
          const mb = Math.max(prevB, b)
          // relative tolerance: sums in another order must not decide a tie
          const tol = 1e-9 * Math.max(1, Math.abs(mt))
          if (mt < time[s][i] - tol || (Math.abs(mt - time[s][i]) <= tol && mb < bytes[s][i])) {
            time[s][i] = mt
            bytes[s][i] = mb
            from[s][i] = j
          }
        }
      }
    }
    if (from[stages - 1][L] < 0) {
      const biggest = Math.max(...costs.map((c) => c.paramBytes * perByte))
      throw new ConfigError({
        field: "preparePipeline.memoryLimitBytes",
        reason:
          `no cut into ${stages} stages keeps every stage under ${limit} bytes (weights, gradients and optimizer state; ` +
          `the largest single unit needs ${biggest}, the whole model ${prefB[L]}): use more stages, tensor parallelism, or a higher limit`
      })
    }
    bounds = new Array<number>(stages + 1)
    bounds[stages] = L
    for (let s = stages - 1; s >= 0; s--) bounds[s] = s === 0 ? 0 : from[s][bounds[s + 1]]
  }
  const stageMs: number[] = []
  const stageBytes: number[] = []
  for (let s = 0; s < stages; s++) {
    stageMs.push((prefC[bounds[s + 1]] - prefC[bounds[s]]) / speeds[s])
    stageBytes.push(prefB[bounds[s + 1]] - prefB[bounds[s]])
  }
  const mean = stageMs.reduce((a, b) => a + b, 0) / stages
  return { bounds, stageMs, stageBytes, imbalance: mean > 0 ? Math.max(...stageMs) / mean : 1 }
}

/**
 * Relative speeds of the workers of each stage from each rank's measured time for the same work
 * (the whole model's profile): a stage's replicas all-reduce its gradients, so it runs at the pace
 * of its slowest replica. `rankMs[r]` is rank r's time; `stageOfRank(r)` its stage.
 */
export const stageSpeeds = (rankMs: ReadonlyArray<number>, stages: number, stageOfRank: (rank: number) => number): number[] => {
  const slowest = new Array<number>(stages).fill(0)
  for (const [r, ms] of rankMs.entries()) slowest[stageOfRank(r)] = Math.max(slowest[stageOfRank(r)], ms)
  const ref = Math.min(...slowest.filter((m) => m > 0))
  return slowest.map((m) => (m > 0 && Number.isFinite(ref) ? ref / m : 1))
}
