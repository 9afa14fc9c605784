// gradwire's binary tensor shard format (".gwshard"): a small header, then the features of every
// row as one raw little-endian float32 array, then the labels as one int32 (class ids) or float32
// (regression targets) array. A reader fetches any row range with two positioned reads straight
// into the typed arrays it trains from (no parsing, no intermediate copy), and the header alone
// (a few hundred bytes) tells the driver everything it needs: rows, shapes, label type.
//
//   bytes 0..7    "GWSHARD1"
//   bytes 8..11   u32 LE: length H of the JSON header
//   bytes 12..    the header (UTF-8 JSON), zero-padded so the arrays start 8-byte aligned
//   xOffset       rows x prod(featureShape) float32
//   yOffset       rows x prod(labelShape) int32 | float32
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { randomBytes } from "node:crypto"
import { DataFormatError } from "./errors.ts"

export const SHARD_MAGIC = "GWSHARD1"
export const SHARD_EXTENSION = ".gwshard"
const PREFIX = 12
/** Headers longer than this are not ours (a stray file): refused before allocating. */
const MAX_HEADER = 1 << 20

export type LabelDtype = "int32" | "float32"

export interface ShardHeader {
  readonly version: 1
  readonly rows: number
  readonly featureShape: ReadonlyArray<number>
  /** [] for one label per row. */
  readonly labelShape: ReadonlyArray<number>
  readonly labelDtype: LabelDtype
  /** Class count (int32 labels); 0 when unknown or for regression. */
  readonly numClasses: number
  readonly xOffset: number
  readonly yOffset: number
}

/** Rows to write: features row-major, labels one (or prod(labelShape)) per row. */
export interface ShardRows {
  readonly x: Float32Array
  readonly y: Int32Array | Float32Array
  readonly featureShape: ReadonlyArray<number>
  readonly labelShape?: ReadonlyArray<number>
  readonly numClasses?: number
}

export const prod = (shape: ReadonlyArray<number>): number => shape.reduce((a, b) => a * b, 1)

const bigEndian = os.endianness() === "BE"

/** Swaps 4-byte words in place (only on big-endian hosts: the format is little-endian). */
const swap32 = (bytes: Uint8Array): void => {
  for (let i = 0; i + 3 < bytes.length; i += 4) {
    const a = bytes[i]!
    const b = bytes[i + 1]!
    bytes[i] = bytes[i + 3]!
    bytes[i + 1] = bytes[i + 2]!
    bytes[i + 2] = b
    bytes[i + 3] = a
  }
}

const bytesOf = (a: Float32Array | Int32Array): Uint8Array => new Uint8Array(a.buffer, a.byteOffset, a.byteLength)

/** The header of `rows` rows of this shape, with the arrays' offsets. */
export const shardHeader = (
  rows: number,
  featureShape: ReadonlyArray<number>,
  labelShape: ReadonlyArray<number>,
  labelDtype: LabelDtype,
  numClasses: number
): { header: ShardHeader; bytes: Uint8Array } => {
  // The offsets are part of the JSON, whose length depends on them: two passes settle it.
  let xOffset = 0
  for (let pass = 0; pass < 3; pass++) {
    const header: ShardHeader = {
      version: 1,
      rows,
      featureShape: [...featureShape],
      labelShape: [...labelShape],
      labelDtype,
      numClasses,
      xOffset,
      yOffset: xOffset + rows * prod(featureShape) * 4
    }
    const json = new TextEncoder().encode(JSON.stringify(header))
    const need = Math.ceil((PREFIX + json.length) / 8) * 8
    if (need === xOffset) {
      const bytes = new Uint8Array(need)
      bytes.set(new TextEncoder().encode(SHARD_MAGIC), 0)
      new DataView(bytes.buffer).setUint32(8, json.length, true)
      bytes.set(json, PREFIX)
      return { header, bytes }
    }
    xOffset = need
  }
  throw new Error("unreachable: shard header offsets did not settle")
}

const checkRows = (r: ShardRows, where: string): { rows: number; labelShape: ReadonlyArray<number>; labelDtype: LabelDtype } => {
  const labelShape = r.labelShape ?? []
  const ySize = prod(labelShape)
  const xSize = prod(r.featureShape)
  if (!(xSize > 0) || !(ySize > 0) || r.y.length % ySize !== 0) {
    throw new DataFormatError({ source: where, reason: `featureShape ${JSON.stringify(r.featureShape)} / labelShape ${JSON.stringify(labelShape)} do not fit ${r.y.length} labels` })
  }
  const rows = r.y.length / ySize
  if (r.x.length !== rows * xSize) {
    throw new DataFormatError({ source: where, reason: `${r.x.length} feature values for ${rows} rows of ${xSize} (featureShape ${JSON.stringify(r.featureShape)})` })
  }
  return { rows, labelShape, labelDtype: r.y instanceof Int32Array ? "int32" : "float32" }
}

/** Writes one shard file atomically (temp file, then rename): header, features, labels. */
export const writeShardFile = async (file: string, r: ShardRows): Promise<ShardHeader> => {
  const { rows, labelShape, labelDtype } = checkRows(r, file)
  const { header, bytes } = shardHeader(rows, r.featureShape, labelShape, labelDtype, r.numClasses ?? 0)
  const tmp = `${file}.tmp-${randomBytes(4).toString("hex")}`
  const h = await fs.open(tmp, "w")
  try {
    const x = bytesOf(r.x)
    const y = bytesOf(r.y)
    if (bigEndian) {
      const xs = x.slice()
      const ys = y.slice()
      swap32(xs)
      swap32(ys)
      await h.writev([bytes, xs, ys], 0)
    } else {
      await h.writev([bytes, x, y], 0)
    }
    await h.sync()
  } finally {
    await h.close()
  }
  await fs.rename(tmp, file)
  return header
}

/** Encodes rows as one shard in memory (the object store's parts of a shard file). */
export const encodeShard = (r: ShardRows): Uint8Array => {
  const { rows, labelShape, labelDtype } = checkRows(r, "encodeShard")
  const { header, bytes } = shardHeader(rows, r.featureShape, labelShape, labelDtype, r.numClasses ?? 0)
  const out = new Uint8Array(header.yOffset + r.y.length * 4)
  out.set(bytes, 0)
  out.set(bytesOf(r.x), header.xOffset)
  out.set(bytesOf(r.y), header.yOffset)
  if (bigEndian) {
    swap32(out.subarray(header.xOffset))
  }
  return out
}

const parseHeader = (prefix: Uint8Array, json: Uint8Array | undefined, source: string): ShardHeader | number => {
  if (new TextDecoder().decode(prefix.subarray(0, 8)) !== SHARD_MAGIC) {
    throw new DataFormatError({ source, reason: `not a gradwire shard (no ${SHARD_MAGIC} magic); write shards with writeShards(), or name the format (format: "csv" | "jsonl")` })
  }
  const len = new DataView(prefix.buffer, prefix.byteOffset, PREFIX).getUint32(8, true)
  if (len > MAX_HEADER) throw new DataFormatError({ source, reason: `shard header of ${len} bytes: the file is damaged` })
  if (!json) return len
  let h: ShardHeader
  try {
    h = JSON.parse(new TextDecoder().decode(json)) as ShardHeader
  } catch (e) {
    throw new DataFormatError({ source, reason: `shard header is not JSON (${(e as Error).message}): the file is damaged` })
  }
  const ok =
    h.version === 1 &&
    Number.isInteger(h.rows) && h.rows >= 0 &&
    Array.isArray(h.featureShape) && Array.isArray(h.labelShape) &&
    (h.labelDtype === "int32" || h.labelDtype === "float32") &&
    h.xOffset % 4 === 0 && h.yOffset === h.xOffset + h.rows * prod(h.featureShape) * 4
  if (!ok) throw new DataFormatError({ source, reason: `shard header ${JSON.stringify(h).slice(0, 200)} is inconsistent: the file is damaged or of a newer version` })
  return h
}

/** Reads a shard file's header (two small reads) and checks the file is as long as it says. */
export const readShardHeader = async (fh: fs.FileHandle, source: string): Promise<ShardHeader> => {
  const prefix = new Uint8Array(PREFIX)
  const { bytesRead } = await fh.read(prefix, 0, PREFIX, 0)
  if (bytesRead < PREFIX) throw new DataFormatError({ source, reason: `${bytesRead} bytes: too short for a gradwire shard` })
  const len = parseHeader(prefix, undefined, source) as number
  const json = new Uint8Array(len)
  await fh.read(json, 0, len, PREFIX)
  const h = parseHeader(prefix, json, source) as ShardHeader
  const size = (await fh.stat()).size
  const end = h.yOffset + h.rows * prod(h.labelShape) * 4
  if (size < end) throw new DataFormatError({ source, reason: `${size} bytes, but its header promises ${h.rows} rows ending at byte ${end}: the file is truncated` })
  return h
}

/** Opens a shard file and reads its header. */
export const shardFileHeader = async (file: string): Promise<ShardHeader> => {
  const fh = await fs.open(file, "r")
  try {
    return await readShardHeader(fh, file)
  } finally {
    await fh.close()
  }
}

const readFully = async (fh: fs.FileHandle, into: Uint8Array, position: number, source: string): Promise<void> => {
  let done = 0
  while (done < into.length) {
    const { bytesRead } = await fh.read(into, done, into.length - done, position + done)
    if (bytesRead === 0) throw new DataFormatError({ source, reason: `ended at byte ${position + done}, before the rows its header promises: the file is truncated` })
    done += bytesRead
  }
}

/**
 * Reads rows [from, to) of a shard into xOut/yOut at row `at`: two positioned reads into views of
 * the output arrays' memory.
 */
export const readShardRows = async (
  fh: fs.FileHandle,
  h: ShardHeader,
  from: number,
  to: number,
  xOut: Float32Array,
  yOut: Int32Array | Float32Array,
  at: number,
  source: string
): Promise<void> => {
  if (to <= from) return
  const xs = prod(h.featureShape)
  const ys = prod(h.labelShape)
  const xView = new Uint8Array(xOut.buffer, xOut.byteOffset + at * xs * 4, (to - from) * xs * 4)
  const yView = new Uint8Array(yOut.buffer, yOut.byteOffset + at * ys * 4, (to - from) * ys * 4)
  await Promise.all([readFully(fh, xView, h.xOffset + from * xs * 4, source), readFully(fh, yView, h.yOffset + from * ys * 4, source)])
  if (bigEndian) {
    swap32(xView)
    swap32(yView)
  }
}

/** A shard held in memory (an object store part): its header and views of its arrays (copied only when misaligned). */
export const decodeShard = (bytes: Uint8Array, source: string): { header: ShardHeader; x: Float32Array; y: Int32Array | Float32Array } => {
  if (bytes.length < PREFIX) throw new DataFormatError({ source, reason: `${bytes.length} bytes: too short for a gradwire shard` })
  const len = parseHeader(bytes.subarray(0, PREFIX), undefined, source) as number
  const h = parseHeader(bytes.subarray(0, PREFIX), bytes.subarray(PREFIX, PREFIX + len), source) as ShardHeader
  const xn = h.rows * prod(h.featureShape)
  const yn = h.rows * prod(h.labelShape)
  if (bytes.length < h.yOffset + yn * 4) throw new DataFormatError({ source, reason: `${bytes.length} bytes, but its header promises ${h.rows} rows: the object is truncated` })
  const view = <T extends Float32Array | Int32Array>(C: { new (b: ArrayBufferLike, o: number, n: number): T; new (n: number): T }, off: number, n: number): T => {
    const at = bytes.byteOffset + off
    if (at % 4 === 0 && !bigEndian) return new C(bytes.buffer, at, n)
    const copy = bytes.slice(off, off + n * 4)
    if (bigEndian) swap32(copy)
    return new C(copy.buffer, 0, n)
  }
  return { header: h, x: view(Float32Array, h.xOffset, xn), y: h.labelDtype === "int32" ? view(Int32Array, h.yOffset, yn) : view(Float32Array, h.yOffset, yn) }
}

export interface WriteShardsOptions {
  /** Rows per file (default: as many as fit in bytesPerShard). */
  readonly rowsPerShard?: number
  /** Target file size when rowsPerShard is not given (default 64 MiB). */
  readonly bytesPerShard?: number
  /** File name prefix: `<prefix>-00000.gwshard` (default "part"). */
  readonly prefix?: string
}

/** One block of rows for writeShards: features and labels, with its row count where the arrays do not say it. */
export type Block = ShardRows & { readonly size?: number }

/**
 * Writes rows as shard files `<dir>/<prefix>-NNNNN.gwshard`, from one dataset or a stream of blocks
 * (an iterable or async iterable of datasets: rows of any size, re-cut into files of rowsPerShard),
 * holding at most one file's rows at a time. Returns the files' paths, in order.
 */
export const writeShards = async (
  dir: string,
  source: Block | Iterable<Block> | AsyncIterable<Block>,
  options: WriteShardsOptions = {}
): Promise<string[]> => {
  await fs.mkdir(dir, { recursive: true })
  const prefix = options.prefix ?? "part"
  const files: string[] = []
  let shape: { featureShape: ReadonlyArray<number>; labelShape: ReadonlyArray<number>; dtype: LabelDtype; numClasses: number } | undefined
  let perFile = 0
  let bx: Float32Array | undefined
  let by: Int32Array | Float32Array | undefined
  let filled = 0
  const flush = async (): Promise<void> => {
    if (!shape || filled === 0) return
    const xs = prod(shape.featureShape)
    const ys = prod(shape.labelShape)
    const file = path.join(dir, `${prefix}-${String(files.length).padStart(5, "0")}${SHARD_EXTENSION}`)
    await writeShardFile(file, {
      x: bx!.subarray(0, filled * xs),
      y: by!.subarray(0, filled * ys),
      featureShape: shape.featureShape,
      labelShape: shape.labelShape,
      numClasses: shape.numClasses
    })
    files.push(file)
    filled = 0
  }
  const blocks: Iterable<Block> | AsyncIterable<Block> =
    Symbol.iterator in (source as object) || Symbol.asyncIterator in (source as object) ? (source as Iterable<Block>) : [source as Block]
  for await (const b of blocks) {
    const { rows, labelShape, labelDtype } = checkRows(b, `writeShards(${dir})`)
    const numClasses = b.numClasses ?? 0
    if (!shape) {
      shape = { featureShape: [...b.featureShape], labelShape: [...labelShape], dtype: labelDtype, numClasses }
      const rowBytes = (prod(shape.featureShape) + prod(shape.labelShape)) * 4
      perFile = options.rowsPerShard ?? Math.max(1, Math.floor((options.bytesPerShard ?? 64 * 1024 * 1024) / rowBytes))
      if (!(perFile >= 1) || !Number.isInteger(perFile)) throw new DataFormatError({ source: dir, reason: `rowsPerShard must be an integer >= 1, got ${perFile}` })
      bx = new Float32Array(perFile * prod(shape.featureShape))
      by = labelDtype === "int32" ? new Int32Array(perFile * prod(shape.labelShape)) : new Float32Array(perFile * prod(shape.labelShape))
    } else if (
      JSON.stringify(shape.featureShape) !== JSON.stringify(b.featureShape) ||
      JSON.stringify(shape.labelShape) !== JSON.stringify(labelShape) ||
      shape.dtype !== labelDtype
    ) {
      throw new DataFormatError({ source: dir, reason: "every block written to one set of shards must have the same featureShape, labelShape and label type" })
    }
    shape.numClasses = Math.max(shape.numClasses, numClasses)
    const xs = prod(shape.featureShape)
    const ys = prod(shape.labelShape)
    let r = 0
    while (r < rows) {
      const n = Math.min(rows - r, perFile - filled)
      bx!.set(b.x.subarray(r * xs, (r + n) * xs), filled * xs)
      by!.set(b.y.subarray(r * ys, (r + n) * ys) as never, filled * ys)
      filled += n
      r += n
      if (filled === perFile) await flush()
    }
  }
  await flush()
  return files
}
