// A process's threads' nice values, as the tests of lowered standby workers and warm processes
// read them (core/priority.ts sets them): /proc/<pid>/task/<tid>/stat.
import { spawnSync } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"

/** The nice values of a process's threads (Linux; none elsewhere, or when it is gone). */
export const threadNices = (pid: number | "self" = "self"): number[] => {
  try {
    // Field 19 of a thread's stat line, the 17th after its parenthesised name.
    return readdirSync(`/proc/${pid}/task`).map((t) => Number(readFileSync(`/proc/${pid}/task/${t}/stat`, "utf8").split(") ")[1]!.split(" ")[16]))
  } catch {
    return []
  }
}

/** The highest nice value among this process's threads (0 where they cannot be read). */
export const highestNice = (): number => Math.max(0, ...threadNices())

/** Whether util-linux's chrt runs here (core/priority.ts sets SCHED_IDLE with it). */
export const chrtRuns = (): boolean => spawnSync("chrt", ["--version"], { stdio: "ignore" }).status === 0
