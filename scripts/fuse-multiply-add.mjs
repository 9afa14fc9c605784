// Rewrites WebAssembly text for relaxed SIMD's fused multiply-add: in the functions exported under
// the given names, every (f32x4.add c (f32x4.mul a b)) or (f32x4.add (f32x4.mul a b) c) becomes
// (f32x4.relaxed_madd a b c), a·b + c in one instruction, rounded once where the CPU fuses it. Used
// by build-wasm.mjs to make the heap kernels' second binary (core/kernels/simd/heap-kernels.wat.mjs,
// FUSED); the text is parsed into s-expressions and printed back without its comments.

/** Parses WebAssembly text into nested arrays of atoms (comments dropped; the kernels hold no strings with parentheses). */
const parse = (text) => {
  let i = 0
  const list = () => {
    const out = []
    while (i < text.length) {
      const c = text[i]
      if (c === "(" && text[i + 1] === ";") {
        const end = text.indexOf(";)", i + 2)
        if (end < 0) throw new Error("fuse-multiply-add: an unterminated block comment")
        i = end + 2
      } else if (c === "(") {
        i++
        out.push(list())
      } else if (c === ")") {
        i++
        return out
      } else if (c === ";" && text[i + 1] === ";") {
        while (i < text.length && text[i] !== "\n") i++
      } else if (/\s/.test(c)) i++
      else if (c === '"') {
        const end = text.indexOf('"', i + 1)
        out.push(text.slice(i, end + 1))
        i = end + 1
      } else {
        let j = i
        while (j < text.length && !/[\s()]/.test(text[j])) j++
        out.push(text.slice(i, j))
        i = j
      }
    }
    return out
  }
  return list()
}

const print = (e) => (Array.isArray(e) ? `(${e.map(print).join(" ")})` : e)
const isMul = (e) => Array.isArray(e) && e[0] === "f32x4.mul" && e.length === 3

/** The function's export name, where it is `(func (export "name") ...)`. */
const exportName = (e) => (Array.isArray(e) && e[0] === "func" && Array.isArray(e[1]) && e[1][0] === "export" ? e[1][1].slice(1, -1) : undefined)

/**
 * `text` with the multiply-adds of the functions in `names` fused; `count` says how many were, per
 * function (a name with none, or missing, is an error: the list and the text have drifted apart).
 */
export const fuseMultiplyAdds = (text, names) => {
  const counts = Object.fromEntries(names.map((n) => [n, 0]))
  const fuse = (e, name) => {
    if (!Array.isArray(e)) return e
    const mapped = e.map((x) => fuse(x, name))
    if (mapped[0] === "f32x4.add" && mapped.length === 3) {
      const [, x, y] = mapped
      if (isMul(y) || isMul(x)) {
        counts[name]++
        return isMul(y) ? ["f32x4.relaxed_madd", y[1], y[2], x] : ["f32x4.relaxed_madd", x[1], x[2], y]
      }
    }
    return mapped
  }
  const walk = (e) => {
    if (!Array.isArray(e)) return e
    const name = exportName(e)
    if (name !== undefined && name in counts) return fuse(e, name)
    return e.map(walk)
  }
  const fused = parse(text).map(walk)
  for (const [name, n] of Object.entries(counts)) if (n === 0) throw new Error(`fuse-multiply-add: no multiply-add fused in "${name}" (not an exported function of the text, or it has none)`)
  return { text: fused.map(print).join("\n"), counts }
}
