// Rewrites .ci/durations.json, the seconds each test file took, from a vitest JSON report of a
// whole-suite run (a CI run's .ci/vitest-report.json). vitest.config.ts starts the longest files
// first from it, so that on a machine without vitest's cache of earlier runs (a fresh CI machine)
// a long file does not start last and keep one worker busy while the other has nothing left to do.
// Each file's entry is its seconds and, of those, the seconds of its tests tagged "faults", which
// `npm test` leaves out and `npm run test:faults` runs alone. Files the report does not have, or
// ran only in part (a test skipped), keep their entry; files that are gone lose it. A file's seconds
// are those .ci/file-seconds.ts measured, hooks included (FILES: by default vitest-files.json
// beside REPORT, where the same run wrote it), else its tests' span in the report. OUT: the table
// to update, .ci/durations.json by default.
//
//   node .ci/durations.mjs REPORT [FILES [OUT]]
import * as fs from "node:fs"
import * as path from "node:path"

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..")
const out = process.argv[4] ?? path.join(root, ".ci/durations.json")
const report = JSON.parse(fs.readFileSync(process.argv[2], "utf8"))
const filesPath = process.argv[3] ?? path.join(path.dirname(process.argv[2]), "vitest-files.json")
const fileSeconds = fs.existsSync(filesPath) ? JSON.parse(fs.readFileSync(filesPath, "utf8")) : {}
const table = fs.existsSync(out) ? JSON.parse(fs.readFileSync(out, "utf8")) : {}
const tenths = (ms) => Math.round(ms / 100) / 10
for (const s of report.testResults) {
  if (s.assertionResults.some((a) => a.status !== "passed" && a.status !== "failed")) continue
  const file = path.posix.join("test", path.basename(s.name))
  const faults = s.assertionResults.filter((a) => a.tags?.includes("faults")).reduce((sum, a) => sum + (a.duration ?? 0), 0)
  table[file] = { seconds: Math.max(fileSeconds[file] ?? 0, tenths(s.endTime - s.startTime)), faults: tenths(faults) }
}
for (const file of Object.keys(table)) if (!fs.existsSync(path.join(root, file))) delete table[file]
const sorted = Object.fromEntries(Object.entries(table).sort(([a, x], [b, y]) => y.seconds - x.seconds || (a < b ? -1 : 1)))
fs.writeFileSync(out, JSON.stringify(sorted, null, 2) + "\n")
console.log(`${Object.keys(sorted).length} files in ${path.relative(root, out)}`)
