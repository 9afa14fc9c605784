// The placement strategies (Ray's four), each declared once: its name, what it does, how many
// workers it puts on which node, and what to suggest when it cannot place them all. placement.ts
// plans through the entry of the requested strategy. The names are the config's vocabulary and live
// in core/config.ts (ScalingConfig.placementStrategy), which may not import the scheduler; the
// table below is typed by them, so a name without an entry (or an entry without a name) does not
// compile, and test/scheduler-placement.test.ts checks the two lists match.
import { placementStrategyNames, type PlacementStrategy } from "../core/config.ts"
import { compareNodes, type NodeResources } from "./resources.ts"

/** A node that can take `capacity` (> 0) more workers of this request. */
export interface PlacementCandidate {
  readonly node: NodeResources
  readonly capacity: number
}

/** Workers per node id, or the largest number placeable when the strategy cannot place them all. */
export type Selection =
  | { readonly ok: true; readonly counts: Map<string, number> }
  | { readonly ok: false; readonly reason: string; readonly maxPlaceable: number }

export interface PlacementStrategyEntry {
  readonly name: PlacementStrategy
  /** One line for the docs and error messages. */
  readonly description: string
  /** Workers per node for `n` workers over the eligible nodes (in canonical node order). */
  select(candidates: readonly PlacementCandidate[], n: number): Selection
  /** What to suggest when only `maxPlaceable` (> 0) of `n` workers fit. */
  hint(n: number, maxPlaceable: number): string
}

// Candidate order for PACK and SPREAD: most room first; ties in canonical node order.
const byCapacityDesc = (a: PlacementCandidate, b: PlacementCandidate): number => b.capacity - a.capacity || compareNodes(a.node, b.node)

const total = (candidates: readonly PlacementCandidate[]): number => candidates.reduce((s, f) => Math.min(Number.MAX_SAFE_INTEGER, s + f.capacity), 0)

const shortOf = (candidates: readonly PlacementCandidate[], n: number, placeable: number): string =>
  candidates.length === 0
    ? "no node can take a single worker"
    : `the cluster has room for ${placeable} of ${n} workers (${candidates.length} eligible node${candidates.length === 1 ? "" : "s"})`

const lowerOrAdd = (_n: number, maxPlaceable: number): string => `lower numWorkers to ${maxPlaceable} or resourcesPerWorker, or add nodes`

const PACK = {
  name: "PACK",
  description:
    "as few nodes as possible (best effort): largest free capacity first, and the last, partly filled node is the smallest that still fits the remainder, so big nodes stay whole",
  select(candidates, n) {
    const room = total(candidates)
    if (room < n) return { ok: false, maxPlaceable: room, reason: shortOf(candidates, n, room) }
    const ordered = [...candidates].sort(byCapacityDesc)
    const counts = new Map<string, number>()
    let remaining = n
    let k = 0
    while (remaining > 0) {
      const f = ordered[k++]!
      const take = Math.min(f.capacity, remaining)
      counts.set(f.node.nodeId, take)
      remaining -= take
    }
    // Largest-first gives the fewest nodes; for the last, partly filled one, prefer the smallest
    // node (among it and the unused ones) that still holds the remainder.
    const last = ordered[k - 1]!
    const rest = counts.get(last.node.nodeId)!
    const pool = [last, ...ordered.slice(k)].filter((f) => f.capacity >= rest)
    const bestFit = pool.sort((a, b) => a.capacity - b.capacity || compareNodes(a.node, b.node))[0]!
    if (bestFit !== last) {
      counts.delete(last.node.nodeId)
      counts.set(bestFit.node.nodeId, rest)
    }
    return { ok: true, counts }
  },
  hint: lowerOrAdd
} satisfies PlacementStrategyEntry

const SPREAD = {
  name: "SPREAD",
  description: "as many nodes as possible (best effort): round-robin, one worker per node per round",
  select(candidates, n) {
    const room = total(candidates)
    if (room < n) return { ok: false, maxPlaceable: room, reason: shortOf(candidates, n, room) }
    const ordered = [...candidates].sort(byCapacityDesc)
    const counts = new Map<string, number>()
    let remaining = n
    while (remaining > 0) {
      for (const f of ordered) {
        if (remaining === 0) break
        const c = counts.get(f.node.nodeId) ?? 0
        if (c < f.capacity) {
          counts.set(f.node.nodeId, c + 1)
          remaining--
        }
      }
    }
    return { ok: true, counts }
  },
  hint: lowerOrAdd
} satisfies PlacementStrategyEntry

const STRICT_PACK = {
  name: "STRICT_PACK",
  description: "all workers on one node (the smallest that fits), or PlacementInfeasible",
  select(candidates, n) {
    const fitting = candidates.filter((f) => f.capacity >= n)
    if (fitting.length === 0) {
      const best = candidates.reduce((m, f) => Math.max(m, f.capacity), 0)
      return {
        ok: false,
        maxPlaceable: best,
        reason:
          candidates.length === 0 ? "no node can take a single worker" : `STRICT_PACK needs all ${n} workers on one node, but the roomiest node fits ${best}`
      }
    }
    // Best fit: the smallest node that holds the whole job keeps larger nodes free.
    const chosen = [...fitting].sort((a, b) => a.capacity - b.capacity || compareNodes(a.node, b.node))[0]!
    return { ok: true, counts: new Map([[chosen.node.nodeId, n]]) }
  },
  hint: (_n, maxPlaceable) => `use placementStrategy "PACK" to span nodes, or lower numWorkers to ${maxPlaceable}`
} satisfies PlacementStrategyEntry

const STRICT_SPREAD = {
  name: "STRICT_SPREAD",
  description: "every worker on a distinct node, or PlacementInfeasible",
  select(candidates, n) {
    if (candidates.length < n) {
      return {
        ok: false,
        maxPlaceable: candidates.length,
        reason:
          candidates.length === 0 ? "no node can take a single worker" : `STRICT_SPREAD needs ${n} distinct nodes, but only ${candidates.length} can take a worker`
      }
    }
    const chosen = [...candidates].sort(byCapacityDesc).slice(0, n)
    return { ok: true, counts: new Map(chosen.map((f) => [f.node.nodeId, 1])) }
  },
  hint: (_n, maxPlaceable) => `use placementStrategy "SPREAD", lower numWorkers to ${maxPlaceable}, or add nodes`
} satisfies PlacementStrategyEntry

/** Every strategy, by name: exactly the names core/config.ts declares. */
export const placementStrategyTable: { readonly [K in PlacementStrategy]: PlacementStrategyEntry & { readonly name: K } } = {
  PACK,
  SPREAD,
  STRICT_PACK,
  STRICT_SPREAD
}

/** The strategies in the config's order. */
export const placementStrategyEntries = (): readonly PlacementStrategyEntry[] => placementStrategyNames.map((n) => placementStrategyTable[n])

/** The entry of a strategy name, or undefined for one that is not declared. */
export const findPlacementStrategy = (name: string): PlacementStrategyEntry | undefined =>
  Object.hasOwn(placementStrategyTable, name) ? placementStrategyTable[name as PlacementStrategy] : undefined
