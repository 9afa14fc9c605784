// The `compression` option: accepted forms, typed errors that name the field and the allowed
// values, and createCompressor.
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import { describe, expect, it } from "vitest"
import { ConfigError } from "../core/errors.ts"
import {
  CompressionAutoUnresolved,
  Fp16Compressor,
  Int8Compressor,
  NoneCompressor,
  PowerSgdCompressor,
  SignCompressor,
  TopKCompressor,
  createCompressor,
  decodeCompressionConfig,
  parseCompressionConfig
} from "../collectives/compression/index.ts"

const fails = (input: unknown): ConfigError => {
  try {
    parseCompressionConfig(input)
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError)
    return e as ConfigError
  }
  return expect.fail(`${JSON.stringify(input)} was accepted`)
}

describe("compression config", () => {
  it("accepts every documented form, absent meaning 'none'", () => {
    for (const ok of [
      "none",
      "fp16",
      "auto",
      { type: "none" },
      { type: "fp16", errorFeedback: false },
      { type: "int8" },
      { type: "int8", chunkSize: 1024, seed: 7 },
      { type: "topk", ratio: 0.01 },
      { type: "topk", ratio: 1, errorFeedback: false },
      { type: "powersgd", rank: 4, warmupSteps: 10 },
      { type: "powersgd", rank: 1 },
      { type: "sign" },
      { type: "sign", chunkSize: 512 }
    ]) {
      expect(parseCompressionConfig(ok)).toEqual(ok)
    }
    expect(parseCompressionConfig(undefined)).toBe("none")
  })

  it("names the field and the allowed values", () => {
    let e = fails("gzip")
    expect(e.field).toBe("compression")
    expect(e.message).toContain('"fp16"')
    expect(e.message).toContain("powersgd")
    e = fails("topk")
    expect(e.message).toContain('{ type: "topk", ratio: 0.01 }')
    e = fails(42)
    expect(e.field).toBe("compression")
    e = fails({ type: "zip" })
    expect(e.field).toBe("compression.type")
    expect(e.message).toMatch(/"int8", "topk", "powersgd", "sign"/)
    e = fails({ ratio: 0.1 })
    expect(e.field).toBe("compression.type")
    e = fails({ type: "topk" })
    expect(e.field).toBe("compression.ratio")
    e = fails({ type: "topk", ratio: 0 })
    expect(e.field).toBe("compression.ratio")
    expect(e.message).toMatch(/greater than 0/)
    e = fails({ type: "topk", ratio: 2 })
    expect(e.message).toMatch(/less than or equal to 1/)
    e = fails({ type: "powersgd", rank: 2.5, warmupSteps: 3 })
    expect(e.field).toBe("compression.rank")
    e = fails({ type: "powersgd", rank: 2, warmupSteps: -1 })
    expect(e.field).toBe("compression.warmupSteps")
    e = fails({ type: "sign", chunkSize: 100 })
    expect(e.message).toMatch(/multiple of 8/)
    e = fails({ type: "int8", errorFeedback: "yes" })
    expect(e.field).toBe("compression.errorFeedback")
    e = fails({ type: "topk", ratio: 0.1, ratoi: 0.1 })
    expect(e.field).toBe("compression.ratoi")
    expect(e.message).toMatch(/unknown option/)
  })

  it("uses the caller's field path", () => {
    try {
      parseCompressionConfig({ type: "topk", ratio: -1 }, "scalingConfig.compression")
      expect.fail("accepted")
    } catch (e) {
      expect((e as ConfigError).field).toBe("scalingConfig.compression.ratio")
    }
  })

  it("has an Effect form that fails with ConfigError", () => {
    const exit = Effect.runSyncExit(decodeCompressionConfig({ type: "sign", chunkSize: 3 }))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(Effect.runSync(decodeCompressionConfig("fp16"))).toBe("fp16")
  })
})

describe("createCompressor", () => {
  it("builds the codec with its options and aggregation", () => {
    expect(createCompressor("none")).toBeInstanceOf(NoneCompressor)
    const fp16 = createCompressor("fp16")
    expect(fp16).toBeInstanceOf(Fp16Compressor)
    expect(fp16.aggregation).toBe("linear")
    expect(fp16.errorFeedback).toBe(true)
    const int8 = createCompressor({ type: "int8", chunkSize: 1024 }) as Int8Compressor
    expect(int8.chunkSize).toBe(1024)
    // what the reducer runs for it
    expect(int8.aggregation).toBe("allgather")
    const topk = createCompressor({ type: "topk", ratio: 0.01, errorFeedback: false }) as TopKCompressor
    expect(topk.ratio).toBe(0.01)
    expect(topk.errorFeedback).toBe(false)
    expect(topk.aggregation).toBe("allgather")
    const psgd = createCompressor({ type: "powersgd", rank: 4, warmupSteps: 10 }) as PowerSgdCompressor
    expect(psgd).toBeInstanceOf(PowerSgdCompressor)
    expect([psgd.rank, psgd.warmupSteps, psgd.aggregation]).toEqual([4, 10, "custom"])
    const sign = createCompressor({ type: "sign" })
    expect(sign).toBeInstanceOf(SignCompressor)
    expect(sign.aggregation).toBe("allgather")
  })

  it("refuses an unresolved 'auto' and invalid input with typed errors", () => {
    expect(() => createCompressor("auto")).toThrow(CompressionAutoUnresolved)
    expect(() => createCompressor({ type: "topk", ratio: 5 } as never)).toThrow(ConfigError)
  })
})
