// File-backed datasets against the in-memory path: `npm run bench -- data [--sizes 0.1,1]
// [--format shards|csv] [--workers 2] [--steps 2000] [--warmup 50] [--batch 32]
// [--in-memory-max-gib 1] [--repeat 1] [--dir DIR] [--keep]`. For each size (GiB on disk) it writes a synthetic
// digits-like dataset (64 float features, 10 classes; .gwshard files of 64 MiB, or CSV), then:
//   - the input pipeline alone in this process: rows/s of one rank's FileStream (prefetch, shuffle
//     window, batches of 1024) next to gathering the same number of shuffled rows from in-memory
//     arrays (gatherRows, what dp.fit does for makeDataset);
//   - a training run per path, each in its own driver process (bench/data-run.ts) on the embedded
//     cluster, the digits MLP for --steps steps per rank: driver peak RSS, each worker's peak RSS,
//     time from the driver's start to the first step, training rows/s over all ranks, and the share
//     of step time spent getting the batch (waiting for rows included).
// The in-memory run is skipped above --in-memory-max-gib (the driver and every worker would hold
// the whole dataset); a run that fails is a row saying why. With --repeat N each path runs N times,
// alternating which goes first, and the medians are printed. Files are removed at the end unless
// --keep.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { writeShards } from "../core/data/shard-format.ts"
import { fromFiles } from "../core/data/file-spec.ts"
import { resolveFileDataset } from "../core/data/resolve.ts"
import { FileStream } from "../core/data/stream.ts"
import { gatherRows, makeDataset, shardIndices } from "../core/datasets.ts"
import { optionReader } from "./args.ts"
import { median } from "../scheduler/cost-model.ts"

const RUNNER = fileURLToPath(new URL("./data-run.ts", import.meta.url))
const GiB = 2 ** 30
const MiB = (b: number): string => (b / 2 ** 20).toFixed(0)
const FEATURES = 64

/** A fast seeded generator of [0, 1) floats (xorshift32). */
const rng = (seed: number) => {
  let s = seed >>> 0 || 1
  return () => {
    s ^= s << 13
    s ^= s >>> 17
    s ^= s << 5
    return (s >>> 0) / 4294967296
  }
}

/** Blocks of rows: random features, the label a function of them (the MLP has something to learn). */
function* blocks(rows: number, seed: number): Generator<{ x: Float32Array; y: Int32Array; featureShape: number[]; numClasses: number }> {
  const next = rng(seed)
  const per = 65536
  for (let at = 0; at < rows; at += per) {
    const n = Math.min(per, rows - at)
    const x = new Float32Array(n * FEATURES)
    const y = new Int32Array(n)
    for (let i = 0; i < n; i++) {
      let best = 0
      let arg = 0
      for (let j = 0; j < FEATURES; j++) {
        const v = next()
        x[i * FEATURES + j] = v
        if (j % 6 === 0 && v > best) {
          best = v
          arg = (j / 6) % 10
        }
      }
      y[i] = arg
    }
    yield { x, y, featureShape: [FEATURES], numClasses: 10 }
  }
}

const writeCsv = async (dir: string, rows: number, seed: number): Promise<void> => {
  const perFile = Math.max(1, Math.floor((64 * 2 ** 20) / 420))
  let file = 0
  let inFile = 0
  let h: fs.FileHandle | undefined
  let buf: string[] = []
  const header = [...Array.from({ length: FEATURES }, (_, j) => `f${j}`), "label"].join(",") + "\n"
  for (const b of blocks(rows, seed)) {
    for (let i = 0; i < b.y.length; i++) {
      if (!h || inFile === perFile) {
        if (h) {
          await h.write(buf.join(""))
          await h.close()
        }
        h = await fs.open(path.join(dir, `part-${String(file++).padStart(5, "0")}.csv`), "w")
        await h.write(header)
        buf = []
        inFile = 0
      }
      const cells: string[] = new Array(FEATURES + 1)
      for (let j = 0; j < FEATURES; j++) cells[j] = b.x[i * FEATURES + j]!.toFixed(4)
      cells[FEATURES] = String(b.y[i])
      buf.push(cells.join(",") + "\n")
      inFile++
      if (buf.length >= 4096) {
        await h.write(buf.join(""))
        buf = []
      }
    }
  }
  if (h) {
    await h.write(buf.join(""))
    await h.close()
  }
}

const runDriver = (config: Record<string, unknown>): Promise<Record<string, unknown>> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [RUNNER, JSON.stringify(config)], { stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString()))
    child.stderr.on("data", (d: Buffer) => (out += d.toString()))
    const timer = setTimeout(() => child.kill("SIGTERM"), 20 * 60_000)
    child.on("exit", (code) => {
      clearTimeout(timer)
      const line = out.split("\n").find((l) => l.startsWith("RESULT "))
      if (code !== 0 || !line) reject(new Error(`data-run ${String(config.mode)} exited ${code}:\n${out.slice(-3000)}`))
      else resolve(JSON.parse(line.slice(7)) as Record<string, unknown>)
    })
  })

export async function run(argv: ReadonlyArray<string>): Promise<void> {
  const get = optionReader(argv)
  const sizes = get("--sizes", "0.1,1").split(",").map(Number)
  const format = get("--format", "shards")
  const workers = Number(get("--workers", "2"))
  const steps = Number(get("--steps", "2000"))
  const warmup = Number(get("--warmup", "50"))
  const batch = Number(get("--batch", "32"))
  const memMax = Number(get("--in-memory-max-gib", "1"))
  const keep = argv.includes("--keep")
  const repeat = Number(get("--repeat", "1"))
  if (format !== "shards" && format !== "csv") throw new Error(`data: --format is shards or csv, got ${format}`)
  if (sizes.some((s) => !(s > 0)) || !(steps > warmup)) throw new Error("data: --sizes are GiB > 0, and --steps > --warmup")
  const root = await fs.mkdtemp(path.join(get("--dir", os.tmpdir()), "gw-bench-data-"))
  const storage = path.join(root, "runs")
  const rowBytes = format === "shards" ? (FEATURES + 1) * 4 : 64 * 6.2 + 2
  console.log(`data: ${format}, sizes ${sizes.join(", ")} GiB, ${workers} workers, ${steps} steps of ${batch} rows per rank (${warmup} warm-up), ${os.cpus().length} cores`)
  const table: string[] = []
  try {
    for (const size of sizes) {
      const rows = Math.floor((size * GiB) / rowBytes)
      const dir = path.join(root, `${size}GiB`)
      await fs.mkdir(dir, { recursive: true })
      const w0 = performance.now()
      if (format === "shards") await writeShards(dir, blocks(rows, 7), { bytesPerShard: 64 * 2 ** 20 })
      else await writeCsv(dir, rows, 7)
      const onDisk = (await fs.readdir(dir)).length
      const bytes = (await Promise.all((await fs.readdir(dir)).map((f) => fs.stat(path.join(dir, f))))).reduce((n, s) => n + s.size, 0)
      console.log(`\n${size} GiB: ${rows} rows in ${onDisk} files, ${MiB(bytes)} MiB, written in ${((performance.now() - w0) / 1000).toFixed(1)} s`)

      // The input pipeline alone: one rank of `workers` reads its part in batches of 1024.
      const d = await resolveFileDataset("train", fromFiles(dir, { label: "label" }))
      const s = new FileStream("train", d, 0, () => ({ rank: 0, worldSize: workers }))
      const left = s.openEpoch(0, 0, workers)
      // The first batches (up to 128, a quarter of the part) warm the JIT up (both paths), the rest is timed.
      const WARM = Math.min(128, Math.floor(left / 4 / 1024)) * 1024
      const take = Math.min(left - WARM, 2_000_000)
      for (let at = 0; at < WARM; at += 1024) await s.take(at, 1024)
      const p0 = performance.now()
      for (let at = WARM; at < WARM + take; at += 1024) await s.take(at, Math.min(1024, WARM + take - at))
      const pipeMs = performance.now() - p0
      await s.close()
      const pipeRows = take / (pipeMs / 1000)
      let gatherRowsPerS: number | undefined
      if (size <= memMax) {
        // The in-memory path's batches: shuffled rows gathered from arrays holding every row.
        const all = await (async () => {
          const r = new FileStream("train", d, 0, () => ({ rank: 0, worldSize: 1 }))
          const a = await r.readAll()
          await r.close()
          return makeDataset(a.x, a.y as Int32Array, a.featureShape, 10)
        })()
        const idx = shardIndices(all.size, 0, workers, 0, 0).subarray(0, take)
        for (let at = 0; at < Math.min(WARM, idx.length); at += 1024) gatherRows(all, idx.subarray(at, Math.min(idx.length, at + 1024)))
        const g0 = performance.now()
        for (let at = 0; at < idx.length; at += 1024) gatherRows(all, idx.subarray(at, Math.min(idx.length, at + 1024)))
        gatherRowsPerS = idx.length / ((performance.now() - g0) / 1000)
      }
      console.log(
        `input pipeline, one rank's rows: files ${(pipeRows / 1e6).toFixed(2)} M rows/s (${((pipeRows * rowBytes) / 2 ** 20).toFixed(0)} MiB/s of ${format})` +
          (gatherRowsPerS ? `, in memory ${(gatherRowsPerS / 1e6).toFixed(2)} M rows/s` : ", in memory not run")
      )

      // Each path --repeat times, alternating which goes first; medians.
      const modes = (["files", "memory"] as const).filter((m) => m === "files" || size <= memMax)
      const runs = new Map<string, Array<Record<string, unknown>>>(modes.map((m) => [m, []]))
      const failures = new Map<string, string>()
      for (let k = 0; k < repeat; k++) {
        for (const mode of k % 2 === 0 ? modes : [...modes].reverse()) {
          if (failures.has(mode)) continue
          try {
            runs.get(mode)!.push(await runDriver({ mode, dir, workers, steps, warmup, batch, storage, name: `${mode}-${String(size).replace(".", "_")}-${k}` }))
          } catch (e) {
            // The in-memory path can fail outright at sizes the files path handles: that is a result.
            const msg = String((e as Error).message)
            const limit = /message of (\d+) bytes is above the limit of (\d+) bytes/.exec(msg)
            const why = limit
              ? `the dataset's ${MiB(Number(limit[1]))} MiB reply is above the actors' message limit (${MiB(Number(limit[2]))} MiB)`
              : /no heartbeat/.test(msg)
                ? "a worker missed its heartbeats while taking in the whole dataset"
                : (/TrainingFailed: [^\n]*/.exec(msg)?.[0] ?? msg.split("\n")[0]!).slice(0, 160)
            failures.set(mode, why)
          }
        }
      }
      for (const mode of modes) {
        const label = mode === "files" ? `files (${format})` : "in memory"
        const rs = runs.get(mode)!
        if (rs.length === 0) {
          const line = `| ${size} | ${label} | failed: ${failures.get(mode)} | | | | | | |`
          console.log(line)
          table.push(line)
          continue
        }
        const ranksOf = (r: Record<string, unknown>) => r.ranks as Array<Record<string, number>>
        const med = (f: (r: Record<string, unknown>) => number): number => median(rs.map(f))
        const line =
          `| ${size} | ${label} | ${MiB(med((r) => Number(r.driverRss)))} | ` +
          `${Array.from({ length: workers }, (_, i) => MiB(med((r) => ranksOf(r)[i]!.rss!))).join(" / ")} | ` +
          `${(med((r) => Number(r.firstStepMs)) / 1000).toFixed(1)} | ${Math.round(med((r) => ranksOf(r).reduce((n, m) => n + m.rows_per_s!, 0)))} | ` +
          `${(med((r) => Math.max(...ranksOf(r).map((m) => m.data_share!))) * 100).toFixed(1)}% | ` +
          `${med((r) => Math.max(...ranksOf(r).map((m) => m.window_wait_ms!))).toFixed(3)} | ${MiB(med((r) => ranksOf(r).reduce((n, m) => n + m.bytes_read!, 0)))} |` +
          (failures.has(mode) ? ` (${rs.length} of ${repeat} runs; then ${failures.get(mode)})` : "")
        console.log(line)
        table.push(line)
      }
      if (!keep) await fs.rm(dir, { recursive: true, force: true })
    }
    console.log("\n| GiB | path | driver RSS MiB | worker RSS MiB | s to first step | training rows/s | batch time / step time | window wait ms/step | MiB read by workers |")
    console.log("|---|---|---|---|---|---|---|---|---|")
    for (const l of table) console.log(l)
  } finally {
    if (!keep) await fs.rm(root, { recursive: true, force: true })
    else console.log(`kept ${root}`)
  }
}
