// The two text formats of file-backed datasets: CSV (a header row naming the columns, one label
// column or several, the other columns features) and JSON Lines (one object per line, features
// under one key as a flat or nested array, or several keys of numbers). A schema is derived once
// from a file's first line(s); rows are then parsed from byte ranges that start and end at line
// boundaries, straight into the typed arrays a batch is built from. CSV numbers are parsed from the
// bytes without building strings; a line with quotes or a value that is not a plain number takes
// a slower string path.
import { DataFormatError } from "./errors.ts"
import { prod, type LabelDtype } from "./shard-format.ts"

export type TextFormat = "csv" | "jsonl"

/** Options of a CSV dataset (fromFiles(..., { format: "csv", ... })). */
export interface CsvOptions {
  /** The first line names the columns; without one, columns are 0, 1, ... Default: true, unless every cell of the first line is a number (a headerless file). */
  readonly header?: boolean
  /** Default ",". */
  readonly delimiter?: string
  /** The label column(s), by name or index. Default: a column named label, y, target or class, else the last one. */
  readonly label?: string | number | ReadonlyArray<string | number>
  /** The feature columns, by name or index. Default: every column that is not a label. */
  readonly features?: ReadonlyArray<string | number>
}

/** Options of a JSON Lines dataset. */
export interface JsonlOptions {
  /** The key holding the features (a number array, nested arrays allowed), or several keys of numbers. Default "x". */
  readonly features?: string | ReadonlyArray<string>
  /** The key holding the label (a number, a string of `classes`, or an array), or several keys. Default "y", else "label". */
  readonly label?: string | ReadonlyArray<string>
}

/** Options every text format takes. */
export interface LabelOptions {
  /** "class" (default): integer class ids (int32); "float": regression targets (float32). */
  readonly labelType?: "class" | "float"
  /** Class names: a label equal to classes[i] is class i (labels that are strings). */
  readonly classes?: ReadonlyArray<string>
  /** Number of classes (class labels); default: classes.length, else one more than the largest class id in local files (the driver's scan; give it for uploaded files). */
  readonly numClasses?: number
  /** Shape of one row's features (its product must equal the feature count). Default [count]. */
  readonly featureShape?: ReadonlyArray<number>
}

/** How to turn a line into a row: derived from the first line, the same for every chunk of a file. */
export interface TextSchema {
  readonly format: TextFormat
  readonly featureShape: ReadonlyArray<number>
  readonly labelShape: ReadonlyArray<number>
  readonly labelDtype: LabelDtype
  readonly numClasses: number
  readonly classes?: ReadonlyArray<string>
  /** CSV: the header line (undefined without one), the column count, and which columns go where. */
  readonly headerLine?: string
  readonly delimiter?: string
  readonly columns?: number
  readonly featureColumns?: ReadonlyArray<number>
  readonly labelColumns?: ReadonlyArray<number>
  /** JSON Lines: the keys. */
  readonly featureKeys?: ReadonlyArray<string>
  readonly labelKeys?: ReadonlyArray<string>
  /** JSON Lines: features are one array under featureKeys[0] (flattened), not one number per key. */
  readonly featureArray?: boolean
}

const LABEL_NAMES = ["label", "y", "target", "class"]

const fail = (source: string, reason: string): never => {
  throw new DataFormatError({ source, reason })
}

const labelSetup = (o: LabelOptions, source: string): { labelDtype: LabelDtype; numClasses: number; classes?: ReadonlyArray<string> } => {
  const labelType = o.labelType ?? "class"
  if (labelType !== "class" && labelType !== "float") fail(source, `labelType must be "class" or "float", got ${JSON.stringify(labelType)}`)
  if (o.classes !== undefined && labelType !== "class") fail(source, "classes names class labels: use it with labelType \"class\"")
  const numClasses = o.numClasses ?? o.classes?.length ?? 0
  return { labelDtype: labelType === "class" ? "int32" : "float32", numClasses, ...(o.classes ? { classes: [...o.classes] } : {}) }
}

const featureShapeOf = (o: LabelOptions, count: number, source: string): ReadonlyArray<number> => {
  const shape = o.featureShape ?? [count]
  if (prod(shape) !== count || shape.some((d) => !Number.isInteger(d) || d < 1)) {
    fail(source, `featureShape ${JSON.stringify(shape)} holds ${prod(shape)} values, but a row has ${count} features`)
  }
  return [...shape]
}

// ------------------------------------------------------------------------------------------------
// CSV

const splitCsv = (line: string, delimiter: string): string[] => {
  if (!line.includes('"')) return line.split(delimiter)
  const out: string[] = []
  let cur = ""
  let quoted = false
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!
    if (quoted) {
      if (c === '"' && line[i + 1] === '"') {
        cur += '"'
        i++
      } else if (c === '"') quoted = false
      else cur += c
    } else if (c === '"') quoted = true
    else if (line.startsWith(delimiter, i)) {
      out.push(cur)
      cur = ""
      i += delimiter.length - 1
    } else cur += c
  }
  out.push(cur)
  return out
}

/** Whether a CSV file's first line is its header where the dataset does not say (header option): any cell that is not a number. */
export const csvFirstLineIsHeader = (firstLine: string, delimiter = ","): boolean =>
  !splitCsv(firstLine.replace(/\r$/, ""), delimiter)
    .map((c) => c.trim())
    .every((c) => c !== "" && Number.isFinite(Number(c)))

/** The schema of a CSV file from its first line (the header, or the first row without one). */
export const csvSchema = (firstLine: string, o: CsvOptions & LabelOptions, source: string): TextSchema => {
  const delimiter = o.delimiter ?? ","
  if (delimiter.length === 0) fail(source, "delimiter must not be empty")
  const line = firstLine.replace(/\r$/, "")
  const cells = splitCsv(line, delimiter).map((c) => c.trim())
  // Not said: a first line of numbers alone is a row (a headerless file), any other the header.
  const header = o.header ?? csvFirstLineIsHeader(line, delimiter)
  const names = header ? cells : cells.map((_, i) => String(i))
  const col = (c: string | number, what: string): number => {
    const i = typeof c === "number" ? c : names.indexOf(c)
    if (!Number.isInteger(i) || i < 0 || i >= names.length) {
      const found = o.header === undefined && !header ? ": its first line is numbers alone, so it was read as a row of a file without a header (give header: true if it is the header), its columns 0, 1, ..." : ""
      fail(source, `${what} column ${JSON.stringify(c)} is not among its ${names.length} columns${header ? ` (${names.slice(0, 12).join(", ")}${names.length > 12 ? ", ..." : ""})` : found}`)
    }
    return i
  }
  const labelSpec = o.label === undefined ? undefined : Array.isArray(o.label) ? (o.label as ReadonlyArray<string | number>) : [o.label as string | number]
  let labelColumns: number[]
  if (labelSpec) labelColumns = labelSpec.map((c) => col(c, "label"))
  else {
    const named = header ? names.findIndex((n) => LABEL_NAMES.includes(n.toLowerCase())) : -1
    labelColumns = [named >= 0 ? named : names.length - 1]
  }
  const featureColumns = o.features ? o.features.map((c) => col(c, "feature")) : names.map((_, i) => i).filter((i) => !labelColumns.includes(i))
  if (featureColumns.length === 0) fail(source, "no feature columns: name them with features: [...]")
  const labels = labelSetup(o, source)
  if (labelColumns.length > 1 && labels.labelDtype === "int32") fail(source, `${labelColumns.length} label columns: several targets are regression targets, set labelType: "float"`)
  return {
    format: "csv",
    featureShape: featureShapeOf(o, featureColumns.length, source),
    labelShape: labelColumns.length === 1 ? [] : [labelColumns.length],
    ...labels,
    ...(header ? { headerLine: line } : {}),
    delimiter,
    columns: names.length,
    featureColumns,
    labelColumns
  }
}

// Where each column goes: >= 0 a feature slot, -1 - k the k-th label, MIN_SAFE: skipped.
const SKIP = Number.MIN_SAFE_INTEGER
const columnTargets = (s: TextSchema): Int32Array | number[] => {
  const t: number[] = new Array<number>(s.columns!).fill(SKIP)
  s.featureColumns!.forEach((c, i) => (t[c] = i))
  s.labelColumns!.forEach((c, k) => (t[c] = -1 - k))
  return t
}

const classId = (s: TextSchema, cell: string, source: string, lineNo: number): number => {
  const v = cell.trim()
  if (s.classes) {
    const i = s.classes.indexOf(v)
    if (i < 0) fail(source, `line ${lineNo}: label ${JSON.stringify(v)} is not one of classes (${s.classes.join(", ")})`)
    return i
  }
  const n = Number(v)
  if (!Number.isInteger(n) || n < 0 || v === "") {
    fail(source, `line ${lineNo}: label ${JSON.stringify(v)} is not a class id (an integer >= 0); give classes: [...] for named classes, or labelType: "float" for regression`)
  }
  return n
}

const numberCell = (cell: string, source: string, lineNo: number, column: number): number => {
  const v = cell.trim()
  const n = v === "" ? Number.NaN : Number(v)
  if (Number.isNaN(n) && !/^nan$/i.test(v)) fail(source, `line ${lineNo}, column ${column + 1}: ${JSON.stringify(v.slice(0, 40))} is not a number`)
  return n
}

/** One line the slow way (quotes, class names, odd numbers): returns false for a blank line. */
const csvLineSlow = (
  s: TextSchema,
  targets: ArrayLike<number>,
  line: string,
  xOut: Float32Array,
  yOut: Int32Array | Float32Array,
  row: number,
  source: string,
  lineNo: number
): boolean => {
  if (line.trim() === "") return false
  const cells = splitCsv(line.replace(/\r$/, ""), s.delimiter!)
  if (cells.length !== s.columns) fail(source, `line ${lineNo} has ${cells.length} columns, the header ${s.columns}`)
  const xs = prod(s.featureShape)
  const ys = prod(s.labelShape)
  for (let c = 0; c < cells.length; c++) {
    const t = targets[c]!
    if (t === SKIP) continue
    if (t >= 0) xOut[row * xs + t] = numberCell(cells[c]!, source, lineNo, c)
    else {
      const k = -1 - t
      yOut[row * ys + k] = s.labelDtype === "int32" ? classId(s, cells[c]!, source, lineNo) : numberCell(cells[c]!, source, lineNo, c)
    }
  }
  return true
}

const POW10 = Array.from({ length: 23 }, (_, i) => 10 ** i)

/**
 * Parses the lines of `bytes` (whole lines: it starts at a line start and ends at a line end or the
 * end of the file) into rows at `at`, at most `maxRows` of them; blank lines are skipped. `skipHeader`
 * drops the first line. Returns the rows parsed.
 */
export const parseCsvRows = (
  s: TextSchema,
  bytes: Uint8Array,
  xOut: Float32Array,
  yOut: Int32Array | Float32Array,
  at: number,
  maxRows: number,
  source: string,
  firstLineNo = 1,
  skipHeader = false
): number => {
  const targets = columnTargets(s)
  const delim = s.delimiter!.length === 1 ? s.delimiter!.charCodeAt(0) : -1
  const xs = prod(s.featureShape)
  const ys = prod(s.labelShape)
  const cols = s.columns!
  const intLabels = s.labelDtype === "int32"
  const named = s.classes !== undefined
  const decoder = new TextDecoder()
  let row = at
  let lineNo = firstLineNo
  let pos = 0
  const n = bytes.length
  if (skipHeader) {
    const nl = bytes.indexOf(10, 0)
    pos = nl < 0 ? n : nl + 1
    lineNo++
  }
  while (pos < n && row - at < maxRows) {
    let end = bytes.indexOf(10, pos)
    if (end < 0) end = n
    const next = end + 1
    let lineEnd = end
    if (lineEnd > pos && bytes[lineEnd - 1] === 13) lineEnd--
    if (lineEnd === pos) {
      pos = next
      lineNo++
      continue
    }
    // Fast path: plain numbers separated by a one-byte delimiter.
    let ok = delim >= 0 && !named
    let c = 0
    let i = pos
    if (ok) {
      while (c < cols) {
        // One number: [ws] [-+] digits [. digits] [e [-+] digits] [ws]
        while (i < lineEnd && (bytes[i] === 32 || bytes[i] === 9)) i++
        let neg = false
        if (bytes[i] === 45) {
          neg = true
          i++
        } else if (bytes[i] === 43) i++
        let mant = 0
        let digits = 0
        let scale = 0
        let b = bytes[i]!
        while (i < lineEnd && b >= 48 && b <= 57) {
          mant = mant * 10 + (b - 48)
          digits++
          b = bytes[++i]!
        }
        if (i < lineEnd && b === 46) {
          b = bytes[++i]!
          while (i < lineEnd && b >= 48 && b <= 57) {
            mant = mant * 10 + (b - 48)
            digits++
            scale--
            b = bytes[++i]!
          }
        }
        if (digits === 0 || digits > 15) {
          ok = false
          break
        }
        if (i < lineEnd && (b === 101 || b === 69)) {
          b = bytes[++i]!
          let eneg = false
          if (b === 45 || b === 43) {
            eneg = b === 45
            b = bytes[++i]!
          }
          let e = 0
          let ed = 0
          while (i < lineEnd && b >= 48 && b <= 57) {
            e = e * 10 + (b - 48)
            ed++
            b = bytes[++i]!
          }
          if (ed === 0) {
            ok = false
            break
          }
          scale += eneg ? -e : e
        }
        while (i < lineEnd && (bytes[i] === 32 || bytes[i] === 9)) i++
        if (scale < -22 || scale > 22) {
          ok = false
          break
        }
        // Both operands exact (mantissa < 2^53, 10^k for k <= 22): one correctly rounded operation, as Number() gives.
        const m = neg ? -mant : mant
        const value = scale >= 0 ? m * POW10[scale]! : m / POW10[-scale]!
        const t = targets[c]!
        if (t >= 0) xOut[row * xs + t] = value
        else if (t !== SKIP) {
          if (intLabels && (!Number.isInteger(value) || value < 0)) {
            ok = false
            break
          }
          yOut[row * ys + (-1 - t)] = value
        }
        c++
        if (c < cols) {
          if (i >= lineEnd || bytes[i] !== delim) {
            ok = false
            break
          }
          i++
        }
      }
      if (ok && i !== lineEnd) ok = false
    }
    if (!ok) csvLineSlow(s, targets, decoder.decode(bytes.subarray(pos, lineEnd)), xOut, yOut, row, source, lineNo)
    row++
    pos = next
    lineNo++
  }
  return row - at
}

// ------------------------------------------------------------------------------------------------
// JSON Lines

const flatten = (v: unknown, out: number[], source: string, lineNo: number): void => {
  if (typeof v === "number") out.push(v)
  else if (Array.isArray(v)) for (const e of v) flatten(e, out, source, lineNo)
  else fail(source, `line ${lineNo}: ${JSON.stringify(v)?.slice(0, 40)} is not a number or an array of numbers`)
}

const shapeOfNested = (v: unknown): number[] => (Array.isArray(v) ? [v.length, ...shapeOfNested(v[0])] : [])

const parseObject = (line: string, source: string, lineNo: number): Record<string, unknown> => {
  let o: unknown
  try {
    o = JSON.parse(line)
  } catch (e) {
    fail(source, `line ${lineNo} is not JSON: ${(e as Error).message}`)
  }
  if (typeof o !== "object" || o === null || Array.isArray(o)) fail(source, `line ${lineNo} is not a JSON object`)
  return o as Record<string, unknown>
}

/** The schema of a JSON Lines file from its first record. */
export const jsonlSchema = (firstLine: string, o: JsonlOptions & LabelOptions, source: string): TextSchema => {
  const rec = parseObject(firstLine, source, 1)
  const keys = Object.keys(rec)
  const featureKeys = o.features === undefined ? ["x"] : typeof o.features === "string" ? [o.features] : [...o.features]
  const labelKeys = o.label === undefined ? [keys.includes("y") ? "y" : "label"] : typeof o.label === "string" ? [o.label] : [...o.label]
  for (const k of [...featureKeys, ...labelKeys]) if (!(k in rec)) fail(source, `the first record has no key "${k}" (it has ${keys.join(", ")}); name the keys with features / label`)
  const featureArray = featureKeys.length === 1 && Array.isArray(rec[featureKeys[0]!])
  const featureCount = featureArray ? (() => { const a: number[] = []; flatten(rec[featureKeys[0]!], a, source, 1); return a.length })() : featureKeys.length
  const labels = labelSetup(o, source)
  let labelShape: number[] = []
  if (labelKeys.length > 1) labelShape = [labelKeys.length]
  else if (Array.isArray(rec[labelKeys[0]!])) labelShape = shapeOfNested(rec[labelKeys[0]!])
  if (labelShape.length > 0 && labels.labelDtype === "int32") fail(source, `the label "${labelKeys.join(", ")}" holds several values: set labelType: "float" (regression or one-hot targets)`)
  const nested = featureArray ? shapeOfNested(rec[featureKeys[0]!]) : [featureCount]
  return {
    format: "jsonl",
    featureShape: o.featureShape ? featureShapeOf(o, featureCount, source) : prod(nested) === featureCount ? nested : [featureCount],
    labelShape,
    ...labels,
    featureKeys,
    labelKeys,
    featureArray
  }
}

/** Parses JSON Lines rows from whole lines of `bytes`, as parseCsvRows. */
export const parseJsonlRows = (
  s: TextSchema,
  bytes: Uint8Array,
  xOut: Float32Array,
  yOut: Int32Array | Float32Array,
  at: number,
  maxRows: number,
  source: string,
  firstLineNo = 1
): number => {
  const xs = prod(s.featureShape)
  const ys = prod(s.labelShape)
  const decoder = new TextDecoder()
  const vals: number[] = []
  let row = at
  let lineNo = firstLineNo
  let pos = 0
  while (pos < bytes.length && row - at < maxRows) {
    let end = bytes.indexOf(10, pos)
    if (end < 0) end = bytes.length
    const line = decoder.decode(bytes.subarray(pos, end)).trim()
    pos = end + 1
    if (line === "") {
      lineNo++
      continue
    }
    const rec = parseObject(line, source, lineNo)
    vals.length = 0
    if (s.featureArray) flatten(rec[s.featureKeys![0]!], vals, source, lineNo)
    else for (const k of s.featureKeys!) flatten(rec[k], vals, source, lineNo)
    if (vals.length !== xs) fail(source, `line ${lineNo} has ${vals.length} feature values, the first record ${xs}`)
    for (let j = 0; j < xs; j++) xOut[row * xs + j] = vals[j]!
    vals.length = 0
    for (const k of s.labelKeys!) {
      const v = rec[k]
      if (s.labelDtype === "int32") {
        if (typeof v === "string" && s.classes) {
          const id = s.classes.indexOf(v)
          if (id < 0) fail(source, `line ${lineNo}: label ${JSON.stringify(v)} is not one of classes (${s.classes.join(", ")})`)
          vals.push(id)
        } else if (typeof v === "number" && Number.isInteger(v) && v >= 0) vals.push(v)
        else fail(source, `line ${lineNo}: label ${JSON.stringify(v)} is not a class id (an integer >= 0); give classes: [...] for named classes, or labelType: "float"`)
      } else flatten(v, vals, source, lineNo)
    }
    if (vals.length !== ys) fail(source, `line ${lineNo} has ${vals.length} label values, the first record ${ys}`)
    for (let j = 0; j < ys; j++) yOut[row * ys + j] = vals[j]!
    row++
    lineNo++
  }
  return row - at
}

/** Rows of a text chunk (whole lines) into the arrays, whichever the format. */
export const parseTextRows = (
  s: TextSchema,
  bytes: Uint8Array,
  xOut: Float32Array,
  yOut: Int32Array | Float32Array,
  at: number,
  maxRows: number,
  source: string,
  firstLineNo = 1
): number =>
  s.format === "csv" ? parseCsvRows(s, bytes, xOut, yOut, at, maxRows, source, firstLineNo) : parseJsonlRows(s, bytes, xOut, yOut, at, maxRows, source, firstLineNo)

// ------------------------------------------------------------------------------------------------
// Class ids at the driver's scan

/**
 * Reads one row's class id from its line's bytes, for a schema with one class-id label and no
 * class names (the ids themselves): the driver's scan takes the largest, so a dataset's numClasses
 * is known before any worker reads it. -1 for a line whose label is not a plain id (the workers'
 * parse reports it, with its line). Undefined when the schema's labels are not such ids.
 */
export const classIdReader = (s: TextSchema): ((line: Uint8Array) => number) | undefined => {
  if (s.labelDtype !== "int32" || s.classes !== undefined || prod(s.labelShape) !== 1) return undefined
  const decoder = new TextDecoder()
  const plainId = (v: string): number => {
    const t = v.trim()
    return /^\d+$/.test(t) ? Number(t) : -1
  }
  if (s.format === "jsonl") {
    const key = s.labelKeys?.[0]
    if (key === undefined) return undefined
    return (line) => {
      let rec: unknown
      try {
        rec = JSON.parse(decoder.decode(line))
      } catch {
        return -1
      }
      const v = (rec as Record<string, unknown> | null)?.[key]
      return typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : -1
    }
  }
  const delimiter = s.delimiter ?? ","
  const column = s.labelColumns?.[0]
  const columns = s.columns
  if (column === undefined || columns === undefined) return undefined
  const single = delimiter.length === 1 && delimiter.charCodeAt(0) < 128 ? delimiter.charCodeAt(0) : -1
  return (line) => {
    let end = line.length
    if (end > 0 && line[end - 1] === 13) end--
    if (single < 0 || line.indexOf(34) >= 0) {
      const cells = splitCsv(decoder.decode(line.subarray(0, end)), delimiter)
      return cells.length === columns ? plainId(cells[column]!) : -1
    }
    // The label's cell found by counting delimiters from the nearer end of the line.
    let a = 0
    let b = end
    if (column < columns / 2) {
      let seen = 0
      let i = 0
      for (; i < end && seen < column; i++) if (line[i] === single) seen++
      if (seen < column) return -1
      a = i
      b = line.indexOf(single, a)
      if (b < 0 || b > end) b = end
    } else {
      let seen = 0
      const want = columns - 1 - column
      let i = end - 1
      for (; i >= 0 && seen < want; i--) if (line[i] === single) seen++
      if (seen < want) return -1
      b = want === 0 ? end : i + 1
      a = line.lastIndexOf(single, b - 1) + 1
    }
    let n = 0
    let digits = 0
    for (let i = a; i < b; i++) {
      const c = line[i]!
      if (c >= 48 && c <= 57) {
        n = n * 10 + (c - 48)
        digits++
        if (digits > 9) return -1
      } else if (c === 32 || c === 9) {
        if (digits > 0) {
          for (let j = i; j < b; j++) if (line[j] !== 32 && line[j] !== 9) return -1
          break
        }
      } else return -1
    }
    return digits > 0 ? n : -1
  }
}
