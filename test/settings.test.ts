// Environment variables: read in core/settings.ts alone, listed in docs/environment.md exactly as that module
// declares them, and each read as its description says.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { afterEach, describe, expect, it } from "vitest"
import * as settings from "../core/settings.ts"

const ROOT = fileURLToPath(new URL("../", import.meta.url))

/** docs/environment.md's tables, as rendered from the module. */
const tables = (): string[] => [
  [
    "| variable | default | what it does |",
    "|---|---|---|",
    ...settings.SETTINGS.map((s) => `| \`${s.name}\`${s.standard ? " (standard)" : ""} | ${s.default} | ${s.description} |`)
  ].join("\n"),
  ["| variable | what it holds |", "|---|---|", ...settings.WORKER_ENVIRONMENT.map((w) => `| \`${w.name}\` | ${w.description} |`)].join("\n")
]

const sourceFiles = (dir: string): string[] =>
  fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true }).flatMap((e) => {
    const rel = path.posix.join(dir, e.name)
    if (e.isDirectory()) return sourceFiles(rel)
    return /\.(ts|mjs)$/.test(e.name) ? [rel] : []
  })

const saved = new Map<string, string | undefined>()
const setEnv = (name: string, value: string | undefined): void => {
  if (!saved.has(name)) saved.set(name, process.env[name])
  if (value === undefined) delete process.env[name]
  else process.env[name] = value
}

afterEach(() => {
  for (const [name, value] of saved) {
    if (value === undefined) delete process.env[name]
    else process.env[name] = value
  }
  saved.clear()
})

describe("environment variables", () => {
  it("docs/environment.md lists every one, as core/settings.ts declares it", () => {
    const guide = fs.readFileSync(path.join(ROOT, "docs", "environment.md"), "utf8")
    // on failure, the expected tables are printed: paste them into docs/environment.md
    for (const t of tables()) expect(guide.includes(t), `docs/environment.md lacks this table:\n${t}`).toBe(true)
  })

  it("nothing but core/settings.ts reads one", () => {
    const files = ["core", "collectives", "scheduler", "actors", "bin"].flatMap(sourceFiles).concat(fs.readdirSync(ROOT).filter((f) => f.endsWith(".ts") && !f.startsWith("vitest")))
    const reads: string[] = []
    for (const f of files) {
      if (f === "core/settings.ts") continue
      const src = fs.readFileSync(path.join(ROOT, f), "utf8")
      for (const m of src.matchAll(/process\.env(\.[A-Za-z_]\w*|\[)/g)) reads.push(`${f}: process.env${m[1]}`)
    }
    expect(reads).toEqual([])
    expect(files).toContain("index.ts")
  })

  it("each setting reads as it says", () => {
    setEnv("GRADWIRE_LOG", "WARN")
    expect(settings.logLevel.read()).toBe("warn")
    setEnv("GRADWIRE_LOG", "loud")
    expect(settings.logLevel.read()).toBe("info")
    setEnv("GRADWIRE_LOG", undefined)
    expect(settings.logLevel.read()).toBe("info")

    for (const s of [settings.simd, settings.natsReadPool]) {
      setEnv(s.name, "0")
      expect(s.read()).toBe(false)
      setEnv(s.name, "1")
      expect(s.read()).toBe(true)
      setEnv(s.name, undefined)
      expect(s.read()).toBe(true)
    }

    setEnv("GRADWIRE_STATE_DIR", "")
    expect(settings.stateDir.read()).toBe(path.join(os.homedir(), ".gradwire"))
    setEnv("GRADWIRE_STATE_DIR", "/srv/gw")
    expect(settings.stateDir.read()).toBe("/srv/gw")

    setEnv("NATS_SERVER_BIN", "")
    expect(settings.natsServerBin.read()).toBeUndefined()
    setEnv("GRADWIRE_CLUSTER", undefined)
    expect(settings.clusterName.read()).toBeUndefined()
    setEnv("GRADWIRE_ADDRESS", "nats://a:4222,nats://b:4222")
    expect(settings.clusterAddress.read()).toBe("nats://a:4222,nats://b:4222")

    for (const [v, on] of [["true", true], ["1", true], ["false", false], ["0", false], ["", false]] as const) {
      setEnv("CI", v)
      expect(settings.ci.read(), `CI=${v}`).toBe(on)
    }
    setEnv("PATH", ["/a", "", "/b"].join(path.delimiter))
    expect(settings.searchPath.read()).toEqual(["/a", "/b"])

    for (const [v, standby, start] of [[undefined, 19, 0], ["0", 0, 0], ["4", 4, 4], ["25", 19, 19], ["-2", 19, 0], ["x", 19, 0]] as const) {
      setEnv("GRADWIRE_STANDBY_NICE", v)
      setEnv("GRADWIRE_START_NICE", v)
      expect(settings.standbyNice.read(), `GRADWIRE_STANDBY_NICE=${v}`).toBe(standby)
      expect(settings.startNice.read(), `GRADWIRE_START_NICE=${v}`).toBe(start)
    }
  })
})
