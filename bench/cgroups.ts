// CPU quotas for benchmarks through cgroup v1's cpu controller (/sys/fs/cgroup/cpu): a group per
// process tree, whose `cpu.cfs_quota_us` per `cpu.cfs_period_us` caps the CPU time of every process
// in it (a quota of half the period: half a core). Processes started inside a group, and their
// children, stay in it. Needs root and a mounted, writable cpu controller; `createCpuGroup` throws
// an Error saying which is missing.
//
// Cleanup is synchronous (kill -9 of every process in the group, then rmdir once it is empty), so
// it can also run in a signal or exit handler.
import * as fs from "node:fs"
import * as path from "node:path"

export const CPU_ROOT = "/sys/fs/cgroup/cpu"

const sleepSync = (ms: number): void => void Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)

export class CpuGroup {
  readonly dir: string
  readonly periodUs: number
  #removed = false
  constructor(dir: string, periodUs: number) {
    this.dir = dir
    this.periodUs = periodUs
  }

  /** Caps the group at `cores` of CPU time (1: one core); Infinity lifts the cap. */
  setCores(cores: number): void {
    const quota = Number.isFinite(cores) ? Math.max(1000, Math.round(this.periodUs * cores)) : -1
    fs.writeFileSync(path.join(this.dir, "cpu.cfs_quota_us"), String(quota))
  }

  get quotaUs(): number {
    return Number(fs.readFileSync(path.join(this.dir, "cpu.cfs_quota_us"), "utf8").trim())
  }

  /** Moves process `pid` (every thread of it) into the group; what it starts from then on stays in it. */
  add(pid: number): void {
    fs.writeFileSync(path.join(this.dir, "cgroup.procs"), String(pid))
  }

  /** The pids in the group now. */
  pids(): number[] {
    try {
      return fs
        .readFileSync(path.join(this.dir, "cgroup.procs"), "utf8")
        .split("\n")
        .filter((l) => l.trim() !== "")
        .map(Number)
    } catch {
      return []
    }
  }

  /** Whether `pid` is in this group (from /proc/<pid>/cgroup). */
  holds(pid: number): boolean {
    try {
      const rel = "/" + path.relative("/sys/fs/cgroup/cpu", this.dir)
      return fs
        .readFileSync(`/proc/${pid}/cgroup`, "utf8")
        .split("\n")
        .some((l) => l.split(":")[1]?.split(",").includes("cpu") && l.split(":")[2] === rel)
    } catch {
      return false
    }
  }

  /** kill -9 of every process in the group, then rmdir once it is empty (up to `timeoutMs`). */
  removeSync(timeoutMs = 5_000): void {
    if (this.#removed) return
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const pids = this.pids()
      for (const pid of pids) {
        try {
          process.kill(pid, "SIGKILL")
        } catch {
          // gone already
        }
      }
      if (pids.length === 0) {
        try {
          fs.rmdirSync(this.dir)
          this.#removed = true
          return
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code === "ENOENT") {
            this.#removed = true
            return
          }
          if (Date.now() > deadline) throw new Error(`could not remove cgroup ${this.dir}: ${(e as Error).message}`)
        }
      } else if (Date.now() > deadline) {
        throw new Error(`cgroup ${this.dir} still holds ${pids.join(", ")} after kill -9`)
      }
      sleepSync(50)
    }
  }
}

/**
 * A new cpu cgroup `name` under /sys/fs/cgroup/cpu with the given period (microseconds) and no
 * cap yet. Throws an Error naming why it cannot be made (not root, no cpu controller, not writable).
 */
export const createCpuGroup = (name: string, periodUs = 100_000): CpuGroup => {
  if (process.getuid?.() !== 0) throw new Error(`not root (uid ${String(process.getuid?.())}): cannot create cgroups`)
  if (!fs.existsSync(path.join(CPU_ROOT, "cpu.cfs_quota_us"))) throw new Error(`no cgroup v1 cpu controller mounted at ${CPU_ROOT}`)
  const dir = path.join(CPU_ROOT, name)
  try {
    fs.mkdirSync(dir)
  } catch (e) {
    throw new Error(`cannot create cgroup ${dir}: ${(e as Error).message}`)
  }
  const group = new CpuGroup(dir, periodUs)
  try {
    fs.writeFileSync(path.join(dir, "cpu.cfs_period_us"), String(periodUs))
    group.setCores(Number.POSITIVE_INFINITY)
  } catch (e) {
    group.removeSync()
    throw new Error(`cannot set the CPU quota of cgroup ${dir}: ${(e as Error).message}`)
  }
  return group
}

/**
 * The argv that starts `argv` inside `group` from its first instruction: a shell writes its own
 * pid into the group's cgroup.procs, then execs the command (so the process and all it spawns are
 * in the group).
 */
export const inGroup = (group: CpuGroup, argv: ReadonlyArray<string>): [string, string[]] => [
  "/bin/sh",
  ["-c", `echo $$ > '${path.join(group.dir, "cgroup.procs")}' && exec "$0" "$@"`, ...argv]
]
