// What a lowered process's start costs two busy ranks beside it: two processes each doing 0.3 ms
// of work, then exchanging 64 bytes over a Unix socket (the all-reduce's pattern), while a node
// agent's way of starting a standby (ActorProcess with GRADWIRE_START_NICE=19: a warm host, which
// loads gradwire's worker modules and tfjs) begins 1.5 s in. Arms, alternated: the host at nice 19
// alone (GRADWIRE_STANDBY_SCHED_IDLE=0) and on SCHED_IDLE as well (the default: from its first
// instruction where chrt runs, core/priority.ts idleStartPrefix). Printed: the pair's rounds a
// second before the start and over windows after it (medians over the pairs of runs), and when
// the host's threads were first seen on SCHED_IDLE.
//
// With --cap X (root, cgroup v1's cpu controller) each rank of the pair runs in a cgroup of its own
// capped at X cores (as a node agent and what it starts are under a container's CPU limit, or the
// chaos bench's --cores-per-agent), and the arms are where the host (on SCHED_IDLE) loads: outside
// any quota, or inside rank a's (an agent's warm process, or a standby, in its worker's cgroup).
// SCHED_IDLE gives way on a core, but the CPU time it takes is spent from the quota all the same.
//
//   node bench/standby-start.ts [--pairs 4] [--seconds 5] [--cap 0.6]
import { spawn, type ChildProcess } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { optionReader } from "./args.ts"
import { ActorProcess } from "../actors/node/actor-process.ts"
import { median } from "../scheduler/cost-model.ts"
import { SCHED_IDLE, threadPolicies } from "../test/support/nice.ts"
import { createCpuGroup, inGroup, type CpuGroup } from "./cgroups.ts"

const option = optionReader(process.argv.slice(2))
const pairs = Number(option("--pairs", "4"))
const seconds = Number(option("--seconds", "5"))
const cap = option("--cap", "") === "" ? undefined : Number(option("--cap", ""))
if (cap !== undefined && !(cap > 0)) throw new Error(`--cap must be a number of cores > 0, got ${option("--cap", "")}`)
const START_AT_MS = 1_500

// One rank of the pair: work, send, wait for the other's message; the times of its rounds on stdout.
const RANK = `
  import * as net from "node:net"
  const [role, sock, secs] = process.argv.slice(1)
  const end = Date.now() + Number(secs) * 1000
  const times = []
  let done = false
  const run = (s) => {
    s.setNoDelay(true)
    const buf = Buffer.alloc(64)
    let pending = 0
    const step = () => {
      if (done) return
      if (Date.now() > end) { done = true; s.end(); process.stdout.write(JSON.stringify(times)); return }
      const until = performance.now() + 0.3
      while (performance.now() < until);
      s.write(buf)
    }
    s.on("data", (d) => { pending += d.length; while (pending >= 64) { pending -= 64; times.push(performance.timeOrigin + performance.now()); step() } })
    s.on("end", () => { if (!done) { done = true; process.stdout.write(JSON.stringify(times)) } })
    step()
  }
  if (role === "a") { const srv = net.createServer((s) => { srv.close(); run(s) }); srv.listen(sock, () => console.error("listening")) }
  else { const s = net.connect(sock, () => run(s)) }`

interface Arm {
  readonly before: number
  readonly first: number
  readonly second: number
  readonly rest: number
  readonly idleAtMs: number | undefined
}

/** With --cap: the pair's two cgroups, capped; the host goes into the first (`inQuota`) or none. */
const capped = (n: number): CpuGroup[] =>
  cap === undefined
    ? []
    : ["a", "b"].map((r) => {
        const g = createCpuGroup(`gradwire-standby-start-${process.pid}-${n}-${r}`)
        g.setCores(cap)
        return g
      })

const once = async (schedIdle: boolean, dir: string, n: number, inQuota = false): Promise<Arm> => {
  const sock = path.join(dir, `pair-${n}.sock`)
  const children: ChildProcess[] = []
  let host: ActorProcess | undefined
  const groups = capped(n)
  const rank = (r: "a" | "b"): [string, string[]] => {
    const argv = [process.execPath, "--input-type=module", "-e", RANK, r, sock, String(seconds)]
    return groups.length > 0 ? inGroup(groups[r === "a" ? 0 : 1]!, argv) : [argv[0]!, argv.slice(1)]
  }
  try {
    const a = spawn(...rank("a"), { stdio: ["ignore", "pipe", "pipe"] })
    children.push(a)
    await new Promise((resolve) => a.stderr!.once("data", resolve))
    children.push(spawn(...rank("b"), { stdio: ["ignore", "ignore", "inherit"] }))
    const rounds = new Promise<number[]>((resolve) => {
      let out = ""
      a.stdout!.on("data", (d: Buffer) => (out += d.toString()))
      a.once("close", () => resolve(out ? (JSON.parse(out) as number[]) : []))
    })
    await new Promise((resolve) => setTimeout(resolve, START_AT_MS))
    const at = performance.timeOrigin + performance.now()
    host = new ActorProcess({ env: { ...process.env, GRADWIRE_START_NICE: "19", GRADWIRE_STANDBY_SCHED_IDLE: schedIdle ? "1" : "0" }, onLine: () => {} })
    // (moved in right after its start: what it starts later stays in the group)
    if (inQuota) groups[0]!.add(host.pid)
    let idleAtMs: number | undefined
    const poll = setInterval(() => {
      if (idleAtMs === undefined && threadPolicies(host!.pid).includes(SCHED_IDLE)) idleAtMs = performance.timeOrigin + performance.now() - at
    }, 5)
    const times = await rounds
    clearInterval(poll)
    const rate = (from: number, to: number): number => (times.filter((t) => t >= at + from && t < at + to).length * 1000) / (to - from)
    return { before: rate(-1_000, 0), first: rate(0, 500), second: rate(500, 1_000), rest: rate(1_000, seconds * 1000 - START_AT_MS - 200), idleAtMs }
  } finally {
    host?.child.kill("SIGKILL")
    for (const c of children) c.kill("SIGKILL")
    for (const g of groups) g.removeSync()
  }
}

if (process.platform !== "linux") {
  console.log("nice values and SCHED_IDLE as gradwire sets them are Linux's; nothing to compare here")
  process.exit(0)
}
/** One printed row: an arm's rate before the start, then over each window after it with its share of that. */
const row = (label: string, width: number, runs: ReadonlyArray<Arm>, tail = ""): string => {
  const before = median(runs.map((r) => r.before))
  const cell = (key: "first" | "second" | "rest"): string => {
    const v = median(runs.map((r) => r[key]))
    return `${v.toFixed(0)} (${((100 * v) / before).toFixed(0)}%)`.padEnd(18)
  }
  return `${label.padEnd(width)}  ${before.toFixed(0).padEnd(7)}  ${cell("first")}${cell("second")}${cell("rest")}${tail}`
}

/** Runs `pairs` alternated pairs of the two arms (`false` first in even pairs), each run by `run(arm, n)`. */
const alternated = async (run: (arm: boolean, n: number) => Promise<Arm>): Promise<{ readonly off: Arm[]; readonly on: Arm[] }> => {
  const out = { off: [] as Arm[], on: [] as Arm[] }
  for (let i = 0; i < pairs; i++) {
    for (const arm of i % 2 ? [true, false] : [false, true]) out[arm ? "on" : "off"].push(await run(arm, i * 2 + Number(arm)))
  }
  return out
}

const dir = mkdtempSync(path.join(os.tmpdir(), "gradwire-standby-start-"))
try {
  if (cap !== undefined) {
    const arms = await alternated((inside, n) => once(true, dir, n, inside))
    console.log(`${os.cpus().length} CPUs, each rank of the pair capped at ${cap} cores, ${pairs} alternated pairs; the pair's rounds a second (median), and the share of its rate before the host's start`)
    console.log("\nthe host (SCHED_IDLE) loads   before   0-0.5 s after     0.5-1 s after     1 s on")
    console.log(row("outside any quota", 28, arms.off))
    console.log(row("in rank a's quota", 28, arms.on))
  } else {
    const arms = await alternated((schedIdle, n) => once(schedIdle, dir, n))
    console.log(`${os.cpus().length} CPUs, ${pairs} alternated pairs; the pair's rounds a second (median), and the share of its rate before the start`)
    console.log("\nstandby                 before   0-0.5 s after     0.5-1 s after     1 s on            on SCHED_IDLE after (ms)")
    const idle = (runs: ReadonlyArray<Arm>): string => runs.map((r) => (r.idleAtMs === undefined ? "-" : r.idleAtMs.toFixed(0))).join(", ")
    console.log(row("nice 19 alone", 22, arms.off, idle(arms.off)))
    console.log(row("nice 19 + SCHED_IDLE", 22, arms.on, idle(arms.on)))
  }
} finally {
  rmSync(dir, { recursive: true, force: true })
}
