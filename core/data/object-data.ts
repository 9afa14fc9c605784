// Dataset files in a JetStream object store bucket, for machines that share no filesystem
// (`gradwire data put <files> nats-obj://bucket/prefix`, putFiles() in the API). The object store
// reads an object whole, so a file is uploaded as parts of whole rows (a few MiB each; a shard
// file's parts are shards themselves) that a worker fetches one at a time, plus a small manifest
// object under the file's own name that lists them with their row counts. A gzip file (.csv.gz, ...)
// is uploaded decompressed, under its name without the .gz. The manifest is written
// last, so a listed file is a complete upload; the driver reads only manifests.
//
//   <prefix>/<file name>                  manifest (JSON; object metadata gradwire-data=manifest)
//   <prefix>/<file name>.parts/NNNNNN     rows (gradwire-data=part)
import * as fs from "node:fs/promises"
import * as path from "node:path"
import type { NatsConnection } from "@nats-io/nats-core"
import { Objm, setSha256Backend, type ObjectStore } from "@nats-io/obj"
import { ConfigError } from "../errors.ts"
import { DataFormatError, DataSourceError } from "./errors.ts"
import { DATA_OBJECT_PREFIX, formatOfName, globToRegExp, hasGlob, parseObjectUrl, type FileFormat } from "./file-spec.ts"
import { plainFileOnce, withoutGz } from "./plain-file.ts"
import { encodeShard, prod, readShardHeader, readShardRows, type LabelDtype } from "./shard-format.ts"
import { csvFirstLineIsHeader } from "./text-formats.ts"

// node:crypto's SHA-256 is about 4x faster than the client's pure-JS one (every chunk is hashed).
setSha256Backend("native")

const CHUNK = 1024 * 1024
const KIND = "gradwire-data"
export const DEFAULT_PART_BYTES = 4 * 1024 * 1024

export interface DataManifest {
  readonly version: 1
  readonly name: string
  readonly format: FileFormat
  /** Size of the file that was uploaded, and its rows. */
  readonly bytes: number
  readonly rows: number
  /** Text: the line a schema is derived from (the CSV header, or the first row / record). */
  readonly schemaLine?: string
  /** Shards: the rows' shapes and label type. */
  readonly shard?: { readonly featureShape: ReadonlyArray<number>; readonly labelShape: ReadonlyArray<number>; readonly labelDtype: LabelDtype; readonly numClasses: number }
  readonly parts: ReadonlyArray<{ readonly object: string; readonly rows: number; readonly bytes: number }>
}

const isNoJetStream = (e: unknown): boolean =>
  /jetstream not enabled|no responders|503|jetstream.*not.*(enabled|available)|JetStreamNotEnabled/i.test(String((e as Error)?.message ?? e))

/** Opens a bucket to read: a missing one, or a server without JetStream, is a DataSourceError saying what to do. */
export const openDataBucket = async (nc: NatsConnection, bucket: string): Promise<ObjectStore> => {
  try {
    return await new Objm(nc).open(bucket)
  } catch (e) {
    const msg = String((e as Error)?.message ?? e)
    throw new DataSourceError({
      source: `${DATA_OBJECT_PREFIX}${bucket}`,
      reason: isNoJetStream(e)
        ? `the NATS server has no JetStream, which object store datasets need: start nats-server with -js (gradwire start --head does) (${msg})`
        : `cannot open the bucket (${msg}); upload the files first: gradwire data put <files> ${DATA_OBJECT_PREFIX}${bucket}/<prefix> --address <the cluster's NATS>`
    })
  }
}

const createBucket = async (nc: NatsConnection, bucket: string): Promise<ObjectStore> => {
  try {
    return await new Objm(nc).create(bucket)
  } catch (e) {
    if (isNoJetStream(e)) {
      throw new DataSourceError({
        source: `${DATA_OBJECT_PREFIX}${bucket}`,
        reason: `the NATS server has no JetStream, which the object store needs: start nats-server with -js (gradwire start --head does) (${String((e as Error)?.message ?? e)})`
      })
    }
    throw e
  }
}

/** The manifests of the files at nats-obj://bucket/prefix[/glob], sorted by name. */
export const listDataFiles = async (os: ObjectStore, url: string): Promise<Array<{ object: string; manifest: DataManifest }>> => {
  const { prefix } = parseObjectUrl(url)
  const match = hasGlob(prefix) ? globToRegExp(prefix) : undefined
  const infos = (await within(os.list(), OBJECT_READ_TIMEOUT_MS, url, "listing the bucket")).filter((i) => i.metadata?.[KIND] === "manifest" && !i.deleted)
  const chosen = infos.filter((i) => (match ? match.test(i.name) : prefix === "" || i.name === prefix || i.name.startsWith(`${prefix}/`)))
  const out: Array<{ object: string; manifest: DataManifest }> = []
  for (const info of chosen.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
    const bytes = await within(os.getBlob(info.name), OBJECT_READ_TIMEOUT_MS, `${url} (${info.name})`, "reading the manifest")
    if (bytes === null) continue
    let manifest: DataManifest
    try {
      manifest = JSON.parse(new TextDecoder().decode(bytes)) as DataManifest
    } catch (e) {
      throw new DataFormatError({ source: `${DATA_OBJECT_PREFIX}${parseObjectUrl(url).bucket}/${info.name}`, reason: `its manifest is not JSON (${(e as Error).message}); upload the file again` })
    }
    out.push({ object: info.name, manifest })
  }
  return out
}

/** How long one object read may take before it is an error (a part is a few MiB). */
export const OBJECT_READ_TIMEOUT_MS = 60_000

/** `p`, or a DataSourceError once `ms` passed: no wait on the object store without a deadline. */
const within = async <A>(p: Promise<A>, ms: number, source: string, what: string): Promise<A> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new DataSourceError({ source, reason: `${what} took longer than ${ms / 1000} s: is the NATS server (with JetStream) reachable?` })), ms)
      })
    ])
  } finally {
    if (timer) clearTimeout(timer)
  }
}

/** Reads one part (whole rows) of an uploaded file. */
export const readPart = async (os: ObjectStore, bucket: string, object: string): Promise<Uint8Array> => {
  const bytes = await within(os.getBlob(object), OBJECT_READ_TIMEOUT_MS, `${DATA_OBJECT_PREFIX}${bucket}/${object}`, "reading the object")
  if (bytes === null) {
    throw new DataSourceError({ source: `${DATA_OBJECT_PREFIX}${bucket}/${object}`, reason: "the object is gone (the file was deleted or uploaded again meanwhile); upload it again and restart" })
  }
  return bytes
}

export interface PutOptions {
  /** Target size of a part (default 4 MiB; a single longer line makes a longer part). */
  readonly partBytes?: number
  /** Default: by each file's extension. */
  readonly format?: FileFormat
  /** Called after each file. */
  readonly onFile?: (info: { file: string; object: string; rows: number; headerLine: boolean; parts: number; bytes: number }) => void
}

/**
 * An uploaded file's rows as a dataset reading it by default sees them: a CSV's first line that is
 * a header by the default rule (csvFirstLineIsHeader) is not a row (the manifest counts lines).
 */
export const dataRows = (m: DataManifest): { readonly rows: number; readonly headerLine: boolean } => {
  const headerLine = m.format === "csv" && m.schemaLine !== undefined && m.rows > 0 && csvFirstLineIsHeader(m.schemaLine, /\.tsv(\.gz)?$/i.test(m.name) ? "\t" : ",")
  return { rows: m.rows - (headerLine ? 1 : 0), headerLine }
}

const manifestMeta = (name: string) => ({ name, metadata: { [KIND]: "manifest" } })
const partMeta = (name: string) => ({ name, options: { max_chunk_size: CHUNK }, metadata: { [KIND]: "part" } })

/** Cuts a text file into parts of whole lines, calling `part` with each; returns the first line and the line count. */
const textParts = async (
  file: string,
  partBytes: number,
  part: (bytes: Uint8Array, rows: number) => Promise<void>
): Promise<{ firstLine: string; rows: number; bytes: number }> => {
  const fh = await fs.open(file, "r")
  try {
    const size = (await fh.stat()).size
    const buf = new Uint8Array(Math.max(partBytes, 64 * 1024) + 64 * 1024)
    let filled = 0
    let pos = 0
    let firstLine: string | undefined
    let rows = 0
    let eof = false
    const countRows = (b: Uint8Array): number => {
      let n = 0
      let start = 0
      for (;;) {
        const nl = b.indexOf(10, start)
        const end = nl < 0 ? b.length : nl
        let e = end
        if (e > start && b[e - 1] === 13) e--
        if (e > start) n++
        if (nl < 0) break
        start = nl + 1
      }
      return n
    }
    let work = buf
    while (!eof || filled > 0) {
      if (!eof && filled < work.length) {
        const { bytesRead } = await fh.read(work, filled, work.length - filled, pos)
        pos += bytesRead
        filled += bytesRead
        if (bytesRead === 0 || pos >= size) eof = true
      }
      const data = work.subarray(0, filled)
      if (firstLine === undefined) {
        const nl = data.indexOf(10)
        if (nl < 0 && !eof) {
          // A first line longer than the buffer: grow it.
          const bigger = new Uint8Array(work.length * 2)
          bigger.set(data)
          work = bigger
          continue
        }
        const end = nl < 0 ? data.length : nl
        firstLine = new TextDecoder().decode(data.subarray(0, end)).replace(/\r$/, "")
      }
      // Cut at the last newline within partBytes (or the first one after, for a longer line).
      let cut: number
      if (eof && filled <= partBytes) cut = filled
      else {
        const limit = Math.min(filled, partBytes)
        cut = data.lastIndexOf(10, limit - 1) + 1
        if (cut === 0) {
          const nl = data.indexOf(10, limit)
          if (nl < 0) {
            if (eof) cut = filled
            else {
              const bigger = new Uint8Array(work.length * 2)
              bigger.set(data)
              work = bigger
              continue
            }
          } else cut = nl + 1
        }
      }
      if (cut === 0) break
      const chunk = work.slice(0, cut)
      const n = countRows(chunk)
      if (n > 0) await part(chunk, n)
      rows += n
      work.copyWithin(0, cut, filled)
      filled -= cut
    }
    return { firstLine: firstLine ?? "", rows, bytes: size }
  } finally {
    await fh.close()
  }
}

/**
 * Uploads dataset files (CSV, JSON Lines, .gwshard) to nats-obj://bucket/prefix: each becomes
 * `<prefix>/<file name>` (a manifest) and its parts. An existing upload of the same name is
 * replaced. The bucket is created when missing (the server needs JetStream).
 */
export const putFiles = async (
  nc: NatsConnection,
  files: ReadonlyArray<string>,
  url: string,
  options: PutOptions = {}
): Promise<DataManifest[]> => {
  const { bucket, prefix } = parseObjectUrl(url, "data put")
  if (hasGlob(prefix)) throw new ConfigError({ field: "data put", reason: `${url}: the destination is a bucket and a prefix, without * or ?` })
  const partBytes = options.partBytes ?? DEFAULT_PART_BYTES
  if (!Number.isInteger(partBytes) || partBytes < 1024) throw new ConfigError({ field: "data put partBytes", reason: `an integer >= 1024, got ${partBytes}` })
  if (files.length === 0) throw new ConfigError({ field: "data put", reason: "name at least one file to upload" })
  // Every file checked before anything is uploaded.
  const plan = await Promise.all(
    files.map(async (file) => {
      const st = await fs.stat(file).catch(() => undefined)
      if (!st?.isFile()) throw new DataSourceError({ source: file, reason: "no such file" })
      const format = options.format ?? formatOfName(file)
      if (!format) throw new DataSourceError({ source: file, reason: "cannot tell its format from the name: use .csv, .tsv, .jsonl, .ndjson or .gwshard (each may end in .gz), or give the format (--format csv|jsonl|shards)" })
      return { file, format, name: path.basename(withoutGz(file)) }
    })
  )
  const names = new Set<string>()
  for (const { name: n } of plan) {
    if (names.has(n)) throw new ConfigError({ field: "data put", reason: `two files are named ${n}: objects are named by the file name, so upload them under different prefixes` })
    names.add(n)
  }
  const os = await createBucket(nc, bucket)
  const out: DataManifest[] = []
  for (const { file, format, name: base } of plan) {
    const name = prefix ? `${prefix}/${base}` : base
    // A .gz file is uploaded decompressed (workers read parts of rows), from a copy removed after.
    const plain = await plainFileOnce(file)
    const read = plain.path
    const parts: Array<{ object: string; rows: number; bytes: number }> = []
    const put = async (bytes: Uint8Array, rows: number): Promise<void> => {
      const object = `${name}.parts/${String(parts.length).padStart(6, "0")}`
      await os.putBlob(partMeta(object), bytes)
      parts.push({ object, rows, bytes: bytes.length })
    }
    let manifest: DataManifest
    try {
      if (format === "shards") {
        const fh = await fs.open(read, "r")
        try {
          const h = await readShardHeader(fh, file)
          const xs = prod(h.featureShape)
          const ys = prod(h.labelShape)
          const per = Math.max(1, Math.floor(partBytes / ((xs + ys) * 4)))
          const x = new Float32Array(per * xs)
          const y = h.labelDtype === "int32" ? new Int32Array(per * ys) : new Float32Array(per * ys)
          for (let r = 0; r < h.rows; r += per) {
            const n = Math.min(per, h.rows - r)
            await readShardRows(fh, h, r, r + n, x, y, 0, file)
            await put(
              encodeShard({ x: x.subarray(0, n * xs), y: y.subarray(0, n * ys), featureShape: h.featureShape, labelShape: h.labelShape, numClasses: h.numClasses }),
              n
            )
          }
          const bytes = (await fh.stat()).size
          manifest = {
            version: 1,
            name: base,
            format,
            bytes,
            rows: h.rows,
            shard: { featureShape: h.featureShape, labelShape: h.labelShape, labelDtype: h.labelDtype, numClasses: h.numClasses },
            parts
          }
        } finally {
          await fh.close()
        }
      } else {
        // Lines as they are (a CSV header stays the first line of part 0: whether it is one is the
        // dataset's option, header); the manifest counts lines and keeps the first one for the schema.
        const t = await textParts(read, partBytes, put)
        manifest = { version: 1, name: base, format, bytes: t.bytes, rows: t.rows, schemaLine: t.firstLine, parts }
      }
    } finally {
      await plain.done()
    }
    await os.putBlob(manifestMeta(name), new TextEncoder().encode(JSON.stringify(manifest)))
    // Parts of an earlier, longer upload of the same name.
    for (const info of await os.list()) {
      if (info.name.startsWith(`${name}.parts/`) && !parts.some((p) => p.object === info.name)) await os.delete(info.name).catch(() => undefined)
    }
    options.onFile?.({ file, object: name, ...dataRows(manifest), parts: parts.length, bytes: manifest.bytes })
    out.push(manifest)
  }
  return out
}

/** The files uploaded under nats-obj://bucket/prefix: name, format, rows, bytes, parts. */
export const listUploaded = async (nc: NatsConnection, url: string): Promise<Array<{ object: string; format: FileFormat; rows: number; headerLine: boolean; bytes: number; parts: number }>> => {
  const { bucket } = parseObjectUrl(url)
  const os = await openDataBucket(nc, bucket)
  return (await listDataFiles(os, url)).map(({ object, manifest }) => ({ object, format: manifest.format, ...dataRows(manifest), bytes: manifest.bytes, parts: manifest.parts.length }))
}
