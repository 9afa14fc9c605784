// A throwaway training strategy, known only to its registration (register.ts): every step sums
// [gradient x samples, samples] over the group with the group's plain sum and divides, instead of
// the gradient reducer's weighted mean: the same update as "allreduce", by another road. It counts
// its exchanges in the report's metrics, so a test sees that it ran.
import { defineStrategy, type StrategyHost, type StrategyWorker } from "../../../actors/train/worker/strategies/index.ts"

class SumMeanWorker implements StrategyWorker {
  readonly name = "sum-mean"
  readonly viaServers = false
  readonly replicated = true
  readonly #host: StrategyHost
  #exchanges = 0

  constructor(host: StrategyHost) {
    this.#host = host
  }

  inPlace(): boolean {
    return false
  }

  async exchange(flat: Float32Array, x: { readonly samples: number }): Promise<{ apply(): void }> {
    const buf = new Float32Array(flat.length + 1)
    for (let i = 0; i < flat.length; i++) buf[i] = flat[i]! * x.samples
    buf[flat.length] = x.samples
    await this.#host.sync.sum(buf)
    const total = Math.max(1, buf[flat.length]!)
    const mean = new Float32Array(flat.length)
    for (let i = 0; i < flat.length; i++) mean[i] = buf[i]! / total
    this.#exchanges++
    return { apply: () => this.#host.applyFlat(mean) }
  }

  metrics(): Record<string, number> {
    return { "sum-mean/exchanges": this.#exchanges }
  }
}

export const sumMean = defineStrategy({
  name: "sum-mean",
  hint: "every step sums gradient x samples over the group and divides (a test's throwaway)",
  servers: false,
  peersCannot: () => "the throwaway strategy sum-mean does not follow regroups",
  benchVariants: [{ name: "sum-mean", collective: () => ({ strategy: "sum-mean" }) }],
  create: (host) => new SumMeanWorker(host)
})
