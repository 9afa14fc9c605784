// Waits until every forked rank process has sent its first IPC message ("ready"), under a
// deadline; a child that exits first fails the wait with its exit code.
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
