// The published package, as a user gets it: `npm pack` (its prepack builds dist/), the tarball's
// file list, then an install into a separate project and a real 2-worker job on the embedded
// cluster through `import { Trainer } from "gradwire"`, with the project's own train loop as a
// .ts file (type stripping) and its driver as .js. Also the installed CLI, and what an older Node
// is told when it imports the package or runs its CLI.
import { spawnSync, type SpawnSyncReturns } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, describe, expect, it } from "vitest"
import { describeOldNode, findOldNode } from "./support/old-node.ts"
import { runScript } from "./support/run-script.ts"

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gw-package-"))
afterAll(() => fs.rmSync(work, { recursive: true, force: true }))

// npm's own variables (set when the suite runs under `npm test`) would steer the nested npm. The
// build and install take about 45 s alone, and twice that on 2 busy cores: the limits are wide.
const npmEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith("npm_")))
const npm = (args: ReadonlyArray<string>, cwd: string): SpawnSyncReturns<string> => {
  const r = spawnSync("npm", args, { cwd, env: npmEnv, encoding: "utf8", timeout: 240_000 })
  if (r.status !== 0) throw new Error(`npm ${args.join(" ")} exited ${r.status}:\n${r.stdout}\n${r.stderr}`)
  return r
}

const TRAIN_LOOP = `
import type { TrainContext } from "gradwire"

export async function trainLoop(config: { epochs: number }, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const shard = await ctx.getDatasetShard("train")
  const model = tf.sequential({ layers: [tf.layers.dense({ units: 10, inputShape: [64], activation: "softmax" })] })
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  for (let epoch = 0; epoch < config.epochs; epoch++) {
    const [r] = await dp.fit(shard, { epochs: epoch + 1, initialEpoch: epoch, batchSize: 32 })
    await ctx.report({ epoch, loss: r.loss, accuracy: r.accuracy, worldSize: ctx.worldSize })
  }
}
`

const DRIVER = `
import { Trainer, loadDigits, trainTestSplit } from "gradwire"

const { train } = trainTestSplit(await loadDigits(), 0.2)
const result = await new Trainer({
  trainLoopPerWorker: { module: new URL("./train.ts", import.meta.url).href, export: "trainLoop" },
  trainLoopConfig: { epochs: 1 },
  scalingConfig: { numWorkers: 2 },
  runConfig: { name: "packed", storagePath: process.argv[2], progress: false },
  datasets: { train }
}).fit()
console.log("RESULT " + JSON.stringify({ metrics: result.metrics, ranks: result.metricsPerRank.at(-1)?.length, path: result.path, error: result.error ? String(result.error) : null }))
process.exit(result.error ? 1 : 0)
`

describe("the packed package", () => {
  const project = path.join(work, "project")
  let packed = false

  it("npm pack builds dist/ and ships it with the worker, host and probe modules, the CLI and the digits data", () => {
    const r = npm(["pack", "--json", "--pack-destination", work], ROOT)
    const [info] = JSON.parse(r.stdout) as Array<{ filename: string; files: Array<{ path: string }> }>
    const files = info.files.map((f) => f.path)
    for (const f of [
      "package.json",
      "README.md",
      "docs/api.md",
      "docs/strategies.md",
      "bin/gradwire.js",
      "bin/check-node.js",
      "bin/fast-start.js",
      "dist/core/fast-start.js",
      "dist/index.js",
      "dist/index.d.ts",
      "dist/core/node-version.js",
      "dist/bin/main.js",
      "dist/actors/train/worker/worker.js",
      "dist/actors/train/parameter-server/ps-server.js",
      "dist/actors/node/host.js",
      "dist/actors/node/backend-probe.js",
      "dist/collectives/simd/kernels-wasm.js",
      "examples/data/digits.csv.gz",
      "examples/data/README.md"
    ]) {
      expect(files, f).toContain(f)
    }
    // Sources, tests and benchmarks stay out: only compiled JavaScript and its declarations.
    expect(files.filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts"))).toEqual([])
    expect(files.filter((f) => /^(test|bench|scripts|\.ci)\//.test(f))).toEqual([])

    fs.mkdirSync(project)
    fs.writeFileSync(
      path.join(project, "package.json"),
      // The same install-script policy as gradwire's own package.json.
      JSON.stringify({ name: "packed-gradwire-user", private: true, type: "module", allowScripts: { "core-js": false, "msgpackr-extract": false } })
    )
    fs.writeFileSync(path.join(project, "train.ts"), TRAIN_LOOP)
    fs.writeFileSync(path.join(project, "main.js"), DRIVER)
    npm(["install", "--prefer-offline", "--no-audit", "--no-fund", path.join(work, info.filename)], project)
    expect(fs.existsSync(path.join(project, "node_modules", "gradwire", "dist", "index.js"))).toBe(true)
    packed = true
  }, 300_000)

  it("installed in another project, it trains 2 workers for an epoch through import { Trainer } from \"gradwire\"", async () => {
    expect(packed, "the pack-and-install test failed").toBe(true)
    const storage = path.join(work, "results")
    const r = await runScript(path.join(project, "main.js"), [storage], { timeoutMs: 120_000 })
    expect(r.code, r.output).toBe(0)
    const line = r.output.split("\n").find((l) => l.startsWith("RESULT "))
    expect(line, r.output).toBeDefined()
    const result = JSON.parse(line!.slice("RESULT ".length)) as {
      metrics: { epoch: number; loss: number; accuracy: number; worldSize: number }
      ranks: number
      path: string
      error: string | null
    }
    expect(result.error).toBeNull()
    expect(result.metrics.epoch).toBe(0)
    expect(result.metrics.worldSize).toBe(2)
    expect(result.ranks).toBe(2)
    expect(Number.isFinite(result.metrics.loss)).toBe(true)
    expect(result.metrics.accuracy).toBeGreaterThan(0.2)
    expect(result.path).toBe(path.join(storage, "packed"))
    expect(fs.readFileSync(path.join(result.path, "metrics.jsonl"), "utf8").trim().split("\n")).toHaveLength(1)
  }, 150_000)

  it("its CLI runs the compiled code: --version, --help", () => {
    expect(packed, "the pack-and-install test failed").toBe(true)
    const cli = path.join(project, "node_modules", ".bin", "gradwire")
    const version = spawnSync(process.execPath, [cli, "--version"], { encoding: "utf8" })
    expect(version.stdout).toBe(`${JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8")).version}\n`)
    const help = spawnSync(process.execPath, [cli, "--help"], { encoding: "utf8" })
    expect(help.status, help.stderr).toBe(0)
    expect(help.stdout).toMatch(/^usage: gradwire <command>/)
  })

  const old = findOldNode()
  it.skipIf(!old)(`an older Node (${describeOldNode(old)}) importing it or running its CLI is told what to install`, () => {
    expect(packed, "the pack-and-install test failed").toBe(true)
    const fix = `gradwire needs Node >= 22.19 (found ${old!.version}): run "npm install -g --prefix /usr/local node@22" (as root) or get it from https://nodejs.org`
    const cli = spawnSync(old!.bin, [path.join(project, "node_modules", ".bin", "gradwire"), "status"], { encoding: "utf8" })
    expect(cli.status).toBe(1)
    expect(cli.stdout + cli.stderr).toBe(`${fix}\n`)
    // Importing throws UnsupportedNode before anything else runs: its message is the same line.
    const imported = spawnSync(old!.bin, [path.join(project, "main.js"), path.join(work, "old")], { encoding: "utf8" })
    expect(imported.status).toBe(1)
    expect(imported.stderr).toContain(`UnsupportedNode: ${fix}\n`)
    expect(imported.stderr).not.toMatch(/ERR_UNKNOWN_FILE_EXTENSION|Unknown file extension/)
    expect(fs.existsSync(path.join(work, "old"))).toBe(false)
  })
})
