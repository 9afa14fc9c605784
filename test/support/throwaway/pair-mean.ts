// A throwaway codec, to show that one is a module and a registration line (register.ts) and
// nothing else: a linear 2x sketch that sends the sum of each pair of neighbouring elements and
// decodes both as their mean. C(a) + C(b) = C(a + b), so it declares the 'linear' aggregation and
// the gradient reducer sums the sketches in the all-reduce and decodes the sum once; error feedback
// keeps what the mean drops. test/registry-proof.test.ts runs it through the conformance suite and
// a GradientReducer over NATS.
import * as Schema from "effect/Schema"
import type { LinearCodec } from "../../../collectives/compression/codec.ts"
import { ErrorFeedbackOption, defineCodec } from "../../../collectives/compression/registry.ts"

class PairMean implements LinearCodec {
  readonly name = "pair-mean"
  readonly aggregation = "linear" as const
  readonly wire = "f32" as const
  readonly castsToWire = false
  readonly errorFeedback: boolean

  constructor(errorFeedback = true) {
    this.errorFeedback = errorFeedback
  }

  domainLength(n: number): number {
    return Math.ceil(n / 2)
  }

  toDomain(x: Float32Array, out: Float32Array): void {
    for (let j = 0; j < out.length; j++) out[j] = x[2 * j]! + (2 * j + 1 < x.length ? x[2 * j + 1]! : 0)
  }

  fromDomain(y: Float32Array, out: Float32Array): void {
    for (let i = 0; i < out.length; i++) out[i] = i === out.length - 1 && out.length % 2 === 1 ? y[i >> 1]! : y[i >> 1]! * 0.5
  }
}

export const pairMean = defineCodec({
  name: "pair-mean",
  aggregation: "linear",
  hint: "sends the sum of each pair of neighbours, decodes both as their mean: 2x, linear; a test of the registry",
  example: { type: "pair-mean" },
  schema: Schema.Struct({ type: Schema.Literal("pair-mean"), errorFeedback: ErrorFeedbackOption }),
  create: (c) => new PairMean(c.errorFeedback ?? true)
})
