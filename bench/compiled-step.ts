// What a Keras-style compiled classifier's data-parallel step costs on a host backend: a model
// compiled with `loss: "categoricalCrossentropy"` (a softmax output) stepped by `dp.trainStep` in a
// group of one, with
//   before: tfjs-layers' loss composition, tfjs's softmax gradient, and every tensor kept for a
//           gradient cloned by an Identity kernel (tfjs's engine), as gradwire ran it until now;
//   loss:   gradwire's loss and softmax gradient kernels (core/kernels/prob-cross-entropy.ts);
//   saves:  those and the kept tensors as second references (core/kernels/saved-tensors.ts);
//   all:    those and the dense layers as one kernel each (core/kernels/train-layers.ts), as now.
// The arms alternate block by block in one process (each its own model), so drift hits all alike;
// each block's CPU time (process.cpuUsage) per step, after a warm-up long enough for V8 to optimize.
// Prints the medians and the kernels one step runs.
//
//   node bench/compiled-step.ts [--models mlp,cnn] [--batch 21] [--backend wasm] [--steps 300] [--rounds 9]
import { optionReader } from "./args.ts"
import { loadEngine, type BackendKind } from "../index.ts"
import { DataParallelModel, type GradientSync } from "../actors/train/worker/data-parallel.ts"
import { buildModel, type ModelKind } from "../examples/digits/model.ts"
import { useProbCrossEntropy } from "../core/kernels/prob-cross-entropy.ts"
import { useSharedSaves } from "../core/kernels/saved-tensors.ts"
import { useDenseTrain } from "../core/kernels/train-layers.ts"

const option = optionReader(process.argv.slice(2))
const opt = (name: string, fallback: string): string => option(`--${name}`, fallback)
const models = opt("models", "mlp,cnn").split(",") as ModelKind[]
const batch = Number(opt("batch", "21"))
const steps = Number(opt("steps", "300"))
const rounds = Number(opt("rounds", "9"))
const { tf, backend } = await loadEngine(opt("backend", "wasm") as BackendKind)
const median = (v: number[]): number => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!

const solo: GradientSync = { rank: 0, worldSize: 1, reduceGradients: async () => {}, broadcast: async () => {}, sum: async () => {} } as never
const ARMS = ["before", "loss", "saves", "all"] as const
type Arm = (typeof ARMS)[number]
const setArm = (arm: Arm): void => {
  useProbCrossEntropy(arm !== "before")
  useSharedSaves(arm === "saves" || arm === "all")
  useDenseTrain(arm === "all")
}

console.log(`backend ${backend}, batch ${batch}, ${rounds} rounds of ${steps} steps per arm, alternated; CPU ms per step (median of rounds)`)
console.log("model   before   +loss kernels   +saved references   +dense kernels   before/after   kernels a step before -> after")
for (const kind of models) {
  const x = tf.randomNormal([batch, 64])
  const y = tf.oneHot(tf.randomUniform([batch], 0, 10, "int32"), 10)
  const dps = {} as Record<Arm, DataParallelModel>
  for (const arm of ARMS) {
    const m = buildModel(tf, kind)
    m.compile({ optimizer: tf.train.adam(0.001), loss: "categoricalCrossentropy" })
    dps[arm] = await DataParallelModel.prepare(tf, m, solo)
    dps[arm].exchangeAlone = true
  }
  const block = async (arm: Arm, n: number): Promise<number> => {
    setArm(arm)
    const c0 = process.cpuUsage()
    for (let i = 0; i < n; i++) await dps[arm].trainStep(x, y)
    const c = process.cpuUsage(c0)
    return (c.user + c.system) / 1000 / n
  }
  for (let r = 0; r < 8; r++) for (const arm of ARMS) await block(arm, 500)
  const cpu = { before: [], loss: [], saves: [], all: [] } as Record<Arm, number[]>
  for (let r = 0; r < rounds; r++) for (const arm of ARMS) cpu[arm].push(await block(arm, steps))
  const kernels = async (arm: Arm): Promise<number> => {
    setArm(arm)
    return (await tf.profile(async () => void (await dps[arm].trainStep(x, y)))).kernels.length
  }
  const [kb, kn] = [await kernels("before"), await kernels("all")]
  const [b, l, s, n] = ARMS.map((a) => median(cpu[a]))
  console.log(`${kind.padEnd(7)} ${b!.toFixed(3).padEnd(8)} ${l!.toFixed(3).padEnd(15)} ${s!.toFixed(3).padEnd(19)} ${n!.toFixed(3).padEnd(16)} ${(b! / n!).toFixed(2)}x          ${kb} -> ${kn}`)
  for (const arm of ARMS) dps[arm].model.dispose()
  tf.dispose([x, y])
}
setArm("all")
process.exit(0)
