// Runs a test's child script on the software WebGPU adapter (swiftshader.ts) and gives back the one
// JSON line it prints: for tests whose webgpu work must run in a process started with the adapter's
// environment. The child is killed after `deadlineMs`; a failure says how it ended and the end of
// its stderr.
import { spawn } from "node:child_process"
import { swiftShaderEnv } from "./swiftshader.ts"

export const runWebGpuChild = <T>(script: string, deadlineMs: number): Promise<T> =>
  new Promise<T>((resolve, reject) => {
    const child = spawn(process.execPath, [script], { env: { ...process.env, ...swiftShaderEnv() }, stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let err = ""
    child.stdout.setEncoding("utf8").on("data", (c: string) => (out += c))
    child.stderr.setEncoding("utf8").on("data", (c: string) => (err = (err + c).slice(-3_000)))
    const timer = setTimeout(() => child.kill("SIGKILL"), deadlineMs)
    child.on("error", (e) => {
      clearTimeout(timer)
      reject(e)
    })
    child.on("exit", (code, signal) => {
      clearTimeout(timer)
      const line = out.split("\n").find((l) => l.startsWith("{"))
      if (code === 0 && line) resolve(JSON.parse(line) as T)
      else reject(new Error(`the child ${signal ? `was killed (${signal})` : `exited with code ${code}`}; stderr: ${err}`))
    })
  })
