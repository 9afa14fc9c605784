// core/tier-up.ts in a real Node process: with GRADWIRE_TURBOFAN_AFTER=500 a function called 1500
// times is optimized by TurboFan, with 0 (V8's own count, 3000) it is not yet; a bad value falls
// back to the default. Optimization is made synchronous (--no-concurrent-recompilation) and read
// with V8's own %GetOptimizationStatus (bit 16: optimized), so the outcome does not depend on timing.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { afterAll, describe, expect, it } from "vitest"
import { turbofanAfter } from "../core/settings.ts"

const TIER_UP = pathToFileURL(fileURLToPath(new URL("../core/tier-up.ts", import.meta.url))).href
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-tier-up-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

const script = path.join(dir, "probe.mjs")
fs.writeFileSync(
  script,
  `const { tierUpSooner } = await import(${JSON.stringify(TIER_UP)})
const set = tierUpSooner()
function f(a) { return a + 1 }
function drive(n) { let s = 0; for (let i = 0; i < n; i++) s = f(s); return s }
%NeverOptimizeFunction(drive)
drive(1500)
console.log(JSON.stringify({ set: set ?? null, optimized: (%GetOptimizationStatus(f) & 16) !== 0 }))
`
)

const probe = (value: string): { set: number | null; optimized: boolean } => {
  const r = spawnSync(process.execPath, ["--allow-natives-syntax", "--no-concurrent-recompilation", script], {
    env: { ...process.env, GRADWIRE_TURBOFAN_AFTER: value },
    encoding: "utf8",
    timeout: 30_000
  })
  expect(r.status, r.stderr).toBe(0)
  return JSON.parse(r.stdout.trim().split("\n").pop()!) as { set: number | null; optimized: boolean }
}

describe("tierUpSooner", () => {
  it("has V8 optimize a function after GRADWIRE_TURBOFAN_AFTER calls (500 by default), and leaves V8's own count at 0", () => {
    expect(probe("500")).toEqual({ set: 500, optimized: true })
    expect(probe("0")).toEqual({ set: null, optimized: false })
  })

  it("reads a bad value as the default", () => {
    const before = process.env.GRADWIRE_TURBOFAN_AFTER
    try {
      for (const bad of ["-1", "1.5", "many"]) {
        process.env.GRADWIRE_TURBOFAN_AFTER = bad
        expect(turbofanAfter.read()).toBe(500)
      }
      process.env.GRADWIRE_TURBOFAN_AFTER = "99999999"
      expect(turbofanAfter.read()).toBe(1_000_000)
      delete process.env.GRADWIRE_TURBOFAN_AFTER
      expect(turbofanAfter.read()).toBe(500)
    } finally {
      if (before === undefined) delete process.env.GRADWIRE_TURBOFAN_AFTER
      else process.env.GRADWIRE_TURBOFAN_AFTER = before
    }
  })
})
