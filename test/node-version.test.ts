// The Node version guard: the version comparison of bin/check-node.js (npm scripts, CLI) and of
// core/node-version.ts (the built package) agree with each other and with package.json's
// "engines"; `gradwire --version`; and, run for real with an older Node found on this machine,
// `npm run demo`, `npm test`, `npm run bench` and the CLI stop at once with the one line that
// names the version and the fix (exit code 1), never a stack trace about ".ts" files.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, describe, expect, it } from "vitest"
import { MIN_NODE, nodeTooOld } from "../core/node-version.ts"
import { describeOldNode, findOldNode } from "./support/old-node.ts"

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8")) as { version: string; engines: { node: string } }

interface Guard {
  readonly MIN_NODE: ReadonlyArray<number>
  readonly nodeTooOld: (version: string) => boolean
  readonly nodeVersionMessage: (version: string, checkout: boolean) => string
}
// Plain JavaScript without types: imported by URL, so TypeScript takes it as it is.
const guard = (await import(new URL("../bin/check-node.js", import.meta.url).href)) as Guard

describe("Node version guard", () => {
  it("bin/check-node.js, core/node-version.ts and package.json engines name the same minimum", () => {
    expect(guard.MIN_NODE).toEqual([...MIN_NODE])
    expect(pkg.engines.node).toBe(`>=${MIN_NODE.join(".")}`)
  })

  it("both compare versions alike, at the edges", () => {
    const cases: Array<[string, boolean]> = [
      ["20.20.2", true],
      ["v22.18.9", true],
      ["22.0.0", true],
      ["22.19.0", false],
      ["v22.100.0", false],
      ["23.0.0", false],
      ["24.1.0", false],
      ["18.20.0", true]
    ]
    for (const [version, old] of cases) {
      expect(nodeTooOld(version), version).toBe(old)
      expect(guard.nodeTooOld(version), version).toBe(old)
    }
  })

  it("the message names the version found and the fix, on one line", () => {
    const inCheckout = guard.nodeVersionMessage("20.20.2", true)
    expect(inCheckout).toBe(
      'gradwire needs Node >= 22.19 (found v20.20.2): run "bash scripts/setup.sh" (or "npm install -g --prefix /usr/local node@22")'
    )
    expect(guard.nodeVersionMessage("v18.0.0", false)).toMatch(/^gradwire needs Node >= 22\.19 \(found v18\.0\.0\): run "npm install -g --prefix \/usr\/local node@22"/)
  })

  it("on this Node the guard passes silently", () => {
    const r = spawnSync(process.execPath, [path.join(ROOT, "bin", "check-node.js")], { encoding: "utf8" })
    expect(r.status).toBe(0)
    expect(r.stdout + r.stderr).toBe("")
  })

  it("gradwire --version and -V print the package version", () => {
    for (const flag of ["--version", "-V"]) {
      const r = spawnSync(process.execPath, [path.join(ROOT, "bin", "gradwire.js"), flag], { encoding: "utf8" })
      expect(r.status, r.stderr).toBe(0)
      expect(r.stdout).toBe(`${pkg.version}\n`)
    }
  })
})

const old = findOldNode()

describe.skipIf(!old)(`with an older Node (${describeOldNode(old)})`, () => {
  // A PATH whose first `node` is the old one, as on a machine that has only that.
  const shim = fs.mkdtempSync(path.join(os.tmpdir(), "gw-oldnode-"))
  afterAll(() => fs.rmSync(shim, { recursive: true, force: true }))
  const expected = `gradwire needs Node >= 22.19 (found ${old?.version}): run "bash scripts/setup.sh" (or "npm install -g --prefix /usr/local node@22")`

  const expectOneLine = (r: ReturnType<typeof spawnSync>): void => {
    const out = `${r.stdout}${r.stderr}`
    expect(r.status, out).toBe(1)
    const lines = out.split("\n").filter((l) => l.trim() !== "" && !l.includes("Unknown user config"))
    expect(lines).toEqual([expected])
    expect(out).not.toMatch(/\.ts\b|ERR_UNKNOWN_FILE_EXTENSION|\n\s+at /)
  }

  it("the guard itself", () => {
    expectOneLine(spawnSync(old!.bin, [path.join(ROOT, "bin", "check-node.js")], { encoding: "utf8" }))
  })

  it("the gradwire CLI (a command, and --version)", () => {
    for (const args of [["status"], ["--version"]]) {
      expectOneLine(spawnSync(old!.bin, [path.join(ROOT, "bin", "gradwire.js"), ...args], { cwd: ROOT, encoding: "utf8" }))
    }
  })

  it("npm run demo, npm test, npm run bench", () => {
    fs.symlinkSync(old!.bin, path.join(shim, "node"))
    const env = { ...process.env, PATH: `${shim}${path.delimiter}${process.env.PATH}` }
    for (const script of [["run", "demo"], ["test"], ["run", "bench", "--", "codecs"]]) {
      const r = spawnSync("npm", ["--silent", ...script], { cwd: ROOT, env, encoding: "utf8", timeout: 60_000 })
      expectOneLine(r)
    }
  })
})
