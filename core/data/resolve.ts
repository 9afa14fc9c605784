// The driver's half of a file dataset: the file list (globs expanded, object store manifests
// listed), each file's row count and how it is cut into chunks (the unit of the per-epoch
// reshuffle): a shard file's header, a text file's byte offset every chunkRows rows (one streaming
// pass counting newlines, constant memory), an uploaded file's parts. Nothing here holds rows: the
// result is metadata of a few KiB that every worker gets, and each reads its own rows (stream.ts).
import * as fs from "node:fs/promises"
import * as path from "node:path"
import type { NatsConnection } from "@nats-io/nats-core"
import { ConfigError } from "../errors.ts"
import { DataFormatError, DataSourceError } from "./errors.ts"
import { csvOptionsOf, formatOfName, hasGlob, isObjectUrl, parseObjectUrl, DATA_OBJECT_PREFIX, type FileDatasetSpec, type FileFormat } from "./file-spec.ts"
import { listDataFiles, openDataBucket } from "./object-data.ts"
import { plainFile, withoutGz } from "./plain-file.ts"
import { prod, shardFileHeader, type LabelDtype } from "./shard-format.ts"
import { classIdReader, csvSchema, jsonlSchema, type TextSchema } from "./text-formats.ts"
import { mixSeed } from "../random.ts"

export interface ResolvedFile {
  /** Absolute path (a .gz file is read from its decompressed copy: plain-file.ts), or nats-obj://bucket/<object> of the manifest. */
  readonly source: string
  readonly rows: number
  readonly bytes: number
  /** Local shard file: where its arrays start. */
  readonly shard?: { readonly xOffset: number; readonly yOffset: number }
  /** Local text file: the byte offset where each chunk's rows start, then the file's end. */
  readonly offsets?: ReadonlyArray<number>
  /** Uploaded file: its bucket, parts (one chunk each), and whether part 0 starts with the CSV header. */
  readonly bucket?: string
  readonly parts?: ReadonlyArray<{ readonly object: string; readonly rows: number }>
  readonly headerInFirstPart?: boolean
}

export interface ResolvedDataset {
  readonly format: FileFormat
  /** Text formats: how lines become rows. */
  readonly schema?: TextSchema
  readonly featureShape: ReadonlyArray<number>
  readonly labelShape: ReadonlyArray<number>
  readonly labelDtype: LabelDtype
  readonly numClasses: number
  readonly files: ReadonlyArray<ResolvedFile>
  readonly rows: number
  /** The same as rows: the whole dataset's, as an in-memory dataset's size. */
  readonly size: number
  readonly chunkRows: number
  readonly shuffleBuffer: number
  readonly prefetch: number
  readonly shuffle: boolean
  /** Identifies the rows and their chunking: a saved data position is only valid for the same one. */
  readonly fingerprint: string
}

/** What a file of an unknown extension is told (the Trainer's option and the CLI's). */
export const UNKNOWN_FORMAT =
  "cannot tell its format from the name: name it .csv, .tsv, .jsonl, .ndjson or .gwshard (each may end in .gz), " +
  'or give the format: fromFiles(files, { format: "csv" | "jsonl" | "shards" }), on the command line --dataset \'NAME={"files": "...", "format": "csv"}\''

const DEFAULT_WINDOW_ROWS = 16384
const DEFAULT_WINDOW_BYTES = 32 * 1024 * 1024
const SCAN_BYTES = 4 * 1024 * 1024

const KNOWN = [".csv", ".tsv", ".jsonl", ".ndjson", ".gwshard"].flatMap((x) => [x, `${x}.gz`])

/** Local paths: a file, a directory (its dataset files), or a glob. Sorted, so every run sees one order. */
const expandLocal = async (source: string): Promise<string[]> => {
  if (hasGlob(source)) {
    const out: string[] = []
    for await (const f of fs.glob(source)) {
      const st = await fs.stat(f).catch(() => undefined)
      if (st?.isFile()) out.push(path.resolve(f))
    }
    if (out.length === 0) throw new DataSourceError({ source, reason: "the pattern matches no file" })
    return out.sort()
  }
  const st = await fs.stat(source).catch(() => undefined)
  if (!st) throw new DataSourceError({ source, reason: "no such file or directory (a path on a shared filesystem must exist on the driver too; for machines without one, upload with gradwire data put)" })
  if (st.isFile()) return [source]
  const out = (await fs.readdir(source, { withFileTypes: true }))
    .filter((e) => e.isFile() && KNOWN.some((x) => e.name.toLowerCase().endsWith(x)))
    .map((e) => path.join(source, e.name))
    .sort()
  if (out.length === 0) throw new DataSourceError({ source, reason: `the directory holds no dataset file (${KNOWN.join(", ")})` })
  return out
}

/**
 * One pass over a text file: rows (non-blank lines, minus a header), the byte offset of every
 * chunkRows-th row, and the first non-blank line (the schema's source). With `classId`, also the
 * largest class id of its rows (-1 for none).
 */
export const scanTextFile = async (
  file: string,
  chunkRows: number,
  header: boolean,
  classId?: (line: Uint8Array) => number
): Promise<{ rows: number; offsets: number[]; firstLine: string; bytes: number; maxClass: number }> => {
  const fh = await fs.open(file, "r")
  try {
    const size = (await fh.stat()).size
    const buf = new Uint8Array(SCAN_BYTES)
    const offsets: number[] = []
    let rows = 0
    let lineStart = 0
    let firstLine: string | undefined
    let headerSeen = !header
    let maxClass = -1
    // The read in hand (its bytes and their offset in the file), the byte before it, and the bytes of
    // the line in progress from earlier reads (kept while a line's bytes are wanted: the first line's,
    // or every row's for its class id).
    let data = buf.subarray(0, 0)
    let base = 0
    let prevLast = -1
    let spill: Uint8Array[] = []
    /** Line [start, end)'s bytes; `final`: the last line, with no newline, all of it spilled. */
    const lineBytes = (start: number, end: number, final: boolean): Uint8Array => {
      if (!final && start >= base) return data.subarray(start - base, end - base)
      return Buffer.concat(final ? spill : [...spill, data.subarray(0, end - base)])
    }
    const line = (start: number, end: number, final: boolean): void => {
      // [start, end) absolute; blank (or just "\r") lines are not rows.
      const len = end - start
      if (len === 0) return
      if (len === 1 && (!final && end - 1 >= base ? data[end - 1 - base] : prevLast) === 13) return
      if (firstLine === undefined) firstLine = new TextDecoder().decode(lineBytes(start, end, final)).replace(/\r$/, "")
      if (!headerSeen) {
        headerSeen = true
        return
      }
      if (rows % chunkRows === 0) offsets.push(start)
      rows++
      if (classId) {
        const c = classId(lineBytes(start, end, final))
        if (c > maxClass) maxClass = c
      }
    }
    for (let pos = 0; pos < size; ) {
      const { bytesRead } = await fh.read(buf, 0, buf.length, pos)
      if (bytesRead === 0) break
      data = buf.subarray(0, bytesRead)
      base = pos
      let from = 0
      for (;;) {
        const nl = data.indexOf(10, from)
        if (nl < 0) break
        line(lineStart, base + nl, false)
        spill = []
        lineStart = base + nl + 1
        from = nl + 1
      }
      // A line that goes on in the next read: keep its bytes here while they are wanted.
      if ((firstLine === undefined || classId) && lineStart < base + bytesRead) spill.push(data.slice(Math.max(0, lineStart - base)))
      prevLast = data[bytesRead - 1]!
      pos += bytesRead
    }
    if (lineStart < size) line(lineStart, size, true)
    offsets.push(size)
    return { rows, offsets, firstLine: firstLine ?? "", bytes: size, maxClass }
  } finally {
    await fh.close()
  }
}

const schemaOf = (format: "csv" | "jsonl", firstLine: string, spec: FileDatasetSpec, source: string): TextSchema => {
  if (firstLine.trim() === "") throw new DataFormatError({ source, reason: "the file is empty" })
  return format === "csv" ? csvSchema(firstLine, csvOptionsOf(spec.options), source) : jsonlSchema(firstLine, spec.options as never, source)
}

const sameSchema = (a: TextSchema, b: TextSchema): boolean =>
  JSON.stringify([a.featureShape, a.labelShape, a.columns, a.featureColumns, a.labelColumns, a.featureKeys, a.labelKeys]) ===
  JSON.stringify([b.featureShape, b.labelShape, b.columns, b.featureColumns, b.labelColumns, b.featureKeys, b.labelKeys])

/** The chunks in canonical order (files in order, chunks within a file in order): file, first row, rows, and part (uploaded files; -1 for local ones). What the epoch order permutes. */
export const chunkSizes = (d: Pick<ResolvedDataset, "files" | "chunkRows" | "format">): { file: Int32Array; start: Float64Array; rows: Int32Array; part: Int32Array } => {
  const file: number[] = []
  const start: number[] = []
  const rows: number[] = []
  const part: number[] = []
  d.files.forEach((f, i) => {
    if (f.parts) {
      let at = 0
      f.parts.forEach((p, k) => {
        const n = p.rows - (f.headerInFirstPart && k === 0 ? 1 : 0)
        if (n > 0) {
          file.push(i)
          start.push(at)
          rows.push(n)
          part.push(k)
        }
        at += n
      })
      return
    }
    for (let r = 0; r < f.rows; r += d.chunkRows) {
      file.push(i)
      start.push(r)
      rows.push(Math.min(d.chunkRows, f.rows - r))
      part.push(-1)
    }
  })
  return { file: Int32Array.from(file), start: Float64Array.from(start), rows: Int32Array.from(rows), part: Int32Array.from(part) }
}

/** Resolves a file dataset to metadata; `nats` opens a connection when a source is in the object store. */
export const resolveFileDataset = async (
  name: string,
  spec: FileDatasetSpec,
  nats?: () => Promise<NatsConnection>
): Promise<ResolvedDataset> => {
  const o = spec.options
  const field = `datasets.${name}`
  // Local files and uploaded ones, in the order of the sources (each source's files sorted).
  type Entry = { source: string; format: FileFormat; local?: string; object?: { bucket: string; object: string; manifest: import("./object-data.ts").DataManifest } }
  const entries: Entry[] = []
  for (const s of spec.sources) {
    if (isObjectUrl(s)) {
      if (!nats) throw new ConfigError({ field, reason: `${s} is in an object store, which needs the cluster's NATS connection` })
      const { bucket } = parseObjectUrl(s)
      const os = await openDataBucket(await nats(), bucket)
      const found = await listDataFiles(os, s)
      if (found.length === 0) {
        throw new DataSourceError({ source: s, reason: `no uploaded file there; upload with: gradwire data put <files> ${s} --address <the cluster's NATS>` })
      }
      for (const f of found) entries.push({ source: `${DATA_OBJECT_PREFIX}${bucket}/${f.object}`, format: f.manifest.format, object: { bucket, object: f.object, manifest: f.manifest } })
    } else {
      for (const f of await expandLocal(s)) {
        const format = o.format ?? formatOfName(f)
        if (!format) throw new DataSourceError({ source: f, reason: UNKNOWN_FORMAT })
        entries.push({ source: f, format, local: await plainFile(f) })
      }
    }
  }
  const format = o.format ?? entries[0]!.format
  const odd = entries.find((e) => e.format !== format)
  if (odd) throw new ConfigError({ field, reason: `${odd.source} is ${odd.format}, ${entries[0]!.source} ${format}: one dataset reads one format (give two datasets)` })

  let schema: TextSchema | undefined
  let featureShape: ReadonlyArray<number>
  let labelShape: ReadonlyArray<number>
  let labelDtype: LabelDtype
  let numClasses = o.numClasses ?? 0
  const files: ResolvedFile[] = []

  // The shapes first (they size the shuffle window, which sizes a text file's chunks).
  let rowBytes: number
  const firstShards = format === "shards" ? new Map<string, Awaited<ReturnType<typeof shardFileHeader>>>() : undefined
  if (format === "shards") {
    const e0 = entries[0]!
    let fs0: { featureShape: ReadonlyArray<number>; labelShape: ReadonlyArray<number>; labelDtype: LabelDtype; numClasses: number }
    if (e0.local) {
      const h = await shardFileHeader(e0.local)
      firstShards!.set(e0.local, h)
      fs0 = h
    } else fs0 = e0.object!.manifest.shard!
    featureShape = fs0.featureShape
    labelShape = fs0.labelShape
    labelDtype = fs0.labelDtype
    if (o.numClasses === undefined) numClasses = fs0.numClasses
    if (o.featureShape) {
      if (prod(o.featureShape) !== prod(featureShape)) throw new ConfigError({ field: `${field}.featureShape`, reason: `${JSON.stringify(o.featureShape)} holds ${prod(o.featureShape)} values, the shards' rows ${prod(featureShape)}` })
      featureShape = [...o.featureShape]
    }
  } else {
    const e0 = entries[0]!
    let first: string
    if (e0.local) {
      const fh = await fs.open(e0.local, "r")
      try {
        const b = new Uint8Array(1 << 20)
        const { bytesRead } = await fh.read(b, 0, b.length, 0)
        const text = new TextDecoder().decode(b.subarray(0, bytesRead))
        first = text.split("\n").find((l) => l.trim() !== "") ?? ""
      } finally {
        await fh.close()
      }
    } else first = e0.object!.manifest.schemaLine ?? ""
    schema = schemaOf(format, first, spec, e0.source)
    // (the first file's header, given or found, holds for every file of the dataset)
    if (format === "csv" && o.header === undefined) spec = { ...spec, options: { ...spec.options, header: schema.headerLine !== undefined } }
    featureShape = schema.featureShape
    labelShape = schema.labelShape
    labelDtype = schema.labelDtype
    numClasses = schema.numClasses
  }
  const header = format === "csv" && schema?.headerLine !== undefined
  rowBytes = (prod(featureShape) + prod(labelShape)) * 4
  const shuffleBuffer = o.shuffleBuffer ?? Math.max(1, Math.min(DEFAULT_WINDOW_ROWS, Math.floor(DEFAULT_WINDOW_BYTES / rowBytes)))
  const chunkRows = o.chunkRows ?? Math.max(1, Math.ceil(shuffleBuffer / 16))

  // Class ids with no count given: the scan of local files finds the largest (an uploaded file's
  // parts are not read here: give numClasses).
  const classId = schema && o.numClasses === undefined && schema.classes === undefined ? classIdReader(schema) : undefined
  let maxClass = -1
  let classesKnown = classId !== undefined
  for (const e of entries) {
    if (format === "shards") {
      if (e.local) {
        const h = firstShards!.get(e.local) ?? (await shardFileHeader(e.local))
        if (prod(h.featureShape) !== prod(featureShape) || JSON.stringify(h.labelShape) !== JSON.stringify(labelShape) || h.labelDtype !== labelDtype) {
          throw new DataFormatError({ source: e.source, reason: `its rows (features ${JSON.stringify(h.featureShape)}, labels ${JSON.stringify(h.labelShape)} ${h.labelDtype}) differ from ${entries[0]!.source}'s` })
        }
        if (o.numClasses === undefined) numClasses = Math.max(numClasses, h.numClasses)
        const bytes = (await fs.stat(e.local)).size
        files.push({ source: e.source, rows: h.rows, bytes, shard: { xOffset: h.xOffset, yOffset: h.yOffset } })
      } else {
        const m = e.object!.manifest
        if (!m.shard || prod(m.shard.featureShape) !== prod(featureShape) || JSON.stringify(m.shard.labelShape) !== JSON.stringify(labelShape) || m.shard.labelDtype !== labelDtype) {
          throw new DataFormatError({ source: e.source, reason: `its rows differ from ${entries[0]!.source}'s` })
        }
        if (o.numClasses === undefined) numClasses = Math.max(numClasses, m.shard.numClasses)
        files.push({ source: e.source, rows: m.rows, bytes: m.bytes, bucket: e.object!.bucket, parts: m.parts.map((p) => ({ object: p.object, rows: p.rows })) })
      }
      continue
    }
    if (e.local) {
      const scan = await scanTextFile(e.local, chunkRows, header, classId)
      maxClass = Math.max(maxClass, scan.maxClass)
      const s = schemaOf(format, scan.firstLine, spec, e.source)
      if (!sameSchema(s, schema!)) throw new DataFormatError({ source: e.source, reason: `its columns differ from ${entries[0]!.source}'s (first line ${JSON.stringify(scan.firstLine.slice(0, 80))})` })
      files.push({ source: e.source, rows: scan.rows, bytes: scan.bytes, offsets: scan.offsets })
    } else {
      const m = e.object!.manifest
      classesKnown = false
      const s = schemaOf(format, m.schemaLine ?? "", spec, e.source)
      if (!sameSchema(s, schema!)) throw new DataFormatError({ source: e.source, reason: `its columns differ from ${entries[0]!.source}'s` })
      files.push({
        source: e.source,
        rows: m.rows - (header ? 1 : 0),
        bytes: m.bytes,
        bucket: e.object!.bucket,
        parts: m.parts.map((p) => ({ object: p.object, rows: p.rows })),
        ...(header ? { headerInFirstPart: true } : {})
      })
    }
  }
  if (classesKnown && maxClass >= 0) numClasses = maxClass + 1
  const rows = files.reduce((n, f) => n + f.rows, 0)
  if (rows === 0) throw new DataSourceError({ source: spec.sources.join(", "), reason: "the files hold no rows" })
  const shape = { files, chunkRows, format }
  const sizes = chunkSizes(shape)
  let h = mixSeed(rows, sizes.rows.length, chunkRows)
  // File names, not paths: the same files moved elsewhere (another mount, a resume elsewhere), or
  // compressed since, are the same data.
  for (const f of files) {
    const base = path.basename(withoutGz(f.source))
    for (let i = 0; i < base.length; i++) h = mixSeed(h, base.charCodeAt(i))
  }
  for (let i = 0; i < sizes.rows.length; i++) h = mixSeed(h, sizes.rows[i]!)
  return {
    format,
    ...(schema ? { schema: { ...schema, numClasses } } : {}),
    featureShape,
    labelShape,
    labelDtype,
    numClasses,
    files,
    rows,
    size: rows,
    chunkRows,
    shuffleBuffer,
    prefetch: o.prefetch ?? 2,
    shuffle: o.shuffle ?? true,
    fingerprint: `${rows}r-${sizes.rows.length}c-${h.toString(16)}`
  }
}
