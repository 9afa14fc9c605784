// core/kernels/webgpu-upload.ts: on webgpu, a tensor's CPU values go to the GPU through the queue's
// writeBuffer into tfjs's pooled buffers, not a new staging buffer per upload. Checked on the
// software adapter (support/swiftshader.ts) in a child process: every dtype and size comes back as
// uploaded, also where a pooled buffer is reused right after a read or while a kernel reading an
// earlier upload is still unsubmitted; and an upload of a size the pool holds creates no GPU buffer,
// where tfjs's own creates one each time.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { runWebGpuChild } from "./support/webgpu-child.ts"

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
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
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
