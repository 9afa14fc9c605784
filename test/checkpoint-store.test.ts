import { afterEach, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { CheckpointStore, indexJson, readCheckpoint } from "../actors/train/driver/checkpoint-store.ts"
import { ConfigError } from "../core/errors.ts"

const dirs: string[] = []
const tmp = async () => {
  const d = await fs.mkdtemp(path.join(os.tmpdir(), "gw-ckpt-"))
  dirs.push(d)
  return d
}
afterEach(async () => {
  for (const d of dirs.splice(0)) await fs.rm(d, { recursive: true, force: true })
})

const bytes = (s: string) => new TextEncoder().encode(s)

describe("checkpoint store", () => {
  it("saves, reads back and indexes checkpoints", async () => {
    const dir = await tmp()
    const store = await CheckpointStore.open(dir)
    const e = await store.save({ files: { "model.json": bytes("{}"), "sub/w.bin": new Uint8Array([1, 2, 3]) }, metadata: { epoch: 1 } }, { loss: 0.5 })
    expect(e.name).toBe("checkpoint_000000")
    const back = await readCheckpoint(e.path)
    expect([...back.files["sub/w.bin"]]).toEqual([1, 2, 3])
    expect(back.metadata).toEqual({ epoch: 1 })
    expect(back.metrics).toEqual({ loss: 0.5 })
    const reopened = await CheckpointStore.open(dir)
    expect(reopened.latest()?.name).toBe("checkpoint_000000")
    const e2 = await reopened.save({ files: {}, metadata: {} }, {})
    expect(e2.index).toBe(1)
    // its metadata alone, its files unread
    expect(await reopened.metadataOf(e.path)).toEqual({ epoch: 1 })
    // a path that is not a checkpoint, and one that does not exist, say which
    await expect(readCheckpoint(dir)).rejects.toThrow(/is not a gradwire checkpoint \(no gradwire_checkpoint\.json\)/)
    await expect(readCheckpoint(path.join(dir, "nope"))).rejects.toThrow(/nope does not exist; pass a checkpoint_NNNNNN directory/)
  })

  it("writes its index with one entry per line, each as it was saved, pruned ones gone", async () => {
    const dir = await tmp()
    // The best two by score and the latest are kept.
    const store = await CheckpointStore.open(dir, { numToKeep: 2, scoreAttribute: "acc", scoreOrder: "max" })
    for (const acc of [0.5, 0.9, 0.7, 0.8, 0.6]) await store.save({ files: {}, metadata: {} }, { acc, note: `acc ${acc}` })
    const text = await fs.readFile(path.join(dir, "checkpoints.json"), "utf8")
    const parsed = JSON.parse(text) as { entries: Array<Record<string, unknown>> }
    expect(parsed.entries).toEqual(store.list().map(({ path: _p, ...rest }) => rest))
    expect(parsed.entries.map((e) => (e.metrics as { acc: number }).acc)).toEqual([0.9, 0.8, 0.6])
    const lines = text.split("\n").filter((l) => l.trim().startsWith("{\"name\""))
    expect(lines).toHaveLength(3)
    // Read back by a new store (and an empty one written) as before.
    expect((await CheckpointStore.open(dir)).list().map((e) => e.index)).toEqual(store.list().map((e) => e.index))
    const empty = await tmp()
    await fs.writeFile(path.join(empty, "checkpoints.json"), indexJson([]))
    expect(JSON.parse(await fs.readFile(path.join(empty, "checkpoints.json"), "utf8"))).toEqual({ entries: [] })
  })

  it("keeps the best numToKeep by score, and always the latest", async () => {
    const dir = await tmp()
    const store = await CheckpointStore.open(dir, { numToKeep: 2, scoreAttribute: "acc", scoreOrder: "max" })
    for (const acc of [0.5, 0.9, 0.7, 0.8, 0.6]) await store.save({ files: {}, metadata: {} }, { acc })
    const names = store.list().map((e) => e.metrics.acc).sort()
    // best two (0.9, 0.8) plus the latest (0.6)
    expect(names).toEqual([0.6, 0.8, 0.9])
    expect(store.best()[0].metrics.acc).toBe(0.9)
    const onDisk = (await fs.readdir(dir)).filter((n) => n.startsWith("checkpoint_")).length
    expect(onDisk).toBe(3)
  })

  it("min order and no score attribute keep the newest", async () => {
    const dir = await tmp()
    const store = await CheckpointStore.open(dir, { numToKeep: 1 })
    for (let i = 0; i < 3; i++) await store.save({ files: {}, metadata: { i } }, {})
    expect(store.list().map((e) => e.index)).toEqual([2])
    const s2 = await CheckpointStore.open(await tmp(), { numToKeep: 1, scoreAttribute: "loss", scoreOrder: "min" })
    await s2.save({ files: {}, metadata: {} }, { loss: 0.1 })
    await s2.save({ files: {}, metadata: {} }, { loss: 0.3 })
    expect(s2.best()[0].metrics.loss).toBe(0.1)
  })

  it("ignores an interrupted write and rejects unsafe file names", async () => {
    const dir = await tmp()
    await fs.mkdir(path.join(dir, ".tmp-checkpoint_000000-dead"), { recursive: true })
    const store = await CheckpointStore.open(dir)
    expect(store.latest()).toBeUndefined()
    expect((await fs.readdir(dir)).some((n) => n.startsWith(".tmp"))).toBe(false)
    await expect(store.save({ files: { "../escape": bytes("x") }, metadata: {} }, {})).rejects.toBeInstanceOf(ConfigError)
    expect((await fs.readdir(dir)).filter((n) => n.startsWith("checkpoint_") || n.startsWith(".tmp"))).toEqual([])
    await expect(readCheckpoint(dir)).rejects.toBeInstanceOf(ConfigError)
  })
})
