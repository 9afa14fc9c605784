// Gzip-compressed dataset files (`train.csv.gz`, `rows.jsonl.gz`, `part.gwshard.gz`). A worker
// reads its chunks by byte offset, which a gzip stream does not allow, so a compressed file is
// decompressed once per node into a cache beside the system's temporary files and read from there:
// the driver's scan and every worker on the node share one copy, named by the file's path, size and
// modification time (a changed file gets a new copy). Decompression writes a temporary name and
// renames it, so processes racing on one file leave one complete copy and never read a partial one.
import * as crypto from "node:crypto"
import { createReadStream, createWriteStream } from "node:fs"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { pipeline } from "node:stream/promises"
import * as zlib from "node:zlib"
import { DataFormatError, DataSourceError } from "./errors.ts"

/** Whether a file name says gzip. */
export const isGzipName = (name: string): boolean => name.toLowerCase().endsWith(".gz")

/** The name without its `.gz` (what the format is read from). */
export const withoutGz = (name: string): string => (isGzipName(name) ? name.slice(0, -3) : name)

/** Where this node keeps decompressed copies. */
export const plainCacheDir = (): string => path.join(os.tmpdir(), "gradwire-data")

const pending = new Map<string, Promise<string>>()

/** Where a .gz file's decompressed copy is kept on this node. */
const copyPath = async (file: string): Promise<string> => {
  const st = await fs.stat(file).catch((e: NodeJS.ErrnoException) => {
    throw new DataSourceError({ source: file, reason: `cannot read it on this node (${e.code ?? e.message}): a local path must exist on every node that trains; for machines without a shared filesystem upload the files with gradwire data put` })
  })
  const key = crypto.createHash("sha256").update(`${path.resolve(file)}\0${st.size}\0${st.mtimeMs}`).digest("hex").slice(0, 20)
  return path.join(plainCacheDir(), `${key}-${path.basename(withoutGz(file))}`)
}

/**
 * The path to read `file` from: the file itself, or for a `.gz` file its decompressed copy on this
 * node (made on the first call). Throws DataSourceError when the file cannot be read and
 * DataFormatError when it is not gzip data.
 */
export const plainFile = async (file: string): Promise<string> => (isGzipName(file) ? copyAt(file, await copyPath(file)) : file)

/** The copy of `file` at `out`, made once in this process (and by no one else before it). */
const copyAt = (file: string, out: string): Promise<string> => {
  let p = pending.get(out)
  if (!p) {
    p = decompress(file, out)
    pending.set(out, p)
    p.catch(() => pending.delete(out))
  }
  return p
}

const decompress = async (file: string, out: string): Promise<string> => {
  if (await fs.stat(out).then((s) => s.isFile(), () => false)) return out
  await fs.mkdir(path.dirname(out), { recursive: true })
  const tmp = `${out}.${process.pid}.${crypto.randomBytes(4).toString("hex")}.part`
  try {
    await pipeline(createReadStream(file), zlib.createGunzip(), createWriteStream(tmp))
    await fs.rename(tmp, out)
  } catch (e) {
    await fs.rm(tmp, { force: true })
    const err = e as NodeJS.ErrnoException
    if (err.code === "ENOSPC") {
      throw new DataSourceError({ source: file, reason: `no room to decompress it under ${plainCacheDir()} (set TMPDIR to a larger disk, or decompress it yourself)` })
    }
    if (typeof err.code === "string" && err.code.startsWith("Z_")) {
      throw new DataFormatError({ source: file, reason: `it is named .gz but is not complete gzip data (${err.message}): rename it, or compress it again with gzip` })
    }
    throw new DataSourceError({ source: file, reason: `cannot decompress it (${err.code ?? err.message})` })
  }
  return out
}

/**
 * plainFile for a one-off read (an upload): `done()` removes the decompressed copy again unless it
 * was there before (a training run's, which the next run uses).
 */
export const plainFileOnce = async (file: string): Promise<{ readonly path: string; done(): Promise<void> }> => {
  if (!isGzipName(file)) return { path: file, done: async () => {} }
  const out = await copyPath(file)
  const had = await fs.stat(out).then((s) => s.isFile(), () => false)
  const copy = await copyAt(file, out)
  return {
    path: copy,
    done: async () => {
      if (had) return
      pending.delete(copy)
      await fs.rm(copy, { force: true })
    }
  }
}
