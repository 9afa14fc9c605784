// Sizing an elastic group (scalingConfig.numWorkers: { min, max }): the largest size between the
// bounds that the cluster can hold, either for a (re)start of the whole group or to grow a running
// one (where the running group's own workers count as free, since it is replaced). Pure: takes the
// nodes' advertisements and the placement request, unit-tested in test/elastic.test.ts.
import { Result } from "effect"
import type { NodeAdvertisement } from "../../../scheduler/node-info.ts"
import { toNodeResources } from "../../../scheduler/node-info.ts"
import { planPlacement, type PlacementInfeasible, type PlacementPlan, type PlacementRequest } from "../../../scheduler/placement.ts"
import type { NodeResources, ResourceUsage } from "../../../scheduler/resources.ts"
import type { ConfigError } from "../../../core/errors.ts"

/** GPU shares less what `mine` (processes each given a fraction of a GPU) hold of them. */
const releasedShares = (shares: Readonly<Record<string, number>>, mine: ReadonlyArray<NodeAdvertisement["processes"][number]>): Record<string, number> => {
  const out: Record<string, number> = { ...shares }
  for (const p of mine) {
    const share = p.resources.GPU
    if (share === undefined || !(share > 0 && share < 1)) continue
    for (const g of p.gpus) out[String(g)] = Math.max(0, (out[String(g)] ?? 0) - share)
  }
  return out
}

/** The nodes as the scheduler sees them, with `job`'s own processes counted as free. */
export const releasingJob = (ads: ReadonlyArray<NodeAdvertisement>, job: string): NodeResources[] =>
  ads.map((ad) => {
    const n = toNodeResources(ad)
    const mine = ad.processes.filter((p) => p.job === job)
    if (mine.length === 0 || !n.used) return n
    const used: ResourceUsage = {
      cpus: Math.max(0, n.used.cpus - mine.reduce((s, p) => s + (p.resources.CPU ?? 0), 0)),
      memoryBytes: Math.max(0, n.used.memoryBytes - mine.reduce((s, p) => s + (p.resources.memory ?? 0), 0)),
      gpuIndices: n.used.gpuIndices.filter((g) => !mine.some((p) => p.gpus.includes(g))),
      ...(n.used.gpuShares ? { gpuShares: releasedShares(n.used.gpuShares, mine) } : {}),
      custom: Object.fromEntries(
        Object.entries(n.used.custom).map(([k, v]) => [k, Math.max(0, v - mine.reduce((s, p) => s + (p.resources[k] ?? 0), 0))])
      )
    }
    return { ...n, used }
  })

/** The nodes as they would be with nothing running on them. */
export const idle = (nodes: ReadonlyArray<NodeResources>): NodeResources[] => nodes.map(({ used: _used, ...n }) => n)

/**
 * The largest world size in [min, max] that fits `nodes`, with its plan; or the placement error of
 * `min` when not even that fits.
 */
export const planLargest = (
  request: Omit<PlacementRequest, "numWorkers">,
  bounds: { readonly min: number; readonly max: number },
  nodes: ReadonlyArray<NodeResources>
): Result.Result<PlacementPlan, PlacementInfeasible | ConfigError> => {
  for (let n = bounds.max; n > bounds.min; n--) {
    const plan = planPlacement({ ...request, numWorkers: n }, nodes)
    if (Result.isSuccess(plan)) return plan
  }
  return planPlacement({ ...request, numWorkers: bounds.min }, nodes)
}

/** The largest size above `current` (up to max) that a regroup could use, or undefined. */
export const growTo = (
  request: Omit<PlacementRequest, "numWorkers">,
  current: number,
  max: number,
  nodes: ReadonlyArray<NodeResources>
): number | undefined => {
  for (let n = max; n > current; n--) {
    if (Result.isSuccess(planPlacement({ ...request, numWorkers: n }, nodes))) return n
  }
  return undefined
}
