// The file formats of file-backed datasets, on real files: gradwire's binary shards (writeShards,
// header, row ranges read straight into typed arrays), CSV (the byte-level number parser against
// Number(), headers, label columns, quotes, class names, errors that name the line) and JSON Lines;
// and the driver's one-pass scan of a text file for its chunk offsets.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import fc from "fast-check"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { DataFormatError } from "../core/data/errors.ts"
import { decodeShard, encodeShard, readShardHeader, readShardRows, shardFileHeader, writeShardFile, writeShards } from "../core/data/shard-format.ts"
import { classIdReader, csvSchema, jsonlSchema, parseCsvRows, parseJsonlRows } from "../core/data/text-formats.ts"
import { resolveFileDataset, scanTextFile } from "../core/data/resolve.ts"
import { fromFiles } from "../core/data/file-spec.ts"

let dir: string
beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "gw-data-formats-"))
})
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true })
})

const enc = new TextEncoder()

describe("binary shards", () => {
  it("write, read the header alone, and read any row range into typed arrays", async () => {
    const rows = 37
    const x = Float32Array.from({ length: rows * 6 }, (_, i) => i * 0.5 - 3)
    const y = Int32Array.from({ length: rows }, (_, i) => i % 5)
    const file = path.join(dir, "one.gwshard")
    await writeShardFile(file, { x, y, featureShape: [2, 3], numClasses: 5 })
    const h = await shardFileHeader(file)
    expect(h).toMatchObject({ rows, featureShape: [2, 3], labelShape: [], labelDtype: "int32", numClasses: 5 })
    expect(h.xOffset % 8).toBe(0)
    const fh = await fs.open(file, "r")
    try {
      const xo = new Float32Array(10 * 6)
      const yo = new Int32Array(10)
      await readShardRows(fh, h, 20, 29, xo, yo, 1, file)
      expect([...xo.subarray(6, 60)]).toEqual([...x.subarray(20 * 6, 29 * 6)])
      expect([...yo.subarray(1)]).toEqual([...y.subarray(20, 29)])
    } finally {
      await fh.close()
    }
  })

  it("float labels with a label shape, and in-memory shards (object store parts) round-trip", () => {
    const x = Float32Array.from({ length: 8 }, (_, i) => i)
    const y = Float32Array.from({ length: 8 }, (_, i) => i / 10)
    const bytes = encodeShard({ x, y, featureShape: [2], labelShape: [2] })
    const d = decodeShard(bytes, "mem")
    expect(d.header).toMatchObject({ rows: 4, labelShape: [2], labelDtype: "float32" })
    expect([...d.x]).toEqual([...x])
    expect(d.y).toBeInstanceOf(Float32Array)
    expect([...d.y]).toEqual([...y])
    // Misaligned bytes are copied, not misread.
    const shifted = new Uint8Array(bytes.length + 1)
    shifted.set(bytes, 1)
    expect([...decodeShard(shifted.subarray(1), "mem").x]).toEqual([...x])
  })

  it("writeShards re-cuts a stream of blocks into files of rowsPerShard, in order", async () => {
    const blocks = Array.from({ length: 4 }, (_, b) => ({
      x: Float32Array.from({ length: 5 }, (_, i) => b * 5 + i),
      y: Int32Array.from({ length: 5 }, (_, i) => (b * 5 + i) % 3),
      featureShape: [1],
      numClasses: 3
    }))
    const out = path.join(dir, "cut")
    const files = await writeShards(out, blocks, { rowsPerShard: 7 })
    expect(files.map((f) => path.basename(f))).toEqual(["part-00000.gwshard", "part-00001.gwshard", "part-00002.gwshard"])
    const seen: number[] = []
    for (const f of files) {
      const d = decodeShard(new Uint8Array(await fs.readFile(f)), f)
      seen.push(...d.x)
    }
    expect(seen).toEqual(Array.from({ length: 20 }, (_, i) => i))
  })

  it("refuses a file that is not a shard, and a truncated one, naming the file", async () => {
    const junk = path.join(dir, "junk.gwshard")
    await fs.writeFile(junk, "label,x\n1,2\n")
    await expect(shardFileHeader(junk)).rejects.toThrow(DataFormatError)
    await expect(shardFileHeader(junk)).rejects.toThrow(/junk\.gwshard.*not a gradwire shard/)
    const file = path.join(dir, "cut", "part-00000.gwshard")
    const short = path.join(dir, "short.gwshard")
    const bytes = await fs.readFile(file)
    await fs.writeFile(short, bytes.subarray(0, bytes.length - 3))
    const fh = await fs.open(short, "r")
    try {
      await expect(readShardHeader(fh, short)).rejects.toThrow(/truncated/)
    } finally {
      await fh.close()
    }
  })
})

const parseCsv = (text: string, opts: Parameters<typeof csvSchema>[1] = {}, rows = 100) => {
  const lines = text.split("\n")
  const s = csvSchema(lines[0]!, opts, "t.csv")
  const body = (opts.header ?? true) ? lines.slice(1).join("\n") : text
  const xs = s.featureShape.reduce((a, b) => a * b, 1)
  const x = new Float32Array(rows * xs)
  const y = s.labelDtype === "int32" ? new Int32Array(rows * Math.max(1, s.labelShape[0] ?? 1)) : new Float32Array(rows * Math.max(1, s.labelShape[0] ?? 1))
  const n = parseCsvRows(s, enc.encode(body), x, y, 0, rows, "t.csv", 2)
  return { s, n, x: [...x.subarray(0, n * xs)], y: [...y.subarray(0, n * Math.max(1, s.labelShape[0] ?? 1))] }
}

describe("CSV", () => {
  it("parses numbers from bytes exactly as Number() does (to float32)", () => {
    const num = fc.oneof(
      fc.double({ noNaN: true, noDefaultInfinity: true, min: -1e12, max: 1e12 }).map((v) => String(v)),
      fc.double({ noNaN: true, noDefaultInfinity: true, min: -1e6, max: 1e6 }).map((v) => v.toFixed(4)),
      fc.integer({ min: -100000, max: 100000 }).map((v) => String(v)),
      fc.double({ noNaN: true, noDefaultInfinity: true, min: 1e-30, max: 1e30 }).map((v) => v.toExponential(6))
    )
    fc.assert(
      fc.property(fc.array(fc.tuple(num, num, fc.integer({ min: 0, max: 9 })), { minLength: 1, maxLength: 20 }), (rows) => {
        const text = ["a,b,label", ...rows.map(([a, b, l]) => `${a},${b},${l}`)].join("\n")
        const r = parseCsv(text)
        expect(r.n).toBe(rows.length)
        expect(r.x).toEqual(rows.flatMap(([a, b]) => [Math.fround(Number(a)), Math.fround(Number(b))]))
        expect(r.y).toEqual(rows.map(([, , l]) => l))
      }),
      { numRuns: 200 }
    )
  })

  it("finds the label column by name, skips blank lines and CRLF, reads quoted fields and class names", () => {
    const r = parseCsv('f1,target,f2\r\n1.5,2,-3\r\n\r\n"4",0," 5e1"\r\n', {}, 10)
    expect(r.s.labelColumns).toEqual([1])
    expect(r.n).toBe(2)
    expect(r.x).toEqual([1.5, -3, 4, 50])
    expect(r.y).toEqual([2, 0])
    const named = parseCsv("sepal,petal,species\n1,2,setosa\n3,4,virginica\n", { classes: ["setosa", "versicolor", "virginica"] })
    expect(named.y).toEqual([0, 2])
    expect(named.s.numClasses).toBe(3)
  })

  it("reads files without a header, regression targets and several label columns", () => {
    const r = parseCsv("1,2,3,4\n5,6,7,8\n", { header: false, label: [2, 3], labelType: "float" })
    expect(r.s.labelShape).toEqual([2])
    expect(r.x).toEqual([1, 2, 5, 6])
    expect(r.y).toEqual([3, 4, 7, 8])
    const reg = parseCsv("x,y\n1,0.25\n", { labelType: "float" })
    expect(reg.y).toEqual([0.25])
  })

  it("says which line and column is wrong, and how to fix a bad option", () => {
    expect(() => parseCsv("a,label\n1,2\nx1,3\n")).toThrow(/line 3, column 1: "x1" is not a number/)
    expect(() => parseCsv("a,label\n1,2\n1,2,3\n")).toThrow(/line 3 has 3 columns, the header 2/)
    expect(() => parseCsv("a,label\n1,2.5\n")).toThrow(/not a class id.*labelType: "float"/)
    expect(() => csvSchema("a,b", { label: "nope" }, "t.csv")).toThrow(/label column "nope" is not among its 2 columns \(a, b\)/)
    expect(() => csvSchema("a,b,c", { featureShape: [3, 3] }, "t.csv")).toThrow(DataFormatError)
  })
})

describe("JSON Lines", () => {
  it("reads nested feature arrays (shape kept), named classes and float targets", () => {
    const lines = ['{"x": [[1, 2], [3, 4]], "y": "cat"}', "", '{"x": [[5, 6], [7, 8]], "y": "dog"}']
    const s = jsonlSchema(lines[0]!, { classes: ["cat", "dog"] }, "t.jsonl")
    expect(s.featureShape).toEqual([2, 2])
    const x = new Float32Array(8)
    const y = new Int32Array(2)
    expect(parseJsonlRows(s, enc.encode(lines.join("\n")), x, y, 0, 10, "t.jsonl")).toBe(2)
    expect([...x]).toEqual([1, 2, 3, 4, 5, 6, 7, 8])
    expect([...y]).toEqual([0, 1])
    const r = jsonlSchema('{"a": 1, "b": 2, "t": [0.5, 1.5]}', { features: ["a", "b"], label: "t", labelType: "float" }, "t.jsonl")
    expect(r).toMatchObject({ featureShape: [2], labelShape: [2], labelDtype: "float32" })
    expect(() => parseJsonlRows(s, enc.encode('{"x": [1, 2], "y": "cat"}'), x, y, 0, 1, "t.jsonl", 7)).toThrow(/line 7 has 2 feature values/)
  })
})

describe("the driver's scan of a text file", () => {
  it("counts rows and records the byte offset of every chunk, across read boundaries, with a header and blank lines", async () => {
    // > 4 MiB so the scan reads it in several pieces; lines of varying length.
    const lines = ["id,v,label"]
    for (let i = 0; i < 90_000; i++) lines.push(`${i},${"7".repeat(i % 97)},${i % 3}`)
    lines.splice(500, 0, "", "\r")
    const text = lines.join("\n")
    const file = path.join(dir, "big.csv")
    await fs.writeFile(file, text)
    const scan = await scanTextFile(file, 1000, true)
    expect(scan.rows).toBe(90_000)
    expect(scan.firstLine).toBe("id,v,label")
    expect(scan.offsets).toHaveLength(91)
    expect(scan.offsets.at(-1)).toBe(Buffer.byteLength(text))
    const bytes = await fs.readFile(file)
    for (const k of [0, 1, 37, 89]) {
      const at = scan.offsets[k]!
      const line = bytes.subarray(at, bytes.indexOf(10, at)).toString()
      expect(line.split(",")[0]).toBe(String(k * 1000))
    }
    // No trailing newline, no header.
    const f2 = path.join(dir, "tail.csv")
    await fs.writeFile(f2, "1,2\n3,4\n5,6")
    expect(await scanTextFile(f2, 2, false)).toMatchObject({ rows: 3, offsets: [0, 8, 11] })
  })

  it("finds the largest class id on the way, for a row spanning two reads too, so numClasses is known before any worker reads", async () => {
    // The one row with class 41 straddles the scan's 4 MiB read boundary.
    const boundary = 4 * 1024 * 1024
    const head = "a,b,label\n"
    const lines: string[] = []
    let bytes = head.length
    const filler = "1.5,2.5,3\n"
    while (bytes + filler.length < boundary - 4) {
      lines.push(filler)
      bytes += filler.length
    }
    const pad = boundary - 4 - bytes
    lines.push(`${"9".repeat(Math.max(0, pad))},1,41\n`.slice(Math.max(0, -pad)))
    for (let i = 0; i < 1000; i++) lines.push(`0,0,${i % 7}\n`)
    const file = path.join(dir, "classes.csv")
    await fs.writeFile(file, head + lines.join(""))
    const schema = csvSchema("a,b,label", {}, file)
    const scan = await scanTextFile(file, 1000, true, classIdReader(schema))
    expect(scan.maxClass).toBe(41)
    // Without the row across the boundary the largest is 6.
    const f2 = path.join(dir, "classes2.csv")
    await fs.writeFile(f2, head + lines.filter((l) => !l.endsWith(",41\n")).join(""))
    expect((await scanTextFile(f2, 1000, true, classIdReader(schema))).maxClass).toBe(6)
    // The last row without a newline.
    const f3 = path.join(dir, "classes3.csv")
    await fs.writeFile(f3, "x,label\n1,2\n3,12")
    expect((await scanTextFile(f3, 10, true, classIdReader(csvSchema("x,label", {}, f3)))).maxClass).toBe(12)

    // Through resolveFileDataset: the count is the largest id + 1; a count given, or class names, win.
    expect((await resolveFileDataset("t", fromFiles(file))).numClasses).toBe(42)
    expect((await resolveFileDataset("t", fromFiles(file, { numClasses: 50 }))).numClasses).toBe(50)
    expect((await resolveFileDataset("t", fromFiles(file, { labelType: "float" }))).numClasses).toBe(0)
    const jl = path.join(dir, "classes.jsonl")
    await fs.writeFile(jl, ['{"x": [1, 2], "y": 3}', '{"x": [1, 2], "y": 9, "z": {"y": 77}}', '{"x": [0, 0], "y": 0}'].join("\n"))
    expect((await resolveFileDataset("t", fromFiles(jl))).numClasses).toBe(10)
    const named = path.join(dir, "named.csv")
    await fs.writeFile(named, "f,kind\n1,cat\n2,dog\n")
    expect((await resolveFileDataset("t", fromFiles(named, { classes: ["cat", "dog", "fox"] }))).numClasses).toBe(3)
  })

  it("reads a class id from a CSV line as the full parse does: any column, quotes, spaces, CR, and -1 for what is not an id", () => {
    const cell = fc.oneof(
      fc.integer({ min: 0, max: 999_999 }).map(String),
      fc.constantFrom("1.5", "-3", "", "abc", " 7 ", "\"4\"", "\"a,b\"", "1e3", "0x1")
    )
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 7 }), fc.nat(), fc.array(cell, { minLength: 7, maxLength: 7 }), fc.boolean(), (columns, which, cells, cr) => {
        const labelColumn = which % columns
        const names = Array.from({ length: columns }, (_, i) => `c${i}`)
        const schema = csvSchema(names.join(","), { label: labelColumn }, "p.csv")
        const row = cells.slice(0, columns)
        const line = row.join(",") + (cr ? "\r" : "")
        const got = classIdReader(schema)!(enc.encode(line))
        // The reference: the cell as splitCsv would give it, an id when it is digits alone.
        const split: string[] = []
        let cur = ""
        let quoted = false
        for (const ch of row.join(",")) {
          if (ch === '"') quoted = !quoted
          else if (ch === "," && !quoted) {
            split.push(cur)
            cur = ""
          } else cur += ch
        }
        split.push(cur)
        const v = split.length === columns ? split[labelColumn]!.trim() : ""
        expect(got).toBe(/^\d{1,9}$/.test(v) ? Number(v) : -1)
      }),
      { numRuns: 500 }
    )
  })

  it("takes a first line of numbers alone for a row (a headerless file) unless header is given, for every file of the dataset", async () => {
    expect(csvSchema("0,0,5.5,13,-1e-3,7", {}, "d.csv").headerLine).toBeUndefined()
    expect(csvSchema("0,0,5.5,13,-1e-3,7", {}, "d.csv").columns).toBe(6)
    expect(csvSchema("a,b,label", {}, "d.csv").headerLine).toBe("a,b,label")
    expect(csvSchema("1,2,label", {}, "d.csv").headerLine).toBe("1,2,label")
    expect(csvSchema("1,2,3", { header: true }, "d.csv").headerLine).toBe("1,2,3")
    // a label named in such a file says how it was read
    expect(() => csvSchema("1,2,3", { label: "y" }, "d.csv")).toThrow(/label column "y" is not among its 3 columns: its first line is numbers alone.*give header: true/)
    const a = path.join(dir, "headless-a.csv")
    const b = path.join(dir, "headless-b.csv")
    await fs.writeFile(a, "0.5,1,2\n0.25,3,1\n")
    await fs.writeFile(b, "9,9,0\n")
    const d = await resolveFileDataset("t", fromFiles([a, b]))
    expect(d.rows).toBe(3)
    expect(d.featureShape).toEqual([2])
    expect(d.numClasses).toBe(3)
    // "~/..." is under the home directory, as in a shell
    const home = await fs.mkdtemp(path.join(os.homedir(), ".gw-tilde-"))
    try {
      await fs.copyFile(a, path.join(home, "rows.csv"))
      expect((await resolveFileDataset("t", fromFiles(`~/${path.basename(home)}/rows.csv`))).rows).toBe(2)
      expect((await resolveFileDataset("t", fromFiles(`~/${path.basename(home)}/*.csv`))).rows).toBe(2)
    } finally {
      await fs.rm(home, { recursive: true, force: true })
    }
    // said: the first line is a header even when it is numbers
    expect((await resolveFileDataset("t", fromFiles([a, b], { header: true }))).rows).toBe(1)
  })
})

