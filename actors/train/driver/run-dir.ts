// A run directory takes one fit() at a time. A run named by default (gradwire_<date>_<time>) gets a
// directory of its own: two fits started in the same second (a sweep's Promise.all, or quick runs
// one after another) had shared one, the second resuming the first's checkpoints and both writing
// its files. A named run keeps its directory across fits (the same name resumes), and while a fit
// holds it (a lock file with its process id) another fit of that name, in this process or another,
// is a ConfigError; a lock whose process is gone (a driver killed) is taken over, one from another
// machine (a shared filesystem) only by hand.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { ConfigError } from "../../../core/errors.ts"
import { pidAlive } from "../../node/agent-state.ts"
import type { Resolved } from "./options.ts"

const LOCK = ".fit-lock"
const held = new Set<string>()

/** Takes the run directory's lock, or says who holds it (`refusal`: the ConfigError for a taker other than a fit()). */
const lock = async (dir: string, name: string, refusal?: (by: string) => ConfigError): Promise<void> => {
  const file = path.join(dir, LOCK)
  const inUse = (by: string): ConfigError =>
    refusal?.(by) ??
    new ConfigError({
      field: "runConfig.name",
      reason: `the run directory ${dir} is in use by a fit() ${by}: a run's directory takes one fit() at a time (the same name resumes it once that one ends); give this one another name than "${name}"`
    })
  // Claimed in this process first, at once: two fits of one name started together here.
  if (held.has(dir)) throw inUse("running in this process")
  held.add(dir)
  try {
    let unreadable = 0
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        await fs.writeFile(file, JSON.stringify({ pid: process.pid, host: os.hostname(), since: new Date().toISOString() }), { flag: "wx" })
        return
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e
      }
      let owner: { pid?: unknown; host?: unknown; since?: unknown } | undefined
      try {
        owner = JSON.parse(await fs.readFile(file, "utf8")) as typeof owner
      } catch {
        // being written by a fit taking it this moment: read again; unreadable twice, stale
        if (++unreadable < 2) {
          await new Promise((resolve) => setTimeout(resolve, 100))
          continue
        }
      }
      // A fit on another machine (a shared filesystem): whether it still runs cannot be seen from here.
      if (typeof owner?.host === "string" && owner.host !== os.hostname()) {
        throw inUse(`on ${owner.host} (process ${String(owner.pid)}, since ${String(owner.since)}; if that driver is gone, delete ${file})`)
      }
      if (typeof owner?.pid === "number" && owner.pid !== process.pid && pidAlive(owner.pid)) throw inUse(`in process ${owner.pid} (since ${String(owner.since)})`)
      // Its process is gone (or is this one, which held no fit of it): stale.
      await fs.rm(file, { force: true })
    }
    throw inUse("starting at the same moment")
  } catch (e) {
    held.delete(dir)
    throw e
  }
}

/**
 * The run directory for this fit(), taken: `cfg` as resolved, or for a run named by default with
 * a suffix (_2, _3, ...) when that directory exists already. `release` gives it back.
 */
export const claimRunDir = async (cfg: Resolved, named: boolean): Promise<{ cfg: Resolved; release: () => Promise<void> }> => {
  let claimed = cfg
  if (!named) {
    await fs.mkdir(path.dirname(cfg.runDir), { recursive: true })
    for (let n = 1; ; n++) {
      const name = n === 1 ? cfg.name : `${cfg.name}_${n}`
      const runDir = path.join(path.dirname(cfg.runDir), name)
      try {
        await fs.mkdir(runDir)
        claimed = { ...cfg, name, runDir }
        break
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST" || n >= 1000) throw e
      }
    }
  } else await fs.mkdir(cfg.runDir, { recursive: true })
  await lock(claimed.runDir, claimed.name)
  const dir = claimed.runDir
  return {
    cfg: claimed,
    release: async () => {
      await fs.rm(path.join(dir, LOCK), { force: true })
      held.delete(dir)
    }
  }
}

/**
 * The run directory held by a reader of its embedded cluster's JetStream data (a checkpoint read
 * back after fit()), so that no fit() of the run starts a nats-server on that data meanwhile;
 * `refusal` is the error while a fit() holds it. Returns the release.
 */
export const holdRunDir = async (dir: string, refusal: (by: string) => ConfigError): Promise<() => Promise<void>> => {
  await lock(dir, path.basename(dir), refusal)
  return async () => {
    await fs.rm(path.join(dir, LOCK), { force: true })
    held.delete(dir)
  }
}
