// Unit and property tests of the tensor wire format (core/wire.ts): exact round trips of every
// dtype, the msgpackr default-options pitfall, zero-copy decoding, typed errors, and a bounded fuzz.
import fc from "fast-check"
import { Packr, pack as defaultPack, unpack as defaultUnpack } from "msgpackr"
import { describe, expect, it } from "vitest"
import { WireDecodeError, WireEncodeError } from "../core/errors.ts"
import { type DType, MAX_RANK, WireTensor, decodeMessage, encodeMessage, wireTensor } from "../core/wire.ts"

const CTOR = {
  float32: Float32Array,
  int32: Int32Array,
  float16: Uint16Array,
  uint8: Uint8Array,
  bool: Uint8Array
} as const

const bytesOf = (a: ArrayBufferView): Array<number> => Array.from(new Uint8Array(a.buffer, a.byteOffset, a.byteLength))

/** A comparable picture of a value: tensors and typed arrays become their kind plus exact bytes. */
const normal = (v: unknown): unknown => {
  if (v instanceof WireTensor) return { tensor: v.dtype, shape: [...v.shape], ctor: v.data.constructor.name, bytes: bytesOf(v.data) }
  if (ArrayBuffer.isView(v)) return { typed: v.constructor.name === "Buffer" ? "Uint8Array" : v.constructor.name, bytes: bytesOf(v) }
  if (Array.isArray(v)) return v.map(normal)
  if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, normal(x)]))
  return v
}

const roundTrip = (v: unknown): unknown => decodeMessage(encodeMessage(v))

const throwsTagged = (tag: "WireDecodeError" | "WireEncodeError", f: () => unknown, match?: RegExp): void => {
  let caught: unknown
  try {
    f()
  } catch (e) {
    caught = e
  }
  expect(caught, "expected a throw").toBeDefined()
  expect((caught as { _tag?: string })._tag).toBe(tag)
  expect(caught).toBeInstanceOf(tag === "WireDecodeError" ? WireDecodeError : WireEncodeError)
  if (match) expect((caught as Error).message).toMatch(match)
}

const decodeOnlyTyped = (bytes: Uint8Array): void => {
  try {
    decodeMessage(bytes)
  } catch (e) {
    if (!(e instanceof WireDecodeError) || e._tag !== "WireDecodeError") {
      throw new Error(`decodeMessage threw ${String(e)} for ${Buffer.from(bytes).toString("hex").slice(0, 200)}`)
    }
  }
}

// --- arbitraries --------------------------------------------------------------------------------

const shapeArb = fc.oneof(
  fc.constant<Array<number>>([]),
  fc.array(fc.integer({ min: 0, max: 6 }), { minLength: 1, maxLength: 4 })
)

const tensorArb = fc
  .tuple(fc.constantFrom<DType>("float32", "int32", "float16", "uint8", "bool"), shapeArb)
  .chain(([dtype, shape]) => {
    const n = shape.reduce((a, b) => a * b, 1)
    const bpe = CTOR[dtype].BYTES_PER_ELEMENT
    return fc.uint8Array({ minLength: n * bpe, maxLength: n * bpe }).map((raw) => {
      const bytes = Uint8Array.prototype.slice.call(raw) // own, aligned buffer
      if (dtype === "bool") for (let i = 0; i < bytes.length; i++) bytes[i] &= 1
      return wireTensor(dtype, shape, new CTOR[dtype](bytes.buffer, 0, n) as never)
    })
  })

const PLAIN = [
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
] as const

const plainArb = fc.tuple(fc.constantFrom(...PLAIN), fc.integer({ min: 0, max: 20 }), fc.integer({ min: 0, max: 2 })).chain(
  ([ctor, n, skip]) =>
    fc.uint8Array({ minLength: (n + skip) * ctor.BYTES_PER_ELEMENT, maxLength: (n + skip) * ctor.BYTES_PER_ELEMENT }).map((raw) => {
      const bytes = Uint8Array.prototype.slice.call(raw)
      // a view that does not start at the beginning of its buffer: only the view must travel
      return new ctor(bytes.buffer, skip * ctor.BYTES_PER_ELEMENT, n)
    })
)

const keyArb = fc.string({ maxLength: 8 }).filter((k) => k !== "__proto__")
const scalarArb = fc.oneof(fc.integer(), fc.string({ maxLength: 20 }), fc.boolean(), fc.constant(null))

const messageArb = fc.record({
  kind: fc.constantFrom("grad", "weights", "ack"),
  step: fc.nat(),
  tensors: fc.array(tensorArb, { maxLength: 4 }),
  extra: fc.array(plainArb, { maxLength: 3 }),
  meta: fc.dictionary(keyArb, fc.oneof(scalarArb, tensorArb), { maxKeys: 4, noNullPrototype: true })
})

// --- round trips --------------------------------------------------------------------------------

describe("wire format round trips", () => {
  it("round-trips random tensors of every dtype (scalars and 0-size included), bit-exact", () => {
    fc.assert(
      fc.property(tensorArb, (t) => {
        const back = roundTrip(t) as WireTensor
        expect(back).toBeInstanceOf(WireTensor)
        expect(normal(back)).toEqual(normal(t))
      }),
      { numRuns: 400 }
    )
  })

  it("round-trips messages with tensors and typed arrays nested anywhere", () => {
    fc.assert(
      fc.property(messageArb, (m) => {
        expect(normal(roundTrip(m))).toEqual(normal(m))
      }),
      { numRuns: 300 }
    )
  })

  it("covers every dtype, scalar and 0-size shapes explicitly", () => {
    for (const dtype of ["float32", "int32", "float16", "uint8", "bool"] as const) {
      for (const shape of [[], [0], [3, 0, 2], [1], [2, 3]]) {
        const n = shape.reduce((a, b) => a * b, 1)
        const data = new CTOR[dtype](n)
        for (let i = 0; i < n; i++) data[i] = dtype === "bool" ? i & 1 : i + 1
        const t = wireTensor(dtype, shape, data as never)
        const back = roundTrip({ kind: "grad", step: 3, tensors: [t, t] }) as { tensors: Array<WireTensor> }
        expect(back.tensors[0].dtype).toBe(dtype)
        expect(back.tensors[0].shape).toEqual(shape)
        expect(back.tensors[1].data).toEqual(data)
        expect(back.tensors[0].data.constructor).toBe(CTOR[dtype])
      }
    }
  })

  it("round-trips float32 special values bit-exact (NaN payloads, ±Inf, -0, subnormals, non-integers)", () => {
    const bits = new Uint32Array([
      0x7fc00000, // NaN
      0x7fc00001, // NaN with payload
      0xffffffff, // negative NaN, all payload bits
      0x7f800001, // signalling NaN
      0x7f800000, // +Inf
      0xff800000, // -Inf
      0x80000000, // -0
      0x00000001, // smallest subnormal
      0x807fffff // largest negative subnormal
    ])
    const values = new Float32Array(bits.buffer)
    const mixed = new Float32Array([...values, 0.1, -1.5, Math.PI, 1e-30, 3.4028234663852886e38, -2.5e-8])
    const back = roundTrip({ g: wireTensor("float32", [mixed.length], mixed), raw: mixed }) as {
      g: WireTensor<"float32">
      raw: Float32Array
    }
    expect(bytesOf(back.g.data)).toEqual(bytesOf(mixed))
    expect(back.raw).toBeInstanceOf(Float32Array)
    expect(bytesOf(back.raw)).toEqual(bytesOf(mixed))
    expect(Object.is(back.raw[6], -0)).toBe(true)
  })

  it("round-trips plain typed arrays as the same kind of typed array (Buffer comes back as Uint8Array)", () => {
    fc.assert(
      fc.property(plainArb, (a) => {
        const back = roundTrip({ a }) as { a: ArrayBufferView }
        expect(back.a.constructor).toBe(a.constructor)
        expect(bytesOf(back.a)).toEqual(bytesOf(a))
      }),
      { numRuns: 300 }
    )
    const back = roundTrip({ b: Buffer.from("hello") }) as { b: Uint8Array }
    expect(back.b).toBeInstanceOf(Uint8Array)
    expect(Buffer.from(back.b).toString()).toBe("hello")
  })

  it("round-trips ordinary msgpack values without tensors", () => {
    const values: Array<unknown> = [null, 0, -1, 2 ** 40, 1.25, "", "héllo", true, [], {}, [1, [2, [3]]], { a: { b: "c" } }]
    for (const v of values) expect(roundTrip(v)).toEqual(v)
    expect(roundTrip(undefined)).toBeUndefined()
    expect(roundTrip(new Set([1, 2]))).toEqual(new Set([1, 2]))
    expect(roundTrip(12345678901234567890n)).toBe(12345678901234567890n)
  })

  it("decodes tensors as views over the input when it is aligned, and copies once when it is not", () => {
    const data = Float32Array.from({ length: 1000 }, (_, i) => i / 7)
    const encoded = encodeMessage({ kind: "grad", tensors: [wireTensor("float32", [10, 100], data)], f64: new Float64Array([1.5, 2.5]) })
    expect(encoded.byteOffset % 8).toBe(0)
    const aligned = decodeMessage(encoded) as { tensors: Array<WireTensor<"float32">>; f64: Float64Array }
    expect(aligned.tensors[0].data.buffer).toBe(encoded.buffer)
    expect(aligned.f64.buffer).toBe(encoded.buffer)
    expect(aligned.tensors[0].data).toEqual(data)

    // 4-aligned but not 8-aligned: float32 can still be viewed, float64 must be copied
    const at4 = new Uint8Array(encoded.length + 4)
    at4.set(encoded, 4)
    const four = decodeMessage(at4.subarray(4)) as typeof aligned
    expect(four.tensors[0].data.buffer).toBe(at4.buffer)
    expect(four.f64.buffer).not.toBe(at4.buffer)
    expect(Array.from(four.f64)).toEqual([1.5, 2.5])

    // misaligned: copies, values intact
    const odd = new Uint8Array(encoded.length + 1)
    odd.set(encoded, 1)
    const copied = decodeMessage(odd.subarray(1)) as typeof aligned
    expect(copied.tensors[0].data.buffer).not.toBe(odd.buffer)
    expect(copied.tensors[0].data).toEqual(data)
  })

  it("writes zero padding, never stale memory", () => {
    const a = encodeMessage({ t: wireTensor("uint8", [3], new Uint8Array([1, 2, 3])), u: new Uint8Array([4]) })
    const b = encodeMessage({ t: wireTensor("uint8", [3], new Uint8Array([1, 2, 3])), u: new Uint8Array([4]) })
    expect(Array.from(a)).toEqual(Array.from(b))
    expect(a[a.length - 2]).toBe(0) // padding between the 3-byte tensor and the next 8-aligned blob
  })
})

// --- the msgpackr pitfall -------------------------------------------------------------------------

describe("msgpackr default-options pitfall", () => {
  const floats = new Float32Array([1.5, -2.25, 3.75])

  it("a default Packr writes a Float32Array one byte per float (documented corruption)", () => {
    const packr = new Packr()
    const back = packr.unpack(packr.pack(floats)) as Uint8Array
    expect(back).not.toBeInstanceOf(Float32Array)
    // the floats were converted to bytes: 1.5 -> 1, -2.25 -> 254, 3.75 -> 3
    expect(Array.from(back.subarray(0, 3))).toEqual([1, 254, 3])
    const viaDefault = defaultUnpack(defaultPack(floats)) as Uint8Array
    expect(Array.from(viaDefault.subarray(0, 3))).toEqual([1, 254, 3])
  })

  it("our codec round-trips the same array exactly", () => {
    expect(roundTrip(floats)).toEqual(floats)
    const t = roundTrip(wireTensor("float32", [3], floats)) as WireTensor<"float32">
    expect(Array.from(t.data)).toEqual([1.5, -2.25, 3.75])
  })

  it("loading gradwire does not change what other Packrs in the process produce", () => {
    const more = new Packr({ moreTypes: true, useRecords: false })
    expect(more.unpack(more.pack(floats))).toEqual(floats)
    expect(more.unpack(more.pack(new BigInt64Array([-5n, 7n])))).toEqual(new BigInt64Array([-5n, 7n]))
    const plain = new Packr({ useRecords: false })
    const buf = Buffer.from([9, 8, 7])
    const packed = plain.pack(buf)
    expect(Array.from(packed)).toEqual([0xc4, 3, 9, 8, 7]) // an ordinary msgpack bin
    expect(Array.from(plain.unpack(packed) as Uint8Array)).toEqual([9, 8, 7])
  })

  it("a WireTensor packed by some other Packr still round-trips (inline form)", () => {
    const t = wireTensor("int32", [2, 2], new Int32Array([1, -2, 3, -4]))
    for (const p of [new Packr(), new Packr({ moreTypes: true })]) {
      const back = p.unpack(p.pack({ t })) as { t: WireTensor }
      expect(normal(back.t)).toEqual(normal(t))
    }
  })
})

// --- encode errors --------------------------------------------------------------------------------

describe("encode errors are WireEncodeError", () => {
  it("rejects unknown dtypes", () => {
    throwsTagged("WireEncodeError", () => wireTensor("float64" as DType, [1], new Float32Array(1) as never), /unknown dtype "float64"/)
  })

  it("rejects shape / data length mismatches", () => {
    throwsTagged("WireEncodeError", () => wireTensor("float32", [2, 3], new Float32Array(5)), /6 elements \(24 bytes\).*5 elements \(20 bytes\)/)
    throwsTagged("WireEncodeError", () => wireTensor("float32", [], new Float32Array(0)))
    throwsTagged("WireEncodeError", () => wireTensor("uint8", [0], new Uint8Array(1)))
  })

  it("rejects negative, non-integer and non-number dimensions", () => {
    throwsTagged("WireEncodeError", () => wireTensor("float32", [-1, 0], new Float32Array(0)), /non-negative integer/)
    throwsTagged("WireEncodeError", () => wireTensor("float32", [1.5], new Float32Array(1)), /non-negative integer/)
    throwsTagged("WireEncodeError", () => wireTensor("float32", [Number.NaN], new Float32Array(0)))
    throwsTagged("WireEncodeError", () => wireTensor("float32", ["2" as never], new Float32Array(2)))
    throwsTagged("WireEncodeError", () => wireTensor("float32", new Array(MAX_RANK + 1).fill(1), new Float32Array(1)), /rank/)
  })

  it("rejects data of the wrong typed-array kind", () => {
    throwsTagged("WireEncodeError", () => wireTensor("float32", [2], new Int32Array(2) as never), /Float32Array/)
    throwsTagged("WireEncodeError", () => wireTensor("float16", [2], new Float32Array(2) as never), /Uint16Array/)
    throwsTagged("WireEncodeError", () => wireTensor("bool", [2], [1, 0] as never))
  })

  it("re-validates a tensor that was tampered with after construction", () => {
    const t = wireTensor("float32", [4], new Float32Array(4))
    ;(t as { data: Float32Array }).data = new Float32Array(3)
    throwsTagged("WireEncodeError", () => encodeMessage({ t }), /4 elements/)
  })

  it("wraps values msgpack cannot carry", () => {
    throwsTagged("WireEncodeError", () => encodeMessage({ s: Symbol("x") }))
  })
})

// --- decode errors --------------------------------------------------------------------------------

const skeletonPackr = new Packr({ useRecords: false })
const concat = (...parts: Array<ArrayLike<number>>): Uint8Array => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const p of parts) {
    out.set(p, at)
    at += p.length
  }
  return out
}
/** The skeleton bytes of a tensor descriptor (ext 0x47 followed by the descriptor value). */
const ref = (desc: unknown): Uint8Array => concat([0xd4, 0x47, 0x00], skeletonPackr.pack(desc))
/** A hand-made message: envelope, skeleton, padding, data. */
const craft = (skeleton: Uint8Array, data?: Uint8Array, version = 1): Uint8Array => {
  const head = 8 + skeleton.length
  const dataStart = head + ((8 - (head % 8)) % 8)
  const out = new Uint8Array(data ? dataStart + data.length : head)
  out.set([0x47, 0x57, 0x4d, version])
  new DataView(out.buffer).setUint32(4, skeleton.length, true)
  out.set(skeleton, 8)
  if (data) out.set(data, dataStart)
  return out
}

describe("decode errors are WireDecodeError", () => {
  it("hand-made messages decode (the crafting helper matches the format)", () => {
    const t = decodeMessage(craft(ref([1, 0, 8, [2]]), new Uint8Array(new Float32Array([1, 2]).buffer))) as WireTensor
    expect(t.dtype).toBe("float32")
    expect(Array.from(t.data)).toEqual([1, 2])
  })

  it("rejects non-bytes, empty, short and foreign input", () => {
    throwsTagged("WireDecodeError", () => decodeMessage("hello" as never), /Uint8Array/)
    throwsTagged("WireDecodeError", () => decodeMessage(new Uint8Array(0)), /shorter/)
    throwsTagged("WireDecodeError", () => decodeMessage(new Uint8Array([0x47, 0x57, 0x4d])), /shorter/)
    throwsTagged("WireDecodeError", () => decodeMessage(skeletonPackr.pack({ kind: "grad", step: 1 })), /not a gradwire message/)
    throwsTagged("WireDecodeError", () => decodeMessage(new TextEncoder().encode('{"kind":"grad"}')), /not a gradwire message/)
  })

  it("rejects an unknown format version", () => {
    throwsTagged("WireDecodeError", () => decodeMessage(craft(skeletonPackr.pack(1), undefined, 2)), /version 2/)
  })

  it("rejects every truncation of a valid message and trailing bytes", () => {
    const good = encodeMessage({ kind: "grad", step: 3, tensors: [wireTensor("float32", [3], new Float32Array([1, 2, 3])), wireTensor("int32", [2], new Int32Array([4, 5]))] })
    for (let n = 0; n < good.length; n++) throwsTagged("WireDecodeError", () => decodeMessage(good.subarray(0, n)))
    throwsTagged("WireDecodeError", () => decodeMessage(concat(good, [0])), /trailing/)
    const small = encodeMessage({ a: 1 })
    for (let n = 0; n < small.length; n++) throwsTagged("WireDecodeError", () => decodeMessage(small.subarray(0, n)))
    throwsTagged("WireDecodeError", () => decodeMessage(concat(small, [0])))
  })

  it("rejects unknown dtype codes", () => {
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([9, 0, 8, [2]]), new Uint8Array(8))), /unknown dtype code 9/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([0x7f, 0, 8]), new Uint8Array(8))), /unknown dtype code 127/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref(["f32", 0, 8, [2]]), new Uint8Array(8))), /code/)
  })

  it("rejects shape / byte-length mismatches", () => {
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 8, [3]]), new Uint8Array(8))), /needs 12 bytes but carries 8/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([2, 0, 8, []]), new Uint8Array(8))), /needs 4 bytes/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([0x27, 0, 6]), new Uint8Array(8))), /multiple of 4/)
  })

  it("rejects negative, non-integer and non-number dimensions, and bad shapes", () => {
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 0, [-1, 0]]), new Uint8Array(0))), /non-negative integer/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 8, [0.5, 4]]), new Uint8Array(8))), /non-negative integer/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 8, ["2"]]), new Uint8Array(8))), /non-negative integer/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 8, "2"]), new Uint8Array(8))), /not an array/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 4, new Array(MAX_RANK + 1).fill(1)]), new Uint8Array(4))), /rank/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 8]), new Uint8Array(8))), /without a shape/)
  })

  it("rejects malformed descriptors, bad offsets and data past the end", () => {
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref("hello"))), /malformed tensor descriptor/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 8, 8, [2]]), new Uint8Array(16))), /offset 8, expected 0/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, -8, 8, [2]]), new Uint8Array(16))), /offset/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(ref([1, 0, 16, [4]]), new Uint8Array(8))), /past the end/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(concat([0xd4, 0x47, 0x00]))), /malformed message body/)
  })

  it("rejects a declared skeleton longer than the message, and an empty one", () => {
    const m = encodeMessage({ a: "b" })
    const bad = Uint8Array.prototype.slice.call(m)
    new DataView(bad.buffer).setUint32(4, 0xfffffff0, true)
    throwsTagged("WireDecodeError", () => decodeMessage(bad), /runs past the end/)
    throwsTagged("WireDecodeError", () => decodeMessage(craft(new Uint8Array(0))), /empty/)
  })

  it("rejects structured-clone pointers and unknown extensions in the body", () => {
    throwsTagged("WireDecodeError", () => decodeMessage(craft(new Uint8Array([0xd6, 0x70, 0, 0, 0, 1]))))
    throwsTagged("WireDecodeError", () => decodeMessage(craft(new Uint8Array([0xd4, 0x33, 0x00]))), /extension/)
  })
})

// --- fuzz -------------------------------------------------------------------------------------------

describe("decodeMessage fuzz (bounded): only WireDecodeError or a value, never another throw", () => {
  const samples = [
    encodeMessage({ kind: "grad", step: 3, tensors: [wireTensor("float32", [2, 3], new Float32Array(6).fill(0.5)), wireTensor("bool", [4], new Uint8Array([1, 0, 1, 1]))], raw: new Int32Array([1, 2, 3]), note: "hi" }),
    encodeMessage({ a: [1, 2, { b: new Set(["x"]) }], s: "a longer string value ".repeat(4), n: -123456789 }),
    encodeMessage([wireTensor("float16", [], new Uint16Array([0x3c00])), new Uint8Array(0), new BigInt64Array([1n])])
  ]

  it("random buffers, with and without a valid envelope", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), fc.boolean(), (raw, envelope) => {
        decodeOnlyTyped(envelope ? craft(raw, raw.length % 2 ? raw : undefined) : raw)
      }),
      { numRuns: 2500 }
    )
  })

  it("every truncation and bit flips of valid messages", () => {
    for (const s of samples) for (let n = 0; n <= s.length; n++) decodeOnlyTyped(s.subarray(0, n))
    fc.assert(
      fc.property(
        fc.constantFrom(...samples),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 7 })), { minLength: 1, maxLength: 3 }),
        (sample, flips) => {
          const bytes = Uint8Array.prototype.slice.call(sample)
          for (const [at, bit] of flips) bytes[at % bytes.length] ^= 1 << bit
          decodeOnlyTyped(bytes)
        }
      ),
      { numRuns: 3000 }
    )
  })

  it("random msgpack-ish bodies behind a valid envelope", () => {
    const interesting = [0xd4, 0x47, 0x48, 0xc7, 0xc8, 0xc9, 0xdc, 0xdd, 0xde, 0xdf, 0x91, 0x94, 0x81, 0xff, 0xc1, 0x74, 0x65, 0x78, 0x73, 0x62]
    fc.assert(
      fc.property(fc.array(fc.oneof(fc.constantFrom(...interesting), fc.integer({ min: 0, max: 255 })), { maxLength: 64 }), fc.uint8Array({ maxLength: 64 }), (body, data) => {
        decodeOnlyTyped(craft(Uint8Array.from(body), data))
      }),
      { numRuns: 2500 }
    )
  })
})
