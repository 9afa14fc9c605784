// .ci/run's verdict (.ci/summary.mjs) on crafted vitest reports: the last line stays
// "N passed, N failed" and the exit status non-zero when anything failed; the line before says
// how many tests were skipped and which; a skipped or todo test counts as failed unless .ci/run's
// allow-list names it.
import { afterAll, describe, expect, it } from "vitest"
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-ci-run-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

type Status = "passed" | "failed" | "skipped" | "pending" | "todo"
interface Case {
  readonly ancestors: ReadonlyArray<string>
  readonly title: string
  readonly status: Status
}

/** A vitest JSON report of the files given (the fields .ci/summary.mjs reads, as vitest writes them). */
const report = (files: Record<string, ReadonlyArray<Case>>, loadFailed: ReadonlyArray<string> = []): string => {
  const all = Object.values(files).flat()
  const count = (s: Status) => all.filter((c) => c.status === s).length
  const r = {
    numTotalTests: all.length,
    numPassedTests: count("passed"),
    numFailedTests: count("failed"),
    numPendingTests: count("skipped") + count("pending"),
    numTodoTests: count("todo"),
    testResults: [
      ...Object.entries(files).map(([file, cases]) => ({
        name: path.join(ROOT, file),
        status: cases.some((c) => c.status === "failed") ? "failed" : "passed",
        assertionResults: cases.map((c) => ({
          ancestorTitles: c.ancestors,
          title: c.title,
          fullName: [...c.ancestors, c.title].join(" "),
          status: c.status
        }))
      })),
      ...loadFailed.map((file) => ({ name: path.join(ROOT, file), status: "failed", assertionResults: [] }))
    ]
  }
  const file = path.join(dir, `report-${Math.random().toString(36).slice(2)}.json`)
  fs.writeFileSync(file, JSON.stringify(r))
  return file
}

/** The allow-list as .ci/run passes it (its `allowed_skips` array, evaluated by bash). */
const ciAllowList = (): string[] => {
  const run = fs.readFileSync(path.join(ROOT, ".ci/run"), "utf8")
  const block = run.match(/^allowed_skips=\([\s\S]*?^\)$/m)
  expect(block, ".ci/run has an allowed_skips=( ... ) array").not.toBeNull()
  const r = spawnSync("bash", ["-c", `${block![0]}\nprintf '%s\\n' "\${allowed_skips[@]}"`], { encoding: "utf8" })
  expect(r.status, r.stderr).toBe(0)
  return r.stdout.split("\n").filter((l) => l !== "")
}

const summary = (reportFile: string, opts: { typecheck?: boolean; docs?: boolean; leftover?: number; vitestRc?: number; allowed?: string[] } = {}) => {
  const r = spawnSync(
    process.execPath,
    [
      path.join(ROOT, ".ci/summary.mjs"),
      reportFile,
      opts.typecheck === false ? "0" : "1",
      opts.docs === false ? "0" : "1",
      String(opts.leftover ?? 0),
      String(opts.vitestRc ?? 0),
      ...(opts.allowed ?? ciAllowList())
    ],
    { encoding: "utf8" }
  )
  expect(r.stderr).toBe("")
  const lines = r.stdout.trimEnd().split("\n")
  return { status: r.status, lines, last: lines.at(-1), beforeLast: lines.at(-2) }
}

const pass = (title: string, ...ancestors: string[]): Case => ({ ancestors, title, status: "passed" })

describe(".ci/run's summary", () => {
  it("all passed: no skips, typecheck and the leftover check count as passed, exit 0", () => {
    const s = summary(report({ "test/a.test.ts": [pass("one", "A"), pass("two", "A")], "test/b.test.ts": [pass("three")] }))
    expect(s.lines).toEqual(["0 skipped", "6 passed, 0 failed"])
    expect(s.status).toBe(0)
  })

  it("a failed test, a failed typecheck, a leftover server and a file that did not load are each one failure", () => {
    const file = report({ "test/a.test.ts": [pass("one"), { ancestors: ["A"], title: "two", status: "failed" }] }, ["test/broken.test.ts"])
    const s = summary(file, { typecheck: false, leftover: 2, vitestRc: 1 })
    expect(s.lines).toEqual(["typecheck failed", "2 nats-server process(es) left running after the suite", "0 skipped", "2 passed, 4 failed"])
    expect(s.status).toBe(1)
  })

  it("vitest failing without a failed test (an error outside the tests) still fails", () => {
    const s = summary(report({ "test/a.test.ts": [pass("one")] }), { vitestRc: 1 })
    expect(s.last).toBe("4 passed, 1 failed")
    expect(s.status).toBe(1)
  })

  it("no report: says so and fails", () => {
    const s = summary(path.join(dir, "missing.json"))
    expect(s.lines[0]).toMatch(/^no vitest report: /)
    expect(s.last).toBe("3 passed, 1 failed")
    expect(s.status).toBe(1)
  })

  it("skipped, pending and todo tests outside the allow-list are counted, named and failed", () => {
    const file = report({
      "test/a.test.ts": [pass("one"), { ancestors: ["A"], title: "needs openssl", status: "skipped" }, { ancestors: ["A", "B"], title: "later", status: "todo" }],
      "test/c.test.ts": [{ ancestors: [], title: "pending one", status: "pending" }]
    })
    const s = summary(file)
    expect(s.lines).toEqual([
      "3 skipped outside .ci/run's allow-list, counted as failed: test/a.test.ts > A > needs openssl; test/a.test.ts > A > B > later; test/c.test.ts > pending one",
      "3 skipped: test/a.test.ts > A > needs openssl; test/a.test.ts > A > B > later; test/c.test.ts > pending one",
      "4 passed, 3 failed"
    ])
    expect(s.status).toBe(1)
  })

  it("skips on .ci/run's allow-list are counted and named but pass: the GPU-only and old-Node cases", () => {
    const noGpu = "on this machine (no GPU, no Vulkan driver)"
    const oldNode = "with an older Node (none on this machine: skipped)"
    const file = report({
      "test/webgpu.test.ts": [pass("parses an adapter", "the status table"), { ancestors: [noGpu], title: "the probe answers \"no adapter\"", status: "skipped" }],
      "test/node-version.test.ts": [{ ancestors: [oldNode], title: "importing it says what to install", status: "skipped" }],
      "test/package.test.ts": [
        pass("npm pack builds dist/", "the packed package"),
        { ancestors: ["the packed package"], title: "an older Node (none on this machine: skipped) importing it or running its CLI is told what to install", status: "skipped" }
      ]
    })
    const s = summary(file)
    expect(s.beforeLast).toMatch(/^3 skipped: test\/webgpu\.test\.ts > on this machine .*; test\/node-version\.test\.ts > with an older Node .*; test\/package\.test\.ts > the packed package > an older Node /)
    expect(s.lines).toHaveLength(2)
    expect(s.last).toBe("5 passed, 0 failed")
    expect(s.status).toBe(0)
  })

  it("the allow-list names a file and a test: the same title in another file, or another test in an allowed file, still fails", () => {
    const file = report({
      "test/other.test.ts": [{ ancestors: ["on this machine (no GPU, no Vulkan driver)"], title: "x", status: "skipped" }],
      "test/webgpu.test.ts": [{ ancestors: ["the status table"], title: "prints the adapter", status: "skipped" }]
    })
    const s = summary(file)
    expect(s.lines[0]).toBe(
      "2 skipped outside .ci/run's allow-list, counted as failed: test/other.test.ts > on this machine (no GPU, no Vulkan driver) > x; test/webgpu.test.ts > the status table > prints the adapter"
    )
    expect(s.last).toBe("3 passed, 2 failed")
    expect(s.status).toBe(1)
  })

  it("a failed API reference build counts as failed and says so", () => {
    const s = summary(report({ "test/a.test.ts": [pass("x")] }), { docs: false })
    expect(s.lines).toEqual(["the API reference (npm run docs) failed", "0 skipped", "3 passed, 1 failed"])
    expect(s.status).toBe(1)
  })

  it("an allow-list entry without FILE::PATTERN is refused", () => {
    const r = spawnSync(process.execPath, [path.join(ROOT, ".ci/summary.mjs"), report({}), "1", "1", "0", "0", "test/a.test.ts"], { encoding: "utf8" })
    expect(r.status).not.toBe(0)
    expect(r.stderr).toContain('allow-list entry "test/a.test.ts" is not FILE::PATTERN')
  })
})

describe(".ci/durations.mjs, the table that orders the suite's files", () => {
  /** A report entry of `file` whose tests spanned `spanMs`, with the statuses given (and their tags). */
  const entry = (file: string, spanMs: number, tests: ReadonlyArray<{ status: Status; ms: number; faults?: boolean }>) => ({
    name: path.join(ROOT, file),
    startTime: 1_000,
    endTime: 1_000 + spanMs,
    assertionResults: tests.map((t, i) => ({ title: `t${i}`, status: t.status, duration: t.ms, tags: t.faults ? ["faults"] : [] }))
  })

  it("takes a file's seconds from .ci/file-seconds.ts's record, hooks included, else its tests' span; keeps the entry of a file that skipped", () => {
    const report = path.join(dir, "durations-report.json")
    // A file whose work is in beforeAll (its tests' span 10 ms), one without a record, one that skipped a test.
    fs.writeFileSync(
      report,
      JSON.stringify({
        testResults: [
          entry("test/webgpu-gru.test.ts", 10, [{ status: "passed", ms: 6 }]),
          entry("test/elastic.test.ts", 84_000, [{ status: "passed", ms: 17_800, faults: true }, { status: "passed", ms: 60_000 }]),
          entry("test/chaos.test.ts", 1_000, [{ status: "skipped", ms: 0 }])
        ]
      })
    )
    const files = path.join(dir, "durations-files.json")
    fs.writeFileSync(files, JSON.stringify({ "test/webgpu-gru.test.ts": 27, "test/chaos.test.ts": 3 }))
    const out = path.join(dir, "durations.json")
    // Before: a file that is gone, and chaos.test.ts's entry from an earlier whole run.
    fs.writeFileSync(out, JSON.stringify({ "test/gone-long-ago.test.ts": { seconds: 5, faults: 0 }, "test/chaos.test.ts": { seconds: 131, faults: 131 } }))
    const r = spawnSync(process.execPath, [path.join(ROOT, ".ci/durations.mjs"), report, files, out], { encoding: "utf8" })
    expect(r.status, r.stderr).toBe(0)
    const table = JSON.parse(fs.readFileSync(out, "utf8")) as Record<string, { seconds: number; faults: number }>
    expect(table).toEqual({
      "test/chaos.test.ts": { seconds: 131, faults: 131 },
      "test/elastic.test.ts": { seconds: 84, faults: 17.8 },
      "test/webgpu-gru.test.ts": { seconds: 27, faults: 0 }
    })
    // Longest first, as vitest.config.ts starts them.
    expect(Object.keys(table)).toEqual(["test/chaos.test.ts", "test/elastic.test.ts", "test/webgpu-gru.test.ts"])
  })
})
