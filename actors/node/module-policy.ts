// Which modules a node agent lets its actor processes run. Anyone who can publish a spawn request
// to an agent could otherwise make it import any module, so an agent runs an actor module only
// from gradwire's own actors/ folder (the trainer's worker lives there) or from the folders its
// owner allowed (`gradwire start --allow-module-root DIR`). A spawn also declares the modules the
// actor will import besides (a worker's train loop): without allowed roots those are the job's to
// choose, as long as they are files on the node; with roots they must lie under one too. The
// agent hands the allowed imports to the process, and the worker imports only those.
import * as fs from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

/** gradwire's own actor modules: the actors/ folder of this install (sources or dist). */
export const GRADWIRE_ACTORS_DIR = path.resolve(fileURLToPath(new URL("../", import.meta.url)))

const real = (p: string): string => {
  try {
    return fs.realpathSync(p)
  } catch {
    return path.resolve(p)
  }
}

export interface ModulePolicy {
  /** Allowed roots besides gradwire's own actors (real paths). */
  readonly roots: ReadonlyArray<string>
}

/** A policy for these roots (relative ones resolved against the current directory; symlinks followed). */
export const modulePolicy = (roots: ReadonlyArray<string> = []): ModulePolicy => ({ roots: roots.map((r) => real(path.resolve(r))) })

/**
 * The file a module specifier names on this node, as the actor process will load it; undefined
 * for modules that are not files (data:, http:, node: ...). `cwd` resolves relative paths.
 */
export const modulePath = (spec: string, cwd: string): string | undefined => {
  if (spec.startsWith("file:")) {
    try {
      return fileURLToPath(spec)
    } catch {
      return undefined
    }
  }
  if (path.isAbsolute(spec)) return spec
  if (/^[A-Za-z][A-Za-z0-9+.-]*:/.test(spec)) return undefined
  if (spec.startsWith(".")) return path.resolve(cwd, spec)
  // A package specifier: resolved from gradwire's own location, as the actor process resolves it.
  try {
    const url = import.meta.resolve(spec)
    return url.startsWith("file:") ? fileURLToPath(url) : undefined
  } catch {
    return undefined
  }
}

const under = (file: string, root: string): boolean => {
  const rel = path.relative(root, file)
  return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel))
}

const NOT_A_FILE =
  "it is not a module file on this node (data:, http: and similar modules would be code sent over the network; " +
  "an agent runs only files present on its node)"

const outside = (policy: ModulePolicy): string =>
  `it is outside gradwire's own actors (${GRADWIRE_ACTORS_DIR}) and the agent's allowed module roots (${policy.roots.join(", ") || "none given"})`

/** Why an actor module may not run (undefined: it may). */
export const refuseActorModule = (policy: ModulePolicy, spec: string, cwd: string): string | undefined => {
  const file = modulePath(spec, cwd)
  if (file === undefined) return NOT_A_FILE
  const at = real(file)
  if (under(at, GRADWIRE_ACTORS_DIR) || policy.roots.some((r) => under(at, r))) return undefined
  return outside(policy)
}

/** Why a module an actor declared it will import may not be (undefined: it may). */
export const refuseImport = (policy: ModulePolicy, spec: string): string | undefined => {
  if (!spec.startsWith("file:") && !path.isAbsolute(spec) && spec.startsWith(".")) {
    return "a relative path: give an absolute path or a file URL (the Trainer resolves the loop's path for you)"
  }
  const file = modulePath(spec, process.cwd())
  if (file === undefined) return NOT_A_FILE
  // Without allowed roots the job's declared modules are its own business (the train loop is the
  // code the job exists to run); with them, they are held to the roots like actor modules.
  if (policy.roots.length === 0) return undefined
  const at = real(file)
  if (under(at, GRADWIRE_ACTORS_DIR) || policy.roots.some((r) => under(at, r))) return undefined
  return outside(policy)
}
