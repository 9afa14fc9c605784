// Compressed pushes to the parameter servers (actors/train/common/ps-push-codec.ts), as pure logic: a
// worker's encoder with an error-feedback residual per server range, the push through the wire
// format as the actors send it, and a server's decoder into its reused buffer. The residual
// carries what compression lost: the sum of the decoded pushes plus the final residual is the sum
// of the raw gradients. Codecs that cannot be pushed (PowerSGD, "auto") are refused by name.
import { describe, expect, it } from "vitest"
import { ConfigError, WireDecodeError } from "../core/errors.ts"
import { decodeMessage, encodeMessage } from "../core/wire.ts"
import { Mulberry32 } from "../collectives/compression/rng.ts"
import type { ResolvedCompressionConfig } from "../collectives/compression/index.ts"
import { shardLayout } from "../actors/train/common/optim/zero.ts"
import { PushDecoder, PushEncoder, checkPushCompression, pushCodecProblem, pushResidualKey, type PushPayload } from "../actors/train/common/ps-push-codec.ts"
import { resolveTrainerOptions } from "../actors/train/driver/options.ts"

const randn = (n: number, rng: Mulberry32, scale: number): Float32Array => Float32Array.from({ length: n }, () => rng.normal() * scale)

/** The payload as a server receives it: through the wire format of actor mail. */
const overTheWire = (p: PushPayload): PushPayload => decodeMessage(encodeMessage({ worker: 0, step: 0, ...p })) as PushPayload

const N = 5003
const SERVERS = 2
const STEPS = 25

const CODECS: Array<[string, ResolvedCompressionConfig]> = [
  ["int8", { type: "int8", chunkSize: 512 }],
  ["topk 1%", { type: "topk", ratio: 0.01 }],
  ["topk 10%", { type: "topk", ratio: 0.1 }],
  ["sign", { type: "sign" }],
  ["fp16", "fp16"]
]

describe("compressed pushes with error feedback", () => {
  for (const [name, compression] of CODECS) {
    it(`${name}: Σ decoded pushes + residual == Σ raw gradients, per server range; buffers reused`, () => {
      const rng = new Mulberry32(11)
      const enc = new PushEncoder({ compression, numServers: SERVERS })
      const layouts = Array.from({ length: SERVERS }, (_, k) => shardLayout(N, SERVERS, k))
      const decoders = layouts.map((l) => new PushDecoder(compression, l.end - l.start))
      const raw = new Float64Array(N)
      const got = new Float64Array(N)
      let firstPacked: ArrayBufferLike | undefined
      let firstOut: Float32Array | undefined
      for (let step = 0; step < STEPS; step++) {
        // gradients of changing scale, as training gives them
        const g = randn(N, rng, 0.1 / (1 + step))
        for (let i = 0; i < N; i++) raw[i] += g[i]!
        layouts.forEach((l, k) => {
          const payload = enc.encode(k, g.subarray(l.start, l.end), { rank: 1, step })
          expect(payload.packed).toBeInstanceOf(Uint8Array)
          expect(payload.grad.length).toBe(0)
          if (k === 0) {
            firstPacked ??= payload.packed!.buffer
            expect(payload.packed!.buffer).toBe(firstPacked)
          }
          const out = decoders[k]!.decode(overTheWire(payload))
          if (k === 0) {
            firstOut ??= out
            expect(out).toBe(firstOut)
          }
          for (let i = 0; i < out.length; i++) got[l.start + i] += out[i]!
        })
        enc.endStep()
      }
      const residuals = enc.state()
      expect(Object.keys(residuals).sort()).toEqual(layouts.map((_, k) => pushResidualKey(k, SERVERS)).sort())
      let worst = 0
      let lost = 0
      layouts.forEach((l, k) => {
        const e = residuals[pushResidualKey(k, SERVERS)]!
        expect(e.length).toBe(l.end - l.start)
        for (let i = 0; i < e.length; i++) {
          worst = Math.max(worst, Math.abs(raw[l.start + i]! - (got[l.start + i]! + e[i]!)))
          lost = Math.max(lost, Math.abs(raw[l.start + i]! - got[l.start + i]!))
        }
      })
      // fp32 residual arithmetic over 25 steps of values ~0.1: rounding far below what was delayed
      console.log(`${name}: |Σg - (ΣD + e)| <= ${worst.toExponential(2)}, |Σg - ΣD| (what the residual carries) up to ${lost.toExponential(2)}`)
      expect(worst, `${name}: Σg - (ΣD + e)`).toBeLessThan(1e-6)
      expect(lost, `${name}: compression delayed something`).toBeGreaterThan(20 * worst)
      const s = enc.stats
      expect(s.steps).toBe(STEPS)
      expect(s.denseBytes).toBe(4 * N)
      expect(s.totalWireBytes).toBe(STEPS * s.wireBytes)
      expect(s.wireBytes).toBeLessThan(s.denseBytes / (name === "fp16" ? 1.9 : name === "topk 10%" ? 4.9 : 3.9))
    })
  }

  it("ranges of a million elements and more (residuals in SIMD memory, the fused kernels) keep the invariant", () => {
    const n = (1 << 20) + 3
    for (const compression of [{ type: "int8" }, { type: "topk", ratio: 0.01 }] as const) {
      const rng = new Mulberry32(9)
      const enc = new PushEncoder({ compression, numServers: 1 })
      const dec = new PushDecoder(compression, n)
      const raw = new Float64Array(n)
      const got = new Float64Array(n)
      for (let step = 0; step < 3; step++) {
        const g = randn(n, rng, 0.1)
        for (let i = 0; i < n; i++) raw[i] += g[i]!
        const out = dec.decode(overTheWire(enc.encode(0, g, { rank: 0, step })))
        for (let i = 0; i < n; i++) got[i] += out[i]!
      }
      const e = enc.state()[pushResidualKey(0, 1)]!
      let worst = 0
      for (let i = 0; i < n; i++) worst = Math.max(worst, Math.abs(raw[i]! - got[i]! - e[i]!))
      expect(worst, compression.type).toBeLessThan(1e-6)
    }
  })

  it("without error feedback nothing is kept, and a push decodes to the codec's own message", () => {
    const rng = new Mulberry32(3)
    const enc = new PushEncoder({ compression: { type: "topk", ratio: 0.05, errorFeedback: false }, numServers: 1 })
    const dec = new PushDecoder({ type: "topk", ratio: 0.05 }, 1000)
    const g = randn(1000, rng, 1)
    const out = dec.decode(overTheWire(enc.encode(0, g, { rank: 0, step: 0 })))
    expect(Object.keys(enc.state())).toEqual([])
    const kept = out.filter((v) => v !== 0)
    expect(kept.length).toBe(50)
    // the 50 largest magnitudes, as they were
    const bar = Float32Array.from(g, Math.abs).sort().reverse()[49]!
    for (let i = 0; i < 1000; i++) {
      if (out[i] === 0) continue
      expect(out[i]).toBe(g[i])
      expect(Math.abs(g[i]!)).toBeGreaterThanOrEqual(bar)
    }
  })

  it("uncompressed pushes: the range itself (fp32), or binary16 bits with wireDtype float16", () => {
    const g = Float32Array.from({ length: 64 }, (_, i) => i / 7)
    const plain = new PushEncoder({ numServers: 1 })
    const p = plain.encode(0, g, { rank: 0, step: 0 })
    expect(p.grad).toBe(g)
    expect(new PushDecoder(undefined, 64).decode(p)).toBe(g)
    const half = new PushEncoder({ compression: "none", halfWire: true, numServers: 1 })
    const h = half.encode(0, g, { rank: 0, step: 0 })
    expect(h.half).toBeInstanceOf(Uint16Array)
    half.endStep()
    expect(half.stats).toMatchObject({ wireBytes: 128, denseBytes: 256 })
    const back = new PushDecoder("none", 64).decode(overTheWire(h))
    for (let i = 0; i < 64; i++) expect(back[i]).toBeCloseTo(g[i]!, 2)
    expect(Object.keys(half.state())).toEqual([])
  })

  it("a checkpoint's residuals continue the sum; those of another number of servers are dropped", () => {
    const rng = new Mulberry32(5)
    const config: ResolvedCompressionConfig = { type: "int8" }
    const a = new PushEncoder({ compression: config, numServers: 1 })
    const dec = new PushDecoder(config, 300)
    const raw = new Float64Array(300)
    const got = new Float64Array(300)
    const push = (enc: PushEncoder, step: number) => {
      const g = randn(300, rng, 1)
      for (let i = 0; i < 300; i++) raw[i] += g[i]!
      const out = dec.decode(overTheWire(enc.encode(0, g, { rank: 0, step })))
      for (let i = 0; i < 300; i++) got[i] += out[i]!
    }
    for (let step = 0; step < 5; step++) push(a, step)
    const saved = decodeMessage(encodeMessage({ residuals: a.state() })) as { residuals: Record<string, Float32Array> }
    const b = new PushEncoder({ compression: config, numServers: 1 })
    expect(b.restore(saved.residuals)).toBe(1)
    for (let step = 5; step < 10; step++) push(b, step)
    const e = b.state()[pushResidualKey(0, 1)]!
    for (let i = 0; i < 300; i++) expect(Math.abs(raw[i]! - got[i]! - e[i]!)).toBeLessThan(1e-4)
    // another number of servers covers other ranges: nothing is taken, pushes start from zero
    expect(new PushEncoder({ compression: config, numServers: 2 }).restore(saved.residuals)).toBe(0)
    // a residual of another length (another model) is dropped at its range's next push
    const c = new PushEncoder({ compression: config, numServers: 1 })
    c.restore(saved.residuals)
    c.encode(0, new Float32Array(10), { rank: 0, step: 0 })
    expect(c.state()[pushResidualKey(0, 1)]!.length).toBe(10)
  })

  it("a server refuses a push it cannot decode: another codec, another length, or a codec it was not given", () => {
    const g = new Float32Array(100).fill(0.5)
    const int8 = new PushEncoder({ compression: { type: "int8" }, numServers: 1 }).encode(0, g, { rank: 0, step: 0 })
    expect(() => new PushDecoder({ type: "topk", ratio: 0.1 }, 100).decode(int8)).toThrow(WireDecodeError)
    expect(() => new PushDecoder({ type: "topk", ratio: 0.1 }, 100).decode(int8)).toThrow(/ranks disagree on the compression config/)
    expect(() => new PushDecoder({ type: "int8" }, 99).decode(int8)).toThrow(WireDecodeError)
    expect(() => new PushDecoder(undefined, 100).decode(int8)).toThrow(ConfigError)
    const half = new PushEncoder({ halfWire: true, numServers: 1 }).encode(0, g, { rank: 0, step: 0 })
    expect(() => new PushDecoder(undefined, 99).decode(half)).toThrow(/disagree on the ranges/)
  })

  it("refuses PowerSGD and compression auto with servers, naming the codecs that work and why", () => {
    const problem = pushCodecProblem({ type: "powersgd", rank: 2 }, "parameter-server")!
    expect(problem).toMatch(/cannot compress pushes to parameter servers/)
    expect(problem).toMatch(/P, then Q/)
    for (const ok of ['"fp16"', '{ type: "int8" }', '{ type: "topk", ratio: 0.01 }', '{ type: "sign" }']) expect(problem).toContain(ok)
    expect(problem.split("; or")[0]).not.toMatch(/use one of .*powersgd/)
    expect(problem).toMatch(/strategy "allreduce" with/)
    expect(() => checkPushCompression({ type: "powersgd", rank: 2 }, "parameter-server")).toThrow(ConfigError)
    expect(pushCodecProblem("auto", "auto")).toMatch(/name a codec the pushes can carry/)
    for (const ok of ["none", "fp16", { type: "int8" }, { type: "topk", ratio: 0.01 }, { type: "sign" }] as const) expect(pushCodecProblem(ok, "parameter-server")).toBeUndefined()
    // and in the Trainer's validation, before anything starts
    const base = { trainLoopPerWorker: "./loop.ts#loop", scalingConfig: { numWorkers: 2 } }
    const err = (() => {
      try {
        resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "parameter-server", compression: { type: "powersgd", rank: 4 } } })
      } catch (e) {
        return e
      }
    })()
    expect(err).toBeInstanceOf(ConfigError)
    expect((err as ConfigError).field).toBe("collectiveConfig.compression")
    expect(resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "auto", compression: { type: "topk", ratio: 0.01 } } }).collective.compression).toEqual({ type: "topk", ratio: 0.01 })
  })
})
