// A worker's streaming input pipeline (core/data/stream.ts) over real files and a real JetStream
// object store: the same rows in the same seeded order from CSV, JSON Lines, shards and uploaded
// parts; ranks that read disjoint parts and only their own windows; a resume from a saved position
// that goes on exactly where it stopped; a re-plan for another world size that neither repeats nor
// skips a row; map transforms; and errors that say what is wrong.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import * as zlib from "node:zlib"
import { fromFiles, type FromFilesOptions } from "../core/data/file-spec.ts"
import { resolveFileDataset, type ResolvedDataset } from "../core/data/resolve.ts"
import { FileStream, normalize, oneHot } from "../core/data/stream.ts"
import { writeShards } from "../core/data/shard-format.ts"
import { dataRows, putFiles, listUploaded } from "../core/data/object-data.ts"
import { DataFormatError, DataPositionMismatch, DataSourceError } from "../core/data/errors.ts"
import { plainCacheDir, plainFile } from "../core/data/plain-file.ts"
import { natsFixtures } from "./support/nats.ts"
import { runScript } from "./support/run-script.ts"
import { partRows, type DataPosition } from "../core/data/plan.ts"
import { IterableStream } from "../core/data/iterable-stream.ts"
import { makeDataset, gatherRows } from "../core/datasets.ts"
import { batchTensors, fitBatch } from "../actors/train/worker/batches.ts"
import * as tf from "@tensorflow/tfjs"

const ROWS = 1000
/** Row i: features [i, 2i, i % 7], label i % 5. Files: rows 0..399 and 400..999. */
const SPLIT = [0, 400, ROWS]
const OPTS: FromFilesOptions = { shuffleBuffer: 64, chunkRows: 16, prefetch: 2 }

let dir: string
const nats = natsFixtures("all")

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "gw-data-stream-"))
  for (const sub of ["csv", "jsonl", "shards"]) await fs.mkdir(path.join(dir, sub))
  for (let f = 0; f < 2; f++) {
    const ids = Array.from({ length: SPLIT[f + 1]! - SPLIT[f]! }, (_, k) => SPLIT[f]! + k)
    await fs.writeFile(path.join(dir, "csv", `part-${f}.csv`), ["id,double,mod,label", ...ids.map((i) => `${i},${2 * i},${i % 7},${i % 5}`)].join("\n") + "\n")
    await fs.writeFile(path.join(dir, "jsonl", `part-${f}.jsonl`), ids.map((i) => JSON.stringify({ x: [i, 2 * i, i % 7], y: i % 5 })).join("\n"))
    await writeShards(
      path.join(dir, "shards"),
      { x: Float32Array.from(ids.flatMap((i) => [i, 2 * i, i % 7])), y: Int32Array.from(ids.map((i) => i % 5)), featureShape: [3], numClasses: 5 },
      { prefix: `part-${f}` }
    )
  }
})
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true })
})

const resolve = (sources: string | string[], o: FromFilesOptions = OPTS, nc?: () => Promise<import("@nats-io/nats-core").NatsConnection>) =>
  resolveFileDataset("train", fromFiles(sources, o), nc)

/** p streams (one per rank) over the dataset. */
const ranks = (d: ResolvedDataset, p: number, seed = 3, nc?: () => Promise<import("@nats-io/nats-core").NatsConnection>): FileStream[] =>
  Array.from({ length: p }, (_, r) => new FileStream("train", d, seed, () => ({ rank: r, worldSize: p }), nc))

/** Every rank takes `steps` batches of `bs` rows of `epoch` (or all it has left): row ids per rank. */
const run = async (streams: FileStream[], epoch: number, bs: number, steps = Infinity): Promise<number[][]> => {
  const p = streams.length
  const left = streams.map((s, r) => s.openEpoch(epoch, r, p))
  expect(new Set(left).size).toBe(1)
  const out: number[][] = streams.map(() => [])
  for (let i = 0; i < steps && i * bs < left[0]!; i++) {
    const n = Math.min(bs, left[0]! - i * bs)
    const batches = await Promise.all(streams.map((s) => s.take(i * bs, n)))
    batches.forEach((b, r) => {
      expect(b.n).toBe(n)
      for (let k = 0; k < n; k++) {
        const id = b.x[k * 3]!
        expect([b.x[k * 3 + 1], b.x[k * 3 + 2], b.y[k]]).toEqual([2 * id, id % 7, id % 5])
        out[r]!.push(id)
      }
    })
  }
  return out
}

const close = (streams: FileStream[]) => Promise.all(streams.map((s) => s.close()))

describe("file dataset streams", () => {
  it("give the same rows in the same seeded order from CSV, JSON Lines and shards; disjoint parts; a new order each epoch", async () => {
    const orders: number[][][] = []
    for (const sub of ["csv", "jsonl", "shards"]) {
      const d = await resolve(path.join(dir, sub))
      expect(d.rows).toBe(ROWS)
      expect(d.files).toHaveLength(2)
      const s = ranks(d, 3)
      orders.push(await run(s, 0, 10))
      await close(s)
    }
    expect(orders[1]).toEqual(orders[0])
    expect(orders[2]).toEqual(orders[0])
    const all = orders[0]!.flat()
    expect(all).toHaveLength(3 * Math.floor(ROWS / 3))
    expect(new Set(all).size).toBe(all.length)
    // Shuffled, not in file order; another epoch, another order; the same seed, the same order.
    const d = await resolve(path.join(dir, "shards"))
    const a = ranks(d, 3)
    const e1 = await run(a, 1, 10)
    expect(e1[0]).not.toEqual(orders[0]![0])
    expect(orders[0]![0]).not.toEqual([...orders[0]![0]!].sort((x, y) => x - y))
    await close(a)
    const b = ranks(d, 3)
    expect(await run(b, 1, 10)).toEqual(e1)
    await close(b)
  })

  it("read only their own part: each rank reads about a quarter of the bytes, holding a few windows", async () => {
    const d = await resolve(path.join(dir, "shards"))
    const s = ranks(d, 4)
    s[0]!.openEpoch(0, 0, 4)
    // Right after opening: the first window and `prefetch` more are loading in the background.
    expect(s[0]!.buffered).toBe(3)
    await run(s, 0, 25)
    const total = ROWS * 4 * 4
    for (const r of s) {
      expect(r.stats.bytesRead).toBeLessThan(total * 0.25 + 2 * 64 * 16 + 1)
      expect(r.buffered).toBeLessThanOrEqual(3)
    }
    await close(s)
  })

  it("resume from a saved position exactly where they stopped, and re-plan for another world size without repeating or skipping a row", async () => {
    const d = await resolve(path.join(dir, "csv"))
    const whole = ranks(d, 4)
    const expected = await run(whole, 2, 8)
    await close(whole)

    // Stop after 5 steps, save, resume in new streams at the same size: the same rows, in order.
    const first = ranks(d, 4)
    const head = await run(first, 2, 8, 5)
    const saved = JSON.parse(JSON.stringify(first[0]!.position())) as DataPosition
    expect(saved).toMatchObject({ epoch: 2, consumed: 40, worldSize: 4 })
    await close(first)
    const again = ranks(d, 4)
    for (const s of again) s.restore(saved)
    const tail = await run(again, 2, 8)
    expect(head.map((h, r) => [...h, ...tail[r]!])).toEqual(expected)
    await close(again)

    // Resize: 4 ranks take 5 steps, then 3 ranks finish the epoch from the saved position.
    const three = ranks(d, 3)
    for (const s of three) s.restore(saved)
    const rest = await run(three, 2, 8)
    const seen = [...head.flat(), ...rest.flat()]
    expect(new Set(seen).size).toBe(seen.length)
    expect(ROWS - seen.length).toBeLessThan(3)
    // The next epoch starts over, at the new size.
    expect(three[0]!.openEpoch(3, 0, 3)).toBe(Math.floor(ROWS / 3))
    await close(three)
  })

  it("keep the plan they opened when they take a regroup's position of it (a hand-written loop's survivors), and say where an epoch is", async () => {
    const d = await resolve(path.join(dir, "csv"))
    const expected = await (async () => {
      const whole = ranks(d, 4)
      const out = await run(whole, 2, 8)
      await close(whole)
      return out
    })()
    const s = ranks(d, 4)
    expect(s[1]!.midEpoch()).toBeUndefined()
    const left = s[1]!.openEpoch(2, 1, 4)
    expect(s[1]!.midEpoch()).toBe(2)
    const a = await s[1]!.take(0, 8)
    // The furthest survivor's position of the same plan, one step further: the open plan goes on,
    // and the loop's next take() is the next batch of this rank's part.
    s[1]!.restore({ ...s[1]!.position()!, consumed: 16 })
    const b = await s[1]!.take(8, 8)
    const rest = await s[1]!.take(16, left - 16)
    const ids = (x: { x: Float32Array | ArrayLike<number>; n: number }) => Array.from({ length: x.n }, (_, k) => Number(x.x[k * 3]))
    expect([...ids(a), ...ids(b), ...ids(rest)]).toEqual(expected[1])
    expect(s[1]!.midEpoch()).toBeUndefined()
    const ended = s[1]!.position()!
    // A rank that opened the next epoch and then takes the end of the one before keeps its plan too.
    s[1]!.openEpoch(3, 1, 4)
    s[1]!.restore(ended)
    await expect(s[1]!.take(0, 8)).resolves.toMatchObject({ n: 8 })
    // Another plan (here: the epoch cut for another size) replaces the open one: the loop must open it.
    s[1]!.restore({ ...ended, epoch: 3, worldSize: 3, consumed: 0 })
    await expect(s[1]!.take(0, 8)).rejects.toThrow(/take\(\) before openEpoch\(\)/)
    await close(s)
  })

  it("apply map transforms in order, and say what is wrong with a bad position or a missing file", async () => {
    const d = await resolve(path.join(dir, "shards"))
    const [s] = ranks(d, 1)
    s!.map(normalize(0, 2)).map(oneHot(5))
    s!.openEpoch(0, 0, 1)
    const b = await s!.take(0, 4)
    expect(b.labelShape).toEqual([5])
    for (let k = 0; k < 4; k++) {
      const id = b.x[k * 3]! * 2
      expect(b.x[k * 3 + 1]).toBe(id)
      expect([...b.y.subarray(k * 5, k * 5 + 5)].indexOf(1)).toBe(id % 5)
    }
    expect(() => s!.restore({ ...s!.position()!, fingerprint: "other" })).toThrow(DataPositionMismatch)
    // a position at an epoch's end (a checkpoint after the epoch) holds no row to go on from: other
    // files (one added to the folder) start the next epoch as they are
    const end = s!.position()!
    s!.restore({ ...end, fingerprint: "other", consumed: partRows(end) })
    expect(s!.midEpoch()).toBeUndefined()
    s!.openEpoch(end.epoch + 1, 0, 1)
    await expect(s!.take(0, 4)).resolves.toMatchObject({ n: 4 })
    // a loop written for an in-memory shard (rows of an epoch), given a stream: what to call instead
    expect(() => s!.rows(0)).toThrow(/getDatasetShard\("train"\)\.rows.*is a stream .* dp\.fit\(shard, .*openEpoch\(epoch, ctx\.worldRank, ctx\.worldSize\)/)
    await s!.close()
    await expect(resolve(path.join(dir, "nope", "*.csv"))).rejects.toThrow(DataSourceError)
    await expect(resolve(path.join(dir, "nope.csv"))).rejects.toThrow(/no such file/)
  })

  it("read gzip-compressed files (.csv.gz, .jsonl.gz, .gwshard.gz) as the plain ones, from one decompressed copy per node; a damaged one is named", async () => {
    const copies: string[] = []
    try {
      for (const sub of ["csv", "jsonl", "shards"]) {
        const plain = await resolve(path.join(dir, sub))
        const gz = path.join(dir, `${sub}-gz`)
        await fs.mkdir(gz, { recursive: true })
        for (const f of await fs.readdir(path.join(dir, sub))) {
          await fs.writeFile(path.join(gz, `${f}.gz`), zlib.gzipSync(await fs.readFile(path.join(dir, sub, f))))
        }
        // A directory of .gz files, as a directory of plain ones.
        const d = await resolve(gz)
        expect(d.rows).toBe(ROWS)
        expect(d.files.map((f) => path.basename(f.source))).toEqual(plain.files.map((f) => `${path.basename(f.source)}.gz`))
        // The same data: the same chunks, the same fingerprint (a position saved on the plain files resumes here), the same order.
        expect(d.fingerprint).toBe(plain.fingerprint)
        const [a, b] = [ranks(plain, 3), ranks(d, 3)]
        expect(await run(b, 0, 10)).toEqual(await run(a, 0, 10))
        await close([...a, ...b])
        // One copy per file, made once: asked again, the same path, not rewritten.
        for (const f of d.files) {
          const copy = await plainFile(f.source)
          expect(path.dirname(copy)).toBe(plainCacheDir())
          const before = (await fs.stat(copy)).mtimeMs
          copies.push(copy)
          expect(await fs.readFile(copy)).toEqual(await fs.readFile(path.join(dir, sub, path.basename(f.source, ".gz"))))
          expect(await plainFile(f.source)).toBe(copy)
          expect((await fs.stat(copy)).mtimeMs).toBe(before)
        }
      }
      // Not gzip data, or cut short: a DataFormatError naming the file, no copy left behind.
      const bad = path.join(dir, "bad.csv.gz")
      await fs.writeFile(bad, "id,label\n1,2\n")
      await expect(resolve(bad)).rejects.toThrow(DataFormatError)
      await expect(resolve(bad)).rejects.toThrow(/bad\.csv\.gz: it is named \.gz but is not complete gzip data/)
      const cut = path.join(dir, "cut.csv.gz")
      const whole = zlib.gzipSync(await fs.readFile(path.join(dir, "csv", "part-1.csv")))
      await fs.writeFile(cut, whole.subarray(0, whole.length >> 1))
      await expect(resolve(cut)).rejects.toThrow(/cut\.csv\.gz: it is named \.gz but is not complete gzip data/)
      expect((await fs.readdir(plainCacheDir())).filter((f) => f.endsWith("-cut.csv") || f.endsWith("-bad.csv") || f.includes(".part"))).toEqual([])
      await expect(resolve(path.join(dir, "missing.csv.gz"))).rejects.toThrow(DataSourceError)
    } finally {
      for (const c of copies) await fs.rm(c, { force: true })
    }
  })

  it("read files uploaded to a real JetStream object store in the same order as the local files", async () => {
    const server = await nats.server({ maxPayload: 8 * 1024 * 1024 })
    const conn = await nats.connect(server.url)
    const local = await resolve(path.join(dir, "csv"))
    const localOrder = await run(ranks(local, 2), 0, 10)
    // Parts of 2 KiB: several per file; the object store chunks on top of that.
    const files = [0, 1].map((f) => path.join(dir, "csv", `part-${f}.csv`))
    await putFiles(conn.nc, files, "nats-obj://data/digits", { partBytes: 2048 })
    const listed = await listUploaded(conn.nc, "nats-obj://data/digits")
    // the rows a dataset reads: each file's header line is not one
    expect(listed.map((f) => [f.object, f.rows, f.headerLine])).toEqual([
      ["digits/part-0.csv", 400, true],
      ["digits/part-1.csv", 600, true]
    ])
    const manifest = { version: 1, name: "a.csv", format: "csv", bytes: 12, rows: 3, parts: [] } as const
    expect(dataRows({ ...manifest, schemaLine: "1, 2.5,-3" })).toEqual({ rows: 3, headerLine: false })
    expect(dataRows({ ...manifest, schemaLine: "x,y,label" })).toEqual({ rows: 2, headerLine: true })
    expect(dataRows({ ...manifest, name: "a.tsv", schemaLine: "1\t2\t3" })).toEqual({ rows: 3, headerLine: false })
    expect(dataRows({ ...manifest, format: "jsonl", schemaLine: '{"x":[1]}' })).toEqual({ rows: 3, headerLine: false })
    expect(listed[0]!.parts).toBeGreaterThan(1)
    const nc = async () => conn.nc
    const remote = await resolve("nats-obj://data/digits", OPTS, nc)
    expect(remote.rows).toBe(ROWS)
    // The chunks are the parts, not chunkRows: the order differs from the local one, the rows do not.
    const s = ranks(remote, 2, 3, nc)
    const order = await run(s, 0, 10)
    expect(order.flat().sort((a, b) => a - b)).toEqual(localOrder.flat().sort((a, b) => a - b))
    await close(s)
    // A glob after the prefix, and shards uploaded as parts that are shards themselves.
    const shardFiles = (await fs.readdir(path.join(dir, "shards"))).map((f) => path.join(dir, "shards", f))
    await putFiles(conn.nc, shardFiles, "nats-obj://data/shards", { partBytes: 4096 })
    const one = await resolve("nats-obj://data/shards/part-1*", OPTS, nc)
    expect(one.rows).toBe(600)
    const t = ranks(one, 1, 3, nc)
    const ids = (await run(t, 0, 50)).flat()
    expect(ids.sort((a, b) => a - b)).toEqual(Array.from({ length: 600 }, (_, i) => 400 + i))
    await close(t)
    await expect(resolve("nats-obj://nobucket/x", OPTS, nc)).rejects.toThrow(/gradwire data put/)
  })

  it("gradwire data put uploads files and data ls lists them; bad arguments are usage errors", async () => {
    const server = await nats.server()
    const cli = path.resolve("bin/gradwire.js")
    const files = [0, 1].map((f) => path.join(dir, "jsonl", `part-${f}.jsonl`))
    const put = await runScript(cli, ["data", "put", ...files, "nats-obj://cli/rows", "--address", server.url, "--part-mib", "0.01"], { timeoutMs: 30_000 })
    expect(put.output).toMatch(/part-0\.jsonl -> nats-obj:\/\/cli\/rows\/part-0\.jsonl: 400 rows/)
    expect(put.output).toMatch(/uploaded 2 files/)
    expect(put.code).toBe(0)
    const ls = await runScript(cli, ["data", "ls", "nats-obj://cli/rows", "--address", server.url], { timeoutMs: 30_000 })
    expect(ls.code).toBe(0)
    expect(ls.output).toMatch(/rows\/part-1\.jsonl\tjsonl\t600 rows/)
    const bad = await runScript(cli, ["data", "put", "nats-obj://cli/rows", "--address", server.url], { timeoutMs: 30_000 })
    expect(bad.code).toBe(2)
    expect(bad.output).toMatch(/name the files to upload/)
    // A gzip file goes up decompressed, under its name without the .gz.
    const gz = path.join(dir, "upload-0.csv.gz")
    await fs.writeFile(gz, zlib.gzipSync(await fs.readFile(path.join(dir, "csv", "part-0.csv"))))
    const putGz = await runScript(cli, ["data", "put", gz, "nats-obj://cli/gz", "--address", server.url], { timeoutMs: 30_000 })
    expect(putGz.code).toBe(0)
    expect(putGz.output).toMatch(/upload-0\.csv\.gz -> nats-obj:\/\/cli\/gz\/upload-0\.csv: 400 rows \(and a header line\)/)
    // its decompressed copy was for the upload only: gone again
    expect((await fs.readdir(plainCacheDir()).catch(() => [])).filter((f) => f.endsWith("-upload-0.csv"))).toEqual([])
    const missing = await runScript(cli, ["data", "put", path.join(dir, "none.csv"), "nats-obj://cli/rows", "--address", server.url], { timeoutMs: 30_000 })
    expect(missing.code).toBe(1)
    expect(missing.output).toMatch(/none\.csv: no such file/)
  })

})

describe("worker-side loaders and in-memory batches", () => {
  it("stream a tf.data pipeline's rows, resume after the rows taken, and refuse one of unknown size", async () => {
    const rows = Array.from({ length: 23 }, (_, i) => ({ xs: [i, 2 * i], ys: i % 3 }))
    const s = new IterableStream("aux", tf.data.array(rows))
    expect(s.openEpoch(0, 0, 1)).toBe(23)
    const a = await s.take(0, 10)
    expect(a.y).toBeInstanceOf(Int32Array)
    expect([...a.x.subarray(0, 4)]).toEqual([0, 0, 1, 2])
    const saved = s.position()!
    expect(saved).toMatchObject({ epoch: 0, consumed: 10 })
    // A new stream (a restarted worker) skips what was trained.
    const t = new IterableStream("aux", tf.data.array(rows))
    t.restore(saved)
    expect(t.openEpoch(0, 0, 1)).toBe(13)
    const b = await t.take(0, 13)
    expect(b.x[0]).toBe(10)
    // Taking a step again (a re-done step) re-reads it.
    expect((await t.take(0, 1)).x[0]).toBe(10)
    // Tensors and float targets, from a function of the epoch.
    const u = new IterableStream("aux", (epoch: number) => [{ xs: tf.tensor1d([epoch, 1]), ys: tf.tensor1d([0.5]) }], { size: 1 })
    u.openEpoch(4, 0, 1)
    const c = await u.take(0, 1)
    expect([...c.x]).toEqual([4, 1])
    expect(c.y).toBeInstanceOf(Float32Array)
    expect(() => new IterableStream("aux", (async function* () {})())).toThrow(/rows per epoch must be known/)
  })

  it("in-memory datasets take float targets with a label shape, and shards apply map transforms", async () => {
    const x = Float32Array.from({ length: 8 }, (_, i) => i)
    const y = Float32Array.from({ length: 8 }, (_, i) => i / 2)
    const ds = makeDataset(x, y, [2], { labelShape: [2] })
    expect(ds).toMatchObject({ size: 4, numClasses: 0, labelShape: [2] })
    const g = gatherRows(ds, [3, 0])
    expect([...g.y]).toEqual([3, 3.5, 0, 0.5])
    expect(() => makeDataset(x, new Int32Array(4), [2], { labelShape: [2] })).toThrow(/labelShape is for float targets/)
    const source = { dataset: ds, rows: () => [0, 1, 2, 3], transforms: [normalize(1, 2)] }
    const b = await fitBatch(source, [1, 2])
    expect([...b.x]).toEqual([0.5, 1, 1.5, 2])
    const t = batchTensors(tf as never, b, false, (v) => v)
    expect(t.yLoss.shape).toEqual([2, 2])
    tf.dispose([t.x, t.y, t.yLoss])
    const ids = makeDataset(x, Int32Array.from([0, 2, 1, 2]), [2])
    const c = batchTensors(tf as never, await fitBatch({ dataset: ids, rows: () => [] }, [0, 1]), true, (v) => tf.oneHot(v, 3))
    expect(c.yLoss.shape).toEqual([2, 3])
    tf.dispose([c.x, c.y, c.yLoss])
    // rows' weights (model.fit's sampleWeight) travel with their batch, also through a transform that builds a new batch
    const weights = Float32Array.of(0.5, 1, 2, 4)
    const rebuilt = { dataset: ds, rows: () => [], weights, transforms: [(bb: typeof b) => ({ x: bb.x, y: bb.y, n: bb.n, featureShape: bb.featureShape, labelShape: bb.labelShape })] }
    expect([...(await fitBatch(rebuilt, [3, 1])).w!]).toEqual([4, 1])
    expect([...(await fitBatch({ dataset: ds, rows: () => [], weights }, [2, 0])).w!]).toEqual([2, 0.5])
    expect((await fitBatch({ dataset: ds, rows: () => [] }, [2, 0])).w).toBeUndefined()
  })
})
