// Strategy "allreduce" (the default): every step all-reduces the ranks' flat gradients (weighted by
// their sample counts) and applies the same update on every rank, so their weights stay identical.
// With collectiveConfig.zeroStage 1 or 2 the optimizer state is sharded (zero.ts).
import { defineStrategy, reduceWithRecompute, type Exchanged, type StepExchange, type StrategyHost, type StrategyWorker } from "./strategy.ts"
import { ZeroWorker } from "./zero.ts"

/** The plain data-parallel step: the whole reduced gradient applied by the optimizer on every rank. */
export class AllReduceWorker implements StrategyWorker {
  readonly name: string = "allreduce"
  readonly viaServers = false
  readonly replicated = true
  readonly #host: StrategyHost

  constructor(host: StrategyHost) {
    this.#host = host
  }

  /** Nobody to exchange with: the gradients are applied where they are. */
  inPlace(): boolean {
    return this.#host.sync.worldSize === 1 && !this.#host.exchangeAlone
  }

  async exchange(flat: Float32Array, x: StepExchange): Promise<Exchanged> {
    const t1 = performance.now()
    // One rank with every row of the step (adaptive batching left the others without): its
    // gradient is the mean, sent from it, and it waits for none of the others' zeros.
    const r = await reduceWithRecompute(this.#host, flat, x, this.#host.soleHolder)
    return {
      adopted: r.adopted,
      ...(r.sentAt !== undefined ? { sentAt: r.sentAt } : {}),
      commMs: performance.now() - (r.sentAt ?? t1),
      // One copy back into the engine per variable, straight from views of the reduced buffer.
      apply: () => this.#host.applyFlat(r.flat)
    }
  }
}

export const allreduce = defineStrategy({
  name: "allreduce",
  hint: "every step all-reduces the gradients and applies the same update on every rank (zeroStage 1/2 shard the optimizer state)",
  servers: false,
  // ZeRO keeps a replica of each rank's optimizer shard on the next rank (optim/zero.ts).
  peersCannot: () => undefined,
  autoCandidates: ["allreduce"],
  benchVariants: [{ name: "all-reduce", collective: () => ({}) }],
  create: (host) => ((host.sync.zeroStage ?? 0) > 0 ? new ZeroWorker(host) : new AllReduceWorker(host))
})
