// A vitest reporter that writes .ci/vitest-files.json: the seconds each test file took, its
// hooks included (a beforeAll that trains a model or starts a browser-like GPU child is most of
// some files' time). Vitest's JSON report gives a file only its tests' span, so those files showed
// as 0 s in .ci/durations.json and started last (vitest.config.ts orders the longest first), two
// minutes of them at the end of a run. .ci/durations.mjs takes a file's seconds from here where
// this file exists.
import * as fs from "node:fs"
import * as path from "node:path"
import type { Reporter, TestModule } from "vitest/node"

/** Where the reporter writes, next to the JSON report. */
const FILE_SECONDS_PATH = ".ci/vitest-files.json"

/** A test file's key in .ci/durations.json and here: its path from the project's root, with forward slashes. */
export const testFileKey = (root: string, moduleId: string): string => path.relative(root, moduleId).split(path.sep).join("/")

export class FileSeconds implements Reporter {
  readonly #seconds: Record<string, number> = {}

  onTestModuleEnd(module: TestModule): void {
    const d = module.diagnostic()
    const ms = d.environmentSetupDuration + d.prepareDuration + d.collectDuration + d.setupDuration + d.duration
    this.#seconds[testFileKey(module.project.config.root, module.moduleId)] = Math.round(ms / 100) / 10
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    if (modules.length === 0) return
    const root = modules[0]!.project.config.root
    fs.writeFileSync(path.join(root, FILE_SECONDS_PATH), JSON.stringify(this.#seconds, null, 2) + "\n")
  }
}
