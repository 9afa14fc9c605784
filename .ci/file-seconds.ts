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
export const FILE_SECONDS_PATH = ".ci/vitest-files.json"

export class FileSeconds implements Reporter {
  readonly #seconds: Record<string, number> = {}

  onTestModuleEnd(module: TestModule): void {
    const d = module.diagnostic()
    const ms = d.environmentSetupDuration + d.prepareDuration + d.collectDuration + d.setupDuration + d.duration
    const file = path.relative(module.project.config.root, module.moduleId).split(path.sep).join("/")
    this.#seconds[file] = Math.round(ms / 100) / 10
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    if (modules.length === 0) return
    const root = modules[0]!.project.config.root
    fs.writeFileSync(path.join(root, FILE_SECONDS_PATH), JSON.stringify(this.#seconds, null, 2) + "\n")
  }
}
