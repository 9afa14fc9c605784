// Forked rank processes of the test fleets: wait until each has sent its first IPC message
// ("ready") under a deadline (a child that exits first fails the wait), and kill them all.
import type { ChildProcess } from "node:child_process"

export const awaitChildrenReady = (children: ReadonlyArray<ChildProcess>, timeoutMs: number): Promise<void> =>
  Promise.all(
    children.map(
      (child, rank) =>
        new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`rank ${rank} did not start within ${timeoutMs} ms`)), timeoutMs)
          child.once("message", () => {
            clearTimeout(timer)
            resolve()
          })
          child.once("exit", (code) => {
            clearTimeout(timer)
            reject(new Error(`rank ${rank} exited during start (code ${code})`))
          })
        })
    )
  ).then(() => undefined)

/** SIGKILLs every child still running (a SIGSTOPped one would ignore SIGTERM) and waits for the exits. */
export const killChildren = (children: ReadonlyArray<ChildProcess>, live: Set<ChildProcess>): Promise<void> =>
  Promise.all(
    children.map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) {
            live.delete(child)
            resolve()
            return
          }
          child.once("exit", () => resolve())
          child.kill("SIGKILL")
        })
    )
  ).then(() => undefined)
