// What a parameter server's shard and its clients (the workers' ps-client.ts) both speak of: the
// server's mode and what a checkpoint keeps of a shard. The shard's logic is parameter-server/shard.ts.
import type { FlatOptimizerState } from "./optim/flat-optimizers.ts"

/** How a parameter server applies pushes: every worker's gradient of a step together, each as it comes, or with bounded staleness. */
export type PsMode = "sync" | "async" | "ssp"

/** What a checkpoint keeps of a shard (the gradients of a sync step still collecting are not kept). */
export interface ShardServerState {
  readonly params: Float32Array
  /** Updates applied. */
  readonly version: number
  /** The optimizer's current learning rate (a push's learningRate changes it). */
  readonly learningRate: number
  readonly optimizer: FlatOptimizerState
  /** Per worker: steps pushed (its last step + 1; 0 = none yet). Restored by load(s, { workers: "continue" }) only. */
  readonly clocks: readonly number[]
  /** sync: the last step applied (-1: none). Restored by load(s, { workers: "continue" }) only. */
  readonly lastAppliedStep: number
}
