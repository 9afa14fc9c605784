// A pipelined model's state made from its survivors at a regroup (actors/train/common/stage-handover.ts):
// each needed stage shard from the replica furthest on (only that one asked for it), a shard held only by lost ranks named, and
// a checkpoint round that lacks a stage's shard told apart (with the worker's own shard names).
import { describe, expect, it } from "vitest"
import { mergeStageHandovers, missingStageShards, pickStageFiles } from "../actors/train/common/stage-handover.ts"
import { LAYOUT_FILE, otherStageFiles, shardFileName, stageFilesOf } from "../actors/train/worker/model-parallel/checkpoint.ts"
import { gridShape, placeOf } from "../actors/train/worker/model-parallel/grid.ts"

const bytes = (...v: number[]) => Uint8Array.from(v)
const layout = (stages: number, tp: number) => new TextEncoder().encode(JSON.stringify({ format: 1, stages, tp, bounds: [], units: 0, weights: [] }))
const needs = (stages: number, tp: number) =>
  Array.from({ length: stages * tp }, (_, i) => ({ name: shardFileName(Math.floor(i / tp), stages, i % tp, tp), what: `stage ${Math.floor(i / tp)}` }))
const handover = (stage: number, step: number) => ({ step, holds: [shardFileName(stage, 2, 0, 1), LAYOUT_FILE], needs: needs(2, 1) })
/** What a survivor's snapshot gives: its stage's shard (`value`) and the layout. */
const filesOf = (stage: number, value: number): Record<string, Uint8Array> => ({ [shardFileName(stage, 2, 0, 1)]: bytes(value), [LAYOUT_FILE]: layout(2, 1) })

describe("a pipelined model's stages handed over at a regroup", () => {
  it("takes each stage's shard from the replica furthest on, whatever the order of the survivors, asking one survivor per stage", () => {
    // stage 0: replicas at steps 7 and 8 (one applied the step in flight); stage 1: one survivor at step 7
    const survivors = [handover(0, 7), handover(0, 8), handover(1, 7)]
    const snapshots = [filesOf(0, 70), filesOf(0, 80), filesOf(1, 71)]
    for (const order of [[0, 1, 2], [2, 1, 0], [1, 0, 2]]) {
      const merged = mergeStageHandovers(order.map((i) => survivors[i]!))
      if ("reason" in merged) throw new Error(merged.reason)
      // the stage-0 replica at step 7 is not asked for anything
      expect(Object.values(merged.from)).not.toContain(order.indexOf(0))
      expect(new Set(Object.values(merged.from)).size).toBe(2)
      const asked: number[] = []
      const picked = pickStageFiles(merged, (k) => (asked.push(order[k]!), snapshots[order[k]!]!))
      if ("missing" in picked) throw new Error(picked.missing)
      expect([...picked.files[shardFileName(0, 2, 0, 1)]!]).toEqual([80])
      expect([...picked.files[shardFileName(1, 2, 0, 1)]!]).toEqual([71])
      expect(merged.steps[shardFileName(0, 2, 0, 1)]).toBe(8)
      expect(picked.files[LAYOUT_FILE]).toBeDefined()
      expect(asked).not.toContain(0)
    }
  })

  it("names the file a picked survivor's snapshot lacks", () => {
    const merged = mergeStageHandovers([handover(0, 4), handover(1, 4)])
    if ("reason" in merged) throw new Error(merged.reason)
    expect(pickStageFiles(merged, (k) => (k === 1 ? { [LAYOUT_FILE]: layout(2, 1) } : filesOf(0, 1)))).toEqual({ missing: shardFileName(1, 2, 0, 1), survivor: 1 })
  })

  it("names a stage held only by lost ranks, and a survivor without a stage to hand over", () => {
    const lost = mergeStageHandovers([handover(0, 3), handover(0, 3)])
    expect(lost).toEqual({ reason: expect.stringMatching(/^stage 1 of the pipelined model was held only by the lost rank\(s\): with one data-parallel replica/) })
    expect(mergeStageHandovers([handover(0, 3), undefined])).toEqual({ reason: "a survivor holds no pipeline stage to hand over" })
    expect(mergeStageHandovers([])).toHaveProperty("reason")
  })

  it("tells a pipeline checkpoint that lacks a stage's shard from a whole one, and leaves other checkpoints alone", () => {
    const whole: Record<string, Uint8Array> = { [LAYOUT_FILE]: layout(2, 2) }
    for (const n of needs(2, 2)) whole[n.name] = bytes(1)
    expect(missingStageShards(whole)).toEqual([])
    const { [shardFileName(1, 2, 1, 2)]: _gone, ...short } = whole
    expect(missingStageShards(short)).toEqual(["stage 1 (tensor rank 1)"])
    // shards of another cut do not count
    expect(missingStageShards({ [LAYOUT_FILE]: layout(2, 1), [shardFileName(0, 3, 0, 1)]: bytes(1), [shardFileName(1, 2, 0, 1)]: bytes(1) })).toEqual(["stage 0"])
    expect(missingStageShards({ "model.json": bytes(1), "weights.bin": bytes(2) })).toEqual([])
    expect(missingStageShards({ [LAYOUT_FILE]: new TextEncoder().encode("{") })).toEqual([LAYOUT_FILE])
  })
  it("leaves out of a rank's checkpoint fetch every shard but its own: each rank's own and left-out files are the whole checkpoint", () => {
    const all = needs(2, 2).map((n) => n.name).sort()
    for (let rank = 0; rank < 8; rank++) {
      const place = placeOf(rank, gridShape(8, 2, 2))
      const left = otherStageFiles(place)
      const own = stageFilesOf(place)
      expect(left).toHaveLength(3)
      expect(left).not.toContain(own[1])
      expect([...left, own[1]].sort()).toEqual(all)
    }
    expect(otherStageFiles(placeOf(0, gridShape(2, 1, 1)))).toEqual([])
  })
})
