// Every layer @tensorflow/tfjs-layers exports trains on the webgpu backend too, run on a software
// adapter (the SwiftShader Vulkan driver of Debian's chromium package, support/swiftshader.ts), so
// the GPU code path is checked on every machine. A child process (started with that driver's
// environment; Dawn may also crash or block inside a driver) takes an Adam step per layer case on
// webgpu, reading only asynchronously, and compares every weight's gradient after it with the wasm
// backend's from the same weights and batch, or with finite differences where wasm-layer-coverage
// does too. One layer cannot run in Node on webgpu: tfjs-layers' categoryEncoding checks its input's
// range with a synchronous read, which needs OffscreenCanvas; the test pins that down, so a tfjs
// release that fixes it fails here until the exception is dropped.
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { TOL, caseNames } from "./support/layer-cases.ts"
import { swiftShaderEnv } from "./support/swiftshader.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-coverage-child.ts", import.meta.url))
const DEADLINE_MS = 8 * 60_000

/** Layers that cannot run on Node's webgpu backend, and the error that says why. */
const CANNOT_RUN: Readonly<Record<string, RegExp>> = { categoryEncoding: /OffscreenCanvas is not defined/ }

interface Line {
  readonly name: string
  readonly worst?: number
  readonly weights?: number
  readonly numeric?: boolean
  readonly none?: string
  readonly error?: string
}

const results = new Map<string, Line>()
let adapter: { software?: boolean; description?: string } | null = null
let stderr = ""

beforeAll(async () => {
  const env = { ...process.env, ...swiftShaderEnv() }
  await new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, [CHILD], { env, stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    child.stdout.setEncoding("utf8").on("data", (c: string) => (out += c))
    child.stderr.setEncoding("utf8").on("data", (c: string) => (stderr = (stderr + c).slice(-4_000)))
    const timer = setTimeout(() => child.kill("SIGKILL"), DEADLINE_MS)
    child.on("error", (e) => {
      clearTimeout(timer)
      reject(e)
    })
    child.on("exit", (code, signal) => {
      clearTimeout(timer)
      for (const l of out.split("\n")) {
        if (!l.startsWith("{")) continue
        const line = JSON.parse(l) as Line & { adapter?: typeof adapter }
        if (line.adapter !== undefined) adapter = line.adapter
        else results.set(line.name, line)
      }
      if (code === 0) resolve()
      else reject(new Error(`the webgpu coverage child ${signal ? `was killed (${signal})` : `exited with code ${code}`} after ${results.size} cases; stderr: ${stderr.slice(-1_500)}`))
    })
  })
}, DEADLINE_MS + 30_000)

describe("every tfjs layer trains on the webgpu backend (SwiftShader), with wasm's gradients", { tags: ["webgpu"] }, () => {
  it("ran on the software adapter, with a result for every case", () => {
    expect(adapter?.software, `adapter: ${JSON.stringify(adapter)}`).toBe(true)
    expect(results.size, stderr).toBe(caseNames().length)
  })

  for (const name of caseNames()) {
    it(name, () => {
      const r = results.get(name)
      expect(r, `no result for ${name}; child stderr: ${stderr.slice(-1_000)}`).toBeDefined()
      if (r!.none !== undefined) {
        expect(r!.none.length).toBeGreaterThan(0)
        return
      }
      const cannot = CANNOT_RUN[name]
      if (cannot) {
        expect(r!.error, `${name} now runs on webgpu: drop it from CANNOT_RUN`).toMatch(cannot)
        return
      }
      expect(r!.error, r!.error).toBeUndefined()
      expect(r!.weights).toBeGreaterThan(0)
      // Finite differences carry float32 rounding of the loss: the same looser bound as on wasm.
      expect(r!.worst, `${name}: worst gradient difference`).toBeLessThanOrEqual(r!.numeric ? 2e-2 : TOL)
    })
  }
})
