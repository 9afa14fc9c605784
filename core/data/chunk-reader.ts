// Reads rows of one chunk of a resolved file dataset into a worker's window buffers: a local shard
// file with two positioned reads straight into the typed arrays, a local text file by reading the
// chunk's byte range and parsing it in place (a .gz file from its decompressed copy on this node), an uploaded file by fetching the part (one object)
// and copying or parsing its rows. Open files and the last parts fetched are kept for the next
// windows, which often continue where the last one stopped.
import * as fs from "node:fs/promises"
import type { NatsConnection } from "@nats-io/nats-core"
import type { ObjectStore } from "@nats-io/obj"
import { DataFormatError, DataSourceError } from "./errors.ts"
import { openDataBucket, readPart } from "./object-data.ts"
import { plainFile } from "./plain-file.ts"
import type { ResolvedDataset, ResolvedFile } from "./resolve.ts"
import { decodeShard, prod, readShardRows, type ShardHeader } from "./shard-format.ts"
import { parseTextRows } from "./text-formats.ts"

export interface ChunkReader {
  /** Rows [from, to) of canonical chunk `chunk` into x/y at row `at`; resolves with the bytes it read (0 for a part fetched before). */
  read(chunk: number, from: number, to: number, x: Float32Array, y: Int32Array | Float32Array, at: number): Promise<number>
  /** Bytes read from files and objects so far. */
  readonly bytesRead: number
  close(): Promise<void>
}

const MAX_OPEN_FILES = 16
const PART_CACHE = 3

/** The byte offset after the first `n` non-blank lines of `bytes`. */
const skipLines = (bytes: Uint8Array, n: number, from = 0): number => {
  let pos = from
  let seen = 0
  while (seen < n && pos < bytes.length) {
    let end = bytes.indexOf(10, pos)
    if (end < 0) end = bytes.length
    let e = end
    if (e > pos && bytes[e - 1] === 13) e--
    if (e > pos) seen++
    pos = end + 1
  }
  return Math.min(pos, bytes.length)
}

export const openChunkReader = (
  d: ResolvedDataset,
  chunks: { readonly file: Int32Array; readonly start: Float64Array; readonly rows: Int32Array; readonly part: Int32Array },
  nats?: () => Promise<NatsConnection>
): ChunkReader => {
  const xs = prod(d.featureShape)
  const ys = prod(d.labelShape)
  const files = new Map<number, Promise<fs.FileHandle>>()
  const buckets = new Map<string, Promise<ObjectStore>>()
  const parts = new Map<string, Promise<Uint8Array>>()
  let bytesRead = 0
  let closed = false

  const handle = (i: number): Promise<fs.FileHandle> => {
    let h = files.get(i)
    if (h) {
      // Most recently used last.
      files.delete(i)
      files.set(i, h)
      return h
    }
    const f = d.files[i]!
    h = plainFile(f.source).then((p) => fs.open(p, "r")).catch((e: NodeJS.ErrnoException) => {
      files.delete(i)
      if (e instanceof DataSourceError || e instanceof DataFormatError) throw e
      throw new DataSourceError({ source: f.source, reason: `cannot open it on this node (${e.code ?? e.message}): a local path must exist on every node that trains; for machines without a shared filesystem upload the files with gradwire data put` })
    })
    files.set(i, h)
    if (files.size > MAX_OPEN_FILES) {
      const [oldest, p] = files.entries().next().value!
      files.delete(oldest)
      void p.then((fh) => fh.close()).catch(() => {})
    }
    return h
  }

  const bucket = (name: string): Promise<ObjectStore> => {
    let b = buckets.get(name)
    if (!b) {
      if (!nats) throw new DataSourceError({ source: `nats-obj://${name}`, reason: "reading the object store needs a NATS connection" })
      b = nats().then((nc) => openDataBucket(nc, name))
      b.catch(() => buckets.delete(name))
      buckets.set(name, b)
    }
    return b
  }

  /** A part's bytes, and how many were fetched for this call (0 when it was cached). */
  const part = async (f: ResolvedFile, object: string): Promise<{ bytes: Uint8Array; fetched: number }> => {
    const key = `${f.bucket}/${object}`
    const cached = parts.get(key)
    if (cached) {
      parts.delete(key)
      parts.set(key, cached)
      return { bytes: await cached, fetched: 0 }
    }
    const p = bucket(f.bucket!).then((os) => readPart(os, f.bucket!, object))
    p.catch(() => parts.delete(key))
    parts.set(key, p)
    if (parts.size > PART_CACHE) parts.delete(parts.keys().next().value!)
    const bytes = await p
    bytesRead += bytes.length
    return { bytes, fetched: bytes.length }
  }

  const readLocalText = async (f: ResolvedFile, fileIndex: number, startRow: number, from: number, to: number, x: Float32Array, y: Int32Array | Float32Array, at: number): Promise<number> => {
    const k = Math.floor(startRow / d.chunkRows)
    const a = f.offsets![k]!
    const b = f.offsets![k + 1]!
    const bytes = new Uint8Array(b - a)
    const fh = await handle(fileIndex)
    let done = 0
    while (done < bytes.length) {
      const { bytesRead: n } = await fh.read(bytes, done, bytes.length - done, a + done)
      if (n === 0) throw new DataSourceError({ source: f.source, reason: `ended at byte ${a + done}, before the ${f.rows} rows it had when the run started: the file changed; restart the run` })
      done += n
    }
    bytesRead += bytes.length
    const off = skipLines(bytes, from)
    const got = parseTextRows(d.schema!, bytes.subarray(off), x, y, at, to - from, `${f.source} (rows from ${startRow + from + 1})`)
    if (got < to - from) throw new DataSourceError({ source: f.source, reason: `chunk at byte ${a} holds ${got + from} rows, ${to} expected: the file changed; restart the run` })
    return bytes.length
  }

  return {
    get bytesRead() {
      return bytesRead
    },
    async read(chunk, from, to, x, y, at) {
      if (closed) throw new DataSourceError({ source: "dataset", reason: "read after the stream was closed" })
      if (to <= from) return 0
      const fi = chunks.file[chunk]!
      const f = d.files[fi]!
      const startRow = chunks.start[chunk]!
      if (f.parts) {
        const k = chunks.part[chunk]!
        const { bytes, fetched } = await part(f, f.parts[k]!.object)
        const where = `${f.source} part ${k}`
        if (d.format === "shards") {
          const s = decodeShard(bytes, where)
          x.set(s.x.subarray(from * xs, to * xs), at * xs)
          y.set(s.y.subarray(from * ys, to * ys) as never, at * ys)
          return fetched
        }
        let off = f.headerInFirstPart && k === 0 ? skipLines(bytes, 1) : 0
        off = skipLines(bytes, from, off)
        const got = parseTextRows(d.schema!, bytes.subarray(off), x, y, at, to - from, where)
        if (got < to - from) throw new DataSourceError({ source: where, reason: `holds fewer rows than its manifest says: upload the file again` })
        return fetched
      }
      if (d.format === "shards") {
        const fh = await handle(fi)
        const h = { ...f.shard!, featureShape: d.featureShape, labelShape: d.labelShape } as unknown as ShardHeader
        await readShardRows(fh, h, startRow + from, startRow + to, x, y, at, f.source)
        const n = (to - from) * (xs + ys) * 4
        bytesRead += n
        return n
      }
      return readLocalText(f, fi, startRow, from, to, x, y, at)
    },
    async close() {
      closed = true
      const open = [...files.values()]
      files.clear()
      parts.clear()
      await Promise.all(open.map((p) => p.then((fh) => fh.close()).catch(() => {})))
    }
  }
}
