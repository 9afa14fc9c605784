// A step's gradients read into the group's flat buffer (actors/train/worker/accumulation.ts
// readGradients) on wasm, straight from the heap: the same values in layout order as the
// concat-and-read path gives, a variable without a gradient as zeros.
import { describe, expect, it } from "vitest"
import { loadEngine } from "../core/engine.ts"
import { readGradients } from "../actors/train/worker/accumulation.ts"

describe("readGradients", () => {
  it("reads each variable's gradient into its slot of the flat buffer (heap views on wasm), zeros where a variable has none, the same as the concat path", async () => {
    {
      const name = "wasm"
      const { tf } = await loadEngine(name)
      expect(tf.getBackend()).toBe(name)
      const shapes = [[3, 4], [5], [2, 2], [7]]
      const vars = shapes.map((s, i) => tf.variable(tf.zeros(s), true, `rg_${name}_${i}`))
      let offset = 0
      const layout = shapes.map((s) => {
        const size = s.reduce((a, b) => a * b, 1)
        const slot = { offset, size }
        offset += size
        return slot
      })
      // a gradient for every variable but the second, made after other tensors so they lie apart on the heap
      const grads: Record<string, import("@tensorflow/tfjs").Tensor> = {}
      vars.forEach((v, i) => {
        if (i !== 1) grads[v.name] = tf.randomNormal(shapes[i]!, 0, 1, "float32", 17 + i)
      })
      const own = new Float32Array(offset).fill(Number.NaN)
      const flat = await readGradients(tf as never, vars, layout, grads as never, own)
      expect(flat).toBe(own)
      const concat = await readGradients(tf as never, vars, layout, grads as never, undefined)
      expect(Array.from(flat)).toEqual(Array.from(concat))
      expect(Array.from(flat.subarray(12, 17))).toEqual([0, 0, 0, 0, 0])
      expect(Array.from(flat.subarray(0, 12))).toEqual(Array.from(grads[vars[0]!.name]!.dataSync()))
      tf.dispose([...vars, ...Object.values(grads)])
    }
  })
})
