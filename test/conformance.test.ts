// Every registered all-reduce algorithm and codec through the conformance suite
// (support/conformance.ts): the lists are the registries', so a new algorithm or codec is tested
// here as soon as it is registered.
import { allReduceAlgorithmNames } from "../collectives/algorithms/index.ts"
import { codecNames } from "../collectives/compression/index.ts"
import { algorithmConformance, codecConformance } from "./support/conformance.ts"

algorithmConformance(allReduceAlgorithmNames())
codecConformance(codecNames())
