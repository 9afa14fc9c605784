// Which CLI bin/gradwire.js runs. In a checkout it must run the TypeScript source even when a
// dist/ is lying around (left by `npm run build` or by `npm pack`'s prepack): agents started by
// the CLI would otherwise run an old build while the driver runs the sources, and two copies of
// the wire format that disagree fail in ways that look like protocol bugs. In an installed package
// (no bin/main.ts is shipped) it runs dist/. Tested on a copy of the launcher in a scratch folder
// whose two entry points only say which one they are.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, describe, expect, it } from "vitest"

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "gw-cli-entry-"))
afterAll(() => fs.rmSync(scratch, { recursive: true, force: true }))

const layout = (withSource: boolean, withDist: boolean): string => {
  const dir = fs.mkdtempSync(path.join(scratch, "pkg-"))
  fs.mkdirSync(path.join(dir, "bin"))
  for (const f of ["bin/gradwire.js", "bin/check-node.js", "bin/fast-start.js", "package.json"]) fs.copyFileSync(path.join(ROOT, f), path.join(dir, f))
  if (withSource) fs.writeFileSync(path.join(dir, "bin", "main.ts"), 'const from: string = "source"\nconsole.log(from, process.argv.slice(2).join(" "))\n')
  if (withDist) {
    fs.mkdirSync(path.join(dir, "dist", "bin"), { recursive: true })
    fs.writeFileSync(path.join(dir, "dist", "bin", "main.js"), 'console.log("dist", process.argv.slice(2).join(" "))\n')
  }
  return dir
}

const run = (dir: string): string => {
  const r = spawnSync(process.execPath, [path.join(dir, "bin", "gradwire.js"), "status", "--json"], { cwd: dir, encoding: "utf8" })
  expect(r.status, r.stderr).toBe(0)
  return r.stdout.trim()
}

describe("bin/gradwire.js entry point", () => {
  it("runs bin/main.ts in a checkout, even with a stale dist/ next to it", () => {
    expect(run(layout(true, true))).toBe("source status --json")
    expect(run(layout(true, false))).toBe("source status --json")
  })

  it("runs dist/bin/main.js in an installed package (no bin/main.ts)", () => {
    expect(run(layout(false, true))).toBe("dist status --json")
  })
})
