// The CI verdict from vitest's JSON report and the checks .ci/run made around it. Prints what
// failed, then how many tests were skipped and which, and as its last line "N passed, N failed"
// (the line the CI harness reads); exits 1 when anything failed. A skipped or todo test counts as
// failed unless it matches the allow-list: on a CI machine set up by scripts/setup.sh --test every
// test has what it needs, so a skip there hides a test that silently stopped running.
//
//   node .ci/summary.mjs REPORT TYPECHECK_OK DOCS_OK LEFTOVER VITEST_RC [ALLOWED ...]
//     REPORT        vitest's JSON report
//     TYPECHECK_OK  1 when the typecheck passed, 0 when not
//     DOCS_OK       1 when the API reference (npm run docs) built, 0 when not
//     LEFTOVER      how many nats-server processes the suite left running
//     VITEST_RC     vitest's exit status
//     ALLOWED       "FILE::PATTERN": a skip of a test in FILE (relative to the repository root)
//                   whose full name ("describe > it") matches the regular expression PATTERN
import * as fs from "node:fs"
import * as path from "node:path"

const [reportFile, typecheckOk, docsOk, leftoverArg, vitestRcArg, ...allowArgs] = process.argv.slice(2)
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..")

const allowed = allowArgs.map((a) => {
  const at = a.indexOf("::")
  if (at < 0) throw new Error(`allow-list entry "${a}" is not FILE::PATTERN`)
  return { file: a.slice(0, at), pattern: new RegExp(a.slice(at + 2)) }
})

const SKIPPED = new Set(["skipped", "pending", "todo", "disabled"])

let passed = 0
let failed = 0
const skips = []
try {
  const r = JSON.parse(fs.readFileSync(reportFile, "utf8"))
  passed = r.numPassedTests
  failed = r.numFailedTests
  for (const s of r.testResults) {
    // A suite that failed to load counts as a failure even when it declared no tests.
    if (s.status === "failed" && s.assertionResults.length === 0) failed++
    const file = path.relative(root, path.resolve(root, s.name))
    for (const a of s.assertionResults) {
      if (!SKIPPED.has(a.status)) continue
      const name = [...a.ancestorTitles, a.title].join(" > ")
      skips.push({ file, name, allowed: allowed.some((x) => x.file === file && x.pattern.test(name)) })
    }
  }
} catch (e) {
  console.log("no vitest report: " + e.message)
  failed++
}

const leftover = Number(leftoverArg)
if (typecheckOk !== "1") {
  console.log("typecheck failed")
  failed++
} else passed++
if (docsOk !== "1") {
  console.log("the API reference (npm run docs) failed")
  failed++
} else passed++
if (leftover > 0) {
  console.log(leftover + " nats-server process(es) left running after the suite")
  failed++
} else passed++

const unexpected = skips.filter((s) => !s.allowed)
failed += unexpected.length
if (Number(vitestRcArg) !== 0 && failed === 0) {
  console.log("vitest exited " + vitestRcArg)
  failed++
}
const names = (list) => list.map((s) => `${s.file} > ${s.name}`).join("; ")
if (unexpected.length > 0) console.log(`${unexpected.length} skipped outside .ci/run's allow-list, counted as failed: ${names(unexpected)}`)
console.log(`${skips.length} skipped${skips.length > 0 ? ": " + names(skips) : ""}`)
console.log(passed + " passed, " + failed + " failed")
process.exit(failed > 0 ? 1 : 0)
