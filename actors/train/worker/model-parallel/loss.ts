// The loss the last pipeline stage computes, from the model's compile() loss or one passed in, and
// the targets it wants (one-hot class ids for a categorical loss). The same choices and formulas
// as the data-parallel wrapper's, so a pipelined model trains on the same objective.
import type { Tf } from "../../../../core/engine.ts"
import { ConfigError } from "../../../../core/errors.ts"
import { probCrossEntropy } from "../../../../core/kernels/prob-cross-entropy.ts"

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

export const resolveLoss = (tf: Tf, loss: unknown, field: string): ResolvedLoss => {
  if (typeof loss === "function") return { fn: loss as LossFn, classification: false, sparse: false }
  switch (loss) {
    case "categoricalCrossentropy":
      // One kernel each way on wasm and cpu (core/kernels/prob-cross-entropy.ts), tfjs-layers' own elsewhere.
      return {
        fn: (yt, yp) => probCrossEntropy(tf, yt, yp, { sparse: false, mean: true }) as Scalar,
        classification: true,
        sparse: false,
        perSample: (yt, yp) => probCrossEntropy(tf, yt, yp, { sparse: false, mean: false }),
        perClass: true
      }
    case "sparseCategoricalCrossentropy":
      return {
        fn: (yt, yp) => probCrossEntropy(tf, yt, yp, { sparse: true, mean: true }) as Scalar,
        classification: true,
        sparse: true,
        perSample: (yt, yp) => probCrossEntropy(tf, yt, yp, { sparse: true, mean: false }),
        perClass: true
      }
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
