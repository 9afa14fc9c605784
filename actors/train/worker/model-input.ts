// What a training step takes as a model's input: one tensor, or for a model of several inputs an
// array of them (in the model's input order) or a map by input name; and the batch's rows.
import { ConfigError } from "../../../core/errors.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel

/** A model's input: one tensor, or for a model of several inputs an array of them (in its input order) or a map by input name. */
export type ModelInput = import("@tensorflow/tfjs").Tensor | import("@tensorflow/tfjs").Tensor[] | { readonly [name: string]: import("@tensorflow/tfjs").Tensor }

/** Whether `v` is a tfjs tensor (of whichever tfjs module instance made it). */
export const isTensor = (v: unknown): v is Tensor =>
  typeof v === "object" && v !== null && Array.isArray((v as { shape?: unknown }).shape) && typeof (v as { data?: unknown }).data === "function" && "dataId" in v

/** The input as model.apply takes it: a map by input name becomes an array in the model's input order. */
export const inputsOf = (model: LayersModel, x: ModelInput): Tensor | Tensor[] => {
  if (isTensor(x) || Array.isArray(x)) return x
  const names = model.inputNames
  const missing = names.filter((n) => !(n in x))
  if (missing.length > 0) throw new ConfigError({ field: "trainStep(x)", reason: `the inputs by name lack ${missing.join(", ")}; the model's inputs are ${names.join(", ")}` })
  return names.map((n) => x[n]!)
}

/** The batch's rows: the first axis of its (first) input. */
export const rowsOf = (x: ModelInput): number => {
  const first = isTensor(x) ? x : Array.isArray(x) ? x[0] : Object.values(x)[0]
  return first?.shape[0] ?? 0
}

