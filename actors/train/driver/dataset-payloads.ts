// The driver's side of `datasets`: what the controller answers a worker's `dataset` ask with. An
// in-memory dataset goes as its arrays (as before); a file dataset as the metadata the driver
// resolved (file list, rows, chunk offsets: never rows, so the driver's memory does not grow with
// the data); a factory as its module and options, to run on the worker.
import type { NatsConnection } from "@nats-io/nats-core"
import type { ArrayDataset } from "../../../core/datasets.ts"
import { isDatasetFactorySpec, isFileDatasetSpec, isObjectUrl } from "../../../core/data/file-spec.ts"
import { resolveFileDataset, type ResolvedDataset } from "../../../core/data/resolve.ts"
import type { DatasetInput } from "./options.ts"
import type { DatasetPayload } from "../common/train-protocol.ts"

/** What config.json records of each dataset (no rows). */
export const describeDatasets = (datasets: Readonly<Record<string, DatasetInput>>): Record<string, unknown> =>
  Object.fromEntries(
    Object.entries(datasets).map(([k, d]) => {
      if (isFileDatasetSpec(d)) return [k, { kind: "files", sources: d.sources, options: d.options }]
      if (isDatasetFactorySpec(d)) return [k, { kind: "factory", module: d.module, export: d.export }]
      const a = d as ArrayDataset
      return [k, { size: a.size, featureShape: a.featureShape, numClasses: a.numClasses, ...(a.labelShape ? { labelShape: a.labelShape } : {}) }]
    })
  )

/** The factory modules the workers will import (the agents check them like the loop's). */
export const datasetModules = (datasets: Readonly<Record<string, DatasetInput>>): string[] =>
  [...new Set(Object.values(datasets).filter(isDatasetFactorySpec).map((d) => d.module))]

/**
 * Resolves the file datasets to metadata: those on local paths when `nats` is undefined (before
 * anything starts, so a missing file fails fast), those in an object store once it is given.
 */
export const resolveDatasets = async (
  datasets: Readonly<Record<string, DatasetInput>>,
  into: Map<string, ResolvedDataset>,
  nats?: () => Promise<NatsConnection>
): Promise<void> => {
  for (const [name, d] of Object.entries(datasets)) {
    if (!isFileDatasetSpec(d) || into.has(name)) continue
    const remote = d.sources.some(isObjectUrl)
    if (remote && !nats) continue
    into.set(name, await resolveFileDataset(name, d, nats))
  }
}

/** The controller's answer for each dataset. */
export const datasetPayloads = (datasets: Readonly<Record<string, DatasetInput>>, resolved: ReadonlyMap<string, ResolvedDataset>): Map<string, DatasetPayload> => {
  const out = new Map<string, DatasetPayload>()
  for (const [name, d] of Object.entries(datasets)) {
    if (isFileDatasetSpec(d)) out.set(name, { kind: "files", resolved: resolved.get(name) })
    else if (isDatasetFactorySpec(d)) out.set(name, { kind: "factory", module: d.module, export: d.export, options: d.options })
    else {
      const a = d as ArrayDataset
      out.set(name, {
        kind: "array",
        x: a.x,
        y: a.y,
        featureShape: [...a.featureShape],
        ...(a.labelShape ? { labelShape: [...a.labelShape] } : {}),
        numClasses: a.numClasses
      })
    }
  }
  return out
}
