// Steps for tests that drive gradient reducers of several ranks in one process: `calls(k)` runs k
// reduceGradients calls on every rank together (rank r's buffer r, r + 1, ...) and checks that each
// rank got the mean of both ends, so a test of which algorithm or path a call took also shows the
// call still reduced right.
import { expect } from "vitest"
import type { GradientReducer } from "../../collectives/gradient-reducer.ts"
import { defaultCostModel } from "../../scheduler/cost-model.ts"
import { Communicator, type CommunicatorOptions } from "../../collectives/communicator.ts"
import type { NatsFixtures } from "./nats.ts"

export const reducerCalls = (reducers: ReadonlyArray<GradientReducer>, n = 1024): ((k: number) => Promise<void>) => {
  const layout = [{ name: "w", shape: [n], offset: 0, size: n }]
  const p = reducers.length
  const mean = (j: number): number => j + (p - 1) / 2
  let step = 0
  return async (k: number): Promise<void> => {
    for (let i = 0; i < k; i++, step++) {
      const flats = reducers.map((_, rank) => Float32Array.from({ length: n }, (_, j) => rank + j))
      await Promise.all(reducers.map((r, rank) => r.reduceGradients(flats[rank]!, layout, 1, step)))
      for (const f of flats) expect([f[0], f[n - 1]]).toEqual([mean(0), mean(n - 1)])
    }
  }
}

/** AutoGradientReducer's options apart from the callbacks: algorithm and compression "auto"/"none", one rank per entry of `nodes` (all on one NATS server), the placeholder cost model. */
export const autoOptions = (nodes: ReadonlyArray<string>) => ({
  algorithm: "auto",
  compression: "none" as const,
  topology: nodes.map((nodeId) => ({ nodeId, server: "s0" })),
  model: defaultCostModel()
})

/**
 * A nats-server and a factory of two-rank groups on it: each rank has its own data and control
 * connection; `more(rank)` adds options (a node, direct links). Several groups may share them.
 */
export const twoRankGroups = async (
  nats: NatsFixtures
): Promise<(job: string, group: string, more?: (rank: number) => Partial<CommunicatorOptions>) => Promise<Communicator[]>> => {
  const server = await nats.server({ jetstream: false })
  const conns = await Promise.all([0, 1, 2, 3].map(() => nats.connect(server.url, { noEcho: true })))
  return (job, group, more = () => ({})) =>
    Promise.all(
      [0, 1].map((rank) =>
        Communicator.create({ nc: conns[2 * rank]!.nc, controlNc: conns[2 * rank + 1]!.nc, cluster: "t", job, group, rank, worldSize: 2, timeoutMs: 10_000, ...more(rank) })
      )
    )
}
