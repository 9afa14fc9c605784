// How many warm-up steps a standby needs before it joins (actors/train/worker/warm-up.ts,
// GRADWIRE_STANDBY_WARM_UP_STEPS): in a fresh process per trial, as a standby does (V8 optimizing
// after GRADWIRE_TURBOFAN_AFTER calls, core/tier-up.ts; the wasm backend), the warm-up's model
// trained for k steps, then a model of another size (64 features, 256 hidden units: the digits
// MLP's input and width) trained through the same step code, as the joined worker's loop does, in
// windows of 50 steps. Printed per k: the warm-up's ms, and the ms per step of the first windows
// after it, next to the baseline of a process with no warm-up (k = 0) and of one warmed up far
// longer (the largest k), medians over the rounds; arms in a rotating order each round.
//
//   node bench/warm-up-steps.ts [--steps 0,100,300,600,2000] [--rounds 3] [--windows 6]
import { execFileSync } from "node:child_process"
import * as os from "node:os"
import { fileURLToPath } from "node:url"
import { optionReader } from "./args.ts"
import { median } from "../scheduler/cost-model.ts"

const ROOT = fileURLToPath(new URL("..", import.meta.url))
const option = optionReader(process.argv.slice(2))
const steps = option("--steps", "0,100,300,600,2000").split(",").map(Number)
const rounds = Number(option("--rounds", "3"))
const windows = Number(option("--windows", "6"))
const WINDOW = 50
if (steps.some((k) => !(Number.isInteger(k) && k >= 0))) throw new RangeError(`--steps must be whole numbers >= 0, got ${steps.join(",")}`)
if (!(rounds >= 1 && windows >= 1)) throw new RangeError("--rounds and --windows must be >= 1")

const TRIAL = `
  import { tierUpSooner } from "./core/tier-up.ts"
  import { loadEngine } from "./core/engine.ts"
  import { warmUpTraining } from "./actors/train/worker/warm-up.ts"
  tierUpSooner()
  const { tf } = await loadEngine("wasm")
  const [k, windows, size] = process.argv.slice(1).map(Number)
  const warm = await warmUpTraining(tf, { maxMs: 1e9, maxSteps: k })
  const after = []
  for (let w = 0; w < windows; w++) {
    const r = await warmUpTraining(tf, { maxMs: 1e9, maxSteps: size, features: 64, hidden: 256 })
    after.push(r.ms / r.steps)
  }
  console.log(JSON.stringify({ warmMs: warm.ms, after }))`

const trial = (k: number): { warmMs: number; after: number[] } => {
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", TRIAL, String(k), String(windows), String(WINDOW)], {
    cwd: ROOT,
    encoding: "utf8",
    timeout: 300_000,
    env: { ...process.env, GRADWIRE_TURBOFAN_AFTER: process.env.GRADWIRE_TURBOFAN_AFTER ?? "500" }
  })
  return JSON.parse(out.trim().split("\n").pop()!) as { warmMs: number; after: number[] }
}

console.log(`warm-up steps: ${os.cpus().length} cores, ${os.cpus()[0]?.model ?? "?"}; ${rounds} rounds, ${windows} windows of ${WINDOW} steps after the warm-up`)
const results = new Map<number, Array<{ warmMs: number; after: number[] }>>(steps.map((k) => [k, []]))
for (let r = 0; r < rounds; r++) {
  const order = steps.map((_, i) => steps[(i + r) % steps.length]!)
  for (const k of order) results.get(k)!.push(trial(k))
}
const head = Array.from({ length: windows }, (_, w) => `steps ${w * WINDOW + 1}-${(w + 1) * WINDOW}`)
console.log(`| warm-up steps | warm-up ms | ${head.join(" | ")} | first ${windows * WINDOW} steps, ms |`)
console.log(`|---|---|${head.map(() => "---|").join("")}---|`)
for (const k of steps) {
  const rs = results.get(k)!
  const perWindow = head.map((_, w) => median(rs.map((x) => x.after[w]!)))
  const total = median(rs.map((x) => x.after.reduce((a, b) => a + b, 0) * WINDOW))
  console.log(`| ${k} | ${median(rs.map((x) => x.warmMs)).toFixed(0)} | ${perWindow.map((v) => v.toFixed(2)).join(" | ")} | ${total.toFixed(0)} |`)
}
console.log("(ms per step after the warm-up, medians over the rounds; each window's steps include building its model)")
