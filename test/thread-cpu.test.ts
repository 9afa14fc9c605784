// bench/thread-cpu.ts, the all-reduce benchmark's `--cpu`: a child process whose worker thread
// spends 300 ms of CPU and whose main thread spends 150 ms (each thread counts its own from
// /proc/thread-self, so a loaded machine only stretches the wall time) is read before and after:
// the busiest thread is the worker's, all threads together both.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import { describe, expect, it } from "vitest"
import { cpuBetween, threadTimes } from "../bench/thread-cpu.ts"

const CHILD = `
const { Worker } = require("node:worker_threads")
const fs = require("node:fs")
const own = () => Number(fs.readFileSync("/proc/thread-self/schedstat", "utf8").split(" ")[0]) / 1e6
const spend = (ms) => { const end = own() + ms; let x = 0; while (own() < end) for (let i = 0; i < 1e5; i++) x += i; return x }
process.stdin.once("data", () => {
  const w = new Worker(\`
    const fs = require("node:fs")
    const own = () => Number(fs.readFileSync("/proc/thread-self/schedstat", "utf8").split(" ")[0]) / 1e6
    const end = own() + 300; let x = 0; while (own() < end) for (let i = 0; i < 1e5; i++) x += i
    require("node:worker_threads").parentPort.postMessage(x)
    setInterval(() => {}, 1000) // alive until the process ends: an ended thread's time leaves /proc\`, { eval: true })
  spend(150)
  w.once("message", () => setTimeout(() => process.stdout.write("done\\n"), 50))
})
process.stdout.write("ready\\n")
setTimeout(() => process.exit(0), 60_000).unref()
`

describe.skipIf(!fs.existsSync("/proc/self/task"))("thread CPU from /proc", () => {
  it("tells a process's busiest thread from all its threads, a thread started in between counted from zero", async () => {
    const child = spawn(process.execPath, ["-e", CHILD], { stdio: ["pipe", "pipe", "inherit"] })
    try {
      const line = (): Promise<string> => new Promise((resolve) => child.stdout!.once("data", (d: Buffer) => resolve(String(d).trim())))
      expect(await line()).toBe("ready")
      const before = threadTimes(child.pid!)
      expect(before).toBeDefined()
      const done = line()
      child.stdin!.write("go\n")
      expect(await done).toBe("done")
      const spent = cpuBetween(before, threadTimes(child.pid!))
      // the worker thread (not there before) is the busiest: its 300 ms, not the main thread's 150
      expect(spent.busiestMs).toBeGreaterThanOrEqual(295)
      expect(spent.busiestMs).toBeLessThan(1000)
      expect(spent.totalMs).toBeGreaterThanOrEqual(spent.busiestMs + 145)
    } finally {
      child.kill("SIGKILL")
    }
    // a process that is gone reads as nothing, and nothing spent
    await new Promise((r) => child.once("exit", r))
    expect(threadTimes(child.pid!)).toBeUndefined()
    expect(cpuBetween(undefined, new Map([["1", 5]]))).toEqual({ busiestMs: 0, totalMs: 0 })
  }, 60_000)
})
