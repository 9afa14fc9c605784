// A test's brake on a short group: while `holdFile` exists and holds a size larger than the
// group's, every training step first waits HOLD_STEP_MS (longer once held a while, shorter once
// its replacement is ready). The group keeps training (slowly), so a regroup can pause it at its
// next step (a rank asleep outside a step would stall the regroup), and the run cannot end before
// something slow outside it (an agent starting, a standby replacement loading on a loaded machine)
// lets the group grow back; once it has, the brake is off.
import { existsSync, readFileSync, writeFileSync } from "node:fs"
import { mkdtemp, writeFile } from "node:fs/promises"
import * as path from "node:path"
import { Trainer, type Result, type TrainerOptions } from "../../index.ts"

/** How long each step of a short group waits while the hold is on (its first HOLD_PATIENCE_MS). */
export const HOLD_STEP_MS = 250

/**
 * After this long held, each step waits HOLD_LONG_STEP_MS instead: on a machine loaded enough (two
 * test files' workers on two cores) that the replacement or agent is not there by then, the steps
 * left give it four times the time; where it comes in time, the run is as long as before.
 */
export const HOLD_PATIENCE_MS = 5_000
export const HOLD_LONG_STEP_MS = 1_000

/**
 * Once the replacement is ready (releaseWhenStandbyReady), each step of the short group waits this
 * long until the group is whole again: it reaches its next step or report() call in a second or two
 * (where the replacement joins), and cannot run to its end first. Taken off then, a short group of
 * async servers ran its last epochs in under a second each and ended before the grow (seen in CI).
 */
export const HOLD_EASED_STEP_MS = 100

/** What releaseWhenStandbyReady adds to the hold file: the brake eases to HOLD_EASED_STEP_MS. */
const EASED = "eased"

/** When this process's group was first held back, while it still is. */
let heldSince: number | undefined

/** Whether a group of `worldSize` is held back by `holdFile`. */
export const holding = (holdFile: string | undefined, worldSize: number): boolean => holdOf(holdFile, worldSize) !== undefined

/** What a hold file says: the group size held to, and whether the brake has eased. */
const readHold = (holdFile: string): { readonly size: string; readonly eased: boolean } => {
  const [size = "", mode] = readFileSync(holdFile, "utf8").trim().split(/\s+/)
  return { size, eased: mode === EASED }
}

/** The hold on a group of `worldSize`: none, on, or eased (its replacement is ready). */
const holdOf = (holdFile: string | undefined, worldSize: number): "on" | "eased" | undefined => {
  if (holdFile === undefined || !existsSync(holdFile)) return undefined
  const hold = readHold(holdFile)
  const size = Number(hold.size)
  if (!Number.isFinite(size) || worldSize >= size) return undefined
  return hold.eased ? "eased" : "on"
}

/** Waits HOLD_STEP_MS when the group is held back, HOLD_LONG_STEP_MS once it has been for HOLD_PATIENCE_MS, HOLD_EASED_STEP_MS once eased. */
export const holdStep = async (holdFile: string | undefined, worldSize: number): Promise<void> => {
  const hold = holdOf(holdFile, worldSize)
  if (hold === undefined) {
    heldSince = undefined
    return
  }
  heldSince ??= Date.now()
  const ms = hold === "eased" ? HOLD_EASED_STEP_MS : Date.now() - heldSince < HOLD_PATIENCE_MS ? HOLD_STEP_MS : HOLD_LONG_STEP_MS
  await new Promise((resolve) => setTimeout(resolve, ms))
}

/** A fresh directory under `parent` (where a test's pid files go too) holding a hold file for a group of `size`. */
export const makeHold = async (parent: string, prefix: string, size: number): Promise<{ readonly dir: string; readonly holdFile: string }> => {
  const dir = await mkdtemp(path.join(parent, prefix))
  const holdFile = path.join(dir, "hold")
  await writeFile(holdFile, String(size))
  return { dir, holdFile }
}

/** An events.jsonl line's type; undefined for a line not (yet) whole. */
const typeOf = (line: string): unknown => {
  try {
    return (JSON.parse(line) as { readonly type?: unknown }).type
  } catch {
    return undefined
  }
}

/**
 * Whether the events in `events` (a run's events.jsonl) leave a replacement ready for the latest
 * failure: a "standby-ready" after the last "restart". A failure after the one whose replacement
 * got ready (a survivor killed as the group grows back) puts the brake back on until its own
 * replacement is ready: eased, a short group of one ran its last epochs before that replacement
 * had loaded on a loaded machine, and the group never grew back (seen in CI).
 */
const replacementReady = (events: string): boolean => {
  let ready = false
  for (const line of events.split("\n")) {
    const type = typeOf(line)
    if (type === "standby-ready") ready = true
    else if (type === "restart") ready = false
  }
  return ready
}

/**
 * Eases the brake while `eventsFile` (a run's events.jsonl) records a standby worker ready since
 * the last failure (replacementReady), and puts it back on at a failure after that, polling every
 * 100 ms; call the result to stop polling (the run has ended). While eased the short group steps
 * every HOLD_EASED_STEP_MS, and the replacement joins it at its next step or report() call; once
 * whole it trains at full speed.
 */
export const releaseWhenStandbyReady = (holdFile: string, eventsFile: string): (() => void) => {
  const timer = setInterval(() => {
    if (!existsSync(eventsFile) || !existsSync(holdFile)) return
    const eased = replacementReady(readFileSync(eventsFile, "utf8"))
    const hold = readHold(holdFile)
    if (hold.eased !== eased) writeFileSync(holdFile, eased ? `${hold.size} ${EASED}` : hold.size)
  }, 100)
  return () => clearInterval(timer)
}

/**
 * `new Trainer(options).fit()`, with the short group's hold file `holdFile` eased once the run's
 * events.jsonl (under runConfig's storagePath and name) records its replacement ready
 * (releaseWhenStandbyReady); without `holdFile`, the plain run.
 */
export const fitReleasingHold = (options: TrainerOptions, holdFile: string | undefined): Promise<Result> => {
  if (holdFile === undefined) return new Trainer(options).fit()
  const run = options.runConfig
  if (run?.storagePath === undefined || run.name === undefined) throw new Error("fitReleasingHold: runConfig needs storagePath and name (where the run's events.jsonl is)")
  const release = releaseWhenStandbyReady(holdFile, path.join(run.storagePath, run.name, "events.jsonl"))
  return new Trainer(options).fit().finally(release)
}
