// The chaos benchmark's position files (test/support/positions.ts): what a worker writes after each
// step is read back as the same point, a rewrite in place leaves no trace of the longer line it
// replaced, and a line whose numbers do not add up to its checksum (a read overlapping a write) is skipped.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { PositionFile, readPositions } from "./support/positions.ts"

describe("position files", () => {
  let dir: string | undefined
  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  it("reads back the last step written, with the first step of its attempt", () => {
    dir = mkdtempSync(path.join(os.tmpdir(), "gw-pos-"))
    const f = new PositionFile(dir)
    f.step(0, 1, 12, 1234, 1500) // a long line first...
    f.step(1, 0, 3, 4, 15) // ...then a new attempt with a shorter one, written over it in place
    f.step(1, 0, 3, 5, 15)
    f.close()
    const [p, ...rest] = readPositions(dir)
    expect(rest).toEqual([])
    expect(p).toMatchObject({ pid: process.pid, attempt: 1, rank: 0, stepsPerEpoch: 15, doneAt: { epoch: 3, step: 6 }, firstAt: { epoch: 3, step: 4 } })
    expect(p!.done).toBeCloseTo(3 + 6 / 15)
  })

  it("skips a line whose checksum does not match (a torn read) and one that is not a position", () => {
    dir = mkdtempSync(path.join(os.tmpdir(), "gw-pos-"))
    writeFileSync(path.join(dir, "101.pos"), "1 0 3 5 15 3 4 31") // sum is 31: kept
    writeFileSync(path.join(dir, "102.pos"), "1 0 3 9 15 3 4 31") // a digit from another write: skipped
    writeFileSync(path.join(dir, "103.pos"), "1 0 3 5 15 3 4") // no checksum: skipped
    writeFileSync(path.join(dir, "notes.txt"), "1 0 3 5 15 3 4 31")
    expect(readPositions(dir).map((p) => p.pid)).toEqual([101])
  })
})
