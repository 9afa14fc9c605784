// A process's threads' nice values and scheduling policies, as the tests of lowered standby workers
// and warm processes read them (core/priority.ts sets them): /proc/<pid>/task/<tid>/stat.
import { spawnSync } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"

/** SCHED_IDLE, as a thread's stat line's policy field says it (0: the normal policy). */
export { SCHED_IDLE } from "../../core/priority.ts"

/** One field of each of a process's threads' stat lines, `after` places past its parenthesised name (Linux; none elsewhere, or when it is gone). */
const threadStatField = (pid: number | "self", after: number): number[] => {
  try {
    return readdirSync(`/proc/${pid}/task`).map((t) => Number(readFileSync(`/proc/${pid}/task/${t}/stat`, "utf8").split(") ")[1]!.split(" ")[after]))
  } catch {
    return []
  }
}

/** The nice values of a process's threads (field 19 of a thread's stat line). */
export const threadNices = (pid: number | "self" = "self"): number[] => threadStatField(pid, 16)

/** The scheduling policies of a process's threads (field 41 of a thread's stat line). */
export const threadPolicies = (pid: number | "self" = "self"): number[] => threadStatField(pid, 38)

/** The highest nice value among this process's threads (0 where they cannot be read). */
export const highestNice = (): number => Math.max(0, ...threadNices())

/** Whether util-linux's chrt runs here (core/priority.ts sets SCHED_IDLE with it). */
export const chrtRuns = (): boolean => spawnSync("chrt", ["--version"], { stdio: "ignore" }).status === 0
