// scripts/fuse-multiply-add.mjs: the rewrite that makes the heap kernels' second binary (relaxed
// SIMD's fused multiply-add in the functions heap-kernels.wat.mjs lists in FUSED).
import { describe, expect, it } from "vitest"

// Plain JavaScript modules (build-time only, no declarations): their types, as used here.
const { fuseMultiplyAdds } = (await import("../scripts/fuse-multiply-add.mjs" as string)) as {
  fuseMultiplyAdds: (text: string, names: readonly string[]) => { text: string; counts: Record<string, number> }
}
const { FUSED, wat } = (await import("../core/kernels/simd/heap-kernels.wat.mjs" as string)) as { FUSED: readonly string[]; wat: string }

const text = `(module
  ;; a comment (f32x4.add (f32x4.mul a b) c)
  (func (export "dot") (param $a v128) (param $b v128) (param $c v128) (result v128)
    (f32x4.add (local.get $c) (f32x4.mul (local.get $a) (local.get $b))))
  (func (export "flipped") (param $a v128) (param $b v128) (param $c v128) (result v128)
    (f32x4.add (f32x4.mul (local.get $a) (local.get $b)) (f32x4.add (local.get $c) (f32x4.mul (local.get $b) (local.get $b)))))
  (func (export "apart") (param $a v128) (param $b v128) (param $c v128) (local $p v128) (result v128)
    (f32x4.add (local.tee $p (f32x4.mul (local.get $a) (local.get $b))) (local.get $c)))
  (func (export "other") (param $a v128) (param $b v128) (param $c v128) (result v128)
    (f32x4.add (local.get $c) (f32x4.mul (local.get $a) (local.get $b)))))`

describe("fusing the heap kernels' multiply-adds", () => {
  it("rewrites c + a·b in either order, nested, into relaxed_madd(a, b, c) in the named functions only, and leaves a product kept in a local apart", () => {
    const { text: out, counts } = fuseMultiplyAdds(text, ["dot", "flipped"])
    expect(counts).toEqual({ dot: 1, flipped: 2 })
    expect(out).toContain(`(func (export "dot") (param $a v128) (param $b v128) (param $c v128) (result v128) (f32x4.relaxed_madd (local.get $a) (local.get $b) (local.get $c)))`)
    expect(out).toContain(`(f32x4.relaxed_madd (local.get $a) (local.get $b) (f32x4.relaxed_madd (local.get $b) (local.get $b) (local.get $c)))`)
    expect(out).toContain(`(f32x4.add (local.tee $p (f32x4.mul (local.get $a) (local.get $b))) (local.get $c))`)
    expect(out).toContain(`(func (export "other") (param $a v128) (param $b v128) (param $c v128) (result v128) (f32x4.add (local.get $c) (f32x4.mul (local.get $a) (local.get $b))))`)
    expect(out).not.toContain("a comment")
  })

  it("refuses a name that is not an exported function of the text, or one with nothing to fuse (the list and the text drifted apart)", () => {
    expect(() => fuseMultiplyAdds(text, ["dot", "missing"])).toThrow(/no multiply-add fused in "missing"/)
    expect(() => fuseMultiplyAdds(text, ["apart"])).toThrow(/no multiply-add fused in "apart"/)
  })

  it("finds multiply-adds in every kernel FUSED names, none in Adam's update (its bits are tfjs's), and every one of them in the text's f32x4 adds of a product", () => {
    const { text: out, counts } = fuseMultiplyAdds(wat, FUSED)
    expect(Object.keys(counts)).toEqual([...FUSED])
    for (const name of FUSED) expect(counts[name]).toBeGreaterThan(0)
    expect(FUSED).not.toContain("adam")
    const adam = (t: string) => t.slice(t.indexOf('(func (export "adam")'), t.indexOf("(func", t.indexOf('(func (export "adam")') + 5))
    expect(adam(out)).toContain("f32x4.add (f32x4.mul")
    expect(adam(out)).not.toContain("relaxed_madd")
    const total = Object.values(counts).reduce((a, b) => a + b, 0)
    expect(out.split("f32x4.relaxed_madd").length - 1).toBe(total)
  })
})
