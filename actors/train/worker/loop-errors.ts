// The tag a loop's error travels to the driver under. tfjs's own argument checks (a tensor's shape,
// rank or dtype that does not fit the op or the layer) throw plain `Error`s, or tfjs-layers'
// `ValueError`, whose `name` is "Error" too: both are a bug the loop's restart from the checkpoint
// would meet again at the same step, so they get tags the failure policy does not retry
// ("ValueError", as Keras names it, and "InvalidArgumentError", as TensorFlow names an op's). Every
// other error keeps the tag `toWireFailure` gives it.
import { toWireFailure, type WireFailure } from "../../runtime/envelope.ts"

/** tfjs-core's checks of an op's arguments: the function a failed check throws from. */
const TFJS_CHECK = /^(?:Object\.)?(?:assert\w*|inferFromImplicitShape)$/
/** A frame in tfjs's own code (its packages, or the bundles of `@tensorflow/tfjs`). */
const TFJS_FILE = /[\\/]@tensorflow[\\/]tfjs(?:-core|-layers)?[\\/]/

/** The first frame of `stack` (after its message): the function and its file, where V8 gives them. */
const topFrame = (stack: string): { readonly fn: string; readonly file: string } | undefined => {
  const line = stack.split("\n").find((l) => /^\s+at /.test(l))
  if (line === undefined) return undefined
  const m = /^\s+at (?:new )?(?:(\S+) \()?([^()]*?)(?::\d+:\d+)?\)?$/.exec(line)
  return m ? { fn: m[1] ?? "", file: m[2] ?? "" } : undefined
}

/** The tag for a tfjs argument check `error` failed, or undefined where it is no such check. */
export const tfjsCheckTag = (error: unknown): "ValueError" | "InvalidArgumentError" | undefined => {
  if (!(error instanceof Error) || error.name !== "Error" || typeof error.stack !== "string") return undefined
  if ((error as { _tag?: unknown })._tag !== undefined) return undefined
  const top = topFrame(error.stack)
  if (top === undefined || !TFJS_FILE.test(top.file)) return undefined
  if (error.constructor.name === "ValueError") return "ValueError"
  return error.constructor === Error && TFJS_CHECK.test(top.fn) ? "InvalidArgumentError" : undefined
}

/** What a loop's `error` says to the driver: `toWireFailure`'s, with tfjs's argument checks tagged as such. */
export const loopFailure = (error: unknown): WireFailure => {
  const f = toWireFailure(error)
  const tag = tfjsCheckTag(error)
  return tag === undefined ? f : { ...f, tag }
}
