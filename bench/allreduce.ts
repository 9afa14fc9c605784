// All-reduce benchmark: `npm run bench -- allreduce [--p 2,4] [--sizes 4K,256K,4M,64M] [--rounds N]
// [--max-payload 8M] [--chunk 1M] [--direct-chunk 8M] [--window 16M] [--no-gloo] [--no-payload-sweep]
// [--algorithms ring,ring-relay,...] [--transports nats,direct] [--no-raw] [--prof DIR] [--link 1gbit]
// [--cpu] [--nodes paired|one|own]` (--prof: --cpu-prof profiles of the rank processes, in DIR;
// --cpu: two more columns, the CPU ms a call of each rank's busiest thread and of all its threads
// (mean over ranks; gloo's too: is a rank's time one busy thread, its work spread over several, or
// waiting; bench/thread-cpu.ts); --nodes: the simulated nodes on loopback, two ranks each
// (default), all on one (Unix sockets only on the direct path) or one each (TCP only); --no-raw: no
// raw NATS rows, whose unthrottled publishes can overrun a client at p = 8 and 64 MiB and up, which
// the server then disconnects). The algorithms are the registered ones (collectives/algorithms/) by default, each that can fan out also as "<name>-relay", without
// fan-out (from p = 3 on: with two ranks a fan-out reaches one receiver, the same traffic as a relay).
//
// --transports (default: nats,direct): the data paths to measure every algorithm on. For each p the
// same rank processes create one communicator group per transport: "bench-p<p>" with everything over
// NATS, and "bench-p<p>-direct" with the direct data path (collectives/direct.ts, transport
// "direct": every call peer to peer, a random 32-byte secret per run). Ranks 2k and 2k+1 share a
// simulated node (nodeOf), so on the direct path they talk over a Unix socket, other pairs over TCP
// on loopback. Rows are named "<algorithm>" for NATS and "<algorithm> direct" for the direct path.
//
// For each p and size it prints every algorithm's median time on each transport, algbw (size /
// time) and busbw (algbw x 2(p-1)/p), next to, measured in the same run:
// - raw NATS moving the same bytes in the same pattern (p publisher processes, the same bytes per
//   link, no reduction, no flow control: the transport's ceiling for that algorithm; the pattern is
//   the one the algorithm's registry entry declares for the cost model), and
// - torch.distributed gloo all_reduce on loopback when `/usr/bin/python3 -c "import torch"` works
//   (else the `python3` on PATH, where that one imports torch).
// Every rank is its own OS process, and reduces a buffer made once per size by its communicator
// (Communicator.allocate, whose sums run in place, as gloo's loop reduces a tensor made by torch;
// GRADWIRE_BENCH_PLAIN_BUFFER=1: an ordinary Float32Array). Variants (algorithms x transports,
// and the raw patterns) are interleaved round by round (each variant's timed calls after one
// untimed call of its own, as gloo's loop warms up), so load from other processes on the machine
// hits them alike; compare
// ratios, not absolute figures, across runs. "x raw" is a row's time over its raw NATS pattern's in
// the same round (for a direct row too: below 1x it beats what NATS itself could move). After each
// (p, size) block, one line: the best NATS row, the best direct row, gloo, and best / gloo.
// A last section shows what the server's max_payload (hence the chunk size) does to throughput
// (NATS only: the direct path does not go through the server).
//
// --link RATE (needs root): every rank in a network namespace of its own, joined to a switch (a
// bridge in a hub namespace, where the nats-server runs) by a link shaped to RATE each way with tc
// tbf, as p machines on a switched network; each rank a node of its own, the direct path over TCP
// on those links, gloo's workers in the same namespaces. One more row per size, "raw TCP, ring
// pattern": one plain TCP connection from each rank to the next carrying what the ring all-reduce
// puts on a link (2(p-1)/p of the size), timed as the all-reduces are: the links' ceiling, against
// which the summary line gives each best row's bus bandwidth. No max_payload sweep.
import { spawn, spawnSync, type ChildProcess } from "node:child_process"
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { launchNatsServer, freePort } from "../core/nats-server.ts"
import { allReduceAlgorithms, allReduceAlgorithmNames, findAllReduceAlgorithm } from "../collectives/algorithms/index.ts"
import type { TransportInfo } from "../collectives/communicator.ts"
import { HEADER_BLOCK_BYTES } from "../collectives/frames.ts"
import { RankFleet } from "../test/support/collectives-fleet.ts"
import { benchNatsServer, onStar, type Star } from "../test/support/netns.ts"
import { median } from "../scheduler/cost-model.ts"
import type { CpuSpent } from "./thread-cpu.ts"

const KiB = 1024
const MiB = 1024 * KiB

const parseSize = (s: string): number => {
  const m = /^(\d+(?:\.\d+)?)\s*([KMG]?)i?B?$/i.exec(s.trim())
  if (!m) throw new Error(`bad size "${s}" (use e.g. 4K, 256K, 4M, 64M)`)
  const unit = { "": 1, K: KiB, M: MiB, G: 1024 * MiB }[m[2].toUpperCase() as "" | "K" | "M" | "G"]
  return Math.round(Number(m[1]) * unit)
}

const fmtSize = (b: number): string => (b >= MiB ? `${+(b / MiB).toFixed(2)} MiB` : `${+(b / KiB).toFixed(2)} KiB`)
const fmtMs = (ms: number): string => (ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2))

interface Args {
  readonly ps: number[]
  readonly sizes: number[]
  readonly rounds: number | undefined
  readonly maxPayload: number
  readonly chunk: number | undefined
  readonly directChunk: number | undefined
  readonly window: number | undefined
  readonly gloo: boolean
  readonly payloadSweep: boolean
  readonly algorithms: string[]
  readonly transports: Transport[]
  /** Directory for --cpu-prof profiles of the rank processes. */
  readonly prof: string | undefined
  /** Measure the raw NATS patterns (the "x raw" column). */
  readonly raw: boolean
  /** tc rate of each rank's link (--link), or undefined for loopback. */
  readonly link: string | undefined
  /** Each rank's CPU a call, its busiest thread and all its threads (--cpu). */
  readonly cpu: boolean
  /** On loopback, the ranks' simulated nodes (--nodes). */
  readonly nodes: "paired" | "one" | "own"
}

/** The data paths a benchmark group can use: everything over NATS, or every call over the direct links. */
type Transport = "nats" | "direct"
const TRANSPORTS: ReadonlyArray<Transport> = ["nats", "direct"]

const parseTransports = (s: string): Transport[] => {
  const ts = [...new Set(s.split(",").map((t) => t.trim()).filter((t) => t !== ""))]
  for (const t of ts) if (!TRANSPORTS.includes(t as Transport)) throw new Error(`unknown transport "${t}" in --transports (use ${TRANSPORTS.join(", ")})`)
  if (ts.length === 0) throw new Error("--transports needs at least one of nats, direct")
  return ts as Transport[]
}

const parseNodes = (s: string): Args["nodes"] => {
  if (s === "paired" || s === "one" || s === "own") return s
  throw new Error(`unknown --nodes "${s}" (use paired: two ranks a node, one: every rank on one node, own: a node each)`)
}

const parseArgs = (args: ReadonlyArray<string>): Args => {
  const get = (flag: string): string | undefined => {
    const i = args.indexOf(flag)
    return i >= 0 ? args[i + 1] : undefined
  }
  return {
    ps: (get("--p") ?? "2,4").split(",").map(Number),
    sizes: (get("--sizes") ?? "4K,256K,4M,64M").split(",").map(parseSize),
    rounds: get("--rounds") ? Number(get("--rounds")) : undefined,
    maxPayload: parseSize(get("--max-payload") ?? "8M"),
    chunk: get("--chunk") ? parseSize(get("--chunk") as string) : undefined,
    directChunk: get("--direct-chunk") ? parseSize(get("--direct-chunk") as string) : undefined,
    window: get("--window") ? parseSize(get("--window") as string) : undefined,
    gloo: !args.includes("--no-gloo"),
    payloadSweep: !args.includes("--no-payload-sweep"),
    algorithms: get("--algorithms")?.split(",") ?? allReduceAlgorithms().flatMap((a) => (a.usesFanout ? [a.name, `${a.name}-relay`] : [a.name])),
    transports: parseTransports(get("--transports") ?? TRANSPORTS.join(",")),
    prof: get("--prof"),
    raw: !args.includes("--no-raw"),
    link: get("--link"),
    cpu: args.includes("--cpu"),
    nodes: parseNodes(get("--nodes") ?? "paired")
  }
}

/**
 * Untimed calls before each variant's timed ones in every round: a variant is timed warm, in the
 * state a training loop's every-step call is in (buffers pooled, pages touched), not right after
 * another variant's traffic; gloo's loop warms up with two calls and then times calls back to back.
 */
const WARMUP = 1

/** Rounds per size (each round runs every variant once) and iterations per round. */
const schedule = (bytes: number, rounds: number | undefined): { rounds: number; iters: number } => {
  if (bytes >= 32 * MiB) return { rounds: rounds ?? 5, iters: 1 }
  if (bytes >= 2 * MiB) return { rounds: rounds ?? 7, iters: 3 }
  if (bytes >= 128 * KiB) return { rounds: rounds ?? 7, iters: 10 }
  return { rounds: rounds ?? 7, iters: 40 }
}

interface Flow {
  readonly to: number | "all"
  readonly bytes: number
}

/** Each rank's node name (what hierarchical groups by, and a Unix socket joins on the direct path). */
type Nodes = (rank: number) => string

/** On loopback: simulated nodes of two ranks each. */
const pairedNodes: Nodes = (rank) => `node${rank >> 1}`

/** --nodes one: every rank on one node. */
const oneNode: Nodes = () => "node0"

/** With --link: every rank a machine of its own (its namespace on the star). */
const ownNodes: Nodes = (rank) => `node${rank}`

/** "2 nodes of 2 ranks" for p = 4, as nodeOf groups them. */
const describeNodes = (p: number, nodeOf: Nodes): string => {
  const counts = new Map<string, number>()
  for (let r = 0; r < p; r++) counts.set(nodeOf(r), (counts.get(nodeOf(r)) ?? 0) + 1)
  const bySize = new Map<number, number>()
  for (const c of counts.values()) bySize.set(c, (bySize.get(c) ?? 0) + 1)
  return [...bySize].map(([ranks, nodes]) => `${nodes} node${nodes === 1 ? "" : "s"} of ${ranks} rank${ranks === 1 ? "" : "s"}`).join(" + ")
}

/** A row's name: the algorithm for NATS, "<algorithm> direct" for the direct path. */
const rowName = (algorithm: string, transport: Transport): string => (transport === "nats" ? algorithm : `${algorithm} direct`)

/** One communicator group per transport, all on the same rank processes. */
interface Group {
  readonly transport: Transport
  readonly group: string
}

const RELAY = "-relay"

/** A variant's registry entry and call options: "<name>" with fan-out, "<name>-relay" without. */
const variantOf = (variant: string) => {
  const relay = variant.endsWith(RELAY)
  const name = relay ? variant.slice(0, -RELAY.length) : variant
  const entry = findAllReduceAlgorithm(name)
  if (!entry || (relay && !entry.usesFanout)) {
    throw new Error(`unknown algorithm "${variant}": registered ${allReduceAlgorithmNames().join(", ")}; "-relay" for one that fans out, without`)
  }
  return { entry, call: { algorithm: name, fanout: !relay } }
}

/**
 * Per rank: what a variant sends (flows) and receives (bytes), with no reduction: the stages its
 * registry entry declares for the cost model (nodes of two ranks, as the fleet is created),
 * summed per sender and destination. A flow to every other rank (p > 2) is one publish to the
 * group's fan-out subject; bytes are rounded per link, and each rank's inbound is what the others
 * send it after rounding.
 */
const rawPatterns = (variant: string, p: number, bytes: number, chunkBytes: number, nodeOf: Nodes): Array<{ flows: Flow[]; inbound: number }> => {
  const { entry, call } = variantOf(variant)
  const topology = Array.from({ length: p }, (_, r) => ({ nodeId: nodeOf(r), server: "s" }))
  const sends = Array.from({ length: p }, () => new Map<number | "all", number>())
  const add = (m: Map<number | "all", number>, to: number | "all", b: number) => m.set(to, (m.get(to) ?? 0) + b)
  for (const phase of entry.stages({ bytes, topology, chunkBytes, hierarchy: "node", fanout: call.fanout })) {
    for (const stage of phase.stages) {
      for (const f of stage.flows) {
        if (f.dsts.length > 1 && f.dsts.length === p - 1) add(sends[f.src]!, "all", f.bytes * stage.times)
        else for (const d of f.dsts) add(sends[f.src]!, d, f.bytes * stage.times)
      }
    }
  }
  const flows = sends.map((m) => [...m].map(([to, b]) => ({ to, bytes: Math.round(b) })).filter((f) => f.bytes > 0))
  return flows.map((mine, rank) => ({
    flows: mine,
    inbound: flows.reduce((sum, theirs, src) => sum + (src === rank ? 0 : theirs.reduce((s, f) => s + (f.to === rank || f.to === "all" ? f.bytes : 0), 0)), 0)
  }))
}

interface Variant {
  readonly name: string
  readonly run: (iters: number) => Promise<number[]>
}

/** What a ring all-reduce of `bytes` puts on each link: 2(p-1)/p of it. */
const ringBytesPerLink = (p: number, bytes: number): number => Math.round((2 * (p - 1) * bytes) / p)

/** The raw TCP row's name (--link). */
const RAW_TCP = "raw TCP, ring pattern"

/** Per-iteration time of a group call: the slowest rank's. */
const slowest = (perRank: number[][]): number[] => perRank[0].map((_, i) => Math.max(...perRank.map((t) => t[i])))

// Run as `gloo.py P PORT OUT SIZES ROUNDS` (P workers on loopback, by mp.spawn) or
// `gloo.py --rank R P MASTER PORT OUT SIZES ROUNDS` (one worker, e.g. in a namespace of its own).
const GLOO_SCRIPT = `
import json, os, sys, time, statistics
import torch, torch.distributed as dist, torch.multiprocessing as mp

def thread_cpu():
    # CPU ms so far of each of this process's threads (gloo's worker threads among them), by thread id
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f: out[tid] = int(f.read().split()[0]) / 1e6
        except OSError:
            pass
    return out

def worker(rank, p, master, port, sizes, rounds, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=p)
    res = {}
    for size in sizes:
        n = size // 4
        x = torch.ones(n, dtype=torch.float32)
        iters = rounds[str(size)]
        times = []
        c0 = None
        for i in range(iters + 2):
            if i == 2 and os.path.isdir("/proc/self/task"): c0 = thread_cpu()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            dt = (time.perf_counter() - t0) * 1000
            if i >= 2: times.append(dt)
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        res[str(size)] = statistics.median(t.tolist())
        if c0 is not None:
            c1 = thread_cpu()
            spent = [max(0.0, ms - c0.get(tid, 0.0)) for tid, ms in c1.items()]
            cpu = torch.tensor([max(spent) / iters, sum(spent) / iters], dtype=torch.float64)
            dist.all_reduce(cpu)
            res["cpu " + str(size)] = [v / p for v in cpu.tolist()]
    if rank == 0:
        with open(out, "w") as f: json.dump(res, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank, p, master, port, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6]
        worker(rank, p, master, port, [int(s) for s in sys.argv[7].split(",")], json.loads(sys.argv[8]), out)
    else:
        p, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
        sizes = [int(s) for s in sys.argv[4].split(",")]
        rounds = json.loads(sys.argv[5])
        mp.spawn(worker, args=(p, "127.0.0.1", port, sizes, rounds, out), nprocs=p, join=True)
`

/** The first of `candidates` that imports torch, and whether that torch sees a CUDA GPU. */
export const findTorch = (candidates: ReadonlyArray<string>): { python: string; cuda: boolean } | undefined => {
  for (const python of candidates) {
    const r = spawnSync(python, ["-c", "import torch; print(torch.cuda.is_available())"], { encoding: "utf8", timeout: 120_000 })
    if (r.status === 0) return { python, cuda: r.stdout.trim().endsWith("True") }
  }
  return undefined
}

let torchPython: string | null | undefined

/**
 * The python that runs the gloo baselines: Debian's (/usr/bin/python3) where it imports torch, else
 * the `python3` on PATH (a machine whose torch lives in a virtual environment); undefined when
 * neither does.
 */
export const glooPython = (): string | undefined => {
  if (torchPython === undefined) torchPython = findTorch(["/usr/bin/python3", "python3"])?.python ?? null
  return torchPython ?? undefined
}

/** Whether a python here imports torch (glooPython). */
export const torchAvailable = (): boolean => glooPython() !== undefined

/**
 * Exit code of `child` (null when it had to be killed after `timeoutMs`). `group`: the child was
 * spawned detached, as its process group's leader, and the kill takes the group (the processes it
 * started itself, e.g. mp.spawn's ranks).
 */
export const exitOf = (child: ChildProcess, timeoutMs: number, group = false): Promise<number | null> =>
  new Promise<number | null>((resolve) => {
    const timer = setTimeout(() => {
      try {
        if (group && child.pid !== undefined) process.kill(-child.pid, "SIGKILL")
        else child.kill("SIGKILL")
      } catch {
        child.kill("SIGKILL")
      }
      resolve(null)
    }, timeoutMs)
    child.once("exit", (c) => {
      clearTimeout(timer)
      resolve(c)
    })
  })

/**
 * Median ms of gloo all_reduce per size, or undefined when it fails. On loopback, or with `star`
 * one worker in each of its rank namespaces (rank 0's address is the rendezvous), over the star's
 * shaped links.
 */
export const runGloo = async (p: number, sizes: number[], star?: Star): Promise<Map<number, number> | undefined> => (await runGlooMeasured(p, sizes, star))?.ms

/** runGloo's medians, and per size each rank's CPU a call (mean over ranks; on Linux). */
const runGlooMeasured = async (p: number, sizes: number[], star?: Star): Promise<{ ms: Map<number, number>; cpu: Map<number, CpuSpent> } | undefined> => {
  if (star && star.ranks.length < p) throw new RangeError(`the star has ${star.ranks.length} namespaces, gloo needs ${p}`)
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gradwire-gloo-"))
  const script = path.join(dir, "gloo.py")
  const out = path.join(dir, "out.json")
  fs.writeFileSync(script, GLOO_SCRIPT)
  const rounds: Record<string, number> = {}
  for (const s of sizes) rounds[String(s)] = s >= 32 * MiB ? 7 : s >= 2 * MiB ? 15 : 40
  const env = { ...process.env, OMP_NUM_THREADS: "1" }
  let stderr = ""
  const children: ChildProcess[] = []
  try {
    if (star) {
      // A fresh namespace: any port is free in rank 0's.
      for (let r = 0; r < p; r++) {
        const { ns, dev } = star.ranks[r]
        const args = ["netns", "exec", ns, glooPython() ?? "/usr/bin/python3", script, "--rank", String(r), String(p), star.ranks[0].ip, "29500", out]
        children.push(spawn("ip", [...args, sizes.join(","), JSON.stringify(rounds)], { stdio: ["ignore", "ignore", "pipe"], env: { ...env, GLOO_SOCKET_IFNAME: dev } }))
      }
    } else {
      const port = await freePort()
      const args = [script, String(p), String(port), out, sizes.join(","), JSON.stringify(rounds)]
      children.push(spawn(glooPython() ?? "/usr/bin/python3", args, { stdio: ["ignore", "ignore", "pipe"], env: { ...env, GLOO_SOCKET_IFNAME: "lo" } }))
    }
    for (const c of children) c.stderr!.on("data", (d) => (stderr += String(d)))
    const codes = await Promise.all(children.map((c) => exitOf(c, 300_000)))
    const code = codes.find((c) => c !== 0) ?? 0
    if (code !== 0 || !fs.existsSync(out)) {
      console.log(`  (gloo p=${p} failed: exit ${code}; ${stderr.trim().split("\n").slice(-2).join(" / ")})`)
      return undefined
    }
    const res = JSON.parse(fs.readFileSync(out, "utf8")) as Record<string, number | [number, number]>
    const ms = new Map<number, number>()
    const cpu = new Map<number, CpuSpent>()
    for (const [k, v] of Object.entries(res)) {
      if (k.startsWith("cpu ")) cpu.set(Number(k.slice(4)), { busiestMs: (v as [number, number])[0], totalMs: (v as [number, number])[1] })
      else ms.set(Number(k), v as number)
    }
    return { ms, cpu }
  } finally {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL")
    fs.rmSync(dir, { recursive: true, force: true })
  }
}

interface Row {
  readonly p: number
  readonly bytes: number
  readonly name: string
  readonly ms: number
  readonly vsRaw?: number
  readonly vsGloo?: number
  /** CPU ms a call of a rank (mean over ranks), its busiest thread and all its threads (--cpu). */
  readonly cpu?: CpuSpent
}

const printRows = (rows: ReadonlyArray<Row>): void => {
  const cpu = rows.some((r) => r.cpu !== undefined)
  const header = ["p", "size", "variant", "median ms", "algbw GB/s", "busbw GB/s", "x raw", "x gloo", ...(cpu ? ["cpu busiest ms", "cpu all ms"] : [])]
  const lines = rows.map((r) => {
    const algbw = r.bytes / (r.ms / 1000) / 1e9
    const busbw = (algbw * 2 * (r.p - 1)) / r.p
    return [
      String(r.p),
      fmtSize(r.bytes),
      r.name,
      fmtMs(r.ms),
      algbw.toFixed(3),
      busbw.toFixed(3),
      r.vsRaw === undefined ? "" : `${r.vsRaw.toFixed(2)}x`,
      r.vsGloo === undefined ? "" : `${r.vsGloo.toFixed(2)}x`,
      ...(cpu ? [r.cpu ? fmtMs(r.cpu.busiestMs) : "", r.cpu ? fmtMs(r.cpu.totalMs) : ""] : [])
    ]
  })
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)))
  const fmt = (cols: string[]): string => cols.map((c, i) => (i <= 2 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join("  ")
  console.log(fmt(header))
  for (const l of lines) console.log(fmt(l))
}

/** One line per (p, size): the best NATS and best direct rows, gloo, and each best over gloo. */
const summaryLine = (p: number, bytes: number, nats: Row | undefined, direct: Row | undefined, glooMs: number | undefined, tcpMs?: number): string => {
  const part = (label: string, r: Row | undefined): string | undefined => (r ? `best ${label} ${r.name} ${fmtMs(r.ms)} ms` : undefined)
  const ratio = (label: string, r: Row | undefined): string | undefined => (r && glooMs !== undefined ? `${label}/gloo ${(r.ms / glooMs).toFixed(2)}x` : undefined)
  const parts = [
    part("NATS", nats),
    part("direct", direct),
    glooMs === undefined ? "gloo -" : `gloo ${fmtMs(glooMs)} ms`,
    ratio("NATS", nats),
    ratio("direct", direct),
    nats && direct ? `direct/NATS ${(direct.ms / nats.ms).toFixed(2)}x` : undefined,
    // busbw over the raw ring's per-link rate: the same bytes per link, so the ratio of times
    tcpMs !== undefined && direct ? `direct busbw ${((100 * tcpMs) / direct.ms).toFixed(0)}% of raw TCP's` : undefined,
    tcpMs !== undefined && glooMs !== undefined ? `gloo busbw ${((100 * tcpMs) / glooMs).toFixed(0)}% of raw TCP's` : undefined
  ]
  return `summary p=${p} ${fmtSize(bytes)}: ${parts.filter((x) => x !== undefined).join("; ")}\n`
}

interface Measured {
  readonly medians: Map<string, number>
  /** Median over rounds of (algorithm time / its raw pattern's time in the same round). */
  readonly pairedRatio: Map<string, number>
  /** With --cpu: per algorithm row, CPU ms a timed call of a rank (mean over ranks and rounds). */
  readonly cpu: Map<string, CpuSpent>
}

/**
 * Runs every variant round-robin on one fleet: per algorithm its raw NATS pattern (on the first
 * group: plain publishes, whatever that group's transport) and the algorithm on each group's
 * transport (named by rowName). Returns median ms per variant, and per algorithm row the paired
 * ratio to its raw pattern.
 */
const measure = async (
  fleet: RankFleet,
  p: number,
  groups: ReadonlyArray<Group>,
  bytes: number,
  chunkBytes: number,
  algorithms: string[],
  rounds: number | undefined,
  opts: { readonly raw: boolean; readonly nodeOf: Nodes; readonly tcp: boolean; readonly cpu?: boolean }
): Promise<Measured> => {
  const { rounds: R, iters } = schedule(bytes, rounds)
  const n = bytes / 4
  const variants: Variant[] = []
  const rawGroup = groups[0]!.group
  // --cpu: each rank reads its own threads around its timed calls (after the warm-up pass below)
  const cpuSum = new Map<string, { busiestMs: number; totalMs: number; runs: number }>()
  let counting = false
  const raw = opts.raw
  // Raw TCP in a ring, each link carrying what the ring all-reduce puts on it: 2(p-1)/p of the size.
  if (opts.tcp) {
    const perLink = ringBytesPerLink(p, bytes)
    variants.push({ name: RAW_TCP, run: async (k) => slowest(await fleet.all<number[]>(p, () => ({ cmd: "benchTcp", group: rawGroup, bytes: perLink, iters: k, warmup: WARMUP }))) })
  }
  for (const algorithm of algorithms) {
    const patterns = rawPatterns(algorithm, p, bytes, chunkBytes, opts.nodeOf)
    if (raw) variants.push({
      name: `raw ${algorithm}`,
      run: async (k) =>
        slowest(
          await fleet.all<number[]>(p, (rank) => {
            const { flows, inbound } = patterns[rank]!
            return { cmd: "benchRaw", group: rawGroup, flows, inbound, chunkBytes, iters: k, warmup: WARMUP, tag: algorithm }
          })
        )
    })
    const { call } = variantOf(algorithm)
    for (const { transport, group } of groups) {
      const name = rowName(algorithm, transport)
      variants.push({
        name,
        run: async (k) => {
          const got = await fleet.all<{ times: number[]; cpu?: CpuSpent }>(p, () => ({ cmd: "benchAllReduce", group, n, ...call, iters: k, warmup: WARMUP, cpu: opts.cpu === true }))
          if (counting) {
            const acc = cpuSum.get(name) ?? { busiestMs: 0, totalMs: 0, runs: 0 }
            for (const { cpu } of got) {
              if (cpu === undefined) continue
              acc.busiestMs += cpu.busiestMs
              acc.totalMs += cpu.totalMs
              acc.runs++
            }
            if (acc.runs > 0) cpuSum.set(name, acc)
          }
          return slowest(got.map((g) => g.times))
        }
      })
    }
  }
  const rowNames = algorithms.flatMap((a) => groups.map((g) => ({ algorithm: a, name: rowName(a, g.transport) })))
  // Warm-up: one iteration of each (JIT, buffers, subscriptions).
  for (const v of variants) await v.run(1)
  counting = true
  const samples = new Map<string, number[]>(variants.map((v) => [v.name, []]))
  const paired = new Map<string, number[]>(rowNames.map((x) => [x.name, []]))
  for (let r = 0; r < R; r++) {
    const roundMedian = new Map<string, number>()
    // Rotate the order so no variant always runs first after a pause.
    for (let j = 0; j < variants.length; j++) {
      const v = variants[(j + r) % variants.length]
      const times = await v.run(iters)
      samples.get(v.name)?.push(...times)
      roundMedian.set(v.name, median(times))
    }
    if (raw) for (const { algorithm, name } of rowNames) paired.get(name)?.push((roundMedian.get(name) as number) / (roundMedian.get(`raw ${algorithm}`) as number))
  }
  return {
    medians: new Map([...samples].map(([k, v]) => [k, median(v)])),
    pairedRatio: new Map([...paired].filter(([, v]) => v.length > 0).map(([k, v]) => [k, median(v)])),
    cpu: new Map([...cpuSum].map(([k, c]) => [k, { busiestMs: c.busiestMs / c.runs, totalMs: c.totalMs / c.runs }]))
  }
}

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const a = parseArgs(args)
  if (a.link === undefined) await runOn(a, undefined, "")
  else await onStar(Math.max(...a.ps), a.link, (star, dir) => runOn(a, star, dir))
}

/** The benchmark on loopback, or with `star` one rank per namespace over its shaped link (--link). */
const runOn = async (a: Args, star: Star | undefined, dir: string): Promise<void> => {
  const gloo = a.gloo && torchAvailable()
  const nodeOf = star || a.nodes === "own" ? ownNodes : a.nodes === "one" ? oneNode : pairedNodes
  // One secret per run, the same on every rank (hex over IPC): peers of the direct path prove they hold it.
  const secret = crypto.randomBytes(32).toString("hex")
  console.log(`all-reduce benchmark: p ${a.ps.join(",")}, sizes ${a.sizes.map(fmtSize).join(", ")}, transports ${a.transports.join(", ")}, nats-server max_payload ${fmtSize(a.maxPayload)}, ${os.cpus().length} cores`)
  console.log(`one OS process per rank; time = slowest rank, barrier to done; median over rounds; raw = same bytes, same pattern, plain NATS publish`)
  if (star) {
    console.log(
      `every rank in a network namespace of its own, joined to a switch (a bridge in a hub namespace, where the nats-server runs) by a link shaped to ${star.rate} each way (tc tbf); ` +
        `direct path: TCP over those links; gloo's workers in the same namespaces; "${RAW_TCP}": one TCP connection from each rank to the next, ` +
        `each carrying what the ring all-reduce puts on a link (2(p-1)/p of the size), no framing: the links' ceiling (busbw = algbw x 2(p-1)/p is what a link carries per second)`
    )
  } else {
    console.log(
      `ranks on simulated nodes (--nodes ${a.nodes}: ${a.ps.map((p) => `p=${p}: ${describeNodes(p, nodeOf)}`).join("; ")})` +
        (a.transports.includes("direct") ? `; direct path: transport "direct", a Unix socket between ranks of a node, TCP on loopback across` : "")
    )
  }
  if (!gloo) console.log(a.gloo ? "torch not importable by /usr/bin/python3 or python3: no gloo baseline" : "gloo baseline skipped (--no-gloo)")
  const rows: Row[] = []
  const server = await benchNatsServer(a.maxPayload, star, dir)
  try {
    for (const p of a.ps) {
      const glooRun = gloo ? await runGlooMeasured(p, a.sizes, star) : undefined
      const glooTimes = glooRun?.ms
      const fleet = await RankFleet.start({
        size: p,
        server: () => server.url,
        ...(a.prof ? { execArgv: ["--cpu-prof", `--cpu-prof-dir=${a.prof}`] } : {}),
        ...(star ? { wrap: (rank: number) => ["ip", "netns", "exec", star.ranks[rank]!.ns] } : {})
      })
      try {
        const groups: Group[] = a.transports.map((transport) => ({ transport, group: transport === "nats" ? `bench-p${p}` : `bench-p${p}-${transport}` }))
        let chunkBytes = 0
        let directChunkBytes = 0
        let windowBytes = 0
        const linkLines: string[] = []
        for (const { transport, group } of groups) {
          // With --link a rank listens on (and advertises) its namespace's address, the only one its peers reach it at.
          const direct = (rank: number) => ({
            transport: "direct",
            secret,
            ...(a.directChunk !== undefined ? { chunkBytes: a.directChunk } : {}),
            ...(star ? { host: star.ranks[rank]!.ip, unixSocket: false } : {})
          })
          const created = await fleet.all<{ chunkElems: number; windowBytes: number; transport: TransportInfo }>(p, (rank) => ({
            cmd: "create",
            group,
            rank,
            worldSize: p,
            node: nodeOf(rank),
            chunkBytes: a.chunk,
            windowBytes: a.window,
            ...(transport === "direct" ? { direct: direct(rank) } : {})
          }))
          // The NATS chunk for the raw patterns (a whole-direct group's frames are the direct
          // links' size, which NATS carries only split); the window is the same on every group.
          if (transport === "nats" || chunkBytes === 0) chunkBytes = Math.min(created[0].chunkElems * 4, a.maxPayload - HEADER_BLOCK_BYTES)
          if (transport === "direct") directChunkBytes = created[0].chunkElems * 4
          windowBytes = created[0].windowBytes
          if (transport === "direct") {
            for (const [rank, c] of created.entries()) {
              const links = c.transport.links.map((l) => `rank ${l.rank} ${l.via}${l.why ? ` (${l.why})` : ""}`).join(", ")
              linkLines.push(`  rank ${rank} sends to: ${links}`)
              if (c.transport.links.some((l) => l.via === "nats")) linkLines.push(`  (rank ${rank}: some links fell back to NATS; its "direct" rows are partly NATS)`)
            }
          }
        }
        if (star) {
          const ports = await fleet.all<{ port: number }>(p, (rank) => ({ cmd: "tcpListen", host: star.ranks[rank]!.ip }))
          const prev = (rank: number): number => (rank + p - 1) % p
          await fleet.all(p, (rank) => ({ cmd: "tcpConnect", host: star.ranks[prev(rank)]!.ip, port: ports[prev(rank)]!.port }))
        }
        const chunks = [a.transports.includes("nats") ? `chunk ${fmtSize(chunkBytes)} over NATS` : "", directChunkBytes > 0 ? `${fmtSize(directChunkBytes)} direct` : ""]
        console.log(`\np = ${p}: ${chunks.filter((c) => c !== "").join(", ")}, window ${fmtSize(windowBytes)} per link, ${describeNodes(p, nodeOf)}`)
        if (linkLines.length > 0) console.log(`direct path (group bench-p${p}-direct):\n${linkLines.join("\n")}`)
        // With two ranks a fan-out reaches one receiver, the same traffic as a relay: "<name>" covers both.
        const algorithms = p === 2 ? a.algorithms.filter((x) => !x.endsWith(RELAY)) : a.algorithms
        for (const bytes of a.sizes) {
          const m = await measure(fleet, p, groups, bytes, chunkBytes, algorithms, a.rounds, { raw: a.raw, nodeOf, tcp: star !== undefined, cpu: a.cpu })
          const g = glooTimes?.get(bytes)
          const block: Row[] = []
          const best = new Map<Transport, Row>()
          for (const algorithm of algorithms) {
            for (const { transport } of groups) {
              const name = rowName(algorithm, transport)
              const ms = m.medians.get(name) as number
              const cpu = m.cpu.get(name)
              const row: Row = { p, bytes, name, ms, vsRaw: m.pairedRatio.get(name), vsGloo: g === undefined ? undefined : ms / g, ...(cpu ? { cpu } : {}) }
              block.push(row)
              const b = best.get(transport)
              if (!b || ms < b.ms) best.set(transport, row)
            }
          }
          if (a.raw) for (const algorithm of algorithms) block.push({ p, bytes, name: `raw NATS, ${algorithm} pattern`, ms: m.medians.get(`raw ${algorithm}`) as number })
          const tcpMs = m.medians.get(RAW_TCP)
          if (tcpMs !== undefined) block.push({ p, bytes, name: RAW_TCP, ms: tcpMs })
          const gCpu = a.cpu ? glooRun?.cpu.get(bytes) : undefined
          if (g !== undefined) block.push({ p, bytes, name: "torch gloo all_reduce", ms: g, ...(gCpu ? { cpu: gCpu } : {}) })
          printRows(block)
          console.log(summaryLine(p, bytes, best.get("nats"), best.get("direct"), g, tcpMs))
          rows.push(...block)
        }
        if (star) await fleet.all(p, () => ({ cmd: "tcpClose" }))
        for (const { group } of groups) await fleet.all(p, () => ({ cmd: "close", group }))
        // A profiled rank writes its profile when it exits by itself (stop() kills).
        if (a.prof) await fleet.exit()
      } finally {
        await fleet.stop()
      }
    }
  } finally {
    await server.stop()
  }

  if (a.payloadSweep && star) console.log("\n(max_payload sweep left out with --link: it measures the NATS server on loopback)")
  if (a.payloadSweep && !star) {
    console.log(`\nmax_payload and throughput: ring all-reduce and its raw pattern at ${fmtSize(64 * MiB)}, chunk = max_payload minus the 100-byte NATS header block`)
    const sweep: Row[] = []
    for (const maxPayload of [1 * MiB, 8 * MiB]) {
      const srv = await launchNatsServer({ jetstream: false, maxPayload })
      try {
        for (const p of a.ps) {
          const fleet = await RankFleet.start({ size: p, server: () => srv.url })
          try {
            const group = `sweep-p${p}`
            const created = await fleet.all<{ chunkElems: number }>(p, (rank) => ({ cmd: "create", group, rank, worldSize: p, node: pairedNodes(rank), chunkBytes: maxPayload, windowBytes: a.window }))
            const m = await measure(fleet, p, [{ transport: "nats", group }], 64 * MiB, created[0].chunkElems * 4, ["ring"], a.rounds ?? 3, { raw: true, nodeOf: pairedNodes, tcp: false })
            const label = `max_payload ${fmtSize(maxPayload)}`
            sweep.push({ p, bytes: 64 * MiB, name: `ring, ${label}`, ms: m.medians.get("ring") as number, vsRaw: m.pairedRatio.get("ring") })
            sweep.push({ p, bytes: 64 * MiB, name: `raw ring pattern, ${label}`, ms: m.medians.get("raw ring") as number })
          } finally {
            await fleet.stop()
          }
        }
      } finally {
        await srv.stop()
      }
    }
    printRows(sweep)
  }
}
