// Local SGD / DiLoCo's outer loop as pure arithmetic (actors/train/common/optim/outer-optimizer.ts) and
// its options: defaults and refusals, the fragments and their staggered schedule, the outer
// optimizers against their formulas, and the state a checkpoint carries.
import { describe, expect, it } from "vitest"
import { ConfigError } from "../core/errors.ts"
import { OuterState, fragmentDue, planFragments, resolveLocalSgd, type LocalSgdSettings } from "../actors/train/common/optim/outer-optimizer.ts"
import { resolveTrainerOptions } from "../actors/train/driver/options.ts"
import { chooseStrategy } from "../scheduler/strategy-choice.ts"
import { LocalSgd } from "../actors/train/worker/local-sgd.ts"

const layout = (sizes: number[]) => {
  let off = 0
  return sizes.map((size, i) => {
    const s = { name: `v${i}`, shape: [size], offset: off, size }
    off += size
    return s
  })
}

const settings = (o: Partial<LocalSgdSettings> = {}): LocalSgdSettings => ({ ...resolveLocalSgd({}), ...o })

describe("collectiveConfig.localSgd", () => {
  it("defaults to DiLoCo's outer Nesterov (0.7, 0.9) every 32 steps, plain averaging at outerLr 1", () => {
    expect(resolveLocalSgd(undefined)).toEqual({ syncEvery: 32, outerOptimizer: "nesterov", outerLr: 0.7, outerMomentum: 0.9, fragments: 1, overlap: false })
    expect(resolveLocalSgd({ outerOptimizer: "average", syncEvery: 8 })).toEqual({ syncEvery: 8, outerOptimizer: "average", outerLr: 1, outerMomentum: 0, fragments: 1, overlap: false })
    expect(resolveLocalSgd({ fragments: 4 }).overlap).toBe(true)
    expect(resolveLocalSgd({ fragments: 4, overlap: false }).overlap).toBe(false)
  })

  it("refuses bad values with the field and what to do", () => {
    const bad: Array<[unknown, RegExp]> = [
      [{ syncEvery: 0 }, /syncEvery.*integer >= 1/],
      [{ syncEvery: 2.5 }, /syncEvery/],
      [{ outerOptimizer: "adam" }, /"average" or "nesterov"/],
      [{ outerLr: 0 }, /outerLr.*> 0/],
      [{ outerOptimizer: "average", outerMomentum: 0.9 }, /only the "nesterov" outer optimizer has momentum/],
      [{ outerMomentum: 1 }, /\[0, 1\)/],
      [{ fragments: 9, syncEvery: 8 }, /at most 8/],
      [{ overlap: "yes" }, /true or false/],
      [{ everyH: 3 }, /unknown option/]
    ]
    for (const [input, message] of bad) {
      const e = (() => {
        try {
          resolveLocalSgd(input)
        } catch (err) {
          return err
        }
      })()
      expect(e).toBeInstanceOf(ConfigError)
      expect(String((e as ConfigError).message)).toMatch(message)
    }
  })

  it("is refused with ZeRO, parameter servers, a gradient codec, compression auto, or without strategy local-sgd", () => {
    const base = { trainLoopPerWorker: "./t.ts#loop", scalingConfig: { numWorkers: 2 } }
    const field = (collectiveConfig: object): string => {
      try {
        resolveTrainerOptions({ ...base, collectiveConfig } as never)
      } catch (e) {
        expect(e).toBeInstanceOf(ConfigError)
        return (e as ConfigError).field
      }
      return "accepted"
    }
    expect(field({ strategy: "local-sgd", zeroStage: 1 })).toBe("collectiveConfig.zeroStage")
    expect(field({ strategy: "local-sgd", parameterServer: { numServers: 1 } })).toBe("collectiveConfig.parameterServer")
    expect(field({ strategy: "local-sgd", compression: { type: "int8" } })).toBe("collectiveConfig.compression")
    expect(field({ strategy: "local-sgd", localSgd: { compression: "auto" } })).toBe("collectiveConfig.localSgd.compression")
    expect(field({ strategy: "local-sgd", localSgd: { compression: { type: "int9" } } })).toBe("collectiveConfig.localSgd.compression.type")
    expect(field({ localSgd: { syncEvery: 4 } })).toBe("collectiveConfig.localSgd")
    expect(field({ strategy: "local-sgd", localSgd: { fragments: 2 }, zeroStage: 0 })).toBe("accepted")
    expect(field({ strategy: "local-sgd", localSgd: { fragments: 2 } })).toBe("accepted")
    // Staggered fragments recover from peers, with overlapped rounds (the default) and without (local-sgd-trainer.test.ts).
    const overlapped = resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "local-sgd", localSgd: { fragments: 2 } } } as never)
    expect(overlapped.recoverFrom).toBe("peers")
    const staggered = resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "local-sgd", localSgd: { fragments: 2, overlap: false } } } as never)
    expect(staggered.recoverFrom).toBe("peers")
    expect(field({ strategy: "local-sgd", localSgd: { fragments: 2 } })).toBe("accepted")
    const r = resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "local-sgd", localSgd: { syncEvery: 8, compression: { type: "int8" } } } } as never)
    expect(r.collective.compression).toEqual({ type: "int8" })
    expect(r.collective.localSgd).toEqual({ syncEvery: 8, outerOptimizer: "nesterov", outerLr: 0.7, outerMomentum: 0.9, fragments: 1, overlap: false })
    expect(r.collective.parameterServer).toBeUndefined()
    expect(r.recoverFrom).toBe("peers")
  })
})

describe("fragments", () => {
  it("cut the layout into contiguous runs of whole variables of about equal size, staggered evenly over H", () => {
    const l = layout([100, 100, 100, 100, 10, 90])
    const f = planFragments(l, 4, 8)
    expect(f.map((x) => [x.start, x.end])).toEqual([
      [0, 100],
      [100, 200],
      [200, 400],
      [400, 500]
    ])
    expect(f[3]!.slots.map((s) => s.offset)).toEqual([0, 10])
    expect(f.map((x) => x.phase)).toEqual([8, 2, 4, 6])
    // one fragment: the whole vector every H steps
    const one = planFragments(l, 1, 8)
    expect(one).toHaveLength(1)
    expect([one[0]!.start, one[0]!.end]).toEqual([0, 500])
    // more fragments than variables: one per variable
    expect(planFragments(layout([5, 5]), 4, 8)).toHaveLength(2)
    // a large first variable: every later fragment still gets one
    expect(planFragments(layout([1000, 1, 1, 1]), 3, 9).map((x) => x.end - x.start)).toEqual([1000, 1, 2])
  })

  it("each fragment is due every H steps, the F fragments H/F steps apart", () => {
    const f = planFragments(layout([10, 10, 10, 10]), 4, 8)
    const due = (steps: number) => f.filter((x) => fragmentDue(x, steps, 8)).map((x) => x.index)
    expect(Array.from({ length: 24 }, (_, i) => due(i + 1))).toEqual(
      Array.from({ length: 24 }, (_, i) => ((i + 1) % 2 === 0 ? [[0], [1], [2], [3]][((i + 1) / 2) % 4]! : []))
    )
    const whole = planFragments(layout([10, 10]), 1, 3)
    expect(Array.from({ length: 9 }, (_, i) => fragmentDue(whole[0]!, i + 1, 3))).toEqual([false, false, true, false, false, true, false, false, true])
  })
})

describe("the outer state", () => {
  it("average at outerLr 1 makes the mean of the ranks' parameters the new anchor", () => {
    const l = layout([3, 2])
    const start = Float32Array.of(1, 2, 3, 4, 5)
    const s = new OuterState(settings({ outerOptimizer: "average", outerLr: 1, syncEvery: 2 }), l, start)
    const ranks = [Float32Array.of(0, 2, 3, 5, 5), Float32Array.of(2, 2, 1, 5, 9)]
    expect(s.tick(10)).toEqual([])
    expect(s.tick(10).map((f) => f.index)).toEqual([0])
    const f = s.fragments[0]!
    // the group's (equally weighted) mean of deltas
    const deltas = ranks.map((p) => s.delta(f, p, new Float32Array(5)))
    expect(Array.from(deltas[0]!)).toEqual([1, 0, 0, -1, 0])
    const mean = deltas[0]!.map((d, i) => (d + deltas[1]![i]!) / 2)
    expect(s.samples).toEqual([20])
    const synced = s.apply(f, mean)
    expect(Array.from(synced)).toEqual([1, 2, 2, 5, 7])
    expect(Array.from(s.anchor)).toEqual([1, 2, 2, 5, 7])
    expect(s.rounds).toBe(1)
    expect(s.samples).toEqual([0])
  })

  it("nesterov follows m = mu m + d; anchor -= lr (d + mu m), round after round", () => {
    const l = layout([2])
    const s = new OuterState(settings({ outerOptimizer: "nesterov", outerLr: 0.7, outerMomentum: 0.9, syncEvery: 1 }), l, Float32Array.of(1, -1))
    const f = s.fragments[0]!
    let m = [0, 0]
    let a = [1, -1]
    for (const d of [
      [0.5, -0.25],
      [0.1, 0.2],
      [-0.3, 0.05]
    ]) {
      s.tick(1)
      s.apply(f, Float32Array.from(d))
      m = m.map((mi, i) => 0.9 * mi + d[i]!)
      a = a.map((ai, i) => ai - 0.7 * (d[i]! + 0.9 * m[i]!))
      expect(Array.from(s.anchor)[0]).toBeCloseTo(a[0]!, 6)
      expect(Array.from(s.anchor)[1]).toBeCloseTo(a[1]!, 6)
    }
  })

  it("saves and loads its anchor, momentum, clock and samples; refuses another model's", () => {
    const l = layout([4, 4])
    const cfg = settings({ syncEvery: 2, fragments: 2 })
    const s = new OuterState(cfg, l, new Float32Array(8).fill(1))
    s.tick(5)
    s.tick(7)
    for (const f of s.fragments) s.apply(f, new Float32Array(4).fill(0.5))
    s.tick(3)
    const bytes = s.toBytes()
    const t = new OuterState(cfg, l, new Float32Array(8))
    t.load(OuterState.fromBytes(bytes))
    expect(Array.from(t.anchor)).toEqual(Array.from(s.anchor))
    expect([t.steps, t.rounds, t.samples]).toEqual([3, 2, [3, 3]])
    // the same momentum: one more identical round gives identical anchors
    for (const x of [s, t]) x.apply(x.fragments[1]!, new Float32Array(4).fill(0.25))
    expect(Array.from(t.anchor)).toEqual(Array.from(s.anchor))
    expect(() => new OuterState(cfg, layout([4]), new Float32Array(4)).load(OuterState.fromBytes(bytes))).toThrow(/8 parameters, this model has 4/)
    expect(() => OuterState.fromBytes(new Uint8Array([0x90]))).toThrow(ConfigError)
  })
})

describe("the automatic strategy's local SGD candidate", () => {
  const group = (p: number, ms: number) => Array.from({ length: p }, () => Array.from({ length: 10 }, () => ms))

  it("picks local SGD where the link bounds training, and explains it", () => {
    // 4 ranks, 5 ms of compute, a 60 ms all-reduce (a slow link): 4/65 ms vs 4/(5 + 60/32) ms.
    const c = chooseStrategy({ computeMs: group(4, 5), allReduceMs: 60, numServers: 1, equalSteps: true, localSgd: { syncEvery: 32 } }, "allreduce")
    expect(c.pick).toBe("local-sgd")
    expect(c.changed).toBe(true)
    const local = c.predictions.find((x) => x.name === "local-sgd")!
    expect(local.stepsPerSec).toBeCloseTo(4000 / (5 + 60 / 32), 6)
    expect(c.text).toMatch(/local-sgd .*round 60\.0 ms \/ H 32\); the link bounds the all-reduce's step  <- picked/)
    // a compressed round (int8: a quarter of the bytes) is cheaper still
    const int8 = chooseStrategy({ computeMs: group(4, 5), allReduceMs: 60, numServers: 1, localSgd: { syncEvery: 8, bytesRatio: 0.25 } }, "allreduce")
    expect(int8.predictions.find((x) => x.name === "local-sgd")!.stepsPerSec).toBeCloseTo(4000 / (5 + 15 / 8), 6)
  })

  it("keeps synchronous training where compute bounds it, saying why", () => {
    const c = chooseStrategy({ computeMs: group(4, 40), allReduceMs: 6, numServers: 1, localSgd: { syncEvery: 32 } }, "allreduce")
    expect(c.pick).toBe("allreduce")
    expect(c.predictions.find((x) => x.name === "local-sgd")!.stepsPerSec).toBe(0)
    expect(c.text).toMatch(/local-sgd .*not a candidate: compute \(40\.0 ms\) bounds the step, not the link/)
    // without localSgd offered it is not among the candidates at all
    expect(chooseStrategy({ computeMs: group(4, 5), allReduceMs: 60, numServers: 1 }, "allreduce").predictions.map((x) => x.name)).not.toContain("local-sgd")
  })

  it("is offered to strategy auto by collectiveConfig.localSgd, whose rounds then use collectiveConfig.compression", () => {
    const base = { trainLoopPerWorker: "./t.ts#loop", scalingConfig: { numWorkers: 2 } }
    const r = resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "auto", compression: "fp16", localSgd: { syncEvery: 16 } } } as never)
    expect(r.collective.localSgd?.syncEvery).toBe(16)
    expect(r.collective.compression).toBe("fp16")
    expect(r.collective.parameterServer).toBeDefined()
    expect(() => resolveTrainerOptions({ ...base, collectiveConfig: { strategy: "auto", localSgd: { compression: { type: "int8" } } } } as never)).toThrow(/collectiveConfig.compression: move the codec there/)
  })
})

describe("the outer loop's bookkeeping (LocalSgd, two ranks in one process)", () => {
  /** A reduction where two ranks' calls meet in memory: the sample-weighted mean, as the reducer gives. */
  const meeting = (): ((buf: Float32Array, weight: number) => Promise<void>) => {
    let waiting: { buf: Float32Array; weight: number; done: () => void } | undefined
    return (buf, weight) =>
      new Promise((resolve) => {
        if (!waiting) {
          waiting = { buf, weight, done: resolve }
          return
        }
        const o = waiting
        waiting = undefined
        const w = o.weight + weight
        for (let i = 0; i < buf.length; i++) buf[i] = o.buf[i] = (o.buf[i]! * o.weight + buf[i]! * weight) / w
        o.done()
        resolve()
      })
  }

  /** Two ranks whose reductions meet in memory. */
  const pair = (settings: LocalSgdSettings, sizes: number[], start: number[]) => {
    const l = layout(sizes)
    const params = [Float32Array.from(start), Float32Array.from(start)]
    const reduce = meeting()
    const ranks = params.map(
      (p) =>
        new LocalSgd(settings, {
          layout: l,
          readParams: async () => p.slice(),
          writeParams: (flat) => p.set(flat),
          reduce: (buf, _layout, weight) => reduce(buf, weight)
        }, p.slice())
    )
    return { params, ranks }
  }

  it("averages the parameter deltas weighted by samples every H steps, and every rank holds the result", async () => {
    const { params, ranks } = pair(settings({ outerOptimizer: "average", outerLr: 1, syncEvery: 2 }), [2], [1, 1])
    // step 1: local progress only
    params[0]!.set([0, 1])
    params[1]!.set([1, 3])
    await Promise.all([ranks[0]!.afterStep(10), ranks[1]!.afterStep(30)])
    expect(Array.from(params[0]!)).toEqual([0, 1])
    // step 2: the round (weights 20 and 60 samples)
    params[0]!.set([0, 0])
    params[1]!.set([2, 4])
    await Promise.all([ranks[0]!.afterStep(10), ranks[1]!.afterStep(30)])
    for (const p of params) expect(Array.from(p)).toEqual([1.5, 3])
    expect(ranks[0]!.metrics()["localsgd/rounds"]).toBe(1)
  })

  it("with overlap merges a fragment's result with the local progress made while it ran", async () => {
    const { params, ranks } = pair(settings({ outerOptimizer: "average", outerLr: 1, syncEvery: 2, fragments: 2, overlap: true }), [1, 1], [0, 0])
    // fragment 1 (phase 1) is due after step 1
    params[0]!.set([1, 2])
    params[1]!.set([3, 4])
    await Promise.all([ranks[0]!.afterStep(1), ranks[1]!.afterStep(1)])
    expect(ranks[0]!.pending).toBe(true)
    // the next step moves the parameters on while the round runs
    params[0]!.set([1, 2.5])
    params[1]!.set([3, 5])
    await Promise.all(ranks.map((r) => r.settle()))
    // fragment 1: mean 3 plus each rank's progress since (0.5 and 1); fragment 0 untouched
    expect(Array.from(params[0]!)).toEqual([1, 3.5])
    expect(Array.from(params[1]!)).toEqual([3, 4])
  })

  it("after a regroup keeps its own parameters in the survivor's round, and starts from the anchor when behind", async () => {
    const { params, ranks } = pair(settings({ outerOptimizer: "average", outerLr: 1, syncEvery: 1 }), [2], [0, 0])
    params[0]!.set([2, 2])
    params[1]!.set([4, 4])
    await Promise.all([ranks[0]!.afterStep(1), ranks[1]!.afterStep(1)])
    const survivor = ranks[0]!.stateFile()
    params[1]!.set([9, 9])
    expect(ranks[1]!.adopt(survivor)).toBe("keep")
    expect(Array.from(params[1]!)).toEqual([9, 9])
    // a rank one round behind (a fresh one, as a replacement is) takes the averaged parameters
    const { params: p2, ranks: r2 } = pair(settings({ outerOptimizer: "average", outerLr: 1, syncEvery: 1 }), [2], [0, 0])
    p2[0]!.set([7, 7])
    expect(r2[0]!.adopt(survivor)).toBe("anchor")
    expect(Array.from(p2[0]!)).toEqual([3, 3])
  })

  it("makes an overlapped round that broke again in the foreground, and a rank taking its state makes that round with it first", async () => {
    const cfg = settings({ outerOptimizer: "average", outerLr: 1, syncEvery: 2, fragments: 2, overlap: true })
    const l = layout([1, 1])
    // Reductions meet in memory (the sample-weighted mean); the first background one breaks, as
    // under a lost peer or a pause for a regroup (GroupSession.operation's `background`).
    const meet = meeting()
    let breakNext = true
    const calls: string[] = []
    const host = (p: Float32Array) => ({
      layout: l,
      readParams: async () => p.slice(),
      writeParams: (flat: Float32Array) => p.set(flat),
      reduce: (buf: Float32Array, _l: unknown, weight: number, _round: number, scope: string, background?: boolean): Promise<void | "recompute"> => {
        calls.push(`${scope}${background ? " background" : ""}`)
        if (background && breakNext) {
          breakNext = false
          return Promise.resolve("recompute")
        }
        return meet(buf, weight)
      }
    })
    const survivorParams = Float32Array.of(0, 0)
    const survivor = new LocalSgd(cfg, host(survivorParams), survivorParams.slice())
    // Fragment 1 (phase 1) is due after step 1: its round starts in the background and breaks.
    survivorParams.set([1, 2])
    await survivor.afterStep(1)
    expect(survivor.pending).toBe(true)
    // The survivor makes it again in the foreground (where it would park); its state says so.
    const redoing = survivor.settle()
    await new Promise((resolve) => setImmediate(resolve))
    const state = survivor.stateFile()
    expect(OuterState.fromBytes(state).redo).toBe(1)
    // A replacement takes that state (behind the survivor: it starts from the anchor) and makes
    // fragment 1's round first, with nothing of its own in it, before anything else.
    const joinerParams = Float32Array.of(5, 5)
    const joiner = new LocalSgd(cfg, host(joinerParams), joinerParams.slice())
    expect(joiner.adopt(state)).toBe("anchor")
    expect(Array.from(joinerParams)).toEqual([0, 0])
    await Promise.all([redoing, joiner.settle()])
    expect(calls).toEqual(["frag1 background", "frag1", "frag1"])
    // Both hold the survivor's fragment 1 (the only delta with weight), and one round each.
    expect(Array.from(survivorParams)).toEqual([1, 2])
    expect(Array.from(joinerParams)).toEqual([0, 2])
    expect(survivor.metrics()["localsgd/rounds"]).toBe(1)
    expect(joiner.metrics()["localsgd/rounds"]).toBe(1)
    // Nothing is left to make again: a state taken now carries no redo.
    expect(OuterState.fromBytes(survivor.stateFile()).redo).toBeUndefined()
  })
})
