// Finds a Node older than gradwire needs on this machine, for the tests that check what such a
// Node is told: $GRADWIRE_OLD_NODE, /usr/bin/node, or any `node` on PATH. Undefined when there
// is none (those tests are then skipped, and say so in their names).
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { nodeTooOld } from "../../core/node-version.ts"

export interface OldNode {
  readonly bin: string
  /** As `node --version` prints it: "v20.20.2". */
  readonly version: string
}

export const findOldNode = (): OldNode | undefined => {
  const onPath = (process.env.PATH ?? "").split(path.delimiter).map((d) => path.join(d, "node"))
  for (const bin of [process.env.GRADWIRE_OLD_NODE, "/usr/bin/node", ...onPath]) {
    if (!bin || !fs.existsSync(bin)) continue
    const r = spawnSync(bin, ["--version"], { encoding: "utf8" })
    const version = r.status === 0 ? r.stdout.trim() : ""
    if (version && nodeTooOld(version)) return { bin, version }
  }
  return undefined
}

/** How a test that needs one names itself. */
export const describeOldNode = (old: OldNode | undefined): string => (old ? `${old.version} at ${old.bin}` : "none on this machine: skipped")
