// Where a rank sits in the model-parallel grid: data-parallel replica x pipeline stage x
// tensor-parallel rank. rank = (replica * stages + stage) * tp + tpRank, so the tensor-parallel
// ranks of a stage, which all-reduce inside every forward and backward, are neighbours (on one
// node under PACK placement), then the stages of one pipeline, then the replicas.
import { ConfigError } from "../../../../core/errors.ts"

export interface GridShape {
  readonly replicas: number
  readonly stages: number
  readonly tp: number
}

export interface GridPlace extends GridShape {
  readonly rank: number
  readonly replica: number
  readonly stage: number
  readonly tpRank: number
}

/** The grid of a world: stages x tp must divide the world size; the quotient is the replica count. */
export const gridShape = (worldSize: number, stages: number, tp: number): GridShape => {
  for (const [field, v] of [["stages", stages], ["tensorParallel", tp]] as const) {
    if (!Number.isInteger(v) || v < 1) throw new ConfigError({ field: `preparePipeline.${field}`, reason: `must be an integer >= 1, got ${v}` })
  }
  if (worldSize % (stages * tp) !== 0) {
    throw new ConfigError({
      field: "preparePipeline.stages",
      reason:
        `stages (${stages}) x tensorParallel (${tp}) = ${stages * tp} must divide the number of workers (${worldSize}); ` +
        `the quotient is the number of data-parallel replicas: use numWorkers ${stages * tp * Math.max(1, Math.round(worldSize / (stages * tp)))}`
    })
  }
  return { replicas: worldSize / (stages * tp), stages, tp }
}

export const placeOf = (rank: number, g: GridShape): GridPlace => ({
  ...g,
  rank,
  tpRank: rank % g.tp,
  stage: Math.floor(rank / g.tp) % g.stages,
  replica: Math.floor(rank / (g.tp * g.stages))
})

export const rankAt = (g: GridShape, replica: number, stage: number, tpRank: number): number => (replica * g.stages + stage) * g.tp + tpRank

/** The ranks that all-reduce a stage's gradients: the same stage and tensor rank in every replica. */
export const replicaGroup = (p: GridPlace): number[] => Array.from({ length: p.replicas }, (_, d) => rankAt(p, d, p.stage, p.tpRank))

/** The tensor-parallel ranks of this rank's stage in its replica. */
export const tensorGroup = (p: GridPlace): number[] => Array.from({ length: p.tp }, (_, t) => rankAt(p, p.replica, p.stage, t))
