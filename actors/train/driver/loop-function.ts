// trainLoopPerWorker given as the function itself, as Ray Train's train_loop_per_worker is: the
// workers are separate processes that import the loop by module and export name, so the driver
// finds which module's export the function is (its script, from V8's function location through the
// inspector, then that module's exports) and passes that on. A function that no module exports (a
// closure, an arrow written in place), or one in the driver's own script (a worker importing it
// would run the driver again), is a ConfigError that names where it is and what to do.
import { Session } from "node:inspector/promises"
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { ConfigError } from "../../../core/errors.ts"
import type { TrainLoopRef } from "../../../core/config.ts"

/** Where V8 says a function is defined: its script's URL and line (1-based). */
export const functionLocation = async (fn: (...args: never[]) => unknown): Promise<{ readonly url: string; readonly line: number } | undefined> => {
  const session = new Session()
  session.connect()
  const key = `__gradwire_loop_${Math.random().toString(36).slice(2)}`
  const global = globalThis as Record<string, unknown>
  global[key] = fn
  try {
    const { result } = await session.post("Runtime.evaluate", { expression: `globalThis[${JSON.stringify(key)}]` })
    if (result.objectId === undefined) return undefined
    const props = await session.post("Runtime.getProperties", { objectId: result.objectId, ownProperties: true })
    const loc = props.internalProperties?.find((p) => p.name === "[[FunctionLocation]]")?.value?.value as { scriptId?: string; lineNumber?: number } | undefined
    if (loc?.scriptId === undefined) return undefined
    // Enabling the debugger reports every script parsed so far, with its URL; it is disabled at once.
    const urls = new Map<string, string>()
    session.on("Debugger.scriptParsed", (m) => urls.set(m.params.scriptId, m.params.url))
    await session.post("Debugger.enable")
    await session.post("Debugger.disable")
    const url = urls.get(loc.scriptId)
    return url ? { url, line: (loc.lineNumber ?? 0) + 1 } : undefined
  } finally {
    delete global[key]
    session.disconnect()
  }
}

const shown = (url: string): string => {
  if (!url.startsWith("file:")) return url
  const rel = path.relative(process.cwd(), fileURLToPath(url))
  return rel.startsWith("..") ? fileURLToPath(url) : rel
}

const howTo =
  'workers are separate processes (possibly on other machines) that import the loop by module and export name: put it in a module of its own and export it (export async function trainLoop(config, ctx) { ... }), then pass that function, or { module: new URL("./train.ts", import.meta.url).href, export: "trainLoop" }'

/**
 * The module and export name of a loop given as a function. `entry` is the driver's own script
 * (process.argv[1]), which workers must not import.
 */
export const locateLoopFunction = async (fn: (...args: never[]) => unknown, entry: string | undefined = process.argv[1]): Promise<TrainLoopRef> => {
  const name = fn.name ? `${fn.name}` : "the function"
  const at = await functionLocation(fn).catch(() => undefined)
  const fail = (what: string): never => {
    throw new ConfigError({ field: "trainLoopPerWorker", reason: `${what}: ${howTo}` })
  }
  if (!at || !at.url.startsWith("file:")) return fail(`${name} was not found in any module`)
  const where = `${name} (${shown(at.url)}:${at.line})`
  if (entry !== undefined && at.url === pathToFileURL(path.resolve(entry)).href) {
    return fail(`${where} is in the driver's own script, which a worker importing it would run again (another Trainer)`)
  }
  let mod: Record<string, unknown>
  try {
    mod = (await import(at.url)) as Record<string, unknown>
  } catch (e) {
    return fail(`${where}: its module could not be imported (${e instanceof Error ? e.message.split("\n")[0] : String(e)})`)
  }
  const exported = Object.keys(mod).find((k) => mod[k] === fn)
  if (exported === undefined) return fail(`${where} is not exported by its module${fn.name ? "" : " (an inline function or a closure)"}`)
  return { module: at.url, export: exported }
}
