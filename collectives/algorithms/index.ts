// The built-in all-reduce algorithms, registered in preference order (the cost model picks the
// first of equally fast ones). A new algorithm is one module next to these and one line in
// `builtinAlgorithms`; see registry.ts for what an entry carries.
import { hierarchical } from "./hierarchical.ts"
import { registerAllReduceAlgorithm } from "./registry.ts"
import { ring } from "./ring.ts"
import { tree } from "./tree.ts"

export const builtinAlgorithms = [ring, tree, hierarchical] as const

for (const a of builtinAlgorithms) registerAllReduceAlgorithm(a)

export type BuiltinAlgorithmName = (typeof builtinAlgorithms)[number]["name"]
/** A built-in algorithm's name, or that of one registered at run time. */
export type AllReduceAlgorithm = BuiltinAlgorithmName | (string & {})

export {
  AlgorithmRegistrationError,
  allReduceAlgorithmByCode,
  allReduceAlgorithmNames,
  allReduceAlgorithms,
  allowedAlgorithms,
  defineAllReduceAlgorithm,
  describeAlgorithms,
  findAllReduceAlgorithm,
  parseAlgorithmChoice,
  registerAllReduceAlgorithm,
  type AllReduceAlgorithmEntry,
  type AllReduceCall
} from "./registry.ts"
