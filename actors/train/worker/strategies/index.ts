// The built-in training strategies, registered in the order error messages list them; the
// registry and the interface, re-exported.
import { allreduce } from "./allreduce.ts"
import { auto } from "./auto.ts"
import { localSgd } from "./local-sgd.ts"
import { pipeline } from "./model-parallel.ts"
import { parameterServer } from "./parameter-server.ts"
import { registerStrategy } from "./registry.ts"

registerStrategy(allreduce)
registerStrategy(parameterServer)
registerStrategy(auto)
registerStrategy(localSgd)
registerStrategy(pipeline)

export * from "./registry.ts"
export * from "./strategy.ts"
export { autoCandidates } from "./auto.ts"
