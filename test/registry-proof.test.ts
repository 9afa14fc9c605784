// An all-reduce algorithm and a codec added through the registries alone: each is one module
// (support/throwaway/gather-broadcast.ts, support/throwaway/pair-mean.ts) plus its registration
// line (support/throwaway/register.ts), and no other file knows them. Registered here and in the
// rank processes (which import the same module by path), they pass the conformance suite the
// built-ins pass, run over NATS, and show up wherever the registries' lists are read: config
// validation and its messages, the cost model's predictions and the compression candidates.
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"
import "./support/throwaway/register.ts"
import { allReduceAlgorithmNames, allReduceAlgorithms, allowedAlgorithms, parseAlgorithmChoice, registerAllReduceAlgorithm, AlgorithmRegistrationError } from "../collectives/algorithms/index.ts"
import {
  CodecContractError,
  CodecRegistrationError,
  allowedCodecTypes,
  codecNames,
  createCompressor,
  defineCodec,
  parseCompressionConfig,
  registerCodec
} from "../collectives/compression/index.ts"
import * as Schema from "effect/Schema"
import { planCommunication, explain } from "../scheduler/algorithm-choice.ts"
import { defaultCostModel } from "../scheduler/cost-model.ts"
import { gatherBroadcast } from "./support/throwaway/gather-broadcast.ts"
import { algorithmConformance, codecConformance } from "./support/conformance.ts"

const REGISTER = fileURLToPath(new URL("./support/throwaway/register.ts", import.meta.url))
const ALGORITHM = "gather-broadcast"
const CODEC = "pair-mean"

describe("registered by a test alone", () => {
  it("the algorithm and the codec are in the registries' lists, after the built-ins", () => {
    expect(allReduceAlgorithmNames().at(-1)).toBe(ALGORITHM)
    expect(allReduceAlgorithmNames()).toContain("ring")
    expect(codecNames().at(-1)).toBe(CODEC)
  })

  it("config validation accepts them and lists them in its messages", () => {
    expect(parseAlgorithmChoice(ALGORITHM, "collectiveConfig.algorithm")).toBe(ALGORITHM)
    expect(allowedAlgorithms()).toContain(`"${ALGORITHM}"`)
    expect(parseCompressionConfig({ type: CODEC, errorFeedback: false })).toEqual({ type: CODEC, errorFeedback: false })
    expect(allowedCodecTypes()).toContain(`"${CODEC}"`)
    expect(() => parseCompressionConfig({ type: CODEC, ratio: 2 })).toThrow(/compression\.ratio/)
  })

  it("the cost model predicts the algorithm and the explanation lists it", () => {
    const topology = Array.from({ length: 4 }, (_, r) => ({ nodeId: `n${r}`, server: "s" }))
    const plan = planCommunication({ bucketBytes: [1 << 20], topology, model: defaultCostModel(), algorithms: allReduceAlgorithms(), compressors: [], computeMs: 1 })
    const predicted = plan.buckets[0]!.predictions.find((p) => p.algorithm === ALGORITHM)
    expect(predicted?.ms).toBeGreaterThan(0)
    expect(predicted?.phases.map((p) => p.name)).toEqual(["gather to rank 0", "result from rank 0"])
    expect(explain(plan).text).toContain(`${ALGORITHM} `)
    expect(Object.keys(explain(plan).json.buckets[0]!.predictedMs)).toContain(ALGORITHM)
  })

  it("the registries refuse a taken name or code, and a codec that does not implement what its entry declares", () => {
    expect(() => registerAllReduceAlgorithm({ ...gatherBroadcast, name: "ring" })).toThrow(AlgorithmRegistrationError)
    expect(() => registerAllReduceAlgorithm({ ...gatherBroadcast, name: "gather-twice" })).toThrow(/code 200 belongs to "gather-broadcast"/)
    expect(() => registerAllReduceAlgorithm({ ...gatherBroadcast, name: "auto", code: 201 })).toThrow(AlgorithmRegistrationError)
    const schema = Schema.Struct({ type: Schema.Literal("half-done") })
    const second = Schema.Struct({ type: Schema.Literal("fp16") })
    expect(() => registerCodec(defineCodec({ name: "fp16", aggregation: "linear", hint: "a second fp16", example: { type: "fp16" }, schema: second, create: () => createCompressor("fp16") }))).toThrow(
      CodecRegistrationError
    )
    // declares 'linear' but its codec has none of the linear hooks: refused when created, not run as fp16
    registerCodec(
      defineCodec({
        name: "half-done",
        aggregation: "linear",
        hint: "a codec that forgot its linear hooks",
        example: { type: "half-done" },
        schema,
        create: () => ({ name: "half-done", aggregation: "linear", errorFeedback: true }) as never
      })
    )
    expect(() => createCompressor({ type: "half-done" })).toThrow(CodecContractError)
    expect(() => createCompressor({ type: "half-done" })).toThrow(/needs domainLength, toDomain, fromDomain/)
  })
})

algorithmConformance([ALGORITHM], { preload: [REGISTER] })
codecConformance([CODEC], { preload: [REGISTER] })
