// On a Node older than gradwire needs, one line saying so instead of suites failing one by one.
import "./bin/check-node.js"
import * as fs from "node:fs"
import { defineConfig } from "vitest/config"
import { BaseSequencer, type TestSpecification } from "vitest/node"
import { FileSeconds, testFileKey } from "./.ci/file-seconds.ts"

/** Seconds each test file took in a CI run, and of those its tests tagged "faults" (.ci/durations.mjs writes it from a report). */
const durations: Record<string, { readonly seconds: number; readonly faults: number }> = JSON.parse(fs.readFileSync(new URL("./.ci/durations.json", import.meta.url), "utf8"))

/** The tags filter this run was given (`npm test`: "!faults", `npm run test:faults`: "faults"), if any. */
const tagsFilter = process.argv.find((a) => a.startsWith("--tags-filter="))?.slice("--tags-filter=".length)

/** A file's seconds in this run: without its fault scenarios under `npm test`, only those under `npm run test:faults`. */
const secondsHere = (d: { readonly seconds: number; readonly faults: number }): number =>
  tagsFilter?.startsWith("!faults") ? d.seconds - d.faults : tagsFilter === "faults" ? d.faults : d.seconds

/** Longest file first, from .ci/durations.json rather than vitest's cache of earlier runs (which a
 * fresh CI machine does not have, and then vitest orders by file size: several of the longest
 * files are short and would start last, leaving one worker busy for a minute or two while the
 * other has nothing left). A file the table does not know yet starts first, as vitest does. */
class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const seconds = (f: TestSpecification): number => {
      const d = durations[testFileKey(f.project.config.root, f.moduleId)]
      return d === undefined ? Infinity : secondsHere(d)
    }
    return [...files].sort((a, b) => seconds(b) - seconds(a))
  }
}

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Integration suites start real nats-server and worker processes; on a 2-core machine
    // running more than two files at once only adds contention.
    maxWorkers: 2,
    sequence: { sequencer: LongestFirst },
    // `npm test` leaves out the tests tagged "faults" (`npm run test:faults` runs them alone) and
    // "webgpu" (`npm run test:webgpu`); `npm run test:all` and .ci/run run every test.
    tags: [
      {
        name: "webgpu",
        description:
          "the webgpu backend's programs and trainings on SwiftShader, the software Vulkan adapter (minutes on 2 cores: `npm run test:webgpu`; `npm test` leaves them out)"
      },
      {
        name: "faults",
        description:
          "fault scenarios over real processes: kill -9, SIGSTOP, hung or held ranks, link cuts and outages, recovery, elastic resizes (about half of the suite's test time, a third of its CPU time, on 2 cores)"
      }
    ],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 20_000,
    reporters: ["default", "json", new FileSeconds()],
    outputFile: { json: ".ci/vitest-report.json" }
  }
})
