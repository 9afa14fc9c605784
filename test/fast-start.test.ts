// bin/fast-start.js, which every process gradwire starts loads first: it keeps V8's compiled code
// and the stripped TypeScript of gradwire's own files across starts, in a directory only this user
// can write. Real node processes, a temp cache directory per test.
import { afterAll, describe, expect, it } from "vitest"
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { FAST_START_ARGS } from "../core/fast-start.ts"

const ROOT = path.resolve(".")
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gw-fast-start-"))
/** A TypeScript file of gradwire's own (below its root; *.tmp.ts is git-ignored) whose line 4 throws. */
const probe = path.join(ROOT, "test", `fast-start-${process.pid}.tmp.ts`)
const probeSource = (word: string): string =>
  [`type Word = string`, `export const word: Word = "${word}"`, `export const fail = (): never => {`, `  throw new Error("line four")`, `}`, ""].join("\n")

afterAll(() => {
  fs.rmSync(work, { recursive: true, force: true })
  fs.rmSync(probe, { force: true })
})

/** Runs node with fast-start first: imports the probe, prints its word and the line of its throw. */
const run = (env: Record<string, string>): { word: string; line: string; stderr: string } => {
  const script = `const m = await import(${JSON.stringify(probe)}); let line = ""; try { m.fail() } catch (e) { line = /tmp\\.ts:(\\d+)/.exec(e.stack)?.[1] ?? "" } console.log(JSON.stringify({ word: m.word, line }))`
  const r = spawnSync(process.execPath, [...FAST_START_ARGS, "--input-type=module", "-e", script], { encoding: "utf8", env: { ...process.env, ...env }, timeout: 30_000 })
  expect(r.status, r.stderr).toBe(0)
  return { ...(JSON.parse(r.stdout.trim()) as { word: string; line: string }), stderr: r.stderr }
}

/** The cached stripped sources in `dir` (one file per source file). */
const entries = (dir: string): string[] => {
  const ts = path.join(dir, `ts-${process.versions.node}`)
  return fs.existsSync(ts) ? fs.readdirSync(ts).map((f) => path.join(ts, f)) : []
}

describe("fast start: compiled code and stripped TypeScript kept across starts", () => {
  it("fills the cache on the first start and runs from it on the next, with the source's line numbers and no warning", () => {
    const dir = path.join(work, "a")
    fs.writeFileSync(probe, probeSource("first"))
    expect(run({ GW_CACHE_DIR: dir })).toEqual({ word: "first", line: "4", stderr: "" })
    const [entry] = entries(dir)
    expect(entries(dir)).toHaveLength(1)
    expect(fs.readFileSync(entry!, "utf8")).toContain('export const word       = "first"')
    expect(fs.existsSync(path.join(dir, "v8"))).toBe(true)
    expect(fs.statSync(dir).mode & 0o777).toBe(0o700)
    // The next start reads the entry: what it runs is the cache's (marked here), lines unchanged.
    fs.writeFileSync(entry!, fs.readFileSync(entry!, "utf8").replace('"first"', '"cached"'))
    expect(run({ GW_CACHE_DIR: dir })).toEqual({ word: "cached", line: "4", stderr: "" })
  })

  it("strips a changed file again: an entry that does not match its source's hash is never run", () => {
    const dir = path.join(work, "b")
    fs.writeFileSync(probe, probeSource("before"))
    expect(run({ GW_CACHE_DIR: dir }).word).toBe("before")
    fs.writeFileSync(probe, probeSource("after"))
    expect(run({ GW_CACHE_DIR: dir }).word).toBe("after")
    // Still one entry per source file, however often it changes.
    expect(entries(dir)).toHaveLength(1)
    expect(fs.readFileSync(entries(dir)[0]!, "utf8")).toContain('"after"')
  })

  it("uses no directory another user could write to, and none with GW_CACHE_DIR=off; the process runs the same", () => {
    const open = path.join(work, "open")
    fs.mkdirSync(open, { mode: 0o777 })
    fs.chmodSync(open, 0o777)
    fs.writeFileSync(probe, probeSource("plain"))
    expect(run({ GW_CACHE_DIR: open })).toEqual({ word: "plain", line: "4", stderr: "" })
    expect(fs.readdirSync(open)).toEqual([])
    const off = path.join(work, "off-default")
    expect(run({ GW_CACHE_DIR: "off", XDG_CACHE_HOME: off })).toEqual({ word: "plain", line: "4", stderr: "" })
    expect(fs.existsSync(off)).toBe(false)
  })

  it("defaults to $XDG_CACHE_HOME/gradwire", () => {
    const xdg = path.join(work, "xdg")
    fs.writeFileSync(probe, probeSource("xdg"))
    const env: Record<string, string> = { XDG_CACHE_HOME: xdg }
    const saved = process.env.GW_CACHE_DIR
    delete process.env.GW_CACHE_DIR
    try {
      expect(run(env).word).toBe("xdg")
    } finally {
      if (saved !== undefined) process.env.GW_CACHE_DIR = saved
    }
    expect(entries(path.join(xdg, "gradwire"))).toHaveLength(1)
  })
})
