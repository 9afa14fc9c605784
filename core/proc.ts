// This machine's processes as Linux's /proc shows them: their pids, the entries of one's command
// line or environment, and the fields of its stat file. Elsewhere (no /proc), and for a process
// gone meanwhile or not ours to read, nothing: callers find no process rather than fail.
import * as fs from "node:fs"

/** The pids of this machine's live processes (none without /proc). */
export const livePids = (): number[] => {
  try {
    return fs.readdirSync("/proc").filter((d) => /^\d+$/.test(d)).map(Number)
  } catch {
    return []
  }
}

/** The NUL-separated entries of `pid`'s command line or environment ([] where it cannot be read). */
export const procEntries = (pid: number, file: "cmdline" | "environ"): string[] => {
  try {
    return fs.readFileSync(`/proc/${pid}/${file}`, "latin1").split("\0").filter((e) => e !== "")
  } catch {
    return []
  }
}

/** `pid`'s command line or environment as one line, its entries joined by spaces ("" where it cannot be read). */
export const procLine = (pid: number, file: "cmdline" | "environ"): string => procEntries(pid, file).join(" ")

/**
 * The fields of `pid`'s stat file after its command name, from its state on (index 1 is its parent's
 * pid): undefined where it cannot be read. The name may hold spaces, so the split starts after its ")".
 */
export const procStatFields = (pid: number): string[] | undefined => {
  try {
    const text = fs.readFileSync(`/proc/${pid}/stat`, "latin1")
    return text.slice(text.lastIndexOf(")") + 2).split(" ")
  } catch {
    return undefined
  }
}
