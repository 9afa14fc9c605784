// Rewrites .ci/durations.json, the seconds each test file took, from a vitest JSON report (a CI
// run's .ci/vitest-report.json). vitest.config.ts starts the longest files first from it, so that
// on a machine without vitest's cache of earlier runs (a fresh CI machine) a long file does not
// start last and keep one worker busy while the other has nothing left to do. Files the report
// does not have keep their entry; files that are gone lose it.
//
//   node .ci/durations.mjs REPORT
import * as fs from "node:fs"
import * as path from "node:path"

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..")
const out = path.join(root, ".ci/durations.json")
const report = JSON.parse(fs.readFileSync(process.argv[2], "utf8"))
const table = fs.existsSync(out) ? JSON.parse(fs.readFileSync(out, "utf8")) : {}
for (const s of report.testResults) {
  const file = path.posix.join("test", path.basename(s.name))
  table[file] = Math.round((s.endTime - s.startTime) / 100) / 10
}
for (const file of Object.keys(table)) if (!fs.existsSync(path.join(root, file))) delete table[file]
const sorted = Object.fromEntries(Object.entries(table).sort(([a, x], [b, y]) => y - x || (a < b ? -1 : 1)))
fs.writeFileSync(out, JSON.stringify(sorted, null, 2) + "\n")
console.log(`${Object.keys(sorted).length} files in ${path.relative(root, out)}`)
