// Sizing an elastic group (scalingConfig.numWorkers: { min, max }): the largest size between the
// bounds that the cluster can hold, either for a (re)start of the whole group or to grow a running
// one (where the running group's own workers count as free, since it is replaced). Pure: takes the
// nodes' advertisements and the placement request, unit-tested in test/elastic.test.ts.
import * as Result from "effect/Result"
import type { NodeAdvertisement } from "../../../scheduler/node-info.ts"
import { toNodeResources } from "../../../scheduler/node-info.ts"
import { planPlacement, type PlacementInfeasible, type PlacementPlan, type PlacementRequest } from "../../../scheduler/placement.ts"
import { subtractUsage, usageOfProcesses, type NodeResources } from "../../../scheduler/resources.ts"
import type { ConfigError } from "../../../core/errors.ts"

/** The nodes as the scheduler sees them, with `job`'s own processes counted as free. */
export const releasingJob = (ads: ReadonlyArray<NodeAdvertisement>, job: string): NodeResources[] =>
  ads.map((ad) => {
    const n = toNodeResources(ad)
    const mine = ad.processes.filter((p) => p.job === job)
    if (mine.length === 0 || !n.used) return n
    // (what its own processes hold, GPUs shared with others' workers included, counted as free)
    const used = subtractUsage(n.used, usageOfProcesses(mine))
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
