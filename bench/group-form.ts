// How long a new group takes to form: `npm run bench -- group-form [--p 2,3,4] [--rounds 15]`.
// Every regroup (a lost worker's survivors, a grow, an elastic resize) makes a new communicator on
// every rank, and the group waits for its slowest rank's: gradwire's Communicator.create over a
// nats-server with direct links (a Unix socket per pair on one machine), p processes
// (bench/group-form-rank.ts), against PyTorch's dist.new_group over gloo plus its first all_reduce
// (bench/torch_group_form.py), the group a torchft-style reconfiguration builds, p processes. Both
// sides start every round at a barrier; printed per p: the slowest rank's ms per round, median and
// max over the rounds after the first two (the first builds warm the code).
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { optionReader } from "./args.ts"
import { exitOf, glooPython } from "./allreduce.ts"
import { freePort, launchNatsServer } from "../core/nats-server.ts"
import { median } from "../scheduler/cost-model.ts"

const RANK = fileURLToPath(new URL("./group-form-rank.ts", import.meta.url))
const TORCH = fileURLToPath(new URL("./torch_group_form.py", import.meta.url))
const DEADLINE_MS = 180_000

/** Median and max of the rounds after the first two. */
const summary = (perRound: ReadonlyArray<number>): string => {
  const kept = perRound.slice(2)
  return `${median([...kept]).toFixed(1)} / ${Math.max(...kept).toFixed(1)}`
}

/** Per round, the slowest of p gradwire ranks' Communicator.create. */
const gradwire = async (p: number, rounds: number, url: string): Promise<number[]> => {
  const outs: string[] = Array.from({ length: p }, () => "")
  const children = Array.from({ length: p }, (_, r) => {
    const c = spawn(process.execPath, [RANK, String(r), String(p), String(rounds), url], { stdio: ["ignore", "pipe", "pipe"] })
    c.stdout!.on("data", (d: Buffer) => (outs[r] += d.toString()))
    c.stderr!.on("data", (d: Buffer) => (outs[r] += d.toString()))
    return c
  })
  const codes = await Promise.all(children.map((c) => exitOf(c, DEADLINE_MS)))
  const lines = outs.map((o) => o.split("\n").find((l) => l.startsWith("RESULT ")))
  const failed = outs.map((o, r) => (codes[r] !== 0 || !lines[r] ? `rank ${r} (exit ${codes[r]}): ${o.trim().split("\n").slice(0, 6).join(" | ")}` : "")).filter((f) => f)
  if (failed.length) throw new Error(`gradwire at p = ${p} failed: ${failed.join("; ")}`)
  const per = lines.map((l) => JSON.parse(l!.slice(7)) as number[])
  return per[0]!.map((_, i) => Math.max(...per.map((t) => t[i]!)))
}

/** Per round, the slowest of p torch ranks' new_group + first all_reduce; undefined without torch. */
const torch = async (p: number, rounds: number, dir: string): Promise<number[] | undefined> => {
  const python = glooPython()
  if (!python) return undefined
  const out = path.join(dir, `torch-${p}.json`)
  const child = spawn(python, [TORCH, String(p), String(rounds), String(await freePort()), out], { stdio: ["ignore", "ignore", "pipe"], detached: true, env: { ...process.env, GLOO_SOCKET_IFNAME: "lo" } })
  let err = ""
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()))
  const code = await exitOf(child, DEADLINE_MS, true)
  if (code !== 0 || !fs.existsSync(out)) throw new Error(`torch at p = ${p} failed (exit ${code}): ${err.trim().split("\n").slice(-3).join(" | ")}`)
  return (JSON.parse(fs.readFileSync(out, "utf8")) as { ms: number[] }).ms
}

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const option = optionReader(args)
  const ps = option("--p", "2,3,4").split(",").map(Number)
  const rounds = Number(option("--rounds", "15"))
  if (ps.some((p) => !(Number.isInteger(p) && p >= 2 && p <= 16))) throw new RangeError(`--p takes group sizes from 2 to 16, got ${ps.join(",")}`)
  if (!(Number.isInteger(rounds) && rounds >= 3 && rounds <= 200)) throw new RangeError(`--rounds must be an integer from 3 to 200, got ${rounds}`)
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-bench-group-form-"))
  const server = await launchNatsServer({ jetstream: false })
  try {
    console.log(`group forming: ${os.cpus().length} cores, ${rounds} rounds per p; the slowest rank's ms per round, median / max over rounds 3-${rounds}`)
    console.log("| p | gradwire Communicator.create (direct links) | torch dist.new_group + first all_reduce (gloo) | gradwire / torch |")
    console.log("|---|---|---|---|")
    for (const p of ps) {
      const g = await gradwire(p, rounds, server.url)
      const t = await torch(p, rounds, dir)
      const ratio = t ? `${(median(g.slice(2)) / median(t.slice(2))).toFixed(2)}x` : "-"
      console.log(`| ${p} | ${summary(g)} | ${t ? summary(t) : "torch not found (apt-get install -y python3-torch)"} | ${ratio} |`)
    }
  } finally {
    await server.stop()
    fs.rmSync(dir, { recursive: true, force: true })
  }
}
