// `npm run bench -- train`: each zoo model (examples/zoo) at p = 1, 2, 4 workers of the embedded
// cluster, gradwire's samples/s against PyTorch DDP (Debian's python3-torch, gloo on loopback, one
// thread per rank) with the same model, data, batch per rank, Adam and learning rate, run back to
// back in the same run; gradwire's step split into compute (forward + backward), communication
// (the all-reduce), apply (the optimizer) and waiting (between steps: batching, the loop).
// With `--backend webgpu` the workers are GPU workers (`useGpu`) and PyTorch runs on CUDA when it
// sees a GPU (`--torch-device` overrides); PyTorch comes from /usr/bin/python3, else from the
// `python3` on PATH, whichever imports torch (`--python` names another). `--algorithm` fixes
// gradwire's all-reduce algorithm (collectiveConfig.algorithm; default auto: the cost model's pick,
// then measured on the job's own calls), `--transport` its data path (auto, direct or nats).
//
//   npm run bench -- train [--models cnn,lenet,...] [--p 1,2,4] [--warmup 20] [--seconds 6] [--batch 32] [--repeat 1] [--algorithm auto] [--transport auto]
//                          [--backend auto|wasm|cpu|webgpu] [--torch-device cpu|cuda] [--python PATH]
//                          [--gpu-share 0.5]   (webgpu: each worker takes that fraction of a GPU, so
//                                              p workers can share one GPU; default a whole GPU each)
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { spawn } from "node:child_process"
import { Trainer } from "../index.ts"
import { loadZooData, type ZooData } from "../examples/zoo/data.ts"
import { DEFAULT_ZOO_MODELS, readsTokens, TASK_OF, ZOO_MODELS, type ZooModel } from "../examples/zoo/models.ts"
import { exitOf, findTorch } from "./allreduce.ts"
import { optionReader } from "./args.ts"
import { median } from "../scheduler/cost-model.ts"
import { allReduceAlgorithms } from "../collectives/algorithms/index.ts"

const LOOP = { module: new URL("../examples/zoo/train.ts", import.meta.url).href, export: "zooLoop" }
const TORCH_SCRIPT = new URL("./torch_zoo.py", import.meta.url).pathname

/** Step time of one model on one worker, a first guess for how many steps fill the time asked (ms). */
const GUESS_MS: Record<ZooModel, number> = { mlp: 1.5, cnn: 2.5, lenet: 13, resnet: 21, resnet28: 120, resnet18: 1400, mobilenet: 40, embedding: 4.5, transformer: 40, lstm: 70, gru: 70 }

interface Figures {
  readonly samplesPerSec: number
  readonly split?: { compute: number; comm: number; apply: number; wait: number }
}

type Backend = "auto" | "wasm" | "cpu" | "webgpu"
const BACKENDS: ReadonlyArray<Backend> = ["auto", "wasm", "cpu", "webgpu"]

const runGradwire = async (model: ZooModel, data: ZooData, p: number, batch: number, warmup: number, steps: number, storage: string, backend: Backend, gpuShare: number, algorithm: string, transport: string): Promise<Figures> => {
  const rows: number[][] = []
  const r = await new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { model, batchSize: batch, bench: { steps, warmup }, ...(data.text ? { text: data.text } : {}) },
    // A GPU backend asked for by name means GPU workers.
    scalingConfig: { numWorkers: p, backend, useGpu: backend === "webgpu", ...(backend === "webgpu" ? { resourcesPerWorker: { GPU: gpuShare } } : {}) },
    ...(algorithm !== "auto" || transport !== "auto" ? { collectiveConfig: { algorithm: algorithm as "ring", transport: transport as "auto" } } : {}),
    runConfig: {
      name: `bench-train-${model}-${p}-${Date.now()}`,
      storagePath: storage,
      progress: false,
      callbacks: [{ onProgress: (info) => void rows.push(...(((info as { stepTimes?: number[][] }).stepTimes ?? []).filter((s) => s[0]! >= warmup))) }]
    },
    datasets: { train: data.train, test: data.test }
  }).fit()
  const own = Number(r.metrics?.samplesPerSec ?? 0)
  const col = (i: number) => median(rows.map((s) => s[i]!))
  return { samplesPerSec: own * p, ...(rows.length > 0 ? { split: { compute: col(1), comm: col(2), apply: col(3), wait: col(4) } } : {}) }
}

/** The last `keep` characters a stream printed. */
const tailOf = (stream: NodeJS.ReadableStream | null, keep = 2000): (() => string) => {
  let text = ""
  stream?.on("data", (d: Buffer) => void (text = (text + d.toString()).slice(-keep)))
  return () => text
}

const lastLine = (text: string): string => text.trim().split("\n").at(-1) ?? ""

/** The same steps in plain tfjs in a child process (bench/zoo-plain.ts): gradwire's own overhead at p = 1. */
const runPlain = async (model: ZooModel, batch: number, warmup: number, steps: number, backend: Backend): Promise<number | string> => {
  const args = [new URL("./zoo-plain.ts", import.meta.url).pathname, model, String(batch), String(warmup), String(steps), backend]
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] })
  const out = tailOf(child.stdout)
  const err = tailOf(child.stderr)
  const code = await exitOf(child, 240_000)
  const line = lastLine(out())
  if (code === 0 && line.startsWith("{")) return (JSON.parse(line) as { samplesPerSec: number }).samplesPerSec
  return `plain tfjs failed (exit ${code}): ${lastLine(err())}`
}

/** torch's run, tried a second time (on another port) when the first fails or hangs. */
interface TorchRun {
  readonly python: string
  readonly device: "cpu" | "cuda"
}

const runTorch = async (torch: TorchRun, model: ZooModel, prefix: string, p: number, batch: number, warmup: number, steps: number, expectedMs: number): Promise<Figures | string> => {
  const first = await runTorchOnce(torch, model, prefix, p, batch, warmup, steps, expectedMs)
  return typeof first === "string" ? runTorchOnce(torch, model, prefix, p, batch, warmup, steps, expectedMs) : first
}

const runTorchOnce = async (torch: TorchRun, model: ZooModel, prefix: string, p: number, batch: number, warmup: number, steps: number, expectedMs: number): Promise<Figures | string> => {
  const out = `${prefix}.torch-${p}.json`
  fs.rmSync(out, { force: true })
  const port = 29000 + Math.floor(Math.random() * 2000)
  const args = [TORCH_SCRIPT, model, String(p), prefix, String(batch), String(warmup), String(steps), String(port), out, torch.device]
  const child = spawn(torch.python, args, { stdio: ["ignore", "ignore", "pipe"], detached: true })
  const err = tailOf(child.stderr)
  // Bounded: a run far past gradwire's time for the same steps is taken for hung and killed, with
  // its process group (the ranks mp.spawn started).
  const code = await exitOf(child, Math.max(60_000, 5 * expectedMs), true)
  if (code === 0 && fs.existsSync(out)) return JSON.parse(fs.readFileSync(out, "utf8")) as Figures
  return `torch failed (${code === null ? "hung: killed" : `exit ${code}`}): ${lastLine(err())}`
}

export const run = async (argv: ReadonlyArray<string>): Promise<void> => {
  const opt = optionReader(argv)
  const models = opt("--models", DEFAULT_ZOO_MODELS.join(",")).split(",") as ZooModel[]
  const ps = opt("--p", "1,2,4").split(",").map(Number)
  const warmup = Number(opt("--warmup", "20"))
  const seconds = Number(opt("--seconds", "6"))
  const batch = Number(opt("--batch", "32"))
  const backend = opt("--backend", "auto") as Backend
  const pythonArg = opt("--python", "")
  const deviceArg = opt("--torch-device", "")
  const gpuShare = Number(opt("--gpu-share", "1"))
  const algorithm = opt("--algorithm", "auto")
  const algorithms = ["auto", ...allReduceAlgorithms().map((a) => a.name)]
  if (!algorithms.includes(algorithm)) throw new RangeError(`--algorithm: unknown all-reduce algorithm ${algorithm} (known: ${algorithms.join(", ")})`)
  const transport = opt("--transport", "auto")
  if (!["auto", "direct", "nats"].includes(transport)) throw new RangeError(`--transport: ${transport} is none of auto, direct, nats`)
  const repeat = Number(opt("--repeat", "1"))
  if (!(Number.isInteger(repeat) && repeat >= 1)) throw new RangeError(`--repeat: ${opt("--repeat", "1")} is not a whole number of rounds (1 or more)`)
  if (!(gpuShare > 0 && gpuShare <= 1)) throw new RangeError(`--gpu-share: ${gpuShare} is not a fraction of a GPU in (0, 1]`)
  if (gpuShare !== 1 && backend !== "webgpu") throw new RangeError("--gpu-share: only GPU workers take a GPU (add --backend webgpu)")
  for (const m of models) if (!ZOO_MODELS.includes(m)) throw new RangeError(`--models: unknown model ${m} (known: ${ZOO_MODELS.join(", ")})`)
  if (!BACKENDS.includes(backend)) throw new RangeError(`--backend: unknown backend ${backend} (known: ${BACKENDS.join(", ")})`)
  if (deviceArg !== "" && deviceArg !== "cpu" && deviceArg !== "cuda") throw new RangeError(`--torch-device: ${deviceArg} is neither cpu nor cuda`)
  const found = findTorch(pythonArg ? [pythonArg] : ["/usr/bin/python3", "python3"])
  const device = deviceArg === "" ? (backend === "webgpu" && found?.cuda ? "cuda" : "cpu") : deviceArg
  if (device === "cuda" && found && !found.cuda) throw new RangeError(`--torch-device cuda: the torch of ${found.python} sees no CUDA GPU`)
  const torch: TorchRun | undefined = found ? { python: found.python, device } : undefined
  const storage = fs.mkdtempSync(path.join(os.tmpdir(), "gradwire-bench-train-"))
  console.log(`machine: ${os.cpus().length} x ${os.cpus()[0]?.model ?? "cpu"}, ${Math.round(os.totalmem() / 2 ** 30)} GiB; node ${process.version}`)
  console.log(`batch ${batch} per rank, Adam 0.003, ${warmup} warm-up steps, then about ${seconds} s of steps per run; samples/s over all ranks${repeat > 1 ? `; medians of ${repeat} rounds, gradwire and PyTorch in turn (the ratio's range in brackets)` : ""}`)
  console.log(`gradwire: backend ${backend}${algorithm !== "auto" ? `, all-reduce ${algorithm}` : ""}${transport !== "auto" ? `, transport ${transport}` : ""}${backend === "webgpu" ? ` (GPU workers${gpuShare < 1 ? `, ${gpuShare} of a GPU each` : ""})` : ""}; PyTorch: ${torch ? `${torch.python} on ${device === "cuda" ? "CUDA (DDP over NCCL at p = 1, gloo beyond: the ranks share the GPU)" : "the CPU (DDP over gloo, one thread per rank)"}` : "not measured - no python3 here imports torch (apt-get install -y python3-torch)"}`)
  const header = "model        p  gradwire/s    torch/s   time/sample x torch   plain tfjs/s (p=1: gradwire's overhead)   step split ms (compute / comm / apply / wait)"
  console.log(`\n${header}`)
  try {
    for (const model of models) {
      const data = await loadZooData(TASK_OF[model])
      const prefix = path.join(storage, model)
      fs.writeFileSync(`${prefix}.x`, data.train.x)
      fs.writeFileSync(`${prefix}.y`, Int32Array.from(data.train.y))
      fs.writeFileSync(`${prefix}.json`, JSON.stringify({ rows: data.train.size, int: readsTokens(model), ...(data.text ?? {}) }))
      for (const p of ps) {
        // Steps per rank for about `seconds` s, with p ranks sharing the machine's cores.
        const steps = Math.max(20, Math.round((seconds * 1000) / (GUESS_MS[model] * Math.max(1, p / os.cpus().length))))
        // --repeat N: N rounds, gradwire and PyTorch in turn, which of them goes first alternating
        // (a slower spell of a shared machine then falls on both alike); medians, and the ratio's
        // range over the rounds.
        const gs: Figures[] = []
        const ts: number[] = []
        const ratios: number[] = []
        let failed: string | undefined
        let gradwireMs = (warmup + steps) * GUESS_MS[model] * 3
        const runG = async (): Promise<Figures> => {
          const t1 = performance.now()
          const g = await runGradwire(model, data, p, batch, warmup, steps, storage, backend, gpuShare, algorithm, transport)
          gradwireMs = performance.now() - t1
          return g
        }
        for (let round = 0; round < repeat; round++) {
          let g: Figures
          let t: Figures | string
          if (round % 2 === 0 || !torch) {
            g = await runG()
            t = torch ? await runTorch(torch, model, prefix, p, batch, warmup, steps, gradwireMs) : "not measured"
          } else {
            t = await runTorch(torch, model, prefix, p, batch, warmup, steps, gradwireMs)
            g = await runG()
          }
          gs.push(g)
          if (typeof t === "string") failed = t
          else (ts.push(t.samplesPerSec), ratios.push(t.samplesPerSec / g.samplesPerSec))
        }
        const gps = median(gs.map((g) => g.samplesPerSec))
        const tps = ts.length > 0 ? median(ts) : undefined
        const plain = p === 1 ? await runPlain(model, batch, warmup, steps, backend) : undefined
        const plainText = plain === undefined ? "" : typeof plain === "string" ? plain : `${plain.toFixed(0)} (${((plain / gps - 1) * 100).toFixed(1)}%)`
        const splits = gs.flatMap((g) => (g.split ? [g.split] : []))
        const s = splits.length > 0 ? { compute: median(splits.map((x) => x.compute)), comm: median(splits.map((x) => x.comm)), apply: median(splits.map((x) => x.apply)), wait: median(splits.map((x) => x.wait)) } : undefined
        const ratio = ratios.length === 0 ? "-" : `${median(ratios).toFixed(2)}x` + (ratios.length > 1 ? ` (${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)})` : "")
        console.log(
          `${model.padEnd(12)} ${String(p).padStart(1)} ${gps.toFixed(0).padStart(11)} ${(tps === undefined ? "-" : tps.toFixed(0)).padStart(10)} ` +
            `${ratio.padStart(21)}   ` +
            `${plainText.padEnd(40)}` +
            (s ? `${s.compute.toFixed(2)} / ${s.comm.toFixed(2)} / ${s.apply.toFixed(2)} / ${s.wait.toFixed(2)}` : "-") +
            (failed !== undefined && torch ? `   (${failed})` : "")
        )
      }
    }
  } finally {
    fs.rmSync(storage, { recursive: true, force: true })
  }
}
