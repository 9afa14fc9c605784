// core/kernels/lstm-sequence.ts: on webgpu the LSTM layer runs its whole recurrence as one program
// forward and one backward (a workgroup per batch row stepping through time), instead of some 13
// programs recorded per time step. Checked on the software adapter in a child process
// (support/webgpu-lstm-sequence-child.ts): the loss and every gradient against the same layer's
// loop with the fused cell and against tfjs-layers' own LSTM on the cpu backend; the programs a
// training step records at two sequence lengths; the layers the loop keeps.
import { fileURLToPath } from "node:url"
import { beforeAll, describe } from "vitest"
import { runWebGpuChild } from "./support/webgpu-child.ts"
import { wholeSequenceTests } from "./support/webgpu-sequence.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-lstm-sequence-child.ts", import.meta.url))
const DEADLINE_MS = 3 * 60_000

interface Result {
  backend: string
  results: Array<{ name: string; againstLoop: number; againstTfjsCpu: number; programs: number; loopPrograms: number }>
  lengths: { short: number; long: number }
  masked: { short: number; long: number }
  backwards: { short: number; long: number }
  backwardsAgainstTfjsCpu: number
}
let r: Result

beforeAll(async () => {
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("an LSTM's whole recurrence as one webgpu program each way", { tags: ["webgpu"] }, () => {
  wholeSequenceTests("LSTM", "every step's outputs or the last, both recurrent activations, 80 units, one step", () => ({ ...r, cases: r.results }))
})
