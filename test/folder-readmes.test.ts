// Every folder's README.md names everything in its folder: each file by its file name (`ring.ts`)
// and each subfolder with a slash (`simd/`), so a reader of the README finds every module, and a
// file added without a word about it fails here, naming the README and the file. The root README
// is the user's front page, not a folder's list, and is left out (docs/development.md's Layout
// table names the folders; test/layout.test.ts checks that the source folders have a README at
// all). What git ignores (.gitignore: build output, node_modules, temp files) and dot files are not
// the folder's files.
import { describe, expect, it } from "vitest"
import * as fs from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

const ROOT = fileURLToPath(new URL("../", import.meta.url))

const escape = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** .gitignore's patterns as tests on a path relative to the root (the forms it uses: globs, anchored and folder patterns). */
const ignoredBy = (gitignore: string): ((rel: string) => boolean) => {
  const tests = gitignore
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"))
    .map((pattern) => {
      if (pattern.startsWith("!")) throw new Error(`.gitignore: negated patterns ("${pattern}") are not read here: teach folder-readmes.test.ts`)
      const p = pattern.replace(/\/$/, "")
      const glob = new RegExp(`^${p.replace(/^\//, "").split("*").map(escape).join("[^/]*")}$`)
      // A pattern with a slash before its end is anchored at the root; one without matches a name anywhere.
      return p.includes("/") ? (rel: string) => glob.test(rel) : (rel: string) => glob.test(path.posix.basename(rel))
    })
  return (rel) => tests.some((t) => t(rel))
}

const ignored = ignoredBy(fs.readFileSync(path.join(ROOT, ".gitignore"), "utf8"))

/** A folder's own entries: name and whether it is a folder. */
const entries = (dir: string): Array<{ name: string; folder: boolean }> =>
  fs
    .readdirSync(path.join(ROOT, dir), { withFileTypes: true })
    .filter((e) => !e.name.startsWith(".") && !ignored(path.posix.join(dir, e.name)))
    .map((e) => ({ name: e.name, folder: e.isDirectory() }))

/** Every folder below the root with a README.md. */
const readmeFolders = (dir = ""): string[] =>
  entries(dir)
    .filter((e) => e.folder)
    .flatMap((e) => {
      const sub = path.posix.join(dir, e.name)
      return [...(fs.existsSync(path.join(ROOT, sub, "README.md")) ? [sub] : []), ...readmeFolders(sub)]
    })

/** The README names it: a file by its whole name, a folder as `name/`, not as part of a longer name. */
const names = (readme: string, entry: { name: string; folder: boolean }): boolean =>
  new RegExp(`(?<![A-Za-z0-9_.-])${escape(entry.name)}${entry.folder ? "/" : "(?![A-Za-z0-9_-]|\\.[A-Za-z0-9])"}`).test(readme)

describe("folder READMEs", () => {
  const folders = readmeFolders()

  it("finds the folders' READMEs", () => {
    expect(folders.length).toBeGreaterThan(15)
    for (const dir of ["core", "collectives", "scheduler", "actors/train/dashboard", "examples/data", "docs"]) expect(folders).toContain(dir)
    expect(folders.some((d) => d.startsWith("node_modules") || d.startsWith("dist"))).toBe(false)
  })

  it("each names every file and subfolder in its folder", () => {
    const missing: string[] = []
    for (const dir of folders) {
      const readme = fs.readFileSync(path.join(ROOT, dir, "README.md"), "utf8")
      for (const e of entries(dir)) if (e.name !== "README.md" && !names(readme, e)) missing.push(`${dir}/README.md does not name ${e.name}${e.folder ? "/" : ""}`)
    }
    expect(missing).toEqual([])
  })

  it("a name counts only whole, and a folder only with its slash", () => {
    const file = { name: "ring.ts", folder: false }
    expect(names("the ring (`ring.ts`).", file)).toBe(true)
    expect(names("see algorithms/ring.ts", file)).toBe(true)
    expect(names("`ring.tsx` and `fast-ring.ts` and ring.ts.bak", file)).toBe(false)
    expect(names("the SIMD kernels (`simd/`)", { name: "simd", folder: true })).toBe(true)
    expect(names("the simd kernels", { name: "simd", folder: true })).toBe(false)
    expect(ignored("dist")).toBe(true)
    expect(ignored("core/__probe.tmp.ts")).toBe(true)
    expect(ignored("core/index.ts")).toBe(false)
  })
})
