// The tensor wire format: every gradwire message (actor mail, collective chunks, checkpoints) is
// encoded here. A message is msgpack (msgpackr) with tensors and typed arrays carried out of band
// so that their bytes are copied exactly once on encode and can be viewed, not copied, on decode.
//
// Layout (all header integers little-endian):
//
//   0   "GWM" magic, then the format version (1)      -- foreign bytes fail fast, cheaply
//   4   u32 length S of the msgpack skeleton
//   8   skeleton: msgpack of the value; each tensor / typed array in it is replaced by an ext
//       0x47 descriptor [code, offset, byteLength, shape?] (shape for WireTensors only)
//   align8(8 + S)  data section: the raw bytes of each tensor, in skeleton order, each starting
//       at an offset that is a multiple of 8 from the message start; zero padding between.
//
// Why out of band rather than inline msgpack ext payloads: the sizes are known only after the
// skeleton is packed, so we can allocate the output once, exactly, and copy each tensor in once.
// Inline payloads would make msgpackr grow its buffer tensor by tensor, re-copying earlier tensors,
// and could not place the data at aligned offsets. Because every data offset is 8-aligned
// relative to the message start, a message whose buffer is itself 8-aligned (what encodeMessage
// and the chunk Reassembler produce) decodes into typed-array views with no copy at all.
//
// Tensor data is little-endian on the wire and is written and read as host bytes (Node on x86 and
// arm is little-endian), so the module refuses to load on a big-endian host rather than put
// big-endian floats on the wire.
//
// Pitfall this module exists to avoid: msgpackr with default options writes a Float32Array as a
// bin whose bytes are the floats truncated to one byte each. We always use our own Packr/Unpackr
// with explicit options and never the default pack/unpack exports.
import { endianness } from "node:os"
import { addExtension, Packr, RESERVE_START_SPACE, Unpackr } from "msgpackr"
import { WireDecodeError, WireEncodeError } from "./errors.ts"

if (endianness() !== "LE") {
  throw new Error(
    "gradwire's wire format sends tensor data as little-endian host bytes; this host is big-endian, which is not supported"
  )
}

/** Element types a WireTensor can hold. float16 travels as raw IEEE half bits in a Uint16Array. */
export type DType = "float32" | "int32" | "float16" | "uint8" | "bool"

/** The typed array that backs each dtype (bool: one byte per element, 0 or 1). */
export type DataFor<D extends DType> = D extends "float32"
  ? Float32Array
  : D extends "int32"
    ? Int32Array
    : D extends "float16"
      ? Uint16Array
      : Uint8Array

export type TensorData = Float32Array | Int32Array | Uint16Array | Uint8Array

/** Plain typed arrays that can be nested in messages and come back as the same kind of array. */
export type WireTypedArray =
  | Int8Array
  | Uint8Array
  | Uint8ClampedArray
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | Float32Array
  | Float64Array
  | BigInt64Array
  | BigUint64Array

type TypedArrayCtor = {
  new (length: number): WireTypedArray
  new (buffer: ArrayBufferLike, byteOffset?: number, length?: number): WireTypedArray
  readonly BYTES_PER_ELEMENT: number
  readonly name: string
}

interface DTypeInfo {
  readonly dtype: DType
  readonly code: number
  readonly ctor: TypedArrayCtor
}

// Wire codes of the WireTensor dtypes (1-5) and of plain typed arrays (0x20 + index). Never reuse
// or renumber a code: it is part of the format.
const DTYPE_LIST: ReadonlyArray<DTypeInfo> = [
  { dtype: "float32", code: 1, ctor: Float32Array },
  { dtype: "int32", code: 2, ctor: Int32Array },
  { dtype: "float16", code: 3, ctor: Uint16Array },
  { dtype: "uint8", code: 4, ctor: Uint8Array },
  { dtype: "bool", code: 5, ctor: Uint8Array }
]
const DTYPES = new Map<string, DTypeInfo>(DTYPE_LIST.map((d) => [d.dtype, d]))
const DTYPE_BY_CODE = new Map<number, DTypeInfo>(DTYPE_LIST.map((d) => [d.code, d]))

const PLAIN_CODE_BASE = 0x20
const PLAIN_CTORS: ReadonlyArray<TypedArrayCtor> = [
  Int8Array,
  Uint8Array,
  Uint8ClampedArray,
  Int16Array,
  Uint16Array,
  Int32Array,
  Uint32Array,
  Float32Array,
  Float64Array,
  BigInt64Array,
  BigUint64Array
]
const PLAIN_CODE_BY_CTOR = new Map<Function, number>(PLAIN_CTORS.map((c, i) => [c, PLAIN_CODE_BASE + i]))

/**
 * `a` copied into an array of V8's "packed" kind. msgpack decoding fills each array it makes with
 * `new Array(n)`, which V8 keeps "holey" for good, while a literal, or an array tfjs makes, is
 * packed. A decoded shape that reaches tfjs (a tensor's shape, a dataset's row shape) makes every
 * function reading shapes meet both kinds, and code V8 optimized for one is thrown away ("wrong
 * map") when the other comes: in a process that took an optimizer state from a file as a joining
 * worker does, 19 deoptimizations over the next 600 training steps, 8 with its shapes packed.
 */
export const packedArray = <T>(a: ReadonlyArray<T>): T[] => a.map((x) => x)

/** Highest rank accepted; bounds the work a hostile descriptor can ask for. */
export const MAX_RANK = 64

const MAGIC0 = 0x47 // G
const MAGIC1 = 0x57 // W
const MAGIC2 = 0x4d // M
export const WIRE_VERSION = 1
const ENVELOPE_BYTES = 8
// msgpack ext type codes (application range). 0x47 'G': a reference into the data section;
// 0x48 'H': a self-contained tensor written by some other Packr in this process (see below).
const EXT_REF = 0x47
const EXT_INLINE = 0x48

const align8 = (n: number): number => n + ((8 - (n % 8)) % 8)

/** Why a dtype/shape/data triple is not a valid tensor, or undefined when it is. */
const tensorProblem = (dtype: unknown, shape: unknown, data: unknown): string | undefined => {
  const info = typeof dtype === "string" ? DTYPES.get(dtype) : undefined
  if (info === undefined) {
    return `unknown dtype ${JSON.stringify(dtype)} (expected one of ${[...DTYPES.keys()].join(", ")})`
  }
  if (!Array.isArray(shape)) return `shape must be an array of dimensions, got ${describe(shape)}`
  if (shape.length > MAX_RANK) return `rank ${shape.length} is above the maximum of ${MAX_RANK}`
  let size = 1
  for (const d of shape) {
    if (typeof d !== "number" || !Number.isSafeInteger(d) || d < 0) {
      return `shape [${shape.map(describe).join(", ")}] has a dimension that is not a non-negative integer (${describe(d)})`
    }
    size *= d
  }
  if (size > Number.MAX_SAFE_INTEGER) return `shape [${shape.join(", ")}] has too many elements`
  if (!(data instanceof info.ctor)) {
    return `dtype ${info.dtype} needs its data in a ${info.ctor.name}, got ${describe(data)}`
  }
  const length = (data as WireTypedArray).length
  if (length !== size) {
    return (
      `shape [${shape.join(", ")}] has ${size} elements (${size * info.ctor.BYTES_PER_ELEMENT} bytes) ` +
      `but the ${info.dtype} data has ${length} elements (${length * info.ctor.BYTES_PER_ELEMENT} bytes)`
    )
  }
  return undefined
}

const describe = (v: unknown): string => {
  if (v === null) return "null"
  if (typeof v === "object" || typeof v === "function") return (v as object).constructor?.name ?? typeof v
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v)
  return String(v)
}

/**
 * A tensor on the wire: dtype, shape and a typed array of exactly shape-product elements.
 * Decoded tensors usually view the received message's buffer; copy `data` if you keep it past the
 * life of that buffer and the buffer may be reused.
 */
export class WireTensor<D extends DType = DType> {
  readonly dtype: D
  readonly shape: ReadonlyArray<number>
  readonly data: DataFor<D>

  /** Throws WireEncodeError when the triple is inconsistent (see wireTensor). */
  constructor(dtype: D, shape: ReadonlyArray<number>, data: DataFor<D>) {
    const problem = tensorProblem(dtype, shape, data)
    if (problem !== undefined) throw new WireEncodeError({ reason: problem })
    this.dtype = dtype
    this.shape = Object.freeze(shape.slice())
    this.data = data
  }

  /** Number of elements. */
  get size(): number {
    return this.data.length
  }
}

/**
 * Builds a validated WireTensor. Throws WireEncodeError for an unknown dtype, a dimension that is
 * negative or not an integer, data of the wrong typed-array kind for the dtype, or an element
 * count that differs from the product of the shape. bool data is not scanned for 0/1 (O(n)).
 */
export const wireTensor = <D extends DType>(dtype: D, shape: ReadonlyArray<number>, data: DataFor<D>): WireTensor<D> =>
  new WireTensor(dtype, shape, data)

// ---------------------------------------------------------------------------------------------
// Encoding

interface EncodeContext {
  readonly blobs: Array<Uint8Array>
  /** Offset (from the data-section start) where the next blob goes. */
  next: number
  /** End of the last blob, unpadded. */
  end: number
}

// msgpackr's extension `pack` hook: (value, allocateForWrite, pack). allocateForWrite reserves
// bytes in msgpackr's output buffer and hands them to us; pack writes a nested value after them.
type Allocate = (size: number) => { target: Uint8Array; targetView: DataView; position: number }
type PackNested = (value: unknown) => void
interface PackrState {
  readonly moreTypes?: boolean
}

const packr = new Packr({
  useRecords: false, // plain msgpack maps, no shared record structures between messages
  mapsAsObjects: true,
  moreTypes: true, // Set, Error, ArrayBuffer, DataView and big BigInts round-trip
  structuredClone: false,
  bundleStrings: false,
  encodeUndefinedAsNil: false,
  useFloat32: 0 // never round doubles to float32
})
const unpackr = new Unpackr({
  useRecords: false,
  mapsAsObjects: true,
  moreTypes: true,
  structuredClone: false, // rejects the pointer/id extensions a hostile message could abuse
  int64AsType: "bigint",
  copyBuffers: false // bin values view the message, like tensors
})

let encodeContext: EncodeContext | null = null

const addBlob = (ctx: EncodeContext, view: ArrayBufferView): number => {
  const offset = ctx.next
  // A Uint8Array view over the caller's buffer, no copy: the bytes are copied once, later, into
  // the output (encodeMessage) or straight into the frames (chunking's encodeFrames).
  ctx.blobs.push(new Uint8Array(view.buffer, view.byteOffset, view.byteLength))
  ctx.end = offset + view.byteLength
  ctx.next = align8(ctx.end)
  return offset
}

const writeRefTag = (allocateForWrite: Allocate): void => {
  const { target, position } = allocateForWrite(3)
  target[position] = 0xd4 // fixext 1: our descriptor follows as an ordinary msgpack value
  target[position + 1] = EXT_REF
  target[position + 2] = 0
}

function packWireTensor(this: PackrState, tensor: WireTensor, allocateForWrite: Allocate, pack: PackNested): void {
  const problem = tensorProblem(tensor.dtype, tensor.shape, tensor.data)
  if (problem !== undefined) throw new WireEncodeError({ reason: problem })
  const code = DTYPES.get(tensor.dtype)!.code
  const ctx = encodeContext
  if (this !== packr || ctx === null) {
    // Some other Packr in this process (extensions are global in msgpackr): write the tensor
    // inline so it still round-trips through any Unpackr here, at the cost of copies.
    const { target, position } = allocateForWrite(3)
    target[position] = 0xd4
    target[position + 1] = EXT_INLINE
    target[position + 2] = 0
    const d = tensor.data
    pack([code, tensor.shape.slice(), Buffer.from(d.buffer, d.byteOffset, d.byteLength)])
    return
  }
  const offset = addBlob(ctx, tensor.data)
  writeRefTag(allocateForWrite)
  pack([code, offset, tensor.data.byteLength, tensor.shape.slice()])
}

const plainCode = (value: WireTypedArray): number => {
  const direct = PLAIN_CODE_BY_CTOR.get(value.constructor)
  if (direct !== undefined) return direct
  // Subclasses (Node's Buffer is a Uint8Array) travel as their base kind.
  for (let i = 0; i < PLAIN_CTORS.length; i++) if (value instanceof PLAIN_CTORS[i]) return PLAIN_CODE_BASE + i
  throw new WireEncodeError({
    reason: `${value.constructor.name} is not supported on the wire; wrap its bytes in a supported typed array or a WireTensor`
  })
}

function packTypedArray(this: PackrState, value: WireTypedArray, allocateForWrite: Allocate, pack: PackNested): void {
  const ctx = encodeContext
  if (this !== packr || ctx === null) {
    packTypedArrayLikeMsgpackr(this, value, allocateForWrite)
    return
  }
  const code = plainCode(value)
  const offset = addBlob(ctx, value)
  writeRefTag(allocateForWrite)
  pack([code, offset, value.byteLength])
}

// Registering an extension for typed arrays changes every Packr in the process, not just ours.
// For the others we reproduce msgpackr 2.1.3's built-in behaviour byte for byte (moreTypes: ext
// 0x74; otherwise a bin written with target.set(value), which for non-byte arrays is the
// one-byte-per-element corruption), so loading gradwire never changes what other code encodes.
const MSGPACKR_TYPED_ARRAYS = PLAIN_CTORS.map((c) => c.name)
const packTypedArrayLikeMsgpackr = (packr: PackrState, value: WireTypedArray, allocateForWrite: Allocate): void => {
  const length = value.byteLength
  if (packr.moreTypes && value.constructor !== Buffer) {
    const type = MSGPACKR_TYPED_ARRAYS.indexOf(value.constructor.name)
    let w: ReturnType<Allocate>
    let p: number
    if (length + 1 < 0x100) {
      w = allocateForWrite(4 + length)
      p = w.position
      w.target[p++] = 0xc7
      w.target[p++] = length + 1
    } else if (length + 1 < 0x10000) {
      w = allocateForWrite(5 + length)
      p = w.position
      w.target[p++] = 0xc8
      w.target[p++] = (length + 1) >> 8
      w.target[p++] = (length + 1) & 0xff
    } else {
      w = allocateForWrite(7 + length)
      p = w.position
      w.target[p++] = 0xc9
      w.targetView.setUint32(p, length + 1)
      p += 4
    }
    w.target[p++] = 0x74
    w.target[p++] = type
    w.target.set(new Uint8Array(value.buffer, value.byteOffset, value.byteLength), p)
    return
  }
  let w: ReturnType<Allocate>
  let p: number
  if (length < 0x100) {
    w = allocateForWrite(length + 2)
    p = w.position
    w.target[p++] = 0xc4
    w.target[p++] = length
  } else if (length < 0x10000) {
    w = allocateForWrite(length + 3)
    p = w.position
    w.target[p++] = 0xc5
    w.target[p++] = length >> 8
    w.target[p++] = length & 0xff
  } else {
    w = allocateForWrite(length + 5)
    p = w.position
    w.target[p++] = 0xc6
    w.targetView.setUint32(p, length)
    p += 4
  }
  ;(w.target as unknown as { set: (src: ArrayLike<number | bigint>, at: number) => void }).set(value, p)
}

/**
 * A message laid out but not yet copied: the envelope + skeleton bytes, and where each tensor's
 * bytes go. Every byte of [0, byteLength) not covered by head or a blob is zero padding.
 * chunking.ts writes this straight into frames, so chunked sending also copies tensors once.
 */
export interface EncodedParts {
  readonly head: Uint8Array
  readonly blobs: ReadonlyArray<{ readonly bytes: Uint8Array; readonly offset: number }>
  readonly byteLength: number
}

/** Lays out a message (see EncodedParts); encodeMessage is this plus one copy. */
export const encodeParts = (value: unknown): EncodedParts => {
  const ctx: EncodeContext = { blobs: [], next: 0, end: 0 }
  const saved = encodeContext
  encodeContext = ctx
  let head: Uint8Array
  try {
    // RESERVE_START_SPACE leaves room for our envelope in front of the skeleton, so a message
    // without tensors needs no copy at all.
    head = packr.pack(value, RESERVE_START_SPACE | ENVELOPE_BYTES)
  } catch (error) {
    throw error instanceof WireEncodeError ? error : new WireEncodeError({ reason: errorText(error) })
  } finally {
    encodeContext = saved
  }
  const skeleton = head.length - ENVELOPE_BYTES
  if (skeleton > 0xffffffff) throw new WireEncodeError({ reason: `message skeleton of ${skeleton} bytes is too large` })
  writeEnvelope(head, skeleton)
  if (ctx.blobs.length === 0) return { head, blobs: [], byteLength: head.length }
  const dataStart = align8(head.length)
  let offset = dataStart
  const blobs = ctx.blobs.map((bytes) => {
    const at = offset
    offset = align8(offset + bytes.byteLength)
    return { bytes, offset: at }
  })
  return { head, blobs, byteLength: dataStart + ctx.end }
}

/**
 * Encodes any msgpack-able value with WireTensors and typed arrays nested anywhere. Tensor bytes
 * are copied once, into the returned buffer, which starts at byte offset 0 of its own ArrayBuffer
 * (so it decodes zero-copy). Messages without tensors are returned from msgpackr's buffer as is.
 * Throws WireEncodeError for invalid tensors or values msgpack cannot carry (symbols, ...).
 */
export const encodeMessage = (value: unknown): Uint8Array => {
  const parts = encodeParts(value)
  if (parts.blobs.length === 0) return parts.head
  // Not zero-filled (a fresh allocation would be, at the cost of one more pass over big
  // messages); every byte is written below, padding explicitly, so no stale memory goes out.
  const out = Buffer.allocUnsafeSlow(parts.byteLength)
  out.set(parts.head, 0)
  let end = parts.head.length
  for (const { bytes, offset } of parts.blobs) {
    out.fill(0, end, offset)
    out.set(bytes, offset) // the one copy of the tensor bytes
    end = offset + bytes.byteLength
  }
  return out
}

const writeEnvelope = (out: Uint8Array, skeleton: number): void => {
  out[0] = MAGIC0
  out[1] = MAGIC1
  out[2] = MAGIC2
  out[3] = WIRE_VERSION
  out[4] = skeleton & 0xff
  out[5] = (skeleton >>> 8) & 0xff
  out[6] = (skeleton >>> 16) & 0xff
  out[7] = (skeleton >>> 24) & 0xff
}

const errorText = (error: unknown): string =>
  error instanceof Error ? error.message : typeof error === "string" ? error : describe(error)

// ---------------------------------------------------------------------------------------------
// Decoding

interface DecodeContext {
  readonly bytes: Uint8Array
  readonly dataStart: number
  /** Offset (from dataStart) the next referenced blob must have: blobs are dense and in order. */
  next: number
  end: number
  blobs: number
}

let decodeContext: DecodeContext | null = null

const fail = (reason: string): never => {
  throw new WireDecodeError({ reason })
}

const isLength = (v: unknown): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= 0

// A typed array over bytes[start, start + byteLength): a view when the absolute byte offset suits
// the element size, otherwise one copy (typed arrays cannot view misaligned memory; this happens
// when the message buffer itself is not aligned, e.g. a NATS payload at an odd socket offset).
const viewOrCopy = (ctor: TypedArrayCtor, bytes: Uint8Array, start: number, byteLength: number): WireTypedArray => {
  const bpe = ctor.BYTES_PER_ELEMENT
  const absolute = bytes.byteOffset + start
  if (absolute % bpe === 0) return new ctor(bytes.buffer, absolute, byteLength / bpe)
  const copy = Uint8Array.prototype.slice.call(bytes, start, start + byteLength) // not Buffer#slice, which views
  return new ctor(copy.buffer, 0, byteLength / bpe)
}

const readShape = (shape: unknown, info: DTypeInfo, byteLength: number): Array<number> => {
  if (!Array.isArray(shape)) return fail(`tensor shape is ${describe(shape)}, not an array`)
  if (shape.length > MAX_RANK) return fail(`tensor rank ${shape.length} is above the maximum of ${MAX_RANK}`)
  let size = 1
  for (const d of shape) {
    if (!isLength(d)) return fail(`tensor shape has a dimension that is not a non-negative integer (${describe(d)})`)
    size *= d
  }
  const bpe = info.ctor.BYTES_PER_ELEMENT
  if (size * bpe !== byteLength) {
    fail(`${info.dtype} tensor of shape [${shape.join(", ")}] needs ${size * bpe} bytes but carries ${byteLength}`)
  }
  return shape as Array<number>
}

const readRef = (desc: unknown): unknown => {
  const ctx = decodeContext
  if (ctx === null) return fail("tensor reference found outside a gradwire message (decode it with decodeMessage)")
  if (!Array.isArray(desc) || (desc.length !== 3 && desc.length !== 4)) {
    return fail(`malformed tensor descriptor (${describe(desc)})`)
  }
  const code: unknown = desc[0]
  const offset: unknown = desc[1]
  const byteLength: unknown = desc[2]
  if (!isLength(offset) || !isLength(byteLength)) return fail("malformed tensor descriptor (offset/length)")
  if (offset !== ctx.next) return fail(`tensor data at offset ${offset}, expected ${ctx.next}`)
  const start = ctx.dataStart + offset
  if (start + byteLength > ctx.bytes.length) {
    fail(
      `tensor data [${start}, ${start + byteLength}) runs past the end of the ${ctx.bytes.length}-byte message (truncated?)`
    )
  }
  ctx.end = offset + byteLength
  ctx.next = align8(ctx.end)
  ctx.blobs++
  if (typeof code !== "number") return fail(`malformed tensor descriptor (code ${describe(code)})`)
  const info = DTYPE_BY_CODE.get(code)
  if (info !== undefined) {
    if (desc.length !== 4) return fail("tensor descriptor without a shape")
    const shape = readShape(desc[3], info, byteLength)
    return new WireTensor(info.dtype, shape, viewOrCopy(info.ctor, ctx.bytes, start, byteLength) as TensorData)
  }
  const ctor = PLAIN_CTORS[code - PLAIN_CODE_BASE]
  if (ctor === undefined || desc.length !== 3) return fail(`unknown dtype code ${code}`)
  if (byteLength % ctor.BYTES_PER_ELEMENT !== 0) {
    fail(`${ctor.name} data of ${byteLength} bytes is not a multiple of ${ctor.BYTES_PER_ELEMENT}`)
  }
  return viewOrCopy(ctor, ctx.bytes, start, byteLength)
}

const readInline = (desc: unknown): unknown => {
  if (!Array.isArray(desc) || desc.length !== 3 || !(desc[2] instanceof Uint8Array)) {
    return fail(`malformed inline tensor (${describe(desc)})`)
  }
  const info = typeof desc[0] === "number" ? DTYPE_BY_CODE.get(desc[0]) : undefined
  if (info === undefined) return fail(`unknown dtype code ${describe(desc[0])}`)
  const bytes = desc[2] as Uint8Array
  const shape = readShape(desc[1], info, bytes.byteLength)
  const copy = Uint8Array.prototype.slice.call(bytes) // inline bytes sit at arbitrary offsets
  return new WireTensor(info.dtype, shape, new info.ctor(copy.buffer, 0, bytes.byteLength / info.ctor.BYTES_PER_ELEMENT) as TensorData)
}

/**
 * Decodes a message made by encodeMessage. Tensors and typed arrays are views over `bytes` when
 * aligned (see the module comment), so `bytes` must not be overwritten while they are in use.
 * Throws WireDecodeError for anything that is not a complete, well-formed gradwire message:
 * foreign or truncated bytes, an unknown version or dtype, a shape that does not match the bytes.
 */
export const decodeMessage = (bytes: Uint8Array): unknown => {
  if (!(bytes instanceof Uint8Array)) return fail(`expected the message as a Uint8Array, got ${describe(bytes)}`)
  if (bytes.length < ENVELOPE_BYTES) {
    return fail(`${bytes.length} bytes is shorter than the ${ENVELOPE_BYTES}-byte header (truncated or not gradwire)`)
  }
  if (bytes[0] !== MAGIC0 || bytes[1] !== MAGIC1 || bytes[2] !== MAGIC2) {
    return fail("not a gradwire message (bad magic; foreign bytes, or a chunk frame that was not reassembled)")
  }
  if (bytes[3] !== WIRE_VERSION) {
    return fail(`wire format version ${bytes[3]} is not supported (this gradwire speaks version ${WIRE_VERSION})`)
  }
  const skeleton = (bytes[4] | (bytes[5] << 8) | (bytes[6] << 16) | (bytes[7] << 24)) >>> 0
  const skeletonEnd = ENVELOPE_BYTES + skeleton
  if (skeleton === 0) return fail("empty message body")
  if (skeletonEnd > bytes.length) {
    return fail(`message body of ${skeleton} bytes runs past the end of the ${bytes.length}-byte message (truncated?)`)
  }
  const ctx: DecodeContext = { bytes, dataStart: align8(skeletonEnd), next: 0, end: 0, blobs: 0 }
  const saved = decodeContext
  decodeContext = ctx
  let value: unknown
  try {
    value = unpackr.unpack(bytes.subarray(ENVELOPE_BYTES, skeletonEnd))
  } catch (error) {
    throw error instanceof WireDecodeError ? error : new WireDecodeError({ reason: `malformed message body: ${errorText(error)}` })
  } finally {
    decodeContext = saved
  }
  const expected = ctx.blobs === 0 ? skeletonEnd : ctx.dataStart + ctx.end
  if (bytes.length !== expected) {
    fail(`message is ${bytes.length} bytes but its contents end at byte ${expected} (trailing bytes)`)
  }
  return value
}

// Extensions are registered once per process (msgpackr keeps them globally). The hooks decide
// per call whether they run for our Packr inside encodeMessage or for someone else's.
addExtension({
  Class: Object.getPrototypeOf(Uint8Array) as Function,
  type: EXT_REF,
  pack: packTypedArray as unknown as (value: unknown) => Uint8Array,
  read: readRef
})
addExtension({
  Class: WireTensor,
  type: EXT_INLINE,
  pack: packWireTensor as unknown as (value: unknown) => Uint8Array,
  read: readInline
})
