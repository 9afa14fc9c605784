// The folders are layers, and imports only go down them: core at the bottom; collectives and
// scheduler on core; the actor runtime on those; the node side on the runtime; observability of a
// run on core alone; training on all of them, its folders sorted by the process a file runs in; the
// CLI and the root entry on top. This reads every source file's imports and fails naming the file
// and the import that goes up or sideways.
import { describe, expect, it } from "vitest"
import * as fs from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

const ROOT = fileURLToPath(new URL("../", import.meta.url))

/** What every folder of actors/train/ may import from below it. */
const BELOW_TRAIN = ["core/", "collectives/", "scheduler/", "actors/runtime/", "actors/node/"]

/** Each layer, by folder prefix (most specific first), and the layers it may import. */
const LAYERS: ReadonlyArray<readonly [string, ReadonlyArray<string>]> = [
  ["core/", ["core/"]],
  ["collectives/", ["core/", "collectives/"]],
  ["scheduler/", ["core/", "scheduler/"]],
  ["actors/runtime/", ["core/", "scheduler/", "actors/runtime/"]],
  ["actors/node/", ["core/", "scheduler/", "actors/runtime/", "actors/node/"]],
  // actors/train/ by the process a file runs in: driver/ (the process that calls fit()), worker/
  // (each worker), parameter-server/ (each server), dashboard/ (the driver or the CLI), common/
  // (imported by more than one of them). None imports another's folder, except that the driver
  // reads the strategy registry (worker/strategies/) to check a configuration before anything starts.
  ["actors/train/common/observe/", ["core/", "actors/train/common/observe/"]],
  ["actors/train/common/optim/", ["core/", "actors/train/common/optim/"]],
  ["actors/train/common/", [...BELOW_TRAIN, "actors/train/common/"]],
  ["actors/train/parameter-server/", [...BELOW_TRAIN, "actors/train/common/", "actors/train/parameter-server/"]],
  ["actors/train/worker/model-parallel/", ["core/", "collectives/", "actors/train/worker/model-parallel/"]],
  ["actors/train/worker/", [...BELOW_TRAIN, "actors/train/common/", "actors/train/worker/"]],
  ["actors/train/dashboard/", [...BELOW_TRAIN, "actors/train/common/", "actors/train/dashboard/"]],
  ["actors/train/driver/", [...BELOW_TRAIN, "actors/train/common/", "actors/train/dashboard/", "actors/train/worker/strategies/", "actors/train/driver/"]],
  ["actors/", ["core/", "collectives/", "scheduler/", "actors/"]]
]

const layerOf = (file: string): readonly [string, ReadonlyArray<string>] | undefined => LAYERS.find(([prefix]) => file.startsWith(prefix))

const sourceFiles = (dir: string): string[] =>
  fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true }).flatMap((e) => {
    const rel = path.posix.join(dir, e.name)
    if (e.isDirectory()) return sourceFiles(rel)
    return /\.(ts|mjs)$/.test(e.name) ? [rel] : []
  })

const importsOf = (file: string): string[] => {
  const src = fs.readFileSync(path.join(ROOT, file), "utf8")
  const out: string[] = []
  for (const m of src.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s*"(\.{1,2}\/[^"]+)"/g)) out.push(m[1])
  for (const m of src.matchAll(/\bimport\(\s*"(\.{1,2}\/[^"]+)"\s*\)/g)) out.push(m[1])
  return out.map((spec) => path.posix.normalize(path.posix.join(path.posix.dirname(file), spec)))
}

describe("layout", () => {
  const files = ["core", "collectives", "scheduler", "actors"].flatMap(sourceFiles)

  it("finds the layers' files", () => {
    expect(files.length).toBeGreaterThan(80)
    for (const f of files) expect(layerOf(f), `${f} is in no layer`).toBeDefined()
  })

  it("imports only go down the layers", () => {
    const wrong: string[] = []
    for (const f of files) {
      const [, allowed] = layerOf(f)!
      for (const target of importsOf(f)) {
        if (!allowed.some((a) => target.startsWith(a))) wrong.push(`${f} imports ${target}`)
      }
    }
    expect(wrong).toEqual([])
  })

  it("every folder says what lives there and what it may import", () => {
    for (const dir of ["core", "core/nats-internals", "core/data", "collectives", "scheduler", "actors", "actors/runtime", "actors/node", "actors/train", "actors/train/driver", "actors/train/worker", "actors/train/worker/strategies", "actors/train/worker/model-parallel", "actors/train/parameter-server", "actors/train/dashboard", "actors/train/common", "actors/train/common/observe", "actors/train/common/optim"]) {
      const readme = path.join(ROOT, dir, "README.md")
      expect(fs.existsSync(readme), `${dir}/README.md`).toBe(true)
      expect(fs.readFileSync(readme, "utf8")).toMatch(/may import/i)
    }
  })

  it("gradwire's own code imports Effect module by module, never the barrel that loads all of it", () => {
    // "effect" loads every one of Effect's modules: about 0.1 s of every process's start (docs/development.md).
    const barrel = /(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s*"effect"/
    const wrong = [...files, "index.ts", "effect.ts"].filter((f) => barrel.test(fs.readFileSync(path.join(ROOT, f), "utf8")))
    expect(wrong).toEqual([])
    expect(barrel.test('import { Schema } from "effect"\n')).toBe(true)
  })

  it("examples import only the public entry points (index.ts, effect.ts) and each other", () => {
    const wrong: string[] = []
    for (const f of sourceFiles("examples")) {
      for (const target of importsOf(f)) {
        if (target !== "index.ts" && target !== "effect.ts" && !target.startsWith("examples/")) wrong.push(`${f} imports ${target}`)
      }
    }
    expect(sourceFiles("examples").length).toBeGreaterThan(5)
    expect(wrong).toEqual([])
  })

  it("the checker sees an import that goes up", () => {
    const tmp = path.join(ROOT, "core", "__layout_probe.tmp.ts")
    fs.writeFileSync(tmp, 'import { Trainer } from "../actors/train/driver/trainer.ts"\nexport const x = Trainer\n')
    try {
      expect(importsOf("core/__layout_probe.tmp.ts")).toEqual(["actors/train/driver/trainer.ts"])
    } finally {
      fs.rmSync(tmp)
    }
  })

  it("no module imports itself back, through any chain of imports, type-only ones included", () => {
    const graph = new Map(files.map((f) => [f, importsOf(f).filter((t) => t !== f)]))
    const circles: string[] = []
    const state = new Map<string, "open" | "done">()
    const visit = (f: string, trail: string[]): void => {
      if (state.get(f) === "done") return
      if (state.get(f) === "open") {
        circles.push([...trail.slice(trail.indexOf(f)), f].join(" -> "))
        return
      }
      state.set(f, "open")
      for (const t of graph.get(f) ?? []) visit(t, [...trail, f])
      state.set(f, "done")
    }
    for (const f of files) visit(f, [])
    expect(circles).toEqual([])
  })
})
