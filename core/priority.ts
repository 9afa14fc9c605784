// A process's CPU priority (its nice value), lowered while it starts in the background and given
// back when it is needed: a standby worker (one started while its group runs short-handed, or a
// spare) loads its engine and imports the loop at a lower priority, so that on cores the running
// workers share it takes only what they leave idle, and joins at the priority it started with.
//
// Linux keeps a nice value per thread (setpriority on a thread id sets that thread's alone), and
// V8's compiler threads start with the process: lowering or restoring goes over every thread in
// /proc/self/task, and threads started later inherit the main thread's value. Lowering is only
// done where it can be undone: raising a priority back needs CAP_SYS_NICE (root has it) or an
// RLIMIT_NICE that allows the value; without either a process that lowered itself would stay
// slower than its group for good (a straggler every step waits for), so it does not lower at all.
//
// Where it is lowered, its threads also take Linux's SCHED_IDLE scheduling policy (through
// util-linux's chrt; a nice value alone where chrt is missing or fails). A nice-19 thread still
// runs out its time slice when a worker wakes on its core (EEVDF protects the slice): two processes
// exchanging a message after each 0.3 ms of work, the all-reduce's pattern, took 1.8x as long per
// round beside one busy nice-19 process (which got 0.98 of a core), 1.3x beside a SCHED_IDLE one
// (0.55 of a core), on this project's 2-core machine. A SCHED_IDLE thread gives way at once.
import { spawn, spawnSync, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { searchPath, standbySchedIdle } from "./settings.ts"

/** CAP_SYS_NICE's bit in /proc/<pid>/status's capability masks. */
const CAP_SYS_NICE = 23n

/** Whether this process may set its threads' nice value down to `nice` again (Linux; false elsewhere). */
export const mayRaiseTo = (nice: number): boolean => {
  if (process.platform !== "linux") return false
  try {
    const status = fs.readFileSync("/proc/self/status", "utf8")
    const capEff = /^CapEff:\s*([0-9a-f]+)/m.exec(status)?.[1]
    if (capEff !== undefined && ((BigInt(`0x${capEff}`) >> CAP_SYS_NICE) & 1n) === 1n) return true
    // RLIMIT_NICE r allows nice values down to 20 - r.
    const limits = fs.readFileSync("/proc/self/limits", "utf8")
    const soft = /^Max nice priority\s+(\S+)/m.exec(limits)?.[1]
    if (soft === undefined) return false
    const r = soft === "unlimited" ? 40 : Number(soft)
    return Number.isFinite(r) && 20 - r <= nice
  } catch {
    return false
  }
}

/** The thread ids of process `pid` (this one by default); the process id alone where /proc is not there or it is gone. */
const threadIds = (pid = process.pid): number[] => {
  try {
    return fs
      .readdirSync(`/proc/${pid}/task`)
      .map(Number)
      .filter((t) => Number.isInteger(t) && t > 0)
  } catch {
    return [pid]
  }
}

/** Sets every thread's nice value; false when any could not be set (threads that ended meanwhile aside). */
const setAll = (nice: number): boolean => {
  let ok = true
  for (const tid of threadIds()) {
    try {
      os.setPriority(tid, nice)
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ESRCH") ok = false
    }
  }
  return ok
}

/** chrt's arguments that put every thread of process `pid` on SCHED_IDLE (`idle`) or back on the normal policy. */
const policyArgs = (idle: boolean, pid: number): string[] => [idle ? "--idle" : "--other", "--all-tasks", "--pid", "0", String(pid)]

/**
 * Sets every thread of this process to SCHED_IDLE (`idle`) or back to the normal policy, with
 * chrt (threads started later inherit the main thread's). False when chrt is missing, fails, or
 * takes over 3 s (a process being put back runs SCHED_IDLE until then, and so does the chrt it
 * starts; beside six busy nice-0 processes on two cores the way back took 23-138 ms).
 */
const setPolicy = (idle: boolean): boolean => {
  const r = spawnSync("chrt", policyArgs(idle, process.pid), { stdio: "ignore", timeout: 3_000 })
  return r.status === 0
}

/**
 * A process that puts this one back on the normal policy when told to: a shell started (through
 * chrt, on the normal policy itself, at the nice value to come back to) while this process goes
 * into the background, waiting on a line from its stdin, then exec'ing chrt on this process's
 * threads. Giving the priority back then costs a write to a pipe instead of a fork: a spawn forks
 * this process on its main thread, and a worker with tfjs loaded (about 300 MB) held its event loop
 * 18-38 ms for it, as it joined a group whose survivors waited for it. It ends with this process
 * (its stdin at end of file) or after its one use.
 */
interface Raiser {
  readonly child: ChildProcess
  /** Whether it exited with status 0 (false where it failed, could not start or ended unused). */
  readonly done: Promise<boolean>
  /** Whether it still waits for its line (not exited, its stdin not broken). */
  readonly alive: boolean
}

let raiser: Raiser | undefined
/** The last way back to the normal policy foregroundPriority started, until it is done. */
let restoring: Promise<boolean> = Promise.resolve(true)

/** Starts a Raiser with chrt at `chrt`, at nice `nice`; undefined where it cannot start. */
const startRaiser = (chrt: string, nice: number): Raiser | undefined => {
  let child: ChildProcess | undefined
  try {
    // "$0" "$@": chrt and the arguments raiseChild's chrt takes, for this process.
    const script = 'read -r _ || exit 3; exec "$0" "$@"'
    const c = (child = spawn(chrt, ["--other", "0", "/bin/sh", "-c", script, chrt, ...policyArgs(false, process.pid)], { stdio: ["pipe", "ignore", "ignore"] }))
    let alive = true
    const done = new Promise<boolean>((resolve) => {
      c.once("error", () => {
        alive = false
        resolve(false)
      })
      c.once("exit", (code) => {
        alive = false
        resolve(code === 0)
      })
    })
    c.stdin!.on("error", () => {
      alive = false
    })
    c.unref()
    ;(c.stdin as unknown as { unref?: () => void }).unref?.()
    // At the value to come back to: a helper left at this process's lowered one would wait for
    // its turn as long as this process does.
    if (c.pid !== undefined) os.setPriority(c.pid, nice)
    return {
      child: c,
      done,
      get alive() {
        return alive
      }
    }
  } catch {
    // Not started, or not at the right priority: gone, and the way back forks as before.
    child?.kill("SIGKILL")
    return undefined
  }
}

/** SCHED_IDLE's number in Linux's sched.h (a thread's stat line's policy field; 0: the normal policy). */
export const SCHED_IDLE = 5

/** Whether the thread whose /proc stat file is `statFile` runs on SCHED_IDLE (its policy field); throws where it cannot be read. */
const statIdle = (statFile: string): boolean => Number(fs.readFileSync(statFile, "utf8").split(") ")[1]!.split(" ")[38]) === SCHED_IDLE

/** Whether this process's main thread runs on SCHED_IDLE (the policy field of /proc/self/stat). */
const mainThreadIdle = (): boolean => {
  try {
    return statIdle("/proc/self/stat")
  } catch {
    return false
  }
}

/** The parent process's nice value, if it can be read. */
const parentNice = (): number | undefined => {
  try {
    return process.ppid > 1 ? os.getPriority(process.ppid) : undefined
  } catch {
    return undefined
  }
}

/**
 * Lowers a child process just spawned by `by` nice steps (its main thread, before it starts
 * others, which inherit it), where its priority can be given back; the child's own
 * backgroundPriority then lowers the threads started before this and raises all of them back.
 */
export const lowerChild = (pid: number, by: number): void => {
  if (!(by > 0) || process.platform !== "linux") return
  try {
    const base = os.getPriority()
    if (mayRaiseTo(base)) os.setPriority(pid, Math.min(19, base + Math.round(by)))
  } catch {
    // The child is gone already, or not ours to lower: it runs at its inherited priority.
  }
}

/**
 * Raises a child this process lowered (lowerChild, a start on SCHED_IDLE) back to this process's
 * own priority from here: every thread's nice value, and the normal policy through a chrt this
 * process starts (at its own priority; not waited for). A lowered child on cores that other work
 * keeps busy gets next to nothing, so it cannot be relied on to raise itself in time: its own
 * timer and the chrt it would start run as starved as it does. No-op where it was never lowered
 * or cannot be raised (not Linux, no right to the value).
 */
export const raiseChild = (pid: number): void => {
  if (process.platform !== "linux" || !(pid > 0)) return
  let base: number
  try {
    base = os.getPriority()
    if (!mayRaiseTo(base)) return
  } catch {
    return
  }
  let idle = false
  for (const tid of threadIds(pid)) {
    try {
      if (os.getPriority(tid) > base) os.setPriority(tid, base)
      idle ||= statIdle(`/proc/${pid}/task/${tid}/stat`)
    } catch {
      // A thread that ended meanwhile.
    }
  }
  const chrt = idle ? chrtStartingIdle() : null
  if (chrt !== null) {
    const c = spawn(chrt, policyArgs(false, pid), { stdio: "ignore" })
    c.on("error", () => {})
    c.unref()
  }
}

/**
 * Process `pid`'s main thread: its on-CPU nanoseconds so far (/proc/<pid>/schedstat, kept current
 * while it runs) and whether it is runnable now (state R in /proc/<pid>/stat); undefined where they
 * cannot be read. (schedstat's time spent waiting for a CPU is only added when the thread next
 * runs, so a starved thread's stays still: it cannot tell starving from sleeping.)
 */
const mainThreadNow = (pid: number): { readonly runNs: number; readonly runnable: boolean } | undefined => {
  try {
    const runNs = Number(fs.readFileSync(`/proc/${pid}/schedstat`, "utf8").split(" ")[0])
    const state = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0]
    return Number.isFinite(runNs) && state !== undefined ? { runNs, runnable: state === "R" } : undefined
  } catch {
    return undefined
  }
}

/** Whether process `pid` runs below this one's priority: a nice value above this one's, or its main thread on SCHED_IDLE. */
const childLowered = (pid: number): boolean => {
  try {
    return os.getPriority(pid) > os.getPriority() || statIdle(`/proc/${pid}/stat`)
  } catch {
    return false
  }
}

/** How often a lowered actor process is checked for starvation (watchStarvation). */
export const STARVED_CHECK_MS = 1_000
/** Checks in a row that must find it starved before it is raised. */
export const STARVED_CHECKS = 3

/**
 * Whether a thread found runnable at both ends of a window of `windowNs` (`runnable`) that ran
 * `runNs` of it starved: it ran under a tenth of the window. One that waits for something else
 * (sleeping: a standby ready and waiting to be let in) is not runnable; one that gets the idle
 * time of the cores runs more.
 */
export const starved = (runNs: number, windowNs: number, runnable: boolean): boolean => runnable && runNs < windowNs / 10

/**
 * Watches a child this process started lowered (a standby worker, on SCHED_IDLE) and raises it
 * (raiseChild) once it starved for STARVED_CHECKS checks in a row: on cores that other work keeps
 * busy at the normal priority (other jobs, other programs) a SCHED_IDLE process gets next to
 * nothing, and the limit it keeps on its own lowering (BACKGROUND_LIMIT_MS) runs as starved as it
 * does: beside two busy loops on two cores a standby was not ready within the 60 s its spawn
 * allows, and its group ran short-handed all that time. Where the running workers leave it idle
 * time, as a lowered start is meant to use, it is not starved and stays lowered. `onRaised` gets
 * what was seen, each time. It goes on watching after a raise (the process may lower itself again,
 * as a standby's host does once it runs: then it is raised again if it starves again) until the
 * process is gone, or until what it returns is called (the process exited).
 */
export const watchStarvation = (pid: number, onRaised: (why: string) => void, checkMs = STARVED_CHECK_MS, checks = STARVED_CHECKS): (() => void) => {
  if (process.platform !== "linux" || !(pid > 0)) return () => {}
  let last = mainThreadNow(pid)
  let lastAt = performance.now()
  let inARow = 0
  let runs: number[] = []
  const timer = setInterval(() => {
    const now = mainThreadNow(pid)
    const at = performance.now()
    if (now === undefined || last === undefined) return stop()
    const windowNs = (at - lastAt) * 1e6
    const ran = now.runNs - last.runNs
    if (starved(ran, windowNs, now.runnable && last.runnable)) {
      inARow++
      runs.push(ran / windowNs)
    } else {
      inARow = 0
      runs = []
    }
    last = now
    lastAt = at
    if (inARow < checks) return
    const share = runs.reduce((a, b) => a + b, 0) / runs.length
    inARow = 0
    runs = []
    // (starved at its own priority: the workers' cores are full, and raising changes nothing)
    if (!childLowered(pid)) return
    raiseChild(pid)
    onRaised(`runnable but on a CPU ${(100 * share).toFixed(1)}% of the last ${((checks * checkMs) / 1000).toFixed(0)} s (the cores are busy at the normal priority)`)
  }, checkMs)
  timer.unref()
  const stop = (): void => clearInterval(timer)
  return stop
}

/**
 * Where this process's PATH has util-linux's chrt, if a command started through `chrt --idle 0`
 * runs here (looked up and checked once, with chrt's own `--version` run so: a child started
 * through a chrt that cannot set the policy would not start at all); null otherwise. An absolute
 * path: a child's own environment need not have a PATH.
 */
let idleChrt: string | null | undefined
const chrtStartingIdle = (): string | null => {
  if (idleChrt !== undefined) return idleChrt
  idleChrt = null
  for (const dir of searchPath.read()) {
    if (!path.isAbsolute(dir)) continue
    const chrt = path.join(dir, "chrt")
    try {
      fs.accessSync(chrt, fs.constants.X_OK)
    } catch {
      continue
    }
    if (spawnSync(chrt, ["--idle", "0", chrt, "--version"], { stdio: "ignore", timeout: 3_000 }).status === 0) idleChrt = chrt
    break
  }
  return idleChrt
}

/**
 * How to start a child that lowerChild will lower by `by` so that it also runs on SCHED_IDLE from
 * its first instruction: the command to put before its own (`chrt --idle 0`, which execs it, so
 * its pid and every thread node starts inherit the policy), or none. Its host's backgroundPriority
 * then finds it lowered and takes it off SCHED_IDLE when it gives the priority back; so the prefix
 * is given only where that call will run the same way: on Linux, with chrt, where lowerChild
 * lowers (this process below nice 19 and able to come back to its value) and the child's
 * environment asks for SCHED_IDLE (`GRADWIRE_STANDBY_SCHED_IDLE`, read in the lowered process).
 * Node's start and the host's imports took 0.35-0.45 s and 0.55-0.64 s of CPU on the 2-core
 * machine before the host lowered its threads itself, at nice 19 only until then.
 */
export const idleStartPrefix = (by: number, childEnv: NodeJS.ProcessEnv): ReadonlyArray<string> => {
  if (!(by > 0) || process.platform !== "linux" || childEnv[standbySchedIdle.name] === "0") return []
  try {
    const base = os.getPriority()
    if (base >= 19 || !mayRaiseTo(base)) return []
  } catch {
    return []
  }
  const chrt = chrtStartingIdle()
  return chrt === null ? [] : [chrt, "--idle", "0"]
}

/** The nice value the process had before backgroundPriority lowered it, while it is lowered. */
let foregroundNice: number | undefined
/** Gives the priority back after backgroundPriority's limit. */
let limit: ReturnType<typeof setTimeout> | undefined
/** The nice value backgroundPriority last lowered this process to. */
let lastLowered: number | undefined
/** Whether backgroundPriority put this process's threads on SCHED_IDLE (until foregroundPriority). */
let idled = false
/** Whether backgroundPriority's last lowering put this process on SCHED_IDLE. */
let lastIdled: boolean | undefined

/**
 * How long a process stays lowered at most: a standby worker prepares in 1.9-2.2 s at nice 19 on
 * two cores its three workers share (1.5-1.7 s at its own priority); where the cores are never
 * idle (other jobs on them) a lowered process gets almost nothing, and its group would run
 * short-handed the longer, so it is back at its own priority after this.
 */
export const BACKGROUND_LIMIT_MS = 3_000

/**
 * Lowers this process's priority by `by` nice steps (at most to 19), where it can be given back
 * (mayRaiseTo), for at most `limitMs` (Infinity: until foregroundPriority): then it is given back
 * whatever happened (a process lowered on cores that never idle would otherwise take minutes over
 * what takes seconds). With `idle` (by default, GRADWIRE_STANDBY_SCHED_IDLE) its threads run
 * SCHED_IDLE besides. Returns the nice value it runs at now, or undefined when nothing changed
 * (`by` 0, not Linux, no way back, already lowered).
 */
export const backgroundPriority = (by: number, limitMs = BACKGROUND_LIMIT_MS, idle = standbySchedIdle.read()): number | undefined => {
  if (!(by > 0) || foregroundNice !== undefined || process.platform !== "linux") return undefined
  // The value to come back to: the parent's (the agent lowered this process's main thread right
  // after spawning it, lowerChild), or this one's where that is lower.
  const base = Math.min(os.getPriority(), parentNice() ?? Infinity)
  const target = Math.min(19, base + Math.round(by))
  if (target <= base || !mayRaiseTo(base)) return undefined
  foregroundNice = base
  lastLowered = target
  setAll(target)
  // Started on SCHED_IDLE (idleStartPrefix), it is on it whatever this chrt does: where that
  // failed (no chrt on this process's own PATH), foregroundPriority must still try to take it off.
  idled = idle && (setPolicy(true) || mainThreadIdle())
  lastIdled = idled
  if (idled) {
    const chrt = chrtStartingIdle()
    raiser = chrt === null ? undefined : startRaiser(chrt, base)
  }
  if (Number.isFinite(limitMs)) {
    limit = setTimeout(() => void foregroundPriority(), limitMs)
    limit.unref()
  }
  return target
}

/**
 * Keeps this process lowered for `limitMs` from now: where backgroundPriority lowered it and has
 * not given it back, only its limit is set anew (no thread changes); else it is lowered by `by`
 * as backgroundPriority does. Returns the nice value it runs at, or undefined when not lowered.
 */
export const keepInBackground = (by: number, limitMs: number): number | undefined => {
  if (foregroundNice === undefined) return backgroundPriority(by, limitMs)
  clearTimeout(limit)
  limit = setTimeout(() => void foregroundPriority(), limitMs)
  limit.unref()
  return lastLowered
}

/**
 * Gives back the priority backgroundPriority took: every thread at the nice value the process
 * started with, and off SCHED_IDLE. Returns false when a thread could not be raised (the process
 * then runs lowered; callers say so), true when it is back or was never lowered. Where a Raiser
 * was started with the lowering, the policy comes back through it, after this returns:
 * policyRestored says how that went.
 */
export const foregroundPriority = (): boolean => {
  const base = foregroundNice
  if (base === undefined) return true
  foregroundNice = undefined
  clearTimeout(limit)
  // The nice value first: leaving SCHED_IDLE needs the right to run at the nice value it has then.
  const niced = setAll(base)
  if (!idled) return niced
  idled = false
  const r = raiser
  raiser = undefined
  if (r !== undefined && r.alive && r.child.stdin?.writable === true) {
    // Told by a write: the threads leave SCHED_IDLE a few ms later (not waited for here; a
    // joining worker's peers wait on the network meanwhile, so the cores are free for it).
    r.child.stdin.end("go\n")
    // Waited for from here (policyRestored), for 3 s at most, as setPolicy's chrt.
    r.child.ref()
    const stop = setTimeout(() => r.child.kill("SIGKILL"), 3_000)
    stop.unref()
    restoring = r.done.finally(() => clearTimeout(stop))
    return niced
  }
  r?.child.kill("SIGKILL")
  const left = setPolicy(false)
  restoring = Promise.resolve(left)
  return left && niced
}

/**
 * Whether the last foregroundPriority took this process off SCHED_IDLE, once that is done (it
 * tells a helper process and does not wait for it); true at once where nothing is pending.
 */
export const policyRestored = (): Promise<boolean> => restoring

/**
 * The nice value backgroundPriority last lowered this process to, also after it was given back
 * (how a worker prepared, whatever its limit did since); undefined when it never lowered it.
 */
export const backgroundNice = (): number | undefined => lastLowered

/** Whether backgroundPriority lowered this process and foregroundPriority has not given it back. */
export const inBackground = (): boolean => foregroundNice !== undefined

/**
 * Whether this process, lowered by backgroundPriority and not given back, runs at the priority it
 * came from again: its agent raised it from outside (watchStarvation: other work starved it).
 */
export const raisedFromOutside = (): boolean => {
  if (foregroundNice === undefined || process.platform !== "linux") return false
  try {
    return os.getPriority() <= foregroundNice && !mainThreadIdle()
  } catch {
    return false
  }
}

/** Whether backgroundPriority put this process on SCHED_IDLE and foregroundPriority has not taken it off. */
export const onIdlePolicy = (): boolean => idled

/**
 * Whether backgroundPriority's last lowering also put this process on SCHED_IDLE, also after it was
 * given back; undefined when it never lowered it.
 */
export const backgroundSchedIdle = (): boolean | undefined => lastIdled
