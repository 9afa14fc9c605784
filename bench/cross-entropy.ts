// What gradwire's crossEntropy (core/kernels/cross-entropy.ts, the zoo's loss) saves against tfjs's
// softmaxCrossEntropy on one-hot labels: a zoo model's plain tfjs training step (bench/zoo-step.ts)
// with each loss on the same model, alternated step block by step block in one process, so drift
// hits both alike. Prints ms per step for each block and the medians.
//
//   node bench/cross-entropy.ts [--models mlp,lenet,transformer] [--backend wasm] [--steps 30] [--rounds 4]
//
// On webgpu (a GPU, or SwiftShader with GRADWIRE_WEBGPU_SOFTWARE=1) each kernel is a program the CPU records.
import { optionReader } from "./args.ts"
import { loadEngine, type BackendKind } from "../index.ts"
import type { ZooModel } from "../examples/zoo/models.ts"
import { plainZooStep, type ZooLossKind } from "./zoo-step.ts"

const option = optionReader(process.argv.slice(2))
const opt = (name: string, fallback: string): string => option(`--${name}`, fallback)
const models = opt("models", "mlp,lenet,transformer").split(",") as ZooModel[]
const steps = Number(opt("steps", "30"))
const rounds = Number(opt("rounds", "4"))
const { tf, backend } = await loadEngine(opt("backend", "wasm") as BackendKind)
const median = (v: number[]): number => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!

console.log(`backend ${backend}, batch 32, ${rounds} rounds of ${steps} steps per loss, alternated`)
console.log("model        tfjs softmaxCrossEntropy ms/step   gradwire crossEntropy ms/step   (per round)")
for (const model of models) {
  const run = await plainZooStep(tf, model, 32)
  const kinds: ZooLossKind[] = ["tfjs", "gradwire"]
  for (const kind of kinds) for (let i = 0; i < 5; i++) await run.step(kind)
  const times: Record<ZooLossKind, number[]> = { tfjs: [], gradwire: [] }
  for (let r = 0; r < rounds; r++)
    for (const kind of kinds) {
      const t0 = performance.now()
      for (let i = 0; i < steps; i++) await run.step(kind)
      times[kind].push((performance.now() - t0) / steps)
    }
  const f = (v: number[]) => `${median(v).toFixed(2)} (${v.map((x) => x.toFixed(2)).join(", ")})`
  console.log(`${model.padEnd(12)} ${f(times.tfjs).padEnd(34)} ${f(times.gradwire)}`)
  run.dispose()
}
process.exit(0)
