// What relaxed SIMD's fused multiply-add saves in whole training steps on wasm: each zoo model's plain
// tfjs step (zoo-step.ts: the zoo's model, batches and loss, tfjs's Adam) with the heap kernels'
// fused binary against the one that multiplies, then adds (core/kernels/heap-simd.ts,
// usePlainMultiplyAdd), alternated in rounds in one process so that drift hits both alike (medians
// of ms per step).
//
//   node bench/fma.ts [--models resnet,lenet,...] [--rounds 12] [--steps 20] [--batch 32]
import { optionReader } from "./args.ts"
import { loadEngine } from "../index.ts"
import { heapKernelsStatus, usePlainMultiplyAdd } from "../core/kernels/heap-simd.ts"
import { DEFAULT_ZOO_MODELS, type ZooModel } from "../examples/zoo/models.ts"
import { median } from "../scheduler/cost-model.ts"
import { plainZooStep } from "./zoo-step.ts"

const option = optionReader(process.argv.slice(2))
const models = option("--models", DEFAULT_ZOO_MODELS.join(",")).split(",") as ZooModel[]
const rounds = Number(option("--rounds", "12"))
const steps = Number(option("--steps", "20"))
const batch = Number(option("--batch", "32"))
const { tf, backend } = await loadEngine("wasm")
if (!heapKernelsStatus().startsWith("in use, fused")) {
  console.log(`the heap kernels here: ${heapKernelsStatus()}; nothing to compare`)
  process.exit(0)
}
console.log(`backend ${backend}, batch ${batch}, ${rounds} rounds of ${steps} steps each way, alternated`)
console.log("\nmodel        multiply, then add ms   fused multiply-add ms   speed-up")
for (const model of models) {
  const { step, dispose } = await plainZooStep(tf, model, batch)
  const timed = async (plain: boolean): Promise<number> => {
    usePlainMultiplyAdd(plain)
    for (let s = 0; s < 3; s++) await step()
    const t0 = performance.now()
    for (let s = 0; s < steps; s++) await step()
    return (performance.now() - t0) / steps
  }
  const plain: number[] = []
  const fused: number[] = []
  for (let r = 0; r < rounds; r++) {
    if (r % 2) {
      plain.push(await timed(true))
      fused.push(await timed(false))
    } else {
      fused.push(await timed(false))
      plain.push(await timed(true))
    }
  }
  usePlainMultiplyAdd(false)
  dispose()
  const [p, f] = [median(plain), median(fused)]
  console.log(`${model.padEnd(12)} ${p.toFixed(3).padStart(20)}   ${f.toFixed(3).padStart(21)}   ${(p / f).toFixed(2)}x`)
}
process.exit(0)
