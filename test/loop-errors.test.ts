// Which errors of a loop are tfjs's checks of its arguments (a tensor's shape, rank or dtype): the
// failure policy does not retry those, since a restart from the checkpoint meets them again. Real
// tfjs errors, thrown by tfjs itself.
import { describe, expect, it } from "vitest"
import * as tf from "@tensorflow/tfjs"
import { loopFailure, tfjsCheckTag } from "../actors/train/worker/loop-errors.ts"
import { decide } from "../actors/train/driver/failure-policy.ts"
import { ConfigError } from "../core/errors.ts"

const thrown = (f: () => unknown): unknown => {
  try {
    f()
  } catch (e) {
    return e
  }
  throw new Error("it did not throw")
}

describe("tfjs's argument checks in a loop", () => {
  const model = tf.sequential({ layers: [tf.layers.dense({ units: 4, inputShape: [8] })] })

  it("tags tfjs-core's shape and dtype checks InvalidArgumentError and tfjs-layers' ValueError as such", () => {
    const core = [
      () => tf.matMul(tf.zeros([2, 3]), tf.zeros([4, 5])),
      () => tf.add(tf.zeros([2, 3]), tf.zeros([4, 5])),
      () => tf.reshape(tf.zeros([2, 3]), [5]),
      () => tf.concat([tf.zeros([2, 3]), tf.zeros([2, 4])], 0),
      () => tf.gather(tf.zeros([2, 3]), tf.tensor1d([0.5], "float32"))
    ]
    for (const f of core) {
      const e = thrown(f)
      expect(tfjsCheckTag(e), String(e)).toBe("InvalidArgumentError")
      expect(loopFailure(e)).toMatchObject({ tag: "InvalidArgumentError", message: (e as Error).message })
    }
    for (const f of [() => model.predict(tf.zeros([2, 5])), () => tf.layers.dense({ units: 4 }).apply(tf.zeros([2]))]) {
      const e = thrown(f)
      expect((e as Error).name).toBe("Error")
      expect(tfjsCheckTag(e), String(e)).toBe("ValueError")
    }
  })

  it("leaves every other error as it was: the loop's own, a disposed tensor, gradwire's typed errors", () => {
    const disposed = tf.zeros([2])
    disposed.dispose()
    const others = [
      new Error("a flaky fetch of the loop's own"),
      thrown(() => disposed.add(1)),
      new TypeError("x is not a function"),
      new ConfigError({ field: "p", reason: "m" }),
      "a string"
    ]
    for (const e of others) {
      expect(tfjsCheckTag(e), String(e)).toBeUndefined()
      expect(loopFailure(e).tag).not.toMatch(/InvalidArgumentError|ValueError/)
    }
  })

  it("the failure policy gives up on them at once, with no limit on restarts, and says why", () => {
    // and on a RangeError (a bug: an array's length, the stack's depth) and a data position saved
    // for other files, which a restart would resume from again
    expect(decide({ kind: "loop-error", rank: 0, tag: "RangeError", message: "" }, 0, -1)).toEqual({ action: "fail", reason: expect.stringMatching(/^not retryable \(RangeError: an error in the loop's code/) })
    expect(decide({ kind: "loop-error", rank: 0, tag: "DataPositionMismatch", message: "" }, 0, -1)).toEqual({ action: "fail", reason: expect.stringMatching(/^not retryable \(DataPositionMismatch: the checkpoint's data position is of other files/) })
    for (const tag of ["InvalidArgumentError", "ValueError"]) {
      expect(decide({ kind: "loop-error", rank: 0, tag, message: "" }, 0, -1)).toEqual({
        action: "fail",
        reason: expect.stringMatching(new RegExp(`^not retryable \\(${tag}: tfjs refused a tensor's shape, rank or dtype`))
      })
    }
  })
})
