// What the alpha-beta cost model (scheduler/cost-model.ts) needs to know of an all-reduce
// algorithm, as plain data: the algorithm's phases, each a list of stages, each a set of flows
// (who sends how many bytes to whom) that run at the same time, repeated some number of times.
// An algorithm declares its stages next to its implementation (collectives/algorithms/), and the
// scheduler prices them without importing the collectives: both layers sit on core, so this
// vocabulary lives here. Pure, no I/O.

/** Where one rank sits. */
export interface RankLocation {
  readonly nodeId: string
  /** NATS server id the rank's connection goes through. */
  readonly server: string
}

/** Index = rank. */
export type Topology = readonly RankLocation[]

/** One transfer in a stage; a flow with several destinations is one publish the server fans out. */
export interface Flow {
  readonly src: number
  readonly dsts: readonly number[]
  readonly bytes: number
}

/** Flows that run concurrently, `times` stages in a row (a pipeline's steady state is one stage, repeated). */
export interface CostStage {
  readonly flows: readonly Flow[]
  readonly times: number
}

/** A named part of an algorithm ("ring reduce-scatter + all-gather"), reported separately. */
export interface CostPhase {
  readonly name: string
  readonly stages: readonly CostStage[]
}

export interface CostInput {
  /** Bytes of the buffer being all-reduced (> 0). */
  readonly bytes: number
  /** At least two ranks. */
  readonly topology: Topology
  /** Chunk of pipelined streams, bytes (> 0). */
  readonly chunkBytes: number
  /** How an algorithm that works per node groups ranks: by node id or by NATS server. */
  readonly hierarchy: "node" | "server"
  /**
   * The call's `fanout` option (what the cost model prices is the communicator's default, true).
   * An algorithm whose stages do not depend on it may ignore it.
   */
  readonly fanout: boolean
}

/** An all-reduce algorithm as the cost model sees it. */
export interface AlgorithmCost {
  readonly name: string
  /** The stages of one all-reduce, as the algorithm runs them; only called with p >= 2 and bytes > 0. */
  stages(input: CostInput): readonly CostPhase[]
}

/** Ranks grouped by node (or server), groups in order of their first (lowest) rank; leader = first member. */
export const nodeGroups = (topo: Topology, by: "node" | "server" = "node"): number[][] => {
  const groups = new Map<string, number[]>()
  topo.forEach((loc, r) => {
    const key = by === "node" ? loc.nodeId : loc.server
    const g = groups.get(key)
    if (g) g.push(r)
    else groups.set(key, [r])
  })
  return [...groups.values()]
}

/** A stream of `bytes` in chunks of at most `chunkBytes`: k chunks of `chunk` bytes each (k >= 1). */
export const chunking = (bytes: number, chunkBytes: number): { k: number; chunk: number } => {
  const k = Math.max(1, Math.ceil(bytes / chunkBytes))
  return { k, chunk: bytes / k }
}
