// Registers the throwaway algorithm and codec: the only place besides their own modules that
// knows them. Imported by test/registry-proof.test.ts and, by path, by its rank processes.
import { registerAllReduceAlgorithm } from "../../../collectives/algorithms/index.ts"
import { registerCodec } from "../../../collectives/compression/index.ts"
import { gatherBroadcast } from "./gather-broadcast.ts"
import { pairMean } from "./pair-mean.ts"

registerAllReduceAlgorithm(gatherBroadcast)
registerCodec(pairMean)
