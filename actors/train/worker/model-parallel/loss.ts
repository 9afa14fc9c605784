// The loss the last pipeline stage computes, from the model's compile() loss or one passed in, and
// the targets it wants (one-hot class ids for a categorical loss). The same choices and formulas
// as the data-parallel wrapper's, so a pipelined model trains on the same objective.
import type { Tf } from "../../../../core/engine.ts"
import { ConfigError } from "../../../../core/errors.ts"
import { correctPredictions, probCrossEntropy } from "../../../../core/kernels/prob-cross-entropy.ts"

import type { Scalar, Tensor } from "@tensorflow/tfjs"

export type LossName = "categoricalCrossentropy" | "sparseCategoricalCrossentropy" | "meanSquaredError" | "binaryCrossentropy"
export type LossFn = (yTrue: Tensor, yPred: Tensor) => Scalar

export interface ResolvedLoss {
  /** Mean loss of a batch. */
  readonly fn: LossFn
  /** Accuracy makes sense (class predictions). */
  readonly classification: boolean
  /** Targets are class ids (no one-hot). */
  readonly sparse: boolean
  /** Each row's loss, a [rows] tensor (the named losses): what sample and class weights scale. */
  readonly perSample?: (yTrue: Tensor, yPred: Tensor) => Tensor
  /** Class weights apply (the cross-entropies: targets are classes). */
  readonly perClass?: boolean
}

/** A cross-entropy on probabilities, on rows of C or class ids: one kernel each way on wasm and cpu (core/kernels/prob-cross-entropy.ts), tfjs-layers' own elsewhere. */
const crossEntropyLoss = (tf: Tf, sparse: boolean): ResolvedLoss => ({
  fn: (yt, yp) => probCrossEntropy(tf, yt, yp, { sparse, mean: true }) as Scalar,
  classification: true,
  sparse,
  perSample: (yt, yp) => probCrossEntropy(tf, yt, yp, { sparse, mean: false }),
  perClass: true
})

export const resolveLoss = (tf: Tf, loss: unknown, field: string): ResolvedLoss => {
  if (typeof loss === "function") return { fn: loss as LossFn, classification: false, sparse: false }
  switch (loss) {
    case "categoricalCrossentropy":
      return crossEntropyLoss(tf, false)
    case "sparseCategoricalCrossentropy":
      return crossEntropyLoss(tf, true)
    case "meanSquaredError":
      return {
        fn: (yt, yp) => tf.losses.meanSquaredError(yt, yp) as Scalar,
        classification: false,
        sparse: false,
        perSample: (yt, yp) => tf.tidy(() => tf.squaredDifference(yt, yp).reshape([yp.shape[0] as number, -1]).mean(1))
      }
    case "binaryCrossentropy":
      return {
        fn: (yt, yp) => tf.metrics.binaryCrossentropy(yt, yp).mean() as Scalar,
        classification: false,
        sparse: false,
        perSample: (yt, yp) => tf.tidy(() => tf.metrics.binaryCrossentropy(yt, yp).reshape([yp.shape[0] as number, -1]).mean(1)),
        perClass: true
      }
    default:
      throw new ConfigError({
        field,
        reason:
          `no usable loss (got ${JSON.stringify(loss)}): compile the model with one of "categoricalCrossentropy", ` +
          `"sparseCategoricalCrossentropy", "meanSquaredError", "binaryCrossentropy", or pass { loss: (yTrue, yPred) => scalar }`
      })
  }
}

/** Class ids of targets (one-hot rows or ids), for counting correct predictions. */
export const labelsOf = (y: Tensor): Tensor => (y.rank > 1 && (y.shape[y.rank - 1] ?? 1) > 1 ? y.argMax(-1) : y.flatten().toInt())

/** How many rows of `pred` predict their target (a scalar): one kernel on wasm and cpu, argMax, equal and sum elsewhere. */
export const countCorrect = (tf: Tf, pred: Tensor, y: Tensor): Tensor => correctPredictions(tf, pred, y) ?? tf.tidy(() => pred.argMax(-1).equal(labelsOf(y)).sum())
