// TensorBoard event files: CRC-32C against its published check values (RFC 3720's iSCSI vectors and
// the catalogue's "123456789"), TFRecord framing read back (and a flipped byte caught), the Event
// protobuf's bytes for a known event, and a run directory's event file as the recorder writes it.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it, vi } from "vitest"
import {
  TensorBoardWriter,
  crc32c,
  decodeEvent,
  fileVersionEvent,
  maskedCrc32c,
  readTfRecords,
  restartEvent,
  scalarsEvent,
  tfRecord
} from "../actors/train/common/observe/tensorboard.ts"
import { RunRecorder } from "../actors/train/common/observe/run-recorder.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-tb-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

describe("TensorBoard event files", () => {
  it("computes CRC-32C (Castagnoli) as published", () => {
    expect(crc32c(new TextEncoder().encode("123456789"))).toBe(0xe3069283)
    expect(crc32c(new Uint8Array(32))).toBe(0x8a9136aa)
    expect(crc32c(new Uint8Array(32).fill(0xff))).toBe(0x62a8ab43)
    expect(crc32c(Uint8Array.from({ length: 32 }, (_, i) => i))).toBe(0x46dd794e)
    expect(crc32c(Uint8Array.from({ length: 32 }, (_, i) => 31 - i))).toBe(0x113fdb5c)
    expect(crc32c(new Uint8Array(0))).toBe(0)
  })

  it("masks the CRC as TFRecord does: rotated right by 15, plus 0xa282ead8", () => {
    const bytes = new TextEncoder().encode("123456789")
    const crc = 0xe3069283
    expect(maskedCrc32c(bytes)).toBe(((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0)
  })

  it("frames records that read back, and refuses a flipped byte or a torn end", () => {
    const a = new TextEncoder().encode("first record")
    const b = new Uint8Array(1000).map((_, i) => i % 251)
    const file = new Uint8Array([...tfRecord(a), ...tfRecord(b), ...tfRecord(new Uint8Array(0))])
    expect(file.length).toBe(3 * 16 + a.length + b.length)
    // The length is a little-endian uint64.
    expect(new DataView(file.buffer).getBigUint64(0, true)).toBe(BigInt(a.length))
    const back = readTfRecords(file)
    expect(back.map((r) => [...r])).toEqual([[...a], [...b], []])
    const flipped = file.slice()
    flipped[20] ^= 0x01
    expect(() => readTfRecords(flipped)).toThrow(/bad data CRC/)
    const badLength = file.slice()
    badLength[0] ^= 0x01
    expect(() => readTfRecords(badLength)).toThrow(/bad length CRC/)
    expect(() => readTfRecords(file.subarray(0, file.length - 3))).toThrow(/truncated/)
  })

  it("encodes the Event protobuf's fields", () => {
    // wall_time 1.5 (field 1, fixed64), file_version "brain.Event:2" (field 3, length-delimited)
    expect([...fileVersionEvent(1.5)]).toEqual([0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x1a, 13, ...new TextEncoder().encode("brain.Event:2")])
    // step 300 (field 2, varint 0xac 0x02); summary (field 5) with value { tag "a" (1), simple_value 0.5 (2, fixed32) }
    const ev = scalarsEvent(2, 300, [["a", 0.5]])
    expect([...ev]).toEqual([0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 0xac, 0x02, 0x2a, 10, 0x0a, 8, 0x0a, 1, 0x61, 0x15, 0, 0, 0, 0x3f])
    expect(decodeEvent(ev)).toEqual({ wallTime: 2, step: 300, scalars: [{ tag: "a", value: 0.5 }] })
    expect(decodeEvent(fileVersionEvent(3)).fileVersion).toBe("brain.Event:2")
    // step 7; session_log (field 7, length-delimited) { status START (field 1, varint 1) }: TensorBoard's restart mark
    const restart = restartEvent(2, 7)
    expect([...restart]).toEqual([0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 7, 0x3a, 2, 0x08, 1])
    expect(decodeEvent(restart)).toEqual({ wallTime: 2, step: 7, sessionStatus: 1, scalars: [] })
  })

  it("writes a run's report rounds as scalars next to metrics.jsonl", async () => {
    const runDir = path.join(dir, "run")
    const rec = await RunRecorder.open(runDir, {}, false)
    rec.stepTimes(0, 0, [[0, 4, 2, 1, 3], [1, 4, 2, 1, 3]])
    rec.metrics(0, { epoch: 0, loss: 1.25, accuracy: 0.5, weights: "abc" }, [{ loss: 1.25 }, { loss: 1.25 }])
    rec.metrics(1, { epoch: 1, loss: 0.75, "val loss": 0.5 }, [{ loss: 0.75 }])
    await rec.close()
    const files = fs.readdirSync(runDir).filter((f) => f.includes("tfevents"))
    expect(files).toHaveLength(1)
    expect(files[0]).toMatch(/^events\.out\.tfevents\.\d+\./)
    expect(rec.tensorboardFile).toBe(path.join(runDir, files[0]))
    const events = readTfRecords(new Uint8Array(fs.readFileSync(path.join(runDir, files[0])))).map(decodeEvent)
    expect(events[0].fileVersion).toBe("brain.Event:2")
    const scalars = events.slice(1).flatMap((e) => e.scalars.map((s) => ({ step: e.step, ...s })))
    expect(scalars).toContainEqual({ step: 0, tag: "loss", value: 1.25 })
    expect(scalars).toContainEqual({ step: 0, tag: "accuracy", value: 0.5 })
    expect(scalars).toContainEqual({ step: 1, tag: "val_loss", value: 0.5 })
    expect(scalars).toContainEqual({ step: 0, tag: "gradwire/step_ms/compute", value: 5 })
    expect(scalars).toContainEqual({ step: 0, tag: "gradwire/step_ms/waiting", value: 3 })
    expect(scalars).toContainEqual({ step: 1, tag: "gradwire/world_size", value: 1 })
    // Strings are not scalars.
    expect(scalars.some((s) => s.tag === "weights")).toBe(false)
    // Writing after close loses nothing and throws nothing.
    new TensorBoardWriter(runDir).close()
  })

  it("gradwire/samples_per_sec is every rank's samples between two report rounds over the time between them", async () => {
    vi.useFakeTimers({ toFake: ["Date"] })
    try {
      const runDir = path.join(dir, "rates")
      const rec = await RunRecorder.open(runDir, {}, false)
      const t0 = Date.now()
      // two ranks, 100 samples/s each, then a 1 s pause (an evaluation) before the round
      for (let i = 0; i <= 10; i++) for (const rank of [0, 1]) rec.progress(rank, i * 10, t0 + i * 100)
      vi.setSystemTime(t0 + 2_000)
      rec.metrics(0, { loss: 1 }, [{ loss: 1 }, { loss: 1 }])
      // rank 1 restarts (its count drops to 0): its new process's samples count from 0
      for (let i = 1; i <= 10; i++) {
        rec.progress(0, 100 + i * 10, t0 + 2_000 + i * 100)
        rec.progress(1, i * 10, t0 + 2_000 + i * 100)
      }
      vi.setSystemTime(t0 + 3_000)
      rec.metrics(1, { loss: 0.5 }, [{ loss: 0.5 }, { loss: 0.5 }])
      await rec.close()
      const file = fs.readdirSync(runDir).find((f) => f.includes("tfevents"))!
      const rates = readTfRecords(new Uint8Array(fs.readFileSync(path.join(runDir, file))))
        .map(decodeEvent)
        .flatMap((e) => e.scalars.filter((x) => x.tag === "gradwire/samples_per_sec").map((x) => [e.step, x.value]))
      // round 0: 200 samples over the 2 s since the first progress; round 1: 200 over 1 s
      expect(rates).toEqual([
        [0, 100],
        [1, 200]
      ])
    } finally {
      vi.useRealTimers()
    }
  })
})
