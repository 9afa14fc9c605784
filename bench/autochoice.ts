// Automatic algorithm choice against measurement: `npm run bench -- autochoice [--p 2,3,4]
// [--sizes 4K,64K,1M,8M] [--reps 5] [--nodes 1] [--transports nats,direct]`. Per transport
// (everything over NATS, or every call over the direct links) and p, p rank processes on one local
// nats-server observe the topology (the probe the trainer runs), the cost model picks an
// algorithm per size, and every algorithm is then timed at that size (rounds interleaved). Prints
// predicted and measured times side by side and marks the cases where the pick is not the
// measured fastest (and by how much the pick is slower), and the same for the tuner's pick
// (each algorithm timed on the group's calls first, as training does with algorithm 'auto'); at
// the end, per transport and way of picking, how often the pick was within 1.1x of the
// measured fastest. `--nodes N` labels ranks as N nodes
// (round-robin blocks) so hierarchical has groups to work with.
import { spawn } from "node:child_process"
import * as crypto from "node:crypto"
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
  const transports = (get("--transports") ?? "nats,direct").split(",")
  for (const t of transports) if (t !== "nats" && t !== "direct") throw new Error(`unknown transport "${t}" in --transports (use nats, direct)`)
  // every registered algorithm (the rank processes register the same built-ins)
  const algorithms = allReduceAlgorithmNames()
  const server = await launchNatsServer({ maxPayload: 8 * MiB })
  // One score per (transport, way of picking): exact = the measured fastest, near = within 1.1x of it.
  const score = new Map<string, { exact: number; near: number; total: number; slower: number[] }>()
  const tally = (key: string, pickMs: number, fastestMs: number): void => {
    const s = score.get(key) ?? { exact: 0, near: 0, total: 0, slower: [] }
    s.total++
    if (pickMs <= fastestMs) s.exact++
    if (pickMs <= 1.1 * fastestMs) s.near++
    s.slower.push(pickMs / fastestMs)
    score.set(key, s)
  }
  const disagreements: string[] = []
  try {
    console.log(
      `autochoice: predicted (cost model from the start-up probe; over the direct links, fitted from the group's timed calls on them) vs measured median of ${reps}, ms; ` +
        `* = the model's pick, ! = measured fastest when different; "tuned" = the pick of the tuner (each algorithm timed 5 times first, as training does)`
    )
    for (const transport of transports) {
      // One secret per group: every call of a direct group goes over the direct links.
      const directSecret = transport === "direct" ? crypto.randomBytes(32).toString("hex") : undefined
      console.log(`\n${transport === "direct" ? "direct links (a Unix socket between ranks of a node, TCP on loopback across)" : "NATS"}, ranks on ${nodes} node(s):`)
      console.log(`${"p".padEnd(3)} ${"size".padEnd(9)} ${algorithms.map((a) => `${a} pred/meas`.padEnd(24)).join("")}${"pick".padEnd(13)}${"tuned".padEnd(13)}fastest`)
      for (const p of ps) {
        const per = Math.ceil(p / nodes)
        const outs = await Promise.all(
          Array.from({ length: p }, (_, rank) =>
            runRank({ rank, worldSize: p, node: `node${Math.floor(rank / per)}`, url: server.url, sizes, algorithms, reps, tune: true, deadlineMs: 240_000, ...(directSecret ? { directSecret } : {}) }, 250_000)
          )
        )
        const res = JSON.parse(outs[0]!.trim().split("\n").at(-1)!) as {
          observation: string
          cases: Array<{ bytes: number; chosen: string; tuned?: string; predicted: Record<string, number>; measured: Record<string, number[]> }>
        }
        console.log(`  ${res.observation}`)
        for (const c of res.cases) {
          const meds = Object.fromEntries(algorithms.map((a) => [a, median(c.measured[a]!)]))
          const fastest = algorithms.reduce((a, b) => (meds[b]! < meds[a]! ? b : a))
          tally(`${transport} model`, meds[c.chosen]!, meds[fastest]!)
          // The noise floor: the fastest by the even rounds, judged by the odd rounds.
          const half = (k: number) => Object.fromEntries(algorithms.map((a) => [a, median(c.measured[a]!.filter((_, i) => i % 2 === k))]))
          const [even, odd] = [half(0), half(1)]
          const evenFastest = algorithms.reduce((a, b) => (even[b]! < even[a]! ? b : a))
          const oddFastest = algorithms.reduce((a, b) => (odd[b]! < odd[a]! ? b : a))
          tally(`${transport} halves`, odd[evenFastest]!, odd[oddFastest]!)
          if (c.tuned !== undefined) tally(`${transport} tuned`, meds[c.tuned]!, meds[fastest]!)
          if (fastest !== c.chosen) {
            disagreements.push(`${transport} p=${p} ${fmtSize(c.bytes)}: model picked ${c.chosen} (${fmtMs(meds[c.chosen]!)} ms), tuned ${c.tuned ?? "-"}, fastest ${fastest} (${fmtMs(meds[fastest]!)} ms): ${(meds[c.chosen]! / meds[fastest]!).toFixed(2)}x slower`)
          }
          const cells = algorithms.map((a) => `${fmtMs(c.predicted[a]!)}/${fmtMs(meds[a]!)}${a === c.chosen ? "*" : ""}${a === fastest && a !== c.chosen ? "!" : ""}`.padEnd(24)).join("")
          console.log(`${String(p).padEnd(3)} ${fmtSize(c.bytes).padEnd(9)} ${cells}${c.chosen.padEnd(13)}${(c.tuned ?? "-").padEnd(13)}${fastest}`)
        }
      }
    }
    console.log("")
    console.log(`("halves": the fastest by the even rounds of the measurement, judged by its odd rounds: how far two measurements of the same calls agree on this machine)`)
    for (const [key, s] of score) {
      const geo = Math.exp(s.slower.reduce((a, r) => a + Math.log(r), 0) / s.slower.length)
      console.log(
        `${key.padEnd(14)} pick = measured fastest in ${s.exact} of ${s.total}, within 1.1x of it in ${s.near} of ${s.total} (${((100 * s.near) / s.total).toFixed(0)}%); ` +
          `geometric mean ${geo.toFixed(2)}x the fastest, worst ${Math.max(...s.slower).toFixed(2)}x`
      )
    }
    for (const d of disagreements) console.log(`  disagree: ${d}`)
  } finally {
    await server.stop()
  }
}
