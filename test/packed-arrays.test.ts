// Decoded shapes reach tfjs as V8's packed arrays (core/wire.ts packedArray). msgpack decoding
// makes every array "holey" (new Array(n), then filled); a holey shape beside tfjs's own packed
// ones makes the functions reading shapes meet two kinds of arrays, and their optimized code is
// thrown away as a worker takes a peer's state. Checked in a child process with V8's
// %HasHoleyElements, against the decoded array itself, which must be holey for the check to mean
// anything.
import { execFileSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"

const ROOT = fileURLToPath(new URL("../", import.meta.url))

const CHILD = `
  import { decodeMessage, encodeMessage, packedArray } from "./core/wire.ts"
  import { optimizerToFile, readOptimizerFile } from "./core/model-io.ts"
  import { makeDataset } from "./core/datasets.ts"
  const holey = (a) => %HasHoleyElements(a)
  const decoded = decodeMessage(encodeMessage({ shape: [64, 256], labels: [3] }))
  const ds = makeDataset(new Float32Array(64 * 256 * 2), new Float32Array(6), decoded.shape, { labelShape: decoded.labels })
  // optimizerToFile needs only getWeights and getClassName of the optimizer
  const tensor = (shape, data) => ({ shape, dtype: "float32", isDisposed: false, data: async () => data, dispose() {} })
  const opt = { getClassName: () => "Adam", getWeights: async () => [{ name: "dense/kernel/m", tensor: tensor([64, 256], new Float32Array(64 * 256)) }] }
  const saved = await readOptimizerFile(await optimizerToFile(opt), "Adam")
  console.log(JSON.stringify({
    decoded: holey(decoded.shape),
    packedArray: holey(packedArray(decoded.shape)),
    values: packedArray(decoded.shape),
    featureShape: holey(ds.featureShape),
    labelShape: holey(ds.labelShape),
    optimizerShape: holey(saved[0].shape),
    optimizerValues: saved[0].shape
  }))`

describe("decoded shapes as packed arrays", () => {
  it("a dataset's row shapes and an optimizer state's shapes are packed, where the decoded arrays are holey", () => {
    const out = execFileSync(process.execPath, ["--allow-natives-syntax", "--input-type=module", "-e", CHILD], { cwd: ROOT, encoding: "utf8", timeout: 60_000 })
    const r = JSON.parse(out.trim().split("\n").pop()!) as Record<string, unknown>
    expect(r.decoded).toBe(true)
    expect(r).toMatchObject({ packedArray: false, featureShape: false, labelShape: false, optimizerShape: false })
    expect(r.values).toEqual([64, 256])
    expect(r.optimizerValues).toEqual([64, 256])
  })
})
