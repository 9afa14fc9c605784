// Registers the throwaway algorithm, codec and training strategy: the only place besides their own
// modules that knows them. Imported by test/registry-proof.test.ts, test/strategy-registry.test.ts
// and, by path, by their rank processes (strategy-loop.ts for the Trainer's workers).
import { registerAllReduceAlgorithm } from "../../../collectives/algorithms/index.ts"
import { registerCodec } from "../../../collectives/compression/index.ts"
import { gatherBroadcast } from "./gather-broadcast.ts"
import { pairMean } from "./pair-mean.ts"
import { registerStrategy } from "../../../actors/train/worker/strategies/index.ts"
import { sumMean } from "./sum-mean.ts"

registerAllReduceAlgorithm(gatherBroadcast)
registerCodec(pairMean)
registerStrategy(sumMean)
