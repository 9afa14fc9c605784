// Faster start-up for the processes gradwire starts (workers, servers, agents, the CLI): loaded
// first (`node --import .../bin/fast-start.js`, or imported first by bin/gradwire.js), before the
// 600-odd modules a worker loads, it
// - turns on Node's compile cache (module.enableCompileCache): V8 keeps the compiled code of every
//   module it loads, so the next process skips compiling tfjs, Effect and gradwire again;
// - when gradwire runs from its TypeScript source (a checkout: Node strips the types of each .ts
//   file as it loads it, in a WebAssembly build of swc, about a quarter of a second per process),
//   keeps the stripped JavaScript of each of gradwire's own .ts files, keyed by the file and
//   checked against a hash of its source, so a process strips only files changed since.
// Both caches live in a directory of this user's (GW_CACHE_DIR, else $XDG_CACHE_HOME/gradwire
// or ~/.cache/gradwire), made with mode 0700; one another user could write to is not used (the code
// in it runs in every process), and then, or with GW_CACHE_DIR=off, nothing is cached and
// nothing else changes. (Not a GRADWIRE_ name: a spawn request may set those for a worker, and
// this one says where code is loaded from; core/settings.ts.) Plain JavaScript (it runs before anything could strip a type), no output,
// and it never throws: start-up goes on without a cache when one cannot be had.
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as module from "node:module"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

/** gradwire's root: a .ts file below it (not under node_modules) is one of gradwire's own. */
const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)))

/** The cache directory to use, or undefined when there is none that only this user can write. */
const cacheDir = (env = process.env) => {
  const asked = env.GW_CACHE_DIR
  if (asked === "off" || asked === "0") return undefined
  const base = asked || path.join(env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache"), "gradwire")
  try {
    fs.mkdirSync(base, { recursive: true, mode: 0o700 })
    const st = fs.statSync(base)
    const uid = typeof process.getuid === "function" ? process.getuid() : undefined
    if (!st.isDirectory() || (uid !== undefined && st.uid !== uid) || (st.mode & 0o022) !== 0) return undefined
    return base
  } catch {
    return undefined
  }
}

/** How a cache entry ends: a comment holding the hash of the source it was stripped from. */
const TRAILER = "\n//# gradwire-source-sha256="

/** Strips `source`'s types (Node's own stripper) without its one-time "experimental" warning. */
const strip = (source) => {
  const emit = process.emitWarning
  process.emitWarning = () => {}
  try {
    return module.stripTypeScriptTypes(source, { mode: "strip" })
  } finally {
    process.emitWarning = emit
  }
}

/** Load hook: gradwire's own .ts files from the cache of stripped sources (filled on a miss). */
const typeScriptCache = (dir) => (url, context, nextLoad) => {
  if (!url.startsWith("file:") || !url.endsWith(".ts")) return nextLoad(url, context)
  const file = fileURLToPath(url)
  if (!file.startsWith(ROOT + path.sep) || file.includes(`${path.sep}node_modules${path.sep}`)) return nextLoad(url, context)
  const source = fs.readFileSync(file, "utf8")
  const hash = crypto.createHash("sha256").update(source).digest("hex")
  const entry = path.join(dir, crypto.createHash("sha256").update(file).digest("hex").slice(0, 32) + ".js")
  let code
  try {
    const cached = fs.readFileSync(entry, "utf8")
    if (cached.endsWith(TRAILER + hash)) code = cached
  } catch {
    // not cached yet
  }
  if (code === undefined) {
    code = strip(source) + TRAILER + hash
    try {
      // Atomic for the processes starting beside this one: write aside, then rename.
      const tmp = `${entry}.${process.pid}.tmp`
      fs.writeFileSync(tmp, code, { mode: 0o600 })
      fs.renameSync(tmp, entry)
    } catch {
      // a full or read-only disk: this process still runs
    }
  }
  return { format: "module", source: code, shortCircuit: true }
}

const start = () => {
  const dir = cacheDir()
  if (dir === undefined) return
  try {
    module.enableCompileCache?.(path.join(dir, "v8"))
  } catch {
    // no compile cache: slower, not wrong
  }
  // Only where Node strips types itself (a checkout) and can let a hook do it instead; not where
  // the process transforms TypeScript (enums, namespaces), which stripping does not cover.
  if (typeof module.registerHooks !== "function" || typeof module.stripTypeScriptTypes !== "function") return
  if (process.execArgv.includes("--experimental-transform-types") || (process.env.NODE_OPTIONS ?? "").includes("--experimental-transform-types")) return
  if (!fs.existsSync(path.join(ROOT, "index.ts"))) return
  const ts = path.join(dir, `ts-${process.versions.node}`)
  try {
    fs.mkdirSync(ts, { recursive: true, mode: 0o700 })
  } catch {
    return
  }
  module.registerHooks({ load: typeScriptCache(ts) })
}

start()
