// Strategy "local-sgd" (Local SGD / DiLoCo, streaming DiLoCo with fragments): steps apply their
// gradients locally with the inner optimizer; every syncEvery steps the parameter deltas are
// averaged through the gradient reducer (scoped per fragment) and the outer optimizer applied. The
// outer loop itself is ../local-sgd.ts; this is its place among the strategies.
import { ConfigError } from "../../../../core/errors.ts"
import { OPTIMIZER_FILE } from "../../../../core/model-io.ts"
import type { GradientSlot } from "../gradient-sync.ts"
import { LOCAL_SGD_FILE, LocalSgd } from "../local-sgd.ts"
import { defineStrategy, type Exchanged, type StrategyHost, type StrategyWorker } from "./strategy.ts"

export class LocalSgdWorker implements StrategyWorker {
  readonly name = "local-sgd"
  readonly viaServers = false
  readonly replicated = false
  readonly #host: StrategyHost
  #local: LocalSgd | undefined

  constructor(host: StrategyHost) {
    this.#host = host
  }

  /** The outer loop, once init() made it. */
  get outer(): LocalSgd {
    return this.#local!
  }

  /** The outer loop starts from the broadcast weights (its anchor). */
  async init(): Promise<void> {
    const h = this.#host
    const sync = h.sync
    this.#local = new LocalSgd(
      sync.localSgd!,
      {
        layout: h.layout,
        readParams: () => h.readFlatParams(),
        writeParams: (flat) => h.assignFlat(flat),
        reduce: (buf, layout, weight, round, scope, background) => sync.reduceGradients(buf, layout as ReadonlyArray<GradientSlot>, weight, round, scope, background),
        observe: (name, start, end) => h.observer?.wait?.(name, start, end),
        ...(sync.wireStats ? { wireStats: () => sync.wireStats!() } : {})
      },
      await h.readFlatParams()
    )
  }

  /** Inner steps apply their gradients where they are. */
  inPlace(): boolean {
    return true
  }

  /** The outer round of the fragments due after this step (none most steps). */
  async afterInPlace(samples: number): Promise<void> {
    const local = this.outer
    await local.afterStep(samples)
    // A round in flight needs the event loop's turns to make progress while steps compute.
    if (local.pending) await new Promise<void>((resolve) => setImmediate(resolve))
  }

  exchange(): Promise<Exchanged> {
    throw new Error("local SGD's inner steps apply in place")
  }

  async settle(): Promise<void> {
    await this.#local?.settle()
  }

  async finish(): Promise<void> {
    await this.settle()
  }

  /** One last round of every fragment, so every rank holds the same weights (strategy "auto" leaving local SGD). */
  async flush(): Promise<void> {
    await this.outer.flush()
  }

  /** The inner optimizer's whole state and the outer loop's anchor and momentum; a round in flight is merged first. */
  async checkpointFiles(optimizerFile: () => Promise<Uint8Array>): Promise<Record<string, Uint8Array>> {
    await this.outer.settle()
    return { [OPTIMIZER_FILE]: await optimizerFile(), [LOCAL_SGD_FILE]: this.outer.stateFile() }
  }

  /** The outer state saved with the weights; a checkpoint without it (another strategy's) starts the outer loop at the restored weights. */
  async restore(files: Readonly<Record<string, Uint8Array>>): Promise<boolean> {
    const outer = files[LOCAL_SGD_FILE]
    if (outer) this.outer.restore(outer)
    else await this.outer.resetAnchor()
    return false
  }

  snapshotFiles(inStep: boolean): Record<string, Uint8Array> {
    return { [LOCAL_SGD_FILE]: this.outer.stateFile(inStep) }
  }

  /** A member in the survivor's round keeps its own parameters (local-sgd.ts). */
  async beforeAdopt(files: Readonly<Record<string, Uint8Array>>): Promise<(() => void) | undefined> {
    const file = files[LOCAL_SGD_FILE]
    if (!file) return undefined
    const own = await this.#host.readFlatParams()
    return () => {
      if (this.outer.adopt(file) === "keep") this.#host.assignFlat(own)
    }
  }

  metrics(): Record<string, number | string> {
    return this.outer.metrics()
  }
}

export const localSgd = defineStrategy({
  name: "local-sgd",
  hint: "steps apply locally; every syncEvery steps the parameter deltas are averaged and an outer optimizer applied (Local SGD / DiLoCo)",
  servers: false,
  peersCannot: () => undefined,
  autoCandidates: ["local-sgd"],
  create: (host) => {
    const stage = host.sync.zeroStage ?? 0
    if (stage > 0 || host.sync.ps) {
      throw new ConfigError({
        field: stage > 0 ? "collectiveConfig.zeroStage" : "collectiveConfig.strategy",
        reason: `strategy "local-sgd" keeps every rank's whole parameters and inner optimizer state and averages parameter deltas; it does not combine with ${stage > 0 ? `zeroStage ${stage}: use zeroStage 0` : "parameter servers"}`
      })
    }
    return new LocalSgdWorker(host)
  }
})
