// GradientReducer.gradientBuffer: the flat gradient buffer the reducer hands out shares one SIMD
// space with the error-feedback residuals and fp16 messages (so the kernels read and write them in
// place). Which reducers get one, where residuals go, and that moving them there keeps their
// values. (The compressed buffer and the residual store never touch the communicator, so none is
// made; the uncompressed buffer's test stands in for the two members it reads. The reductions
// themselves run over NATS and the direct links in compression-network.test.ts.)
import { describe, expect, it } from "vitest"
import { GradientReducer } from "../collectives/gradient-reducer.ts"
import type { ResolvedCompressionConfig } from "../collectives/compression/index.ts"
import { inSimdSpace, simdAvailable, simdSpace } from "../collectives/simd.ts"

const reducer = (compression: ResolvedCompressionConfig) => new GradientReducer(undefined as never, { algorithm: "ring", compression })
const N = 1 << 16

describe("GradientReducer.gradientBuffer", () => {
  it("is offered only where error feedback runs on a gradient large enough, and is the same buffer each time", () => {
    expect(reducer("none").gradientBuffer(N)).toBeUndefined()
    expect(reducer({ type: "topk", ratio: 0.01, errorFeedback: false }).gradientBuffer(N)).toBeUndefined()
    expect(reducer("fp16").gradientBuffer(1000)).toBeUndefined()
    const r = reducer({ type: "powersgd", rank: 4 })
    const flat = r.gradientBuffer(N)!
    expect(flat.length).toBe(N)
    expect(inSimdSpace(flat)).toBe(true)
    expect(r.gradientBuffer(N)).toBe(flat)
    // one space per reducer: another length gets none (the caller passes its own array)
    expect(r.gradientBuffer(N + 4)).toBeUndefined()
  })

  it("uncompressed, asks the communicator once per length: its allocated buffer with a direct link, nothing without, each step after the first answered from memory", () => {
    // A stand-in for the communicator's two members gradientBuffer reads (the real ones run in
    // compression-network.test.ts), counting how often the reducer asks.
    const group = (via: "nats" | "tcp") => {
      const asked = { transport: 0, allocate: 0 }
      const comm = {
        get transport() {
          asked.transport++
          return { links: [{ peer: 1, via }] }
        },
        allocate: (n: number) => {
          asked.allocate++
          return simdSpace([n])?.[0] ?? new Float32Array(n)
        }
      }
      return { r: new GradientReducer(comm as never, { algorithm: "ring", compression: "none" }), asked }
    }
    const direct = group("tcp")
    const flat = direct.r.gradientBuffer(N)
    if (simdAvailable()) expect(inSimdSpace(flat!)).toBe(true)
    else expect(flat).toBeUndefined()
    for (let step = 0; step < 5; step++) expect(direct.r.gradientBuffer(N)).toBe(flat)
    expect(direct.asked).toEqual({ transport: 1, allocate: 1 })
    const nats = group("nats")
    for (let step = 0; step < 5; step++) expect(nats.r.gradientBuffer(N)).toBeUndefined()
    expect(nats.asked).toEqual({ transport: 1, allocate: 0 })
    // another length is decided afresh
    nats.r.gradientBuffer(N + 4)
    expect(nats.asked.transport).toBe(2)
  })

  it("residuals made afterwards live in the same space, zeroed, apart from the gradient and each other", () => {
    const r = reducer({ type: "topk", ratio: 0.01 })
    const flat = r.gradientBuffer(N)!
    flat.fill(7)
    const a = r.ef.residual("bucket0", N / 2)
    const b = r.ef.residual("bucket1", N / 2 - 3)
    for (const e of [a, b]) {
      expect(e.buffer).toBe(flat.buffer)
      expect(e.every((v) => v === 0)).toBe(true)
    }
    a.fill(1)
    b.fill(2)
    expect(flat.every((v) => v === 7)).toBe(true)
    expect(a.every((v) => v === 1)).toBe(true)
    // a restore puts each key back in its own region, with the saved values
    const at = a.byteOffset
    r.ef.restore(r.ef.state())
    const a2 = r.ef.get("bucket0")!
    expect(a2.byteOffset).toBe(at)
    expect(a2.every((v) => v === 1)).toBe(true)
    expect(r.ef.get("bucket1")!.every((v) => v === 2)).toBe(true)
    // more residual than the arena holds: ordinary storage, still correct
    const big = r.ef.residual("other", 2 * N)
    expect(big.buffer).not.toBe(flat.buffer)
    expect(big.every((v) => v === 0)).toBe(true)
  })

  it("is not offered without SIMD (GRADWIRE_SIMD=0): the caller keeps its own array", async () => {
    const { execFileSync } = await import("node:child_process")
    const script = `
      import { GradientReducer } from "./collectives/gradient-reducer.ts"
      import { simdAvailable } from "./collectives/simd.ts"
      const r = new GradientReducer(undefined, { algorithm: "ring", compression: { type: "powersgd", rank: 4 } })
      const e = r.ef.residual("a", 1 << 20)
      console.log(JSON.stringify({ simd: simdAvailable(), buffer: r.gradientBuffer(1 << 16) === undefined ? "none" : "given", residual: e.length }))`
    const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { env: { ...process.env, GRADWIRE_SIMD: "0" }, encoding: "utf8" })
    expect(JSON.parse(out.trim())).toEqual({ simd: false, buffer: "none", residual: 1 << 20 })
  })

  it("residuals restored before the buffer existed move into its space with their values", () => {
    const r = reducer("fp16")
    const saved = Float32Array.from({ length: 5000 }, (_, i) => i * 0.5)
    r.ef.restore({ bucket0: saved })
    expect(r.ef.get("bucket0")!.buffer).not.toBe(saved.buffer)
    const flat = r.gradientBuffer(N)!
    const moved = r.ef.get("bucket0")!
    expect(moved.buffer).toBe(flat.buffer)
    expect(Array.from(moved)).toEqual(Array.from(saved))
  })
})
