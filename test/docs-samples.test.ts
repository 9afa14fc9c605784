// The TypeScript samples of README.md and docs/*.md, type-checked against the sources as they stand:
// every ```ts block is compiled (in memory, with the project's compiler options) as a module of its
// own, with "gradwire" and "gradwire/effect" resolving to index.ts and effect.ts. A sample that is
// part of a larger program (a loop's body, a driver's option) names what it leaves to its
// surroundings in an HTML comment just before it, which the page does not show:
//
//   <!-- ts-check prelude
//   import type { TrainContext } from "gradwire"
//   declare const ctx: TrainContext
//   -->
//
// and a sample that cannot be checked at all starts with `// @check-skip: <why>` (none does today;
// at most two may). The links between the pages are checked too: every relative link names a file
// that exists, and every #anchor a heading of that file.
import * as fs from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import ts from "typescript"
import { describe, expect, it } from "vitest"

const ROOT = fileURLToPath(new URL("../", import.meta.url))

const pages = (): string[] => [
  "README.md",
  ...fs
    .readdirSync(path.join(ROOT, "docs"))
    .filter((f) => f.endsWith(".md"))
    .sort()
    .map((f) => `docs/${f}`)
]

interface Sample {
  readonly page: string
  /** Line of the page where the sample's first line is (1-based). */
  readonly line: number
  readonly prelude: string
  readonly code: string
}

const PRELUDE = "<!-- ts-check prelude\n"

/** The prelude comment that ends the text before a sample (only blank lines after it), or "". */
const preludeBefore = (before: string): string => {
  const text = before.trimEnd()
  if (!text.endsWith("-->")) return ""
  const start = text.lastIndexOf(PRELUDE)
  return start >= 0 && !text.slice(start, -3).includes("-->") ? text.slice(start + PRELUDE.length, -3) : ""
}

/** Every ```ts block of a page, with the prelude comment right before it (blank lines between allowed). */
export const samplesOf = (page: string, text: string): Sample[] => {
  const out: Sample[] = []
  const fence = /^```ts\n([\s\S]*?)^```$/gm
  for (let m = fence.exec(text); m !== null; m = fence.exec(text)) {
    const before = text.slice(0, m.index)
    const prelude = preludeBefore(before)
    out.push({ page, line: before.split("\n").length + 1, prelude, code: m[1]! })
  }
  return out
}

const skipReason = (code: string): string | undefined => /^\/\/ @check-skip: (.+)$/m.exec(code.split("\n")[0] ?? "")?.[1]

/** Type-checks samples as modules next to the sources; returns one line per error, naming the page and line. */
export const check = (samples: ReadonlyArray<Sample>): string[] => {
  const configPath = path.join(ROOT, "tsconfig.json")
  const parsed = ts.parseJsonConfigFileContent(ts.readConfigFile(configPath, ts.sys.readFile).config, ts.sys, ROOT)
  const options: ts.CompilerOptions = {
    ...parsed.options,
    noEmit: true,
    moduleDetection: ts.ModuleDetectionKind.Force,
    paths: { gradwire: [path.join(ROOT, "index.ts")], "gradwire/effect": [path.join(ROOT, "effect.ts")] }
  }
  // The samples live in memory, in a folder of the repository, so packages resolve from its node_modules.
  const dir = path.join(ROOT, "__docs_samples__")
  const files = new Map<string, { sample: Sample; preludeLines: number; text: string }>()
  samples.forEach((sample, i) => {
    const prelude = sample.prelude.endsWith("\n") || sample.prelude === "" ? sample.prelude : `${sample.prelude}\n`
    files.set(path.join(dir, `sample-${i}.mts`), { sample, preludeLines: prelude === "" ? 0 : prelude.split("\n").length - 1, text: prelude + sample.code })
  })
  const host = ts.createCompilerHost(options)
  const getSourceFile = host.getSourceFile.bind(host)
  host.getSourceFile = (name, lang, onError, create) => {
    const f = files.get(path.resolve(name))
    return f ? ts.createSourceFile(name, f.text, lang) : getSourceFile(name, lang, onError, create)
  }
  const fileExists = host.fileExists.bind(host)
  host.fileExists = (name) => files.has(path.resolve(name)) || fileExists(name)
  const readFile = host.readFile.bind(host)
  host.readFile = (name) => files.get(path.resolve(name))?.text ?? readFile(name)
  const program = ts.createProgram([...files.keys()], options, host)
  const errors: string[] = []
  for (const [name, f] of files) {
    const sf = program.getSourceFile(name)!
    for (const d of [...program.getSyntacticDiagnostics(sf), ...program.getSemanticDiagnostics(sf)]) {
      const { line } = sf.getLineAndCharacterOfPosition(d.start ?? 0)
      const where = line < f.preludeLines ? `its prelude, line ${line + 1}` : `line ${f.sample.line + line - f.preludeLines}`
      errors.push(`${f.sample.page}, ${where}: ${ts.flattenDiagnosticMessageText(d.messageText, "\n")}`)
    }
  }
  return errors
}

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens. */
const slug = (heading: string): string =>
  heading
    .trim()
    .toLowerCase()
    .replace(/`/g, "")
    .replace(/[^\p{L}\p{N} _-]/gu, "")
    .replace(/ /g, "-")

const anchorsOf = (text: string): Set<string> =>
  new Set(text.replace(/^```[\s\S]*?^```$/gm, "").match(/^#{1,6} .+$/gm)?.map((h) => slug(h.replace(/^#+ /, ""))) ?? [])

describe("the docs' code samples", () => {
  const samples = pages().flatMap((p) => samplesOf(p, fs.readFileSync(path.join(ROOT, p), "utf8")))

  it("finds the samples, and skips few, each with its reason", () => {
    expect(samples.length).toBeGreaterThanOrEqual(8)
    for (const p of ["README.md", "docs/strategies.md", "docs/datasets.md"]) expect(samples.some((s) => s.page === p), p).toBe(true)
    const skipped = samples.filter((s) => s.code.startsWith("// @check-skip"))
    for (const s of skipped) expect(skipReason(s.code), `${s.page}:${s.line}: a skip says why`).toBeTruthy()
    expect(skipped.length).toBeLessThanOrEqual(2)
  })

  it("every sample type-checks against the sources", () => {
    const errors = check(samples.filter((s) => skipReason(s.code) === undefined))
    expect(errors).toEqual([])
  }, 120_000)

  it("the check fails on a sample that no longer fits the API, and resolves gradwire to the sources", () => {
    const text = [
      "Before.",
      "",
      "<!-- ts-check prelude",
      'import type { TrainerOptions } from "gradwire"',
      "declare const options: TrainerOptions",
      "-->",
      "",
      "```ts",
      'import { Trainer } from "gradwire"',
      'new Trainer({ ...options, scalingConfig: { numWorkers: "four" } })',
      "```",
      "",
      "```ts",
      'import { NoSuchExport } from "gradwire"',
      "```",
      ""
    ].join("\n")
    const errors = check(samplesOf("page.md", text))
    expect(errors.length).toBe(2)
    expect(errors[0]).toMatch(/^page\.md, line 10: Type 'string' is not assignable to type 'number/)
    expect(errors[1]).toMatch(/^page\.md, line 14: .*NoSuchExport/)
  }, 120_000)
})

describe("the docs' links", () => {
  it("every relative link names a file that exists, and every anchor a heading of it", () => {
    const broken: string[] = []
    for (const page of pages()) {
      const text = fs.readFileSync(path.join(ROOT, page), "utf8")
      const prose = text.replace(/^```[\s\S]*?^```$/gm, "")
      for (const m of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = m[1]!
        if (/^[a-z]+:/i.test(target)) continue
        const [file, anchor] = target.split("#") as [string, string | undefined]
        const resolved = file === "" ? page : path.posix.normalize(path.posix.join(path.posix.dirname(page), file))
        const abs = path.join(ROOT, resolved)
        if (!fs.existsSync(abs)) {
          broken.push(`${page}: ${target} (no ${resolved})`)
          continue
        }
        if (anchor !== undefined && !anchorsOf(fs.readFileSync(abs, "utf8")).has(anchor)) broken.push(`${page}: ${target} (no heading #${anchor} in ${resolved})`)
      }
    }
    expect(broken).toEqual([])
  })
})
