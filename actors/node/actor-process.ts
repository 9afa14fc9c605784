// One actor process run by a node agent: a Node child running actors/node/host.ts. Its stdout and
// stderr are split into lines and handed on (the agent prefixes and forwards them), the last
// stderr lines are kept for the exit notice (usually they say why it died), and killing is
// SIGTERM then SIGKILL after a grace period. The child's stdin is a pipe only we hold: it carries
// the spawn spec, then stays open, so the child sees EOF and exits if the agent dies, however.
import { spawn, type ChildProcess } from "node:child_process"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"
import { FAST_START_ARGS } from "../../core/fast-start.ts"
import { idleStartPrefix, lowerChild, raiseChild, watchStarvation } from "../../core/priority.ts"
import { nodeOptions } from "../../core/settings.ts"

export const HOST_SCRIPT = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "./host.ts" : "./host.js", import.meta.url))

const MAX_LINE = 16 * 1024

export interface ProcessExit {
  readonly code: number | null
  readonly signal: string | null
}

export interface ActorProcessOptions {
  readonly cwd?: string
  readonly env: NodeJS.ProcessEnv
  /**
   * The spec line written to the child's stdin (base64, newline-terminated by us). Without one the
   * process starts warm: it loads gradwire's worker modules and waits for assign() (host.ts).
   */
  readonly spec?: string
  readonly onLine: (stream: "stdout" | "stderr", line: string) => void
  readonly tailLines?: number
}

/**
 * argv of a warm host: the flag, and room for the title it takes once assigned (Linux keeps a
 * process's title in the space of its original argv), so `ps` and /proc/<pid>/cmdline name the job
 * and actor it runs, as a cold start's environment does.
 */
const WARM_ARGS = ["--warm", `--title-room=${".".repeat(160)}`]

/**
 * How this process runs TypeScript, which the actor processes it starts run the same way: a driver
 * started with --experimental-transform-types (enums, namespaces) has workers (of its embedded
 * cluster's agent) that import the loop's module with it too.
 */
const TYPESCRIPT_FLAGS: ReadonlyArray<string> = [...new Set([...process.execArgv, ...nodeOptions.read()])].filter(
  (a) => a === "--experimental-transform-types" || a === "--no-experimental-strip-types"
)

export class ActorProcess {
  readonly child: ChildProcess
  readonly pid: number
  readonly exited: Promise<ProcessExit>
  /** Why we killed it, when we did (goes into the exit notice). */
  killedBy: string | undefined
  readonly #tail: string[] = []
  readonly #tailLines: number
  #exit: ProcessExit | undefined
  /** Where output lines go (a warm process's change when it is assigned). */
  onLine: (stream: "stdout" | "stderr", line: string) => void
  /** Whether the process started warm and still waits for its spec. */
  #waiting: boolean
  /** Whether it was started lowered (GRADWIRE_START_NICE). */
  readonly #startedLowered: boolean

  constructor(options: ActorProcessOptions) {
    this.#tailLines = options.tailLines ?? 30
    this.onLine = options.onLine
    this.#waiting = options.spec === undefined
    // A standby worker, or a warm process on a fully used node, starts lowered (core/priority.ts):
    // on SCHED_IDLE from its first instruction where that applies (started through chrt, which
    // execs node), its main thread's nice value right after the spawn, before node starts its
    // other threads; its host lowers the rest and raises them all back when it is needed.
    const startNice = Number(options.env.GRADWIRE_START_NICE ?? "0")
    this.#startedLowered = startNice > 0
    const [command, ...prefix] = [...idleStartPrefix(startNice, options.env), process.execPath]
    this.child = spawn(command!, [...prefix, ...FAST_START_ARGS, ...TYPESCRIPT_FLAGS, HOST_SCRIPT, ...(options.spec === undefined ? WARM_ARGS : [])], {
      cwd: options.cwd,
      env: options.env,
      stdio: ["pipe", "pipe", "pipe"]
    })
    // EPIPE when the child is already gone is not our problem.
    this.child.stdin!.on("error", () => {})
    this.pid = this.child.pid ?? -1
    if (startNice > 0 && this.pid > 0) lowerChild(this.pid, startNice)
    this.exited = new Promise((resolve) => {
      let streams = 2
      let exit: ProcessExit | undefined
      const settle = (): void => {
        // Resolve after both streams ended, so the tail has the last lines.
        if (exit && streams <= 0 && this.#exit === undefined) {
          this.#exit = exit
          resolve(exit)
        }
      }
      for (const [name, stream] of [
        ["stdout", this.child.stdout!],
        ["stderr", this.child.stderr!]
      ] as const) {
        const lines = createInterface({ input: stream, crlfDelay: Infinity })
        lines.on("line", (raw) => {
          const line = raw.length > MAX_LINE ? `${raw.slice(0, MAX_LINE)}… (${raw.length} chars)` : raw
          if (name === "stderr") {
            this.#tail.push(line)
            if (this.#tail.length > this.#tailLines) this.#tail.shift()
          }
          this.onLine(name, line)
        })
        lines.on("close", () => {
          streams--
          settle()
        })
      }
      this.child.on("exit", (code, signal) => {
        exit = { code, signal }
        settle()
        // A grandchild that inherited stdout/stderr can keep the pipes open after the process
        // itself is gone: do not wait for them for long.
        setTimeout(() => {
          streams = 0
          settle()
        }, 1_000).unref()
      })
      this.child.on("error", (e) => {
        this.#tail.push(`spawn failed: ${e.message}`)
        exit = { code: null, signal: null }
        streams = 0
        settle()
      })
    })
    if (options.spec !== undefined) this.child.stdin!.write(`${options.spec}\n`)
  }

  /** Whether this is a warm process that still waits for its spec (and is running). */
  get idle(): boolean {
    return this.#waiting && this.running
  }

  /**
   * Hands a warm process its spec (which carries the environment it takes, host-spec.ts); once.
   * `lowered`: whether the actor it becomes starts lowered (a standby); where it does not and this
   * warm process was started lowered, it is raised from here first (core/priority.ts raiseChild):
   * on cores that other work keeps busy it could not raise itself in time.
   */
  assign(spec: string, onLine: (stream: "stdout" | "stderr", line: string) => void, lowered = false): void {
    if (!this.#waiting) throw new Error(`process ${this.pid} is not a warm one waiting for its spec`)
    if (this.#startedLowered && !lowered) raiseChild(this.pid)
    this.#waiting = false
    this.#tail.length = 0
    this.onLine = onLine
    this.child.stdin!.write(`${spec}\n`)
  }

  /**
   * For a process started lowered that runs an actor (a standby worker, or a lowered warm process a
   * spawn took): raises it from here if it starves while lowered (core/priority.ts
   * watchStarvation), and says so through `onRaised`; watched until it exits. No-op for a process
   * not started lowered.
   */
  raiseWhenStarved(onRaised: (why: string) => void): void {
    if (!this.#startedLowered || !this.running) return
    const stop = watchStarvation(this.pid, onRaised)
    void this.exited.then(stop)
  }

  get running(): boolean {
    return this.#exit === undefined
  }

  stderrTail(): string {
    return this.#tail.join("\n")
  }

  /** SIGTERM (and SIGCONT, for a stopped process), then SIGKILL after `graceMs`; resolves when it has exited. */
  /**
   * SIGKILL now, with no SIGTERM first: for a process that must not run another instruction (one
   * found stopped: continuing it to take a SIGTERM would let a hung rank step and send again).
   */
  async killNow(reason: string): Promise<ProcessExit> {
    if (this.#exit) return this.#exit
    this.killedBy ??= reason
    this.child.kill("SIGKILL")
    return await this.exited
  }

  async kill(reason: string, graceMs: number): Promise<ProcessExit> {
    if (this.#exit) return this.#exit
    this.killedBy ??= reason
    this.child.kill("SIGTERM")
    // A stopped process (SIGSTOP, a debugger, a frozen cgroup) would hold SIGTERM pending until the
    // grace period ends in SIGKILL: continue it so it takes the SIGTERM now and exits as asked.
    this.child.kill("SIGCONT")
    const timer = setTimeout(() => this.child.kill("SIGKILL"), graceMs)
    try {
      return await this.exited
    } finally {
      clearTimeout(timer)
    }
  }
}
