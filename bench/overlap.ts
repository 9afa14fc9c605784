// `npm run bench -- overlap`: does overlapping the gradient all-reduce with the backward pass pay?
// For each zoo model (digits and 28x28 CNNs and MLP; the text models cannot be cut at one tensor),
// p ranks of the embedded cluster time, interleaved on the same batch (bench/overlap-loop.ts):
// a whole step (forward + backward in one tfjs call, then the all-reduce of the gradients), its
// compute alone and its all-reduce alone, and the backward split at each cut point with the back
// part's all-reduce started before the front part's backward runs. Overlap pays where a split step
// is faster than the whole one; the all-reduce alone is the most it could ever save.
//
//   npm run bench -- overlap [--models mlp,cnn,lenet,resnet] [--p 2] [--batch 32] [--steps 30] [--warmup 5] [--backend auto]
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer } from "../index.ts"
import { loadZooData } from "../examples/zoo/data.ts"
import { TASK_OF, type ZooModel } from "../examples/zoo/models.ts"
import { optionReader } from "./args.ts"

const LOOP = { module: new URL("./overlap-loop.ts", import.meta.url).href, export: "overlapLoop" }
const MODELS: ReadonlyArray<ZooModel> = ["mlp", "cnn", "lenet", "resnet"]

export const run = async (argv: ReadonlyArray<string>): Promise<void> => {
  const opt = optionReader(argv)
  const models = opt("--models", MODELS.join(",")).split(",") as ZooModel[]
  for (const m of models) if (!MODELS.includes(m)) throw new RangeError(`--models: ${m} cannot be cut at one tensor here (known: ${MODELS.join(", ")})`)
  const p = Number(opt("--p", "2"))
  const batch = Number(opt("--batch", "32"))
  const steps = Number(opt("--steps", "30"))
  const warmup = Number(opt("--warmup", "5"))
  const backend = opt("--backend", "auto") as "auto" | "wasm" | "cpu" | "webgpu"
  for (const [name, v, min] of [["--p", p, 2], ["--batch", batch, 1], ["--steps", steps, 1], ["--warmup", warmup, 0]] as const) {
    if (!(Number.isInteger(v) && v >= min)) throw new RangeError(`${name} must be an integer >= ${min}, got ${v}`)
  }
  const storage = fs.mkdtempSync(path.join(os.tmpdir(), "gradwire-bench-overlap-"))
  console.log(`machine: ${os.cpus().length} x ${os.cpus()[0]?.model ?? "cpu"}; ${p} ranks of the embedded cluster, backend ${backend}, batch ${batch} per rank; medians of ${steps} interleaved steps per variant`)
  console.log("\nmodel   params  whole step ms  compute ms  all-reduce ms  best split step ms (cut, back's share of the weights)  split / whole  most overlap could save")
  try {
    for (const model of models) {
      const data = await loadZooData(TASK_OF[model])
      const r = await new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig: { model, batch, steps, warmup },
        scalingConfig: { numWorkers: p, backend, useGpu: backend === "webgpu" },
        runConfig: { name: `bench-overlap-${model}-${Date.now()}`, storagePath: storage, progress: false },
        datasets: { train: data.train }
      }).fit()
      const m = r.metrics ?? {}
      const num = (k: string): number => Number(m[k])
      const cuts = Object.keys(m)
        .filter((k) => k.startsWith("ms/cut "))
        .map((k) => k.slice(3))
      const best = cuts.reduce<string | undefined>((b, c) => (b === undefined || num(`ms/${c}`) < num(`ms/${b}`) ? c : b), undefined)
      const whole = num("ms/whole")
      const worstDiff = Math.max(...cuts.map((c) => num(`diff/${c}`)))
      console.log(
        `${model.padEnd(6)} ${String(num("parameters")).padStart(7)}  ${whole.toFixed(2).padStart(13)}  ${num("ms/compute").toFixed(2).padStart(10)}  ${num("ms/reduce").toFixed(2).padStart(13)}  ` +
          `${best ? `${num(`ms/${best}`).toFixed(2)} (${best}, ${(num(`back/${best}`) * 100).toFixed(0)}%)` : "no cut with weights on both sides"}`.padEnd(55) +
          `${best ? (num(`ms/${best}`) / whole).toFixed(2) + "x" : "-"}`.padStart(13) +
          `  ${num("ms/reduce").toFixed(2)} ms (${((num("ms/reduce") / whole) * 100).toFixed(0)}%)`
      )
      console.log(`        every cut: ${cuts.map((c) => `${c} ${num(`ms/${c}`).toFixed(2)} ms`).join(", ")}; split gradients vs whole: max |diff| ${worstDiff}`)
    }
  } finally {
    fs.rmSync(storage, { recursive: true, force: true })
  }
}
