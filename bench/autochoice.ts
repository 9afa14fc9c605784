// Automatic algorithm choice against measurement: `npm run bench -- autochoice [--p 2,3,4]
// [--sizes 4K,64K,1M,8M] [--reps 5] [--nodes 1]`. For each p, p rank processes on one local
// nats-server observe the topology (the probe the trainer runs), the cost model picks an
// algorithm per size, and every algorithm is then timed at that size (rounds interleaved). Prints
// predicted and measured times side by side and marks the cases where the pick is not the
// measured fastest (and by how much the pick is slower). `--nodes N` labels ranks as N nodes
// (round-robin blocks) so hierarchical has groups to work with.
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { launchNatsServer } from "../core/nats-server.ts"
import { allReduceAlgorithmNames } from "../collectives/algorithms/index.ts"
import { median } from "../scheduler/cost-model.ts"

const KiB = 1024
const MiB = 1024 * KiB
const RANK = fileURLToPath(new URL("../test/support/choice-rank.ts", import.meta.url))

const parseSize = (s: string): number => {
  const m = /^(\d+(?:\.\d+)?)\s*([KMG]?)i?B?$/i.exec(s.trim())
  if (!m) throw new Error(`bad size "${s}" (use e.g. 4K, 256K, 4M)`)
  return Math.round(Number(m[1]) * { "": 1, K: KiB, M: MiB, G: 1024 * MiB }[m[2]!.toUpperCase() as "" | "K" | "M" | "G"])
}
const fmtSize = (b: number): string => (b >= MiB ? `${b / MiB} MiB` : `${b / KiB} KiB`)
const fmtMs = (ms: number): string => (ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2))

const runRank = (args: object, timeoutMs: number): Promise<string> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [RANK, JSON.stringify(args)], { stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let err = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString()))
    child.stderr.on("data", (d: Buffer) => (err += d.toString()))
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
    child.on("exit", (code) => {
      clearTimeout(timer)
      if (code === 0) resolve(out)
      else reject(new Error(`rank exited with ${code}: ${err.slice(-1500)}`))
    })
  })

export async function run(argv: ReadonlyArray<string>): Promise<void> {
  const get = (flag: string): string | undefined => {
    const i = argv.indexOf(flag)
    return i >= 0 ? argv[i + 1] : undefined
  }
  const ps = (get("--p") ?? "2,3,4").split(",").map(Number)
  const sizes = (get("--sizes") ?? "4K,64K,1M,8M").split(",").map(parseSize)
  const reps = Number(get("--reps") ?? 5)
  const nodes = Number(get("--nodes") ?? 1)
  // every registered algorithm (the rank processes register the same built-ins)
  const algorithms = allReduceAlgorithmNames()
  const server = await launchNatsServer({ maxPayload: 8 * MiB })
  let agree = 0
  let total = 0
  const disagreements: string[] = []
  try {
    console.log(`autochoice: predicted (cost model from the start-up probe) vs measured median of ${reps}, ms; * = picked, ! = measured fastest when different`)
    console.log(`${"p".padEnd(3)} ${"size".padEnd(9)} ${algorithms.map((a) => `${a} pred/meas`.padEnd(24)).join("")}pick         fastest`)
    for (const p of ps) {
      const per = Math.ceil(p / nodes)
      const outs = await Promise.all(
        Array.from({ length: p }, (_, rank) =>
          runRank({ rank, worldSize: p, node: `node${Math.floor(rank / per)}`, url: server.url, sizes, algorithms, reps, deadlineMs: 240_000 }, 250_000)
        )
      )
      const res = JSON.parse(outs[0]!.trim().split("\n").at(-1)!) as {
        observation: string
        cases: Array<{ bytes: number; chosen: string; predicted: Record<string, number>; measured: Record<string, number[]> }>
      }
      console.log(`  ${res.observation}`)
      for (const c of res.cases) {
        const meds = Object.fromEntries(algorithms.map((a) => [a, median(c.measured[a]!)]))
        const fastest = algorithms.reduce((a, b) => (meds[b]! < meds[a]! ? b : a))
        total++
        if (fastest === c.chosen) agree++
        else disagreements.push(`p=${p} ${fmtSize(c.bytes)}: picked ${c.chosen} (${fmtMs(meds[c.chosen]!)} ms), fastest ${fastest} (${fmtMs(meds[fastest]!)} ms): ${(meds[c.chosen]! / meds[fastest]!).toFixed(2)}x slower`)
        const cells = algorithms.map((a) => `${fmtMs(c.predicted[a]!)}/${fmtMs(meds[a]!)}${a === c.chosen ? "*" : ""}${a === fastest && a !== c.chosen ? "!" : ""}`.padEnd(24)).join("")
        console.log(`${String(p).padEnd(3)} ${fmtSize(c.bytes).padEnd(9)} ${cells}${c.chosen.padEnd(13)}${fastest}`)
      }
    }
    console.log(`\nthe pick is the measured fastest in ${agree} of ${total} cases`)
    for (const d of disagreements) console.log(`  disagree: ${d}`)
  } finally {
    await server.stop()
  }
}
