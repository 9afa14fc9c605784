// CPU time of a process's threads, from Linux's /proc/<pid>/task/<tid>/schedstat (nanoseconds on a
// CPU; /proc/<pid>/task/<tid>/stat's ticks where schedstat is missing). With the all-reduce
// benchmark's `--cpu` each rank process reads its own around its timed calls
// (test/support/collectives-rank.ts), and gloo's script the same way: a rank's busiest thread
// against all its threads tells whether its time a call is one thread's work (then work spread over
// threads, as gloo spreads its own over its worker threads, is what more cores per rank would buy)
// or waiting (lockstep, the links).
// Also a whole process's CPU from /proc/<pid>/stat (processStat: the chaos bench's joined workers,
// the strategy bench's process classes).
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"

let ticks: number | undefined
/** Clock ticks per second of /proc's CPU times (getconf CLK_TCK, asked once, when first needed; 100 where it cannot be asked). */
export const clockTicks = (): number => {
  if (ticks === undefined) {
    try {
      ticks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100
    } catch {
      ticks = 100
    }
  }
  return ticks
}

/** Parent, user + system CPU ms so far and command name from a /proc stat file (a process's, or a thread's: its task's); undefined: gone, or not Linux. */
const statOf = (file: string): { ppid: number; cpuMs: number; comm: string } | undefined => {
  try {
    const s = fs.readFileSync(file, "latin1")
    const close = s.lastIndexOf(")")
    const f = s.slice(close + 2).split(" ")
    return { ppid: Number(f[1]), cpuMs: ((Number(f[11]) + Number(f[12])) * 1000) / clockTicks(), comm: s.slice(s.indexOf("(") + 1, close) }
  } catch {
    return undefined
  }
}

/** A process's parent, user + system CPU ms so far and command name, from /proc/<pid>/stat (undefined: gone, or not Linux). */
export const processStat = (pid: number): { ppid: number; cpuMs: number; comm: string } | undefined => statOf(`/proc/${pid}/stat`)

/** A process's main thread's user + system CPU ms so far (/proc/<pid>/task/<pid>/stat; undefined: gone, or not Linux). */
export const mainThreadCpuMs = (pid: number): number | undefined => statOf(`/proc/${pid}/task/${pid}/stat`)?.cpuMs

/** CPU ms so far of each thread of a process, by thread id. */
export type ThreadTimes = ReadonlyMap<string, number>

/** What a process's threads spent between two readings: the busiest thread's ms and all threads' ms. */
export interface CpuSpent {
  readonly busiestMs: number
  readonly totalMs: number
}

/** One thread's CPU ms, or undefined when it is gone (a thread that ended between the listing and the read). */
const taskMs = (pid: number, tid: string): number | undefined => {
  try {
    return Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]) / 1e6
  } catch {
    try {
      // utime and stime (fields 14 and 15) in clock ticks, after the command's closing parenthesis
      const stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8")
      const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
      return ((Number(f[11]) + Number(f[12])) * 1000) / clockTicks()
    } catch {
      return undefined
    }
  }
}

/** Every thread's CPU ms so far of `pid` (undefined where /proc does not have the process: not Linux, or it exited). */
export const threadTimes = (pid: number): ThreadTimes | undefined => {
  let tids: string[]
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`)
  } catch {
    return undefined
  }
  const out = new Map<string, number>()
  for (const tid of tids) {
    const ms = taskMs(pid, tid)
    if (ms !== undefined) out.set(tid, ms)
  }
  return out
}

/**
 * What one process's threads spent from `before` to `after`: a thread started in between counts
 * from zero, one that ended in between is not counted (its time is gone from /proc). Zero when
 * either reading is missing.
 */
export const cpuBetween = (before: ThreadTimes | undefined, after: ThreadTimes | undefined): CpuSpent => {
  if (before === undefined || after === undefined) return { busiestMs: 0, totalMs: 0 }
  let busiestMs = 0
  let totalMs = 0
  for (const [tid, ms] of after) {
    const d = Math.max(0, ms - (before.get(tid) ?? 0))
    busiestMs = Math.max(busiestMs, d)
    totalMs += d
  }
  return { busiestMs, totalMs }
}
