// What a user writes in `datasets`: fromFiles(pattern | urls, options) for files on a local or
// shared path or in a JetStream object store bucket (nats-obj://bucket/prefix), and
// datasetFactory(module#export, options) for a loader that runs on each worker. Both are plain,
// serialisable descriptions: the driver resolves a file dataset to metadata only (resolve.ts) and
// every worker reads its own rows (stream.ts); a factory is imported and called on the workers.
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { ConfigError } from "../errors.ts"
import { expandHome } from "../config.ts"
import type { CsvOptions, LabelOptions } from "./text-formats.ts"

export const DATA_OBJECT_PREFIX = "nats-obj://"

export type FileFormat = "csv" | "jsonl" | "shards"

export interface FromFilesOptions extends LabelOptions {
  /** Default: from the extension (.csv / .tsv, .jsonl / .ndjson, .gwshard; each may end in .gz: see plain-file.ts). */
  readonly format?: FileFormat
  /** CSV: the first line names the columns. Default: it does when any of its cells is not a number. */
  readonly header?: boolean
  /** CSV: default ",". */
  readonly delimiter?: string
  /** The label column(s) (CSV: name or index) or key(s) (JSON Lines). */
  readonly label?: string | number | ReadonlyArray<string | number>
  /** The feature columns (CSV) or key(s) (JSON Lines: one key holding an array, default "x"). */
  readonly features?: string | ReadonlyArray<string | number>
  /**
   * Rows of the shuffle buffer: each epoch's stream (files and chunks in a seeded order) is
   * shuffled within windows of this many rows. Default: 16384 rows, fewer for wide rows (at most
   * 32 MiB of them). 1 turns row shuffling off (chunk order is still shuffled unless shuffle: false).
   */
  readonly shuffleBuffer?: number
  /** Rows per chunk, the unit of the per-epoch reshuffle, of local files (default: shuffleBuffer / 16). */
  readonly chunkRows?: number
  /** Shuffle windows read ahead in the background (default 2). */
  readonly prefetch?: number
  /** false: every epoch reads the files in order, unshuffled. Default true. */
  readonly shuffle?: boolean
}

export interface FileDatasetSpec {
  readonly kind: "files"
  /** Paths, globs (`*`, `?`, `**`), file: URLs or nats-obj://bucket/prefix[/glob]. */
  readonly sources: ReadonlyArray<string>
  readonly options: FromFilesOptions
}

export interface DatasetFactorySpec {
  readonly kind: "factory"
  /** An absolute file URL (resolved in the driver). */
  readonly module: string
  readonly export: string
  readonly options: unknown
}

const FORMATS: ReadonlyArray<FileFormat> = ["csv", "jsonl", "shards"]
const KEYS = new Set(["format", "header", "delimiter", "label", "features", "labelType", "classes", "numClasses", "featureShape", "shuffleBuffer", "chunkRows", "prefetch", "shuffle"])

const positiveInt = (field: string, v: unknown, min = 1): void => {
  if (v !== undefined && (typeof v !== "number" || !Number.isInteger(v) || v < min)) {
    throw new ConfigError({ field: `fromFiles.${field}`, reason: `must be an integer >= ${min}, got ${JSON.stringify(v)}` })
  }
}

export const isObjectUrl = (s: string): boolean => s.startsWith(DATA_OBJECT_PREFIX)

/** A local source as an absolute path (relative ones against the driver's current directory). */
const absolute = (s: string): string => (s.startsWith("file:") ? fileURLToPath(s) : path.resolve(expandHome(s)))

/** Splits nats-obj://bucket/prefix into the bucket and the object name prefix (maybe with a glob). */
export const parseObjectUrl = (url: string, field = "fromFiles"): { bucket: string; prefix: string } => {
  const m = /^nats-obj:\/\/([-\w]+)(?:\/(.*))?$/.exec(url)
  if (!m) {
    throw new ConfigError({ field, reason: `${JSON.stringify(url)} is not an object store location; expected nats-obj://<bucket>/<prefix> (bucket: letters, digits, - and _)` })
  }
  return { bucket: m[1]!, prefix: (m[2] ?? "").replace(/\/+$/, "") }
}

/** A file dataset: every worker reads only its shard of these files, directly. Checked here, resolved by the Trainer. */
export const fromFiles = (sources: string | URL | ReadonlyArray<string | URL>, options: FromFilesOptions = {}): FileDatasetSpec => {
  const list = (Array.isArray(sources) ? sources : [sources]) as ReadonlyArray<string | URL>
  if (list.length === 0) throw new ConfigError({ field: "fromFiles", reason: "give at least one path, glob or nats-obj:// location" })
  const out = list.map((s) => {
    const str = s instanceof URL ? s.href : s
    if (typeof str !== "string" || str.length === 0) throw new ConfigError({ field: "fromFiles", reason: `sources are paths, globs, file: URLs or nats-obj:// locations, got ${JSON.stringify(s)}` })
    if (isObjectUrl(str)) {
      parseObjectUrl(str)
      return str
    }
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(str) && !str.startsWith("file:")) {
      throw new ConfigError({ field: "fromFiles", reason: `${str}: only local or shared paths, file: URLs and nats-obj://bucket/prefix are read; upload other data with "gradwire data put"` })
    }
    return absolute(str)
  })
  if (typeof options !== "object" || options === null) throw new ConfigError({ field: "fromFiles(options)", reason: "an object such as { format: \"csv\", label: \"label\" }" })
  for (const k of Object.keys(options)) {
    if (!KEYS.has(k)) throw new ConfigError({ field: `fromFiles.${k}`, reason: `unknown option; allowed: ${[...KEYS].join(", ")}` })
  }
  if (options.format !== undefined && !FORMATS.includes(options.format)) {
    throw new ConfigError({ field: "fromFiles.format", reason: `one of ${FORMATS.join(", ")}, got ${JSON.stringify(options.format)}` })
  }
  if (options.labelType !== undefined && options.labelType !== "class" && options.labelType !== "float") {
    throw new ConfigError({ field: "fromFiles.labelType", reason: `"class" (integer class ids) or "float" (regression targets), got ${JSON.stringify(options.labelType)}` })
  }
  positiveInt("shuffleBuffer", options.shuffleBuffer)
  positiveInt("chunkRows", options.chunkRows)
  positiveInt("prefetch", options.prefetch, 0)
  positiveInt("numClasses", options.numClasses, 0)
  if (options.featureShape !== undefined && (!Array.isArray(options.featureShape) || options.featureShape.some((d) => !Number.isInteger(d) || d < 1))) {
    throw new ConfigError({ field: "fromFiles.featureShape", reason: `an array of integers >= 1, got ${JSON.stringify(options.featureShape)}` })
  }
  if (options.classes !== undefined && (!Array.isArray(options.classes) || options.classes.some((c) => typeof c !== "string"))) {
    throw new ConfigError({ field: "fromFiles.classes", reason: "an array of class names (strings)" })
  }
  return { kind: "files", sources: out, options: JSON.parse(JSON.stringify(options)) as FromFilesOptions }
}

/**
 * A dataset made on each worker by `module#export` (a path or file URL; relative paths against the
 * driver's current directory). The export is called as `fn(options, { rank, worldSize, seed, tf })`
 * and returns an in-memory dataset (makeDataset), a file dataset (fromFiles), or a tf.data dataset
 * of { xs, ys } rows (or any async iterable of such rows) that is this rank's own part.
 */
export const datasetFactory = (ref: string | URL | { readonly module: string | URL; readonly export?: string }, options?: unknown): DatasetFactorySpec => {
  let module: string
  let exp: string | undefined
  if (ref instanceof URL) module = ref.href
  else if (typeof ref === "string") {
    const hash = ref.lastIndexOf("#")
    module = hash > 0 ? ref.slice(0, hash) : ref
    exp = hash > 0 ? ref.slice(hash + 1) : undefined
  } else if (typeof ref === "object" && ref !== null) {
    module = ref.module instanceof URL ? ref.module.href : ref.module
    exp = ref.export
  } else {
    throw new ConfigError({ field: "datasetFactory", reason: 'name a module and its export: datasetFactory("./data.ts#load", options)' })
  }
  if (typeof module !== "string" || module.length === 0) throw new ConfigError({ field: "datasetFactory", reason: 'name a module and its export: datasetFactory("./data.ts#load", options)' })
  if (/^[a-z][a-z0-9+.-]*:/i.test(module) && !module.startsWith("file:")) {
    throw new ConfigError({ field: "datasetFactory", reason: `${module}: workers import only module files on their node (a path or file: URL)` })
  }
  const url = module.startsWith("file:") ? module : pathToFileURL(path.resolve(module)).href
  try {
    JSON.stringify(options ?? null)
  } catch {
    throw new ConfigError({ field: "datasetFactory(options)", reason: "options travel to the workers as JSON: plain values only" })
  }
  return { kind: "factory", module: url, export: exp ?? "default", options: options ?? null }
}

export const isFileDatasetSpec = (v: unknown): v is FileDatasetSpec =>
  typeof v === "object" && v !== null && (v as { kind?: unknown }).kind === "files" && Array.isArray((v as { sources?: unknown }).sources)

export const isDatasetFactorySpec = (v: unknown): v is DatasetFactorySpec =>
  typeof v === "object" && v !== null && (v as { kind?: unknown }).kind === "factory" && typeof (v as { module?: unknown }).module === "string"

/** The format of a file by its name, a `.gz` after it allowed (undefined when the extension says nothing). */
export const formatOfName = (name: string): FileFormat | undefined => {
  const n = name.toLowerCase().replace(/\.gz$/, "")
  if (n.endsWith(".csv") || n.endsWith(".tsv")) return "csv"
  if (n.endsWith(".jsonl") || n.endsWith(".ndjson")) return "jsonl"
  if (n.endsWith(".gwshard")) return "shards"
  return undefined
}

/** CSV options out of the union of options (the text parser's own type). */
export const csvOptionsOf = (o: FromFilesOptions): CsvOptions & LabelOptions => {
  const { features, ...rest } = o
  return { ...rest, ...(features !== undefined ? { features: typeof features === "string" ? [features] : features } : {}) }
}

/** A glob as a regular expression over "/"-separated names: `*` and `?` stay inside a segment, `**` crosses them. */
export const globToRegExp = (glob: string): RegExp => {
  let re = ""
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!
    if (c === "*" && glob[i + 1] === "*") {
      re += ".*"
      i++
      if (glob[i + 1] === "/") i++
    } else if (c === "*") re += "[^/]*"
    else if (c === "?") re += "[^/]"
    else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&")
  }
  return new RegExp(`^${re}$`)
}

export const hasGlob = (s: string): boolean => /[*?]/.test(s)
