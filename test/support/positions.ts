// Where each worker process of a run got, for the chaos benchmark (bench/chaos.ts): after every
// step it trained (not one a replacement skipped while replaying the loop), a worker overwrites
// <dir>/<pid>.pos with "<attempt> <rank> <epoch> <step> <steps per epoch> <first epoch> <first step>",
// the last two being the first step this process trained in that attempt. `attempt` is read at each
// step: a survivor regrouped from its peers keeps its process and goes on into the next attempt.
// From these the benchmark knows how far a generation got before a fault (the furthest step any
// of its processes completed) and where the next generation started (the earliest first step of
// its processes), whichever rank died and whoever is rank 0 now.
import { closeSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs"
import * as path from "node:path"

export class PositionFile {
  readonly #fd: number
  readonly #line = Buffer.alloc(LINE_BYTES)
  #attempt = -1
  #first = { epoch: 0, step: 0 }

  constructor(dir: string) {
    this.#fd = openSync(path.join(dir, `${process.pid}.pos`), "w")
  }

  step(attempt: number, rank: number, epoch: number, step: number, stepsPerEpoch: number): void {
    if (attempt !== this.#attempt) {
      this.#attempt = attempt
      this.#first = { epoch, step }
    }
    const n = [attempt, rank, epoch, step, stepsPerEpoch, this.#first.epoch, this.#first.step]
    this.#line.fill(0x20)
    this.#line.write(`${n.join(" ")} ${n.reduce((a, b) => a + b, 0)}`)
    writeSync(this.#fd, this.#line, 0, LINE_BYTES, 0)
  }

  close(): void {
    closeSync(this.#fd)
  }
}

/** Seven numbers and their sum fit easily; padded with spaces. */
const LINE_BYTES = 96

export interface Position {
  readonly pid: number
  readonly attempt: number
  readonly rank: number
  readonly stepsPerEpoch: number
  /** Epochs completed after the last step this process trained (epoch + (step + 1) / steps per epoch). */
  readonly done: number
  /** Epochs completed before the first step it trained in `attempt`. */
  readonly first: number
  /** The same two as (epoch, steps of it): the step after the last one trained, and the first trained in `attempt`. */
  readonly doneAt: StepAt
  readonly firstAt: StepAt
}

/** A point in a loop: an epoch and a step index in it. */
export interface StepAt {
  readonly epoch: number
  readonly step: number
}

/** Orders two points of a loop. */
export const compareSteps = (a: StepAt, b: StepAt): number => a.epoch - b.epoch || a.step - b.step

/** Every position file in `dir` (a file being rewritten at that moment is skipped). */
export const readPositions = (dir: string): Position[] => {
  const out: Position[] = []
  for (const f of readdirSync(dir)) {
    const m = /^(\d+)\.pos$/.exec(f)
    if (!m) continue
    let text: string
    try {
      text = readFileSync(path.join(dir, f), "utf8")
    } catch {
      continue
    }
    const all = text.trim().split(/ +/).map(Number)
    const n = all.slice(0, 7)
    if (all.length !== 8 || all.some((x) => !Number.isFinite(x)) || n.reduce((a, b) => a + b, 0) !== all[7]) continue
    const [attempt, rank, epoch, step, spe, firstEpoch, firstStep] = n as [number, number, number, number, number, number, number]
    out.push({
      pid: Number(m[1]),
      attempt,
      rank,
      stepsPerEpoch: spe,
      done: epoch + (step + 1) / spe,
      first: firstEpoch + firstStep / spe,
      doneAt: { epoch, step: step + 1 },
      firstAt: { epoch: firstEpoch, step: firstStep }
    })
  }
  return out
}
