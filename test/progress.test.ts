// The driver's progress lines (not on a TTY): a dp.fit loop shows its epoch's bar figures and ETA;
// a hand-written trainStep loop, which has no epoch length, shows its step count without a bogus
// "/0 0% ETA 0.0s".
import { describe, expect, it, vi } from "vitest"
import { ProgressPrinter, changedConfigLine, configChanges, loopFrames } from "../actors/train/common/observe/progress.ts"
import { sharedCoresLine } from "../actors/train/driver/cluster.ts"
import { Interrupted } from "../actors/train/driver/result.ts"

const printer = (): { p: ProgressPrinter; lines: string[] } => {
  const lines: string[] = []
  const out = { isTTY: false, write: (s: string) => (lines.push(s), true) } as unknown as NodeJS.WriteStream
  return { p: new ProgressPrinter(true, 1, out), lines }
}

describe("progress lines", () => {
  it("names what a rerun's trainLoopConfig changed against its checkpoints' (top-level keys)", () => {
    expect(configChanges({ epochs: 3, lr: 0.1 }, { epochs: 3, lr: 0.1 })).toEqual([])
    expect(configChanges({ epochs: 3, lr: 0.1, tag: "a" }, { epochs: 5, lr: 0.1, seed: 1 })).toEqual(["epochs 5 (was 3)", 'tag (gone, was "a")', "seed 1 (new)"])
    expect(configChanges({ sizes: [64, 32] }, { sizes: [64, 16] })).toEqual(["sizes [64,16] (was [64,32])"])
    expect(configChanges({ big: 2n ** 70n }, { big: 2n ** 70n })).toEqual([])
    expect(configChanges(undefined, { epochs: 3 })).toEqual(['{"epochs":3} (was undefined)'])
    expect(changedConfigLine("digits", ["lr 0.05 (was 0.1)"])).toMatch(/^gradwire: run "digits" goes on from its own checkpoint .*: lr 0\.05 \(was 0\.1\); .*another name or storagePath starts afresh$/)
  })


  it("with progress off, prints no progress but the workers' own output (stdout) and the run's warnings (stderr)", () => {
    const out: string[] = []
    const err: string[] = []
    const stream = (to: string[]) => ({ isTTY: false, write: (s: string) => (to.push(s), true) }) as unknown as NodeJS.WriteStream
    const p = new ProgressPrinter(false, 2, stream(out), stream(err))
    expect(p.mode).toBe("off")
    p.start(1, 2)
    p.step({ rank: 0, epoch: 0, step: 9, stepsPerEpoch: 10, samples: 320, loss: 0.5, computeMs: 3 })
    p.report(0, { loss: 0.5 })
    p.line("gradwire: a progress line")
    p.summary("/runs/x", { loss: 0.5 }, undefined)
    expect(out).toEqual([])
    p.output("(worker rank=1 pid=7 node=local) hello from rank 1")
    p.warn("gradwire: callback onReport threw: boom")
    expect(out).toEqual(["(worker rank=1 pid=7 node=local) hello from rank 1\n"])
    expect(err).toEqual(["gradwire: callback onReport threw: boom\n"])
    // with progress on, both are lines of the progress output
    const on = printer()
    on.p.warn("gradwire: w")
    on.p.output("(worker rank=0) o")
    expect(on.lines).toEqual(["gradwire: w\n", "(worker rank=0) o\n"])
    // a report round is numbered as metrics.jsonl's `report` and TensorBoard's step number it
    on.p.report(0, { loss: 0.5, epoch: 0 })
    expect(on.lines.at(-1)).toBe("report 0: loss=0.5000  epoch=0\n")
  })


  it("a fit loop's line has the step out of the epoch's steps and an ETA", () => {
    const { p, lines } = printer()
    expect(p.mode).toBe("lines")
    p.step({ rank: 0, epoch: 1, step: 9, stepsPerEpoch: 10, samples: 320, loss: 0.5, computeMs: 3 })
    // (epochs numbered as the loop's own, EpochResult's and metrics.jsonl's: the first is epoch 0)
    expect(lines.at(-1)).toMatch(/^epoch 1 +10\/10 100% .*loss 0\.5000 +ETA 0\.0s\n$/)
  })

  it("the run's first step has no ETA yet (no step timed), not a bogus 0 s", () => {
    const { p, lines } = printer()
    p.step({ rank: 0, epoch: 0, step: 0, stepsPerEpoch: 200, samples: 32, loss: 2.3, computeMs: 3 })
    expect(lines.at(-1)).toMatch(/^epoch 0 +1\/200 +1% .*ETA -\n$/)
    const start = performance.now()
    while (performance.now() - start < 5);
    p.step({ rank: 0, epoch: 0, step: 199, stepsPerEpoch: 200, samples: 6400, loss: 0.4, computeMs: 3 })
    expect(lines.at(-1)).toMatch(/ETA 0\.0s\n$/)
  })

  it("samples/s is every rank's over this epoch; after a regroup a survivor's samples count from its first point, not from its process's start", () => {
    vi.useFakeTimers({ toFake: ["performance"] })
    try {
      const { p, lines } = printer()
      p.start(0, 2)
      const point = (rank: number, epoch: number, step: number, samples: number) => p.step({ rank, epoch, step, stepsPerEpoch: 10, samples, loss: 1, computeMs: 3 })
      // epoch 0: two ranks, 10 samples each every 100 ms (200 samples/s in all)
      for (let s = 0; s < 10; s++) {
        point(1, 0, s, (s + 1) * 10)
        point(0, 0, s, (s + 1) * 10)
        vi.advanceTimersByTime(100)
      }
      expect(lines.at(-1)).toMatch(/^epoch 0 +10\/10 100% +200 samples\/s /)
      // epoch 1 after an evaluation of 2 s: still the epoch's own rate, not the run's average
      vi.advanceTimersByTime(2_000)
      for (let s = 0; s < 10; s++) {
        point(1, 1, s, 100 + (s + 1) * 20)
        point(0, 1, s, 100 + (s + 1) * 20)
        vi.advanceTimersByTime(100)
      }
      expect(lines.at(-1)).toMatch(/^epoch 1 +10\/10 100% +\d+ samples\/s /)
      const epoch1 = Number(/(\d+) samples\/s/.exec(lines.at(-1)!)![1])
      expect(epoch1).toBeGreaterThan(300)
      expect(epoch1).toBeLessThanOrEqual(400)
      // rank 1 dies; rank 0 goes on alone in a regrouped generation at 10 samples every 100 ms
      p.start(1, 1)
      for (let s = 0; s < 10; s++) {
        point(0, 2, s, 300 + (s + 1) * 10)
        vi.advanceTimersByTime(100)
      }
      // 100 samples/s (it had shown the survivor's 300 samples since its start over the short time since the regroup)
      expect(lines.at(-1)).toMatch(/^epoch 2 +10\/10 100% +100 samples\/s /)
    } finally {
      vi.useRealTimers()
    }
  })

  it("epochs shorter than half a second, two points a rank each, show each epoch's rate with the epochs just before (not the first long epoch's, held)", () => {
    vi.useFakeTimers({ toFake: ["performance"] })
    try {
      const { p, lines } = printer()
      p.start(0, 2)
      const rates: number[] = []
      let samples = 0
      // each epoch: 10 steps of 40 ms, then a 300 ms pause; a rank's points at its first and last
      // step (the worker's throttle lets only those through); per rank 10, 20, 20 samples a step
      for (const [epoch, perStep] of [[0, 10], [1, 20], [2, 20]] as const) {
        for (let s = 0; s < 10; s++) {
          vi.advanceTimersByTime(40)
          samples += perStep
          if (s === 0 || s === 9) for (const rank of [1, 0]) p.step({ rank, epoch, step: s, stepsPerEpoch: 10, samples, loss: 1, computeMs: 3 })
        }
        rates.push(Number(/(\d+) samples\/s/.exec(lines.at(-1)!)?.[1]))
        vi.advanceTimersByTime(300)
      }
      // epoch 0: 90 samples in 360 ms a rank (500/s in all); epoch 1 with epoch 0 (270 in 720 ms:
      // 750/s); epoch 2 with epoch 1 (360 in 720 ms: 1000/s)
      expect(rates).toEqual([500, 750, 1000])
    } finally {
      vi.useRealTimers()
    }
  })

  it("a trainStep loop's line counts steps, with no epoch length, percentage or ETA", () => {
    const { p, lines } = printer()
    p.step({ rank: 0, epoch: 0, step: 13, stepsPerEpoch: 0, samples: 448, loss: 1.25, computeMs: 3 })
    expect(lines.at(-1)).toMatch(/^step +14 +loss 1\.250\n$/)
    expect(lines.join("")).not.toMatch(/\/0|ETA|%/)
  })

  it("shows the epoch's mean loss when the rank sends it (as Keras's bar), not the last batch's", () => {
    const { p, lines } = printer()
    p.step({ rank: 0, epoch: 0, step: 14, stepsPerEpoch: 15, samples: 453, loss: 2.285, meanLoss: 0.7547, computeMs: 3 })
    expect(lines.at(-1)).toMatch(/loss 0\.7547 /)
    expect(lines.at(-1)).not.toContain("2.285")
  })

  it("rank 0 without rows (no loss of its own) shows another rank's mean loss of the epoch, not NaN", () => {
    const { p, lines } = printer()
    p.step({ rank: 1, epoch: 2, step: 13, stepsPerEpoch: 15, samples: 900, loss: 0.31, meanLoss: 0.4125, computeMs: 3 })
    p.step({ rank: 0, epoch: 2, step: 14, stepsPerEpoch: 15, samples: 0, loss: Number.NaN, computeMs: 0 })
    expect(lines.at(-1)).toMatch(/loss 0\.4125 /)
    expect(lines.join("")).not.toContain("NaN")
  })

  it("a run that finished without a report() call says that its Result has no metrics and no checkpoint", () => {
    const { p, lines } = printer()
    p.summary("/tmp/run", undefined, undefined)
    expect(lines.join("")).toMatch(/finished, with no report\(\) call from the loop: the Result has no metrics and no checkpoint/)
    const other = printer()
    other.p.summary("/tmp/run", { loss: 1 }, undefined)
    expect(other.lines.join("")).toContain("last metrics: loss=1")
    expect(other.lines.join("")).not.toContain("no report()")
  })

  it("says when the embedded cluster runs more CPU workers than the machine has cores", () => {
    expect(sharedCoresLine(4, 2)).toBe(
      "gradwire: 4 workers on this machine's 2 cores (the embedded cluster is sized to the job): they share the cores, and a step waits for every rank: more workers than cores rarely train faster"
    )
    expect(sharedCoresLine(2, 2)).toBeUndefined()
    expect(sharedCoresLine(0, 2)).toBeUndefined()
  })
})


describe("the run's closing line", () => {
  it("a run with no report() says the Result has no checkpoint, unless it has one (a rerun that resumed past its last epoch)", () => {
    const fresh = printer()
    fresh.p.summary("/runs/a", undefined, undefined)
    expect(fresh.lines.join("")).toMatch(/no metrics and no checkpoint/)
    const rerun = printer()
    rerun.p.summary("/runs/a", undefined, undefined, "/runs/a/checkpoint_000009")
    const said = rerun.lines.join("")
    expect(said).not.toMatch(/no checkpoint/)
    expect(said).toMatch(/no metrics; its checkpoint is the latest one, \/runs\/a\/checkpoint_000009/)
    expect(said).toMatch(/run directory: \/runs\/a\n$/)
  })

  it("a failed run says where the loop threw: the frames in the user's code, not gradwire's, a package's or Node's", () => {
    const own = new URL("../actors/train/worker/worker-run.ts", import.meta.url).href
    const remoteStack = [
      "Error: boom on rank 1",
      "    at step (file:///home/u/proj/model.ts:7:11)",
      "    at trainLoop (file:///home/u/proj/train.ts:14:80)",
      "    at Engine.tidy (file:///home/u/proj/node_modules/@tensorflow/tfjs-core/dist/tf-core.node.js:4541:19)",
      `    at #runLoop (${own}:727:66)`,
      "    at process.processTicksAndRejections (node:internal/process/task_queues:105:5)"
    ].join("\n")
    const failed = printer()
    failed.p.summary("/runs/a", undefined, Object.assign(new Error("training failed on rank 1"), { remoteStack }))
    expect(failed.lines.join("")).toBe(
      "gradwire: run failed: training failed on rank 1\n" +
        "gradwire:     at step (file:///home/u/proj/model.ts:7:11)\n" +
        "gradwire:     at trainLoop (file:///home/u/proj/train.ts:14:80)\n" +
        "gradwire: run directory: /runs/a\n"
    )
    // Ctrl-C: said as an interruption, not a failure
    const stopped = printer()
    stopped.p.summary("/runs/a", undefined, new Interrupted({ signal: "SIGINT" }))
    expect(stopped.lines[0]).toMatch(/^gradwire: run interrupted: training was interrupted by SIGINT; .*checkpoints written so far are kept\n$/)
    expect(loopFrames(remoteStack.split("\n").slice(0, 1).concat(`    at #runLoop (${own}:1:1)`).join("\n"))).toEqual([])
  })
})
