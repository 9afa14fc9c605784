// TensorBoard scalars in the run directory, so `tensorboard --logdir <storagePath>` shows every run:
// an event file (events.out.tfevents.<seconds>.<host>) of TFRecord records, each one a serialized
// tensorflow.Event protobuf. No maintained JavaScript writer exists, and the format is small:
//   TFRecord: uint64 length, uint32 masked CRC32C of the length, the bytes, uint32 masked CRC32C
//   of the bytes (little-endian; mask = rotate right by 15, plus 0xa282ead8).
//   Event: wall_time (1, double), step (2, int64), file_version (3, string) | summary (5, Summary)
//   | session_log (7, SessionLog).
//   Summary: value (1, repeated Value); Value: tag (1, string), simple_value (2, float).
//   SessionLog: status (1, enum; START = 1). TensorBoard drops the points of a run at that step
//   and later when it reads a START (a restart makes those steps again): PyTorch's
//   SummaryWriter(purge_step=N) writes the same event.
// The first record says file_version "brain.Event:2", as TensorFlow's writers do. The reader here
// (readTfRecords, decodeEvent) is what the tests check the writer with.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"

const CRC32C_TABLE = (() => {
  const t = new Uint32Array(256)
  for (let i = 0; i < 256; i++) {
    let c = i
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1
    t[i] = c >>> 0
  }
  return t
})()

/** CRC-32C (Castagnoli), as TFRecord and iSCSI use it. */
export const crc32c = (bytes: Uint8Array): number => {
  let crc = 0xffffffff
  for (let i = 0; i < bytes.length; i++) crc = CRC32C_TABLE[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8)
  return (crc ^ 0xffffffff) >>> 0
}

/** TFRecord's masked CRC: stored CRCs of CRCs would be weak, so the stored one is rotated and offset. */
export const maskedCrc32c = (bytes: Uint8Array): number => {
  const crc = crc32c(bytes)
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0
}

/** One TFRecord: length, its masked CRC, the data, the data's masked CRC. */
export const tfRecord = (data: Uint8Array): Uint8Array => {
  const out = new Uint8Array(12 + data.length + 4)
  const view = new DataView(out.buffer)
  view.setBigUint64(0, BigInt(data.length), true)
  view.setUint32(8, maskedCrc32c(out.subarray(0, 8)), true)
  out.set(data, 12)
  view.setUint32(12 + data.length, maskedCrc32c(data), true)
  return out
}

/** The records of a TFRecord file; throws on a bad length or CRC (a torn last record included). */
export const readTfRecords = (bytes: Uint8Array): Uint8Array[] => {
  const out: Uint8Array[] = []
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  let at = 0
  while (at < bytes.length) {
    if (at + 12 > bytes.length) throw new Error(`truncated record header at byte ${at}`)
    const len = Number(view.getBigUint64(at, true))
    if (view.getUint32(at + 8, true) !== maskedCrc32c(bytes.subarray(at, at + 8))) throw new Error(`bad length CRC at byte ${at}`)
    if (at + 12 + len + 4 > bytes.length) throw new Error(`truncated record at byte ${at}`)
    const data = bytes.subarray(at + 12, at + 12 + len)
    if (view.getUint32(at + 12 + len, true) !== maskedCrc32c(data)) throw new Error(`bad data CRC at byte ${at}`)
    out.push(data)
    at += 12 + len + 4
  }
  return out
}

// Protobuf: just the wire types used here.
const varint = (n: number | bigint): number[] => {
  let v = BigInt(n)
  if (v < 0n) v = BigInt.asUintN(64, v)
  const out: number[] = []
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80)
    v >>= 7n
  }
  out.push(Number(v))
  return out
}
const utf8 = new TextEncoder()
const key = (field: number, wire: number): number[] => varint((field << 3) | wire)
const lengthDelimited = (field: number, bytes: Uint8Array | number[]): number[] => [...key(field, 2), ...varint(bytes.length), ...bytes]
const double = (field: number, v: number): number[] => {
  const b = new Uint8Array(8)
  new DataView(b.buffer).setFloat64(0, v, true)
  return [...key(field, 1), ...b]
}
const float = (field: number, v: number): number[] => {
  const b = new Uint8Array(4)
  new DataView(b.buffer).setFloat32(0, v, true)
  return [...key(field, 5), ...b]
}

/** A serialized Event holding file_version. */
export const fileVersionEvent = (wallTime: number): Uint8Array => new Uint8Array([...double(1, wallTime), ...lengthDelimited(3, utf8.encode("brain.Event:2"))])

/** A serialized Event with one Summary of scalars (tag, simple_value) at `step`. */
export const scalarsEvent = (wallTime: number, step: number, scalars: ReadonlyArray<readonly [string, number]>): Uint8Array => {
  const values = scalars.flatMap(([tag, v]) => lengthDelimited(1, [...lengthDelimited(1, utf8.encode(tag)), ...float(2, v)]))
  return new Uint8Array([...double(1, wallTime), ...key(2, 0), ...varint(Math.max(0, Math.trunc(step))), ...lengthDelimited(5, values)])
}

/** A serialized Event holding SessionLog START at `step`: TensorBoard drops the run's points at `step` and later read before it. */
export const restartEvent = (wallTime: number, step: number): Uint8Array =>
  new Uint8Array([...double(1, wallTime), ...key(2, 0), ...varint(Math.max(0, Math.trunc(step))), ...lengthDelimited(7, [...key(1, 0), ...varint(1)])])

export interface DecodedEvent {
  wallTime: number
  step: number
  fileVersion?: string
  /** SessionLog's status (1 = START), when the event holds one. */
  sessionStatus?: number
  scalars: Array<{ tag: string; value: number }>
}

/** Decodes the fields of an Event this module writes (others are skipped by wire type). */
export const decodeEvent = (bytes: Uint8Array): DecodedEvent => {
  const text = new TextDecoder()
  const fields = (b: Uint8Array): Array<{ field: number; wire: number; value: bigint | Uint8Array | number }> => {
    const out: Array<{ field: number; wire: number; value: bigint | Uint8Array | number }> = []
    const view = new DataView(b.buffer, b.byteOffset, b.byteLength)
    let at = 0
    const readVarint = (): bigint => {
      let v = 0n
      let shift = 0n
      for (;;) {
        const byte = b[at++]
        if (byte === undefined) throw new Error("truncated varint")
        v |= BigInt(byte & 0x7f) << shift
        if (!(byte & 0x80)) return v
        shift += 7n
      }
    }
    while (at < b.length) {
      const k = Number(readVarint())
      const field = k >>> 3
      const wire = k & 7
      if (wire === 0) out.push({ field, wire, value: readVarint() })
      else if (wire === 1) {
        out.push({ field, wire, value: view.getFloat64(at, true) })
        at += 8
      } else if (wire === 5) {
        out.push({ field, wire, value: view.getFloat32(at, true) })
        at += 4
      } else if (wire === 2) {
        const len = Number(readVarint())
        out.push({ field, wire, value: b.subarray(at, at + len) })
        at += len
      } else throw new Error(`unsupported wire type ${wire}`)
    }
    return out
  }
  const ev: DecodedEvent = { wallTime: 0, step: 0, scalars: [] }
  for (const f of fields(bytes)) {
    if (f.field === 1 && f.wire === 1) ev.wallTime = f.value as number
    else if (f.field === 2 && f.wire === 0) ev.step = Number(f.value)
    else if (f.field === 3 && f.wire === 2) ev.fileVersion = text.decode(f.value as Uint8Array)
    else if (f.field === 7 && f.wire === 2) {
      for (const x of fields(f.value as Uint8Array)) if (x.field === 1 && x.wire === 0) ev.sessionStatus = Number(x.value)
    }
    else if (f.field === 5 && f.wire === 2) {
      for (const v of fields(f.value as Uint8Array)) {
        if (v.field !== 1 || v.wire !== 2) continue
        let tag = ""
        let value = NaN
        for (const x of fields(v.value as Uint8Array)) {
          if (x.field === 1 && x.wire === 2) tag = text.decode(x.value as Uint8Array)
          else if (x.field === 2 && x.wire === 5) value = x.value as number
        }
        ev.scalars.push({ tag, value })
      }
    }
  }
  return ev
}

/** TensorBoard's tags: letters, digits, and . _ - / (anything else becomes "_"). */
const tagOf = (name: string): string => name.replace(/[^A-Za-z0-9._/-]/g, "_") || "_"

/** Appends scalar events to one event file of a run directory (synchronously: a record is never torn by a crash in between). */
export class TensorBoardWriter {
  readonly file: string
  #fd: number | undefined

  constructor(dir: string, now = Date.now()) {
    this.file = path.join(dir, `events.out.tfevents.${Math.floor(now / 1000)}.${os.hostname().replace(/[^A-Za-z0-9.-]/g, "_")}.${process.pid}.gradwire`)
    this.#fd = fs.openSync(this.file, "a")
    this.#write(fileVersionEvent(now / 1000))
  }

  #write(event: Uint8Array): void {
    if (this.#fd === undefined) return
    try {
      fs.writeSync(this.#fd, tfRecord(event))
    } catch {
      // a full disk loses TensorBoard points, not the run
    }
  }

  /** The numeric entries of `values` at `step`, each as a scalar tagged with its key (prefixed). */
  scalars(step: number, values: Readonly<Record<string, unknown>>, prefix = "", now = Date.now()): void {
    const list = Object.entries(values)
      .filter(([, v]) => typeof v === "number" && Number.isFinite(v))
      .map(([k, v]) => [tagOf(prefix + k), v as number] as const)
    if (list.length) this.#write(scalarsEvent(now / 1000, step, list))
  }

  /** The rounds from `step` on are made again (a restart from a checkpoint): TensorBoard drops the points it read of them before. */
  restartAt(step: number, now = Date.now()): void {
    this.#write(restartEvent(now / 1000, step))
  }

  close(): void {
    if (this.#fd === undefined) return
    try {
      fs.closeSync(this.#fd)
    } catch {
      // already closed
    }
    this.#fd = undefined
  }
}
