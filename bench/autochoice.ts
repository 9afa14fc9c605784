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
//
// Under load as in training: `--compute-ms M` runs M ms of CPU work before every timed call (a
// step's forward and backward pass), `--cores-per-rank X` (root) caps each rank process at X cores
// through a cgroup of its own (the chaos bench's `--cores-per-agent`, same 10 ms period), and
// `--tunings N` tunes each case N times, each judged on its own, so the tuner's rule is scored over
// N x cases decisions; `--out FILE` keeps every case's rounds as JSON. The rules in KEEP_RULES are scored on the same rounds as well: the tuner's
// own (`now`) against the alternatives.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as crypto from "node:crypto"
import { fileURLToPath } from "node:url"
import { launchNatsServer } from "../core/nats-server.ts"
import { allReduceAlgorithmNames } from "../collectives/algorithms/index.ts"
import { median } from "../scheduler/cost-model.ts"
import { clearlySlower, roundsSlower, roundsToOverride, type TunedSize } from "../scheduler/algorithm-tuner.ts"
import { TUNE_KEEP_WITHIN } from "../actors/train/worker/auto-config.ts"
import { createCpuGroup, inGroup, type CpuGroup } from "./cgroups.ts"

/**
 * Ways to decide from one tuning's rounds whether the model's pick (calls `a`, median `ma`) is
 * clearly slower than the fastest candidate (`b`, `mb`), scored side by side on the same rounds.
 */
const KEEP_RULES: Record<string, (a: readonly number[], b: readonly number[], ma: number, mb: number) => boolean> = {
  // the tuner's own: median over 1.1x, and slower in 3 of every 4 rounds
  now: (a, b, ma, mb) => clearlySlower(a, b, ma, mb, TUNE_KEEP_WITHIN),
  // the median alone
  median: (_a, _b, ma, mb) => ma > TUNE_KEEP_WITHIN * mb,
  // over 1.5x by the median: slower in most rounds is enough
  graded: (a, b, ma, mb) => ma > TUNE_KEEP_WITHIN * mb && roundsSlower(a, b) >= (ma > 1.5 * mb ? Math.floor(a.length / 2) + 1 : roundsToOverride(a.length)),
  // unpaired: the model's pick's second-fastest call slower than the fastest's median (4 of its 5 calls)
  quartile: (a, _b, ma, mb) => ma > TUNE_KEEP_WITHIN * mb && [...a].sort((x, y) => x - y)[Math.floor(a.length / 4)]! > mb
}
const rulePick = (t: TunedSize, rule: (typeof KEEP_RULES)[string]): string => {
  const r = t.rounds!
  let best = 0
  for (let k = 1; k < t.candidates.length; k++) if (t.ms[k]! < t.ms[best]!) best = k
  const m = t.candidates.indexOf(t.modelPick)
  return m >= 0 && !rule(r[m]!, r[best]!, t.ms[m]!, t.ms[best]!) ? t.modelPick : t.candidates[best]!
}

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

const runRank = (args: object, timeoutMs: number, group?: CpuGroup): Promise<string> =>
  new Promise((resolve, reject) => {
    const argv = [process.execPath, RANK, JSON.stringify(args)]
    const [cmd, rest] = group !== undefined ? inGroup(group, argv) : [argv[0]!, argv.slice(1)]
    const child = spawn(cmd, rest, { stdio: ["ignore", "pipe", "pipe"] })
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
  const tunings = Number(get("--tunings") ?? 1)
  // --steady: also time every algorithm in blocks of steps as training runs them (CPU work, call, no barrier), and judge by those too
  const steady = argv.includes("--steady")
  const computeMs = Number(get("--compute-ms") ?? 0)
  const cores = get("--cores-per-rank") === undefined ? undefined : Number(get("--cores-per-rank"))
  if (!(Number.isInteger(tunings) && tunings >= 1)) throw new Error(`--tunings must be an integer >= 1, got ${get("--tunings")}`)
  if (!(computeMs >= 0)) throw new Error(`--compute-ms must be a number of ms >= 0, got ${get("--compute-ms")}`)
  if (cores !== undefined && !(cores > 0)) throw new Error(`--cores-per-rank must be a number of cores > 0, got ${get("--cores-per-rank")}`)
  // One cgroup per rank, capped (root); created up front so that a missing controller fails before any run.
  const groups: CpuGroup[] = []
  const dropGroups = (): void => {
    for (const g of groups.splice(0)) g.removeSync()
  }
  process.once("exit", dropGroups)
  if (cores !== undefined) {
    for (let r = 0; r < Math.max(...ps); r++) {
      const g = createCpuGroup(`gwchoice${process.pid}-${r}`, 10_000)
      g.setCores(cores)
      groups.push(g)
    }
  }
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
  // --out FILE: every case's measurement and tunings as JSON (to score other rules on them later)
  const out = get("--out")
  const raw: unknown[] = []
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
            runRank(
              { rank, worldSize: p, node: `node${Math.floor(rank / per)}`, url: server.url, sizes, algorithms, reps, tune: true, tunings, computeMs, steady, deadlineMs: 480_000, ...(directSecret ? { directSecret } : {}) },
              500_000,
              groups[rank]
            )
          )
        )
        const res = JSON.parse(outs[0]!.trim().split("\n").at(-1)!) as {
          observation: string
          cases: Array<{ bytes: number; chosen: string; tuned?: string; tunings?: TunedSize[]; steady?: Record<string, number[]>; predicted: Record<string, number>; measured: Record<string, number[]> }>
        }
        console.log(`  ${res.observation}`)
        raw.push({ transport, p, cases: res.cases })
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
          // every tuning of the case under every rule, judged by the same measurement
          for (const t of c.tunings ?? []) for (const [name, rule] of Object.entries(KEEP_RULES)) tally(`${transport} rule ${name}`, meds[rulePick(t, rule)]!, meds[fastest]!)
          if (c.steady !== undefined) {
            // judged by the steps as training runs them
            const st = Object.fromEntries(algorithms.map((a) => [a, median(c.steady![a]!)]))
            const sf = algorithms.reduce((a, b) => (st[b]! < st[a]! ? b : a))
            tally(`${transport} steps: model`, st[c.chosen]!, st[sf]!)
            tally(`${transport} steps: calls' fastest`, st[fastest]!, st[sf]!)
            for (const t of c.tunings ?? []) tally(`${transport} steps: tuned`, st[t.picked]!, st[sf]!)
            console.log(`      steps, ms each: ${algorithms.map((a) => `${a} ${fmtMs(st[a]!)}`).join(", ")}`)
          }
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
    if (out !== undefined) fs.writeFileSync(out, JSON.stringify({ argv, runs: raw }))
    console.log(`(rule X: each of the ${tunings} tuning(s) per case decided by rule X from its own rounds; "rule now" is the tuner's. --compute-ms ${computeMs}${cores !== undefined ? `, --cores-per-rank ${cores}` : ""})`)
  } finally {
    dropGroups()
    await server.stop()
  }
}
