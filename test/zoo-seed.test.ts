// The zoo's --seed: the same seed gives the same initial weights (tfjs's unseeded initializers
// draw their seeds from Math.random, which withSeed swaps for a seeded generator while the model is
// built), another seed or none gives others, and Math.random is itself again afterwards.
import { beforeAll, describe, expect, it } from "vitest"
import * as tf from "@tensorflow/tfjs"
import type { Tf } from "../index.ts"
import { weightsHash } from "../examples/digits/model.ts"
import { buildZooModel } from "../examples/zoo/models.ts"
import { withSeed } from "../examples/zoo/train.ts"

beforeAll(async () => {
  await tf.setBackend("cpu")
})

const start = (seed: number | undefined): string => {
  const model = withSeed(seed, () => buildZooModel(tf as unknown as Tf, "resnet"))
  const hash = weightsHash(model.trainableWeights.map((w) => w.read()))
  model.dispose()
  return hash
}

describe("the zoo's seeded initial weights", () => {
  it("are the same for the same seed and differ for another seed or none", () => {
    expect(start(7)).toBe(start(7))
    expect(start(8)).not.toBe(start(7))
    expect(start(undefined)).not.toBe(start(undefined))
  })

  it("leave Math.random as it was, also when the build throws", () => {
    const random = Math.random
    withSeed(3, () => 1)
    expect(Math.random).toBe(random)
    expect(() => withSeed(3, () => { throw new Error("bad model") })).toThrow("bad model")
    expect(Math.random).toBe(random)
  })
})
