// The local agent's state file: how `gradwire stop` and `gradwire status` find the agent started
// on this machine. One agent per state dir ($GRADWIRE_STATE_DIR, else ~/.gradwire). Written
// atomically (temp file + rename) so a reader never sees half a file.
import * as fs from "node:fs"
import * as path from "node:path"
import * as settings from "../../core/settings.ts"
import { livePids, procEntries } from "../../core/proc.ts"

export interface AgentState {
  readonly pid: number
  readonly nodeId: string
  readonly cluster: string
  /** Where clients connect (the head's server, or the --address joined). */
  readonly address: string
  readonly head: boolean
  /**
   * The NATS server this agent started (head without --address), if any: its current pid (it
   * changes when the agent restarts the server after an unexpected exit), restarts so far and when
   * it last exited and came back (ms since the epoch). Older state files lack the last three.
   */
  readonly natsServer: {
    readonly pid: number
    readonly url: string
    readonly restarts?: number
    readonly lastExitAt?: number
    readonly lastRestartAt?: number
  } | null
  readonly logFile: string | null
  readonly startedAt: number
  /**
   * The agent's NATS connection as it last saw it (rewritten when it is lost and when it is back),
   * so that `gradwire status` can say something useful when NATS itself cannot be reached.
   */
  readonly nats?: {
    readonly up: boolean
    readonly server: string
    readonly downSince?: number
    readonly outages: number
    readonly lastOutageAt?: number
    readonly lastOutageMs?: number
    readonly updatedAt: number
  }
}

export const defaultStateDir = (): string => settings.stateDir.read()

/** The state dir a `gradwire start` command line names (`--state-dir DIR` or `--state-dir=DIR`), resolved against `cwd`; undefined: the default. */
export const stateDirOfArgs = (args: ReadonlyArray<string>, cwd: string): string | undefined => {
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!
    const v = a === "--state-dir" ? args[i + 1] : a.startsWith("--state-dir=") ? a.slice("--state-dir=".length) : undefined
    if (v !== undefined) return path.resolve(cwd, v)
  }
  return undefined
}

/**
 * gradwire agents running on this machine (`gradwire start` processes that run the agent: their
 * command line has start and --block) with the state dir each was given, from /proc (Linux; none
 * elsewhere): so that `gradwire stop` can name the ones its state dir does not hold.
 */
export const runningAgents = (): Array<{ readonly pid: number; readonly stateDir: string }> => {
  const out: Array<{ pid: number; stateDir: string }> = []
  for (const pid of livePids()) {
    const args = procEntries(pid, "cmdline")
    if (!args.includes("start") || !args.includes("--block") || !args.some((a) => a.includes("gradwire"))) continue
    try {
      out.push({ pid, stateDir: stateDirOfArgs(args, fs.readlinkSync(`/proc/${pid}/cwd`)) ?? defaultStateDir() })
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return out
}

export const stateFile = (dir: string): string => path.join(dir, "agent.json")
export const logFile = (dir: string): string => path.join(dir, "agent.log")

export const readState = (dir: string): AgentState | undefined => {
  try {
    return JSON.parse(fs.readFileSync(stateFile(dir), "utf8")) as AgentState
  } catch {
    return undefined
  }
}

export const writeState = (dir: string, state: AgentState): void => {
  fs.mkdirSync(dir, { recursive: true })
  const tmp = `${stateFile(dir)}.${process.pid}.tmp`
  fs.writeFileSync(tmp, `${JSON.stringify(state, null, 2)}\n`)
  fs.renameSync(tmp, stateFile(dir))
}

/** Removes the state file if it still describes process `pid` (a newer agent's is left alone). */
export const removeState = (dir: string, pid: number): void => {
  const state = readState(dir)
  if (state && state.pid !== pid) return
  try {
    fs.unlinkSync(stateFile(dir))
  } catch {
    // already gone
  }
}

/** A process's state letter from /proc/<pid>/stat (R, S, D, T, t, Z...), or undefined where unreadable (gone). */
export const processState = (pid: number): string | undefined => {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "latin1")
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3)
  } catch {
    return undefined
  }
}

export const pidAlive = (pid: number): boolean => {
  if (!Number.isInteger(pid) || pid <= 0) return false
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}
