// The checks a recurrent layer's whole-sequence programs on webgpu pass (core/kernels/lstm-sequence.ts,
// gru-sequence.ts), on what its test's child measured: the same loss and gradients as the layer's
// loop and tfjs-layers' own layer on cpu with fewer programs, as many programs for 32 time steps as
// for 8, and the layers the loop keeps (a mask, going backwards).
import { expect, it } from "vitest"

export interface SequenceResult {
  readonly backend: string
  readonly cases: ReadonlyArray<{ name: string; ran?: boolean; loopRan?: boolean; againstLoop: number; againstTfjsCpu: number; programs: number; loopPrograms: number }>
  readonly lengths: { short: number; long: number }
  readonly masked: { short: number; long: number }
  readonly backwards: { short: number; long: number }
  readonly backwardsAgainstTfjsCpu: number
}

/** Declares the three tests, on `get()` (the child's result, read once the tests run); `layer` and `cases` name what the first one covers. */
export const wholeSequenceTests = (layer: string, cases: string, get: () => SequenceResult): void => {
  it(`gives the loss and every gradient the loop and tfjs-layers' own ${layer} give: ${cases}`, () => {
    const r = get()
    expect(r.backend).toBe("webgpu")
    expect(r.cases.map((c) => c.name)).toHaveLength(4)
    for (const c of r.cases) {
      // (Where the child tells which kernel ran: the whole-sequence one, and not in the loop.)
      if (c.ran !== undefined) expect(c.ran, c.name).toBe(true)
      if (c.loopRan !== undefined) expect(c.loopRan, c.name).toBe(false)
      expect(c.againstLoop, c.name).toBeLessThan(1e-4)
      expect(c.againstTfjsCpu, c.name).toBeLessThan(1e-4)
      // Fewer programs than the loop records, for the same step.
      expect(c.programs, c.name).toBeLessThan(c.loopPrograms)
    }
  })

  it("records as many programs a training step for 32 time steps as for 8", () => {
    const r = get()
    expect(r.lengths.long).toBe(r.lengths.short)
  })

  it("leaves a masked sequence and one going backwards to the loop (their programs grow with the length), with the same values", () => {
    const r = get()
    expect(r.masked.long).toBeGreaterThan(r.masked.short + 100)
    expect(r.backwards.long).toBeGreaterThan(r.backwards.short + 100)
    expect(r.backwardsAgainstTfjsCpu).toBeLessThan(1e-4)
  })
}
