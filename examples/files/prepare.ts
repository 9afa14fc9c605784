// Writes the digits data (examples/data/digits.csv.gz, CC BY 4.0: see examples/data/README.md) as
// dataset files the way a larger dataset would arrive: the training rows split over several CSV
// files with a header row (or, with format "shards", gradwire's binary .gwshard files written by
// writeShards), and the held-out rows in one file of their own.
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { loadDigits, trainTestSplit, writeShards } from "../../index.ts"

export interface Prepared {
  /** Where the training files are, and the held-out file. */
  readonly train: string
  readonly test: string
  readonly files: ReadonlyArray<string>
}

const csv = (x: Float32Array, y: Int32Array | Float32Array, from: number, to: number): string => {
  const lines = [[...Array.from({ length: 64 }, (_, j) => `p${j}`), "label"].join(",")]
  // The raw 0..16 pixel counts, as the original file holds them (the loop scales them).
  for (let i = from; i < to; i++) lines.push([...Array.from(x.subarray(i * 64, i * 64 + 64), (v) => Math.round(v * 16)), y[i]].join(","))
  return lines.join("\n") + "\n"
}

export const prepareDigitsFiles = async (dir: string, format: "csv" | "shards", parts = 4): Promise<Prepared> => {
  const { train, test } = trainTestSplit(await loadDigits(), 0.2, 2024)
  const trainDir = path.join(dir, "train")
  await fs.mkdir(trainDir, { recursive: true })
  const files: string[] = []
  if (format === "csv") {
    const per = Math.ceil(train.size / parts)
    for (let k = 0; k < parts; k++) {
      const f = path.join(trainDir, `digits-${k}.csv`)
      await fs.writeFile(f, csv(train.x, train.y, k * per, Math.min(train.size, (k + 1) * per)))
      files.push(f)
    }
  } else {
    // Pixel counts as in the CSV files, so one loop serves both.
    const x = train.x.map((v) => Math.round(v * 16))
    files.push(...(await writeShards(trainDir, { x, y: train.y, featureShape: [64], numClasses: 10 }, { rowsPerShard: Math.ceil(train.size / parts), prefix: "digits" })))
  }
  const testFile = path.join(dir, "test.csv")
  await fs.writeFile(testFile, csv(test.x, test.y, 0, test.size))
  return { train: trainDir, test: testFile, files }
}
