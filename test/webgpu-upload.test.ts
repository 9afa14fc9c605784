// core/kernels/webgpu-upload.ts: on webgpu, a tensor's CPU values go to the GPU through the queue's
// writeBuffer into tfjs's pooled buffers, not a new staging buffer per upload. Checked on the
// software adapter (support/swiftshader.ts) in a child process: every dtype and size comes back as
// uploaded, also where a pooled buffer is reused right after a read or while a kernel reading an
// earlier upload is still unsubmitted; and an upload of a size the pool holds creates no GPU buffer,
// where tfjs's own creates one each time.
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { swiftShaderEnv } from "./support/swiftshader.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-upload-child.ts", import.meta.url))
const DEADLINE_MS = 2 * 60_000

interface Result {
  backend: string
  installed: boolean
  again: boolean
  failures: string[]
  ours: number
  tfjs: number
}
let r: Result

beforeAll(async () => {
  const env = { ...process.env, ...swiftShaderEnv() }
  r = await new Promise<Result>((resolve, reject) => {
    const child = spawn(process.execPath, [CHILD], { env, stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let err = ""
    child.stdout.setEncoding("utf8").on("data", (c: string) => (out += c))
    child.stderr.setEncoding("utf8").on("data", (c: string) => (err = (err + c).slice(-3_000)))
    const timer = setTimeout(() => child.kill("SIGKILL"), DEADLINE_MS)
    child.on("exit", (code, signal) => {
      clearTimeout(timer)
      const line = out.split("\n").find((l) => l.startsWith("{"))
      if (code === 0 && line) resolve(JSON.parse(line) as Result)
      else reject(new Error(`the child ${signal ? `was killed (${signal})` : `exited with code ${code}`}; stderr: ${err}`))
    })
  })
}, DEADLINE_MS + 30_000)

describe("webgpu uploads through queue.writeBuffer", () => {
  it("is installed when the webgpu engine loads", () => {
    expect(r.backend).toBe("webgpu")
    expect(r.installed).toBe(true)
    expect(r.again).toBe(true)
  })

  it("reads back every dtype and size as uploaded, with pooled buffers reused after a read and within one command buffer", () => {
    expect(r.failures).toEqual([])
  })

  it("creates no GPU buffer for an upload of a size the pool holds (tfjs's own upload creates one each time)", () => {
    expect(r.ours).toBe(0)
    expect(r.tfjs).toBeGreaterThanOrEqual(1)
  })
})
