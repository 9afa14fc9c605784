// A pipelined model's state after a lost rank, made from its survivors (driver/regroup.ts): each
// survivor says which files of its stage it holds (its shard: weights, optimizer state; and the
// layout) with the optimizer steps it has taken. A stage's replicas hold the same state, except
// where the group broke between their updates of the step in flight: the copy furthest on is the
// stage's state (the others take it; a stage none of whose replicas made that step skips it), and
// only that survivor is asked for the files. A shard held only by lost ranks (one data-parallel
// replica, or every replica of a stage lost) cannot be made again: the regroup gives up, with that
// reason, and the group restarts from the checkpoint.
import type { StageHandover } from "./train-protocol.ts"

/** `from`: for each file, the index (in the list given) of the survivor to take it from; `steps`: that copy's optimizer steps. */
export type MergedStages = { readonly from: Record<string, number>; readonly steps: Record<string, number> } | { readonly reason: string }

/** Every needed shard from the survivor furthest on that holds it, or why one cannot be had. */
export const mergeStageHandovers = (perSurvivor: ReadonlyArray<StageHandover | undefined>): MergedStages => {
  if (perSurvivor.length === 0 || perSurvivor.some((h) => h === undefined)) return { reason: "a survivor holds no pipeline stage to hand over" }
  const handovers = perSurvivor as ReadonlyArray<StageHandover>
  const from: Record<string, number> = {}
  const steps: Record<string, number> = {}
  for (const [i, h] of handovers.entries()) {
    for (const name of h.holds) {
      const held = steps[name]
      if (held === undefined || h.step > held) {
        from[name] = i
        steps[name] = h.step
      }
    }
  }
  const needs = new Map<string, string>()
  for (const h of handovers) for (const n of h.needs) needs.set(n.name, n.what)
  const lost = [...needs].filter(([name]) => !(name in from)).map(([, what]) => what)
  if (lost.length > 0) {
    return {
      reason:
        `${lost.join(", ")} of the pipelined model ${lost.length > 1 ? "were" : "was"} held only by the lost rank(s): with one data-parallel replica ` +
        "(or every replica of a stage lost) a stage's weights are only in the checkpoint. More replicas (numWorkers a multiple of stages x tensorParallel) let a lost stage be made again from another"
    }
  }
  return { from, steps }
}

/**
 * The files of the merged stages, each from the snapshot of the survivor `from` names (`files`
 * gives a survivor's, by its index), or the first file a snapshot lacked.
 */
export const pickStageFiles = (
  merged: { readonly from: Readonly<Record<string, number>> },
  files: (survivor: number) => Readonly<Record<string, Uint8Array>>
): { readonly files: Record<string, Uint8Array> } | { readonly missing: string; readonly survivor: number } => {
  const out: Record<string, Uint8Array> = {}
  for (const [name, i] of Object.entries(merged.from)) {
    const bytes = files(i)[name]
    if (bytes === undefined) return { missing: name, survivor: i }
    out[name] = bytes
  }
  return { files: out }
}

/** A pipeline checkpoint's stage shard: pipeline/stage-<s>-of-<S>.tp-<t>-of-<T>.msgpack (worker/model-parallel/checkpoint.ts). */
const SHARD = /^pipeline\/stage-(\d+)-of-(\d+)\.tp-(\d+)-of-(\d+)\.msgpack$/
const LAYOUT = "pipeline/layout.json"

/** Whether a checkpoint file is a stage shard (not the layout, nor any other file). */
export const isStageShard = (name: string): boolean => SHARD.test(name)

/**
 * The stage shards a pipeline checkpoint's files lack (empty when complete, or when the files are
 * not a pipeline checkpoint): a report round that a regroup completed without the lost rank's
 * report has no shard of that rank's stage, and is no checkpoint to resume from.
 */
export const missingStageShards = (files: Readonly<Record<string, Uint8Array>>): string[] => {
  const layout = files[LAYOUT]
  if (!layout) return []
  let shape: { stages?: unknown; tp?: unknown }
  try {
    shape = JSON.parse(new TextDecoder().decode(layout)) as { stages?: unknown; tp?: unknown }
  } catch {
    return [LAYOUT]
  }
  const stages = Number(shape.stages)
  const tp = Number(shape.tp)
  if (!(Number.isInteger(stages) && stages >= 1 && Number.isInteger(tp) && tp >= 1)) return [LAYOUT]
  const held = new Set<string>()
  for (const name of Object.keys(files)) {
    const m = SHARD.exec(name)
    if (m && Number(m[2]) === stages && Number(m[4]) === tp) held.add(`${m[1]}/${m[3]}`)
  }
  const missing: string[] = []
  for (let s = 0; s < stages; s++) for (let t = 0; t < tp; t++) if (!held.has(`${s}/${t}`)) missing.push(`stage ${s}${tp > 1 ? ` (tensor rank ${t})` : ""}`)
  return missing
}
