// The digits example's loop, with the throwaway strategy registered first: the rank processes of
// test/strategy-registry.test.ts run it, so the registration is in every worker.
import "./register.ts"
export { trainLoop } from "../../../examples/digits/train.ts"
