// Runs an example script as its own process (as a user would), collecting its output. Bounded:
// past timeoutMs it gets SIGTERM (the examples tear down on it), then SIGKILL for its whole process
// group, so a hung example never outlives the test.
import { spawn } from "node:child_process"

export interface ScriptRun {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly output: string
}

export const runScript = (
  script: string,
  args: ReadonlyArray<string>,
  opts: { timeoutMs?: number; env?: Record<string, string>; nodeArgs?: ReadonlyArray<string>; onOutput?: (all: string, kill: (s: NodeJS.Signals) => void) => void } = {}
): Promise<ScriptRun> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...(opts.nodeArgs ?? []), script, ...args], {
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, CI: "true", ...opts.env }
    })
    let output = ""
    const kill = (s: NodeJS.Signals): void => {
      try {
        child.kill(s)
      } catch {
        // gone
      }
    }
    const onData = (d: Buffer): void => {
      output += d.toString()
      opts.onOutput?.(output, kill)
    }
    child.stdout.on("data", onData)
    child.stderr.on("data", onData)
    const soft = setTimeout(() => kill("SIGTERM"), opts.timeoutMs ?? 120_000)
    const hard = setTimeout(() => {
      try {
        if (child.pid) process.kill(-child.pid, "SIGKILL")
      } catch {
        // gone
      }
    }, (opts.timeoutMs ?? 120_000) + 20_000)
    child.on("error", reject)
    child.on("close", (code, signal) => {
      clearTimeout(soft)
      clearTimeout(hard)
      resolve({ code, signal, output })
    })
  })

/** Whether a process id is alive. */
export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}
