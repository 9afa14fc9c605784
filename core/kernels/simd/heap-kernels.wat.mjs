// gradwire's SIMD kernels on tfjs-backend-wasm's own heap (WebAssembly 128-bit SIMD, 4 x f32 per
// instruction), written as WebAssembly text; `node scripts/build-wasm.mjs` assembles it into
// heap-kernels-wasm.ts. The module imports the backend's memory (env.memory), so the kernels read
// and write tensors where tfjs keeps them: no copy in or out. Every address is a byte address on
// that heap; every float array is 4-byte aligned (tfjs allocates them with malloc), which is all
// v128.load and v128.store need (they take any alignment).
//
// The host side (../heap-simd.ts) calls a kernel only where its preconditions hold (named at each
// kernel) and keeps its JavaScript loop otherwise.

/** A counted loop: `body` runs with local $<i> from 0 while $<i> < `end` (an i32 expression). */
const loop = (i, end, body) => `
    (local.set $${i} (i32.const 0))
    (block $${i}_done
      (br_if $${i}_done (i32.ge_s (local.get $${i}) ${end}))
      (loop $${i}_next
        ${body}
        (local.set $${i} (i32.add (local.get $${i}) (i32.const 1)))
        (br_if $${i}_next (i32.lt_s (local.get $${i}) ${end}))))`

const f4 = (name) => `(local $${name} v128)`
const ZERO = "(v128.const f32x4 0 0 0 0)"
const get = (n) => `(local.get $${n})`
const add = (...xs) => xs.reduce((a, b) => `(i32.add ${a} ${b})`)
const mul = (a, b) => `(i32.mul ${a} ${b})`
const c32 = (v) => `(i32.const ${v})`

/**
 * matmul's columns `lanes` at a time from $j while they fit: 16 in four f32x4 accumulators, 4 in
 * one, 1 as a float32; each summed over the whole k loop, A's element splatted against B's row.
 */
const matmulColumns = (lanes) => {
  const accs = lanes === 16 ? ["c0", "c1", "c2", "c3"] : ["c0"]
  const one = lanes === 1
  const name = `cols${lanes}`
  return `(block $${name}_done
          (br_if $${name}_done ${one ? "(i32.ge_s (local.get $j) (local.get $n))" : `(i32.gt_s (i32.add (local.get $j) (i32.const ${lanes})) (local.get $n))`})
          (loop $${name}
            ${one ? "(local.set $x (f32.const 0))" : accs.map((a) => `(local.set $${a} ${ZERO})`).join(" ")}
            (local.set $ap (local.get $row))
            (local.set $bp ${add(get("bt"), mul(get("j"), c32(4)))})
            ${loop(
              "kk",
              get("k"),
              `${
                one
                  ? "(local.set $x (f32.add (local.get $x) (f32.mul (f32.load (local.get $ap)) (f32.load (local.get $bp)))))"
                  : `(local.set $s (v128.load32_splat (local.get $ap)))
              ${accs.map((a, q) => `(local.set $${a} (f32x4.add (local.get $${a}) (f32x4.mul (local.get $s) (v128.load offset=${16 * q} (local.get $bp)))))`).join("\n              ")}`
              }
              (local.set $ap (i32.add (local.get $ap) (local.get $ak)))
              (local.set $bp (i32.add (local.get $bp) (local.get $nb)))`
            )}
            ${one ? "(f32.store (local.get $cp) (local.get $x))" : accs.map((a, q) => `(v128.store offset=${16 * q} (local.get $cp) (local.get $${a}))`).join("\n            ")}
            (local.set $cp (i32.add (local.get $cp) (i32.const ${4 * lanes})))
            (local.set $j (i32.add (local.get $j) (i32.const ${lanes})))
            (br_if $${name} ${one ? "(i32.lt_s (local.get $j) (local.get $n))" : `(i32.le_s (i32.add (local.get $j) (i32.const ${lanes})) (local.get $n))`})))`
}

/**
 * matmul(a, b, c, batches, m, k, n, sa, sb, ai, ak): for each batch t, C_t = A_t · B_t with A_t
 * [m, k] at a + t·sa, its element (i, kk) at i·ai + kk·ak bytes from there (row-major: ai = 4k,
 * ak = 4; A_t stored transposed, [k, m]: ai = 4, ak = 4m), B_t [k, n] row-major at b + t·sb
 * (byte strides; 0 repeats one matrix for every batch) and C_t [m, n] row-major at
 * c + t·m·n·4. Rows go two at a time, their columns 16 at a time (eight accumulators held across
 * the whole k loop, each load of B's 16 floats used by both rows), then each row's next 4 columns
 * at a time, then the last n mod 4 one at a time; an odd last row on its own. Each product is a
 * multiply then an add (no fused multiply-add), summed over k in order (the bits do not depend on
 * the blocking).
 */
const matmul = `
  (func (export "matmul") (param $a i32) (param $b i32) (param $c i32) (param $batches i32)
      (param $m i32) (param $k i32) (param $n i32) (param $sa i32) (param $sb i32) (param $ai i32) (param $ak i32)
    (local $t i32) (local $i i32) (local $kk i32) (local $j i32) (local $row i32) (local $bt i32)
    (local $ap i32) (local $bp i32) (local $cp i32) (local $nb i32) (local $j0 i32)
    (local $x f32) (local $s v128) (local $s2 v128) (local $bv v128) ${["c0", "c1", "c2", "c3", "e0", "e1", "e2", "e3"].map(f4).join(" ")}
    (local.set $nb ${mul(get("n"), c32(4))})
    (local.set $cp ${get("c")})
    ${loop(
      "t",
      get("batches"),
      `(local.set $bt ${add(get("b"), mul(get("t"), get("sb")))})
      (local.set $i (i32.const 0))
      ;; rows two at a time: each 16 columns of B loaded once for both rows' accumulators
      (block $pairs_done
        (br_if $pairs_done (i32.gt_s (i32.add (local.get $i) (i32.const 2)) (local.get $m)))
        (loop $pairs
          (local.set $row ${add(get("a"), mul(get("t"), get("sa")), mul(get("i"), get("ai")))})
          (local.set $j (i32.const 0))
          (block $pair16_done
            (br_if $pair16_done (i32.gt_s (i32.add (local.get $j) (i32.const 16)) (local.get $n)))
            (loop $pair16
              ${["c0", "c1", "c2", "c3", "e0", "e1", "e2", "e3"].map((a) => `(local.set $${a} ${ZERO})`).join(" ")}
              (local.set $ap (local.get $row))
              (local.set $bp ${add(get("bt"), mul(get("j"), c32(4)))})
              ${loop(
                "kk",
                get("k"),
                `(local.set $s (v128.load32_splat (local.get $ap)))
                (local.set $s2 (v128.load32_splat (i32.add (local.get $ap) (local.get $ai))))
                ${[0, 1, 2, 3]
                  .map(
                    (q) => `(local.set $bv (v128.load offset=${16 * q} (local.get $bp)))
                (local.set $c${q} (f32x4.add (local.get $c${q}) (f32x4.mul (local.get $s) (local.get $bv))))
                (local.set $e${q} (f32x4.add (local.get $e${q}) (f32x4.mul (local.get $s2) (local.get $bv))))`
                  )
                  .join("\n                ")}
                (local.set $ap (i32.add (local.get $ap) (local.get $ak)))
                (local.set $bp (i32.add (local.get $bp) (local.get $nb)))`
              )}
              ${[0, 1, 2, 3].map((q) => `(v128.store offset=${16 * q} (local.get $cp) (local.get $c${q}))`).join(" ")}
              ${[0, 1, 2, 3].map((q) => `(v128.store offset=${16 * q} (i32.add (local.get $cp) (local.get $nb)) (local.get $e${q}))`).join(" ")}
              (local.set $cp (i32.add (local.get $cp) (i32.const 64)))
              (local.set $j (i32.add (local.get $j) (i32.const 16)))
              (br_if $pair16 (i32.le_s (i32.add (local.get $j) (i32.const 16)) (local.get $n)))))
          ;; the rest of each of the two rows' columns on its own, 4 then 1 at a time
          (local.set $j0 (local.get $j))
          ${[4, 1].map(matmulColumns).join("\n")}
          (local.set $row (i32.add (local.get $row) (local.get $ai)))
          (local.set $cp (i32.add (local.get $cp) (i32.shl (local.get $j0) (i32.const 2))))
          (local.set $j (local.get $j0))
          ${[4, 1].map(matmulColumns).join("\n")}
          (local.set $i (i32.add (local.get $i) (i32.const 2)))
          (br_if $pairs (i32.le_s (i32.add (local.get $i) (i32.const 2)) (local.get $m)))))
      ;; an odd last row
      (if (i32.lt_s (local.get $i) (local.get $m))
        (then
          (local.set $row ${add(get("a"), mul(get("t"), get("sa")), mul(get("i"), get("ai")))})
          (local.set $j (i32.const 0))
          ${[16, 4, 1].map(matmulColumns).join("\n")}))`
    )})`

// Float64 halves of an f32x4 and back: sums over many rows are kept in float64, as the JavaScript
// loops keep them (batch-norm-train.ts), two lanes per f64x2.
const lo64 = (v) => `(f64x2.promote_low_f32x4 ${v})`
const hi64 = (v) => `(f64x2.promote_low_f32x4 (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 ${v} ${v}))`
const join32 = (lo, hi) => `(i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (f32x4.demote_f64x2_zero ${lo}) (f32x4.demote_f64x2_zero ${hi}))`
const v = (n) => `(local $${n} v128)`
const set = (n, e) => `(local.set $${n} ${e})`
const vadd = (a, b) => `(f32x4.add ${a} ${b})`
const vsub = (a, b) => `(f32x4.sub ${a} ${b})`
const vmul = (a, b) => `(f32x4.mul ${a} ${b})`
const dadd = (a, b) => `(f64x2.add ${a} ${b})`
const dmul = (a, b) => `(f64x2.mul ${a} ${b})`
const dsub = (a, b) => `(f64x2.sub ${a} ${b})`
const ld = (p) => `(v128.load ${p})`
const ZERO64 = "(v128.const f64x2 0 0)"

/**
 * Batch norm's loops over groups of channels ($at their byte offset in a row), with $stride (a
 * row's bytes) and $rows (M as an f64x2) set: `body(V)` for V f32x4 vectors of channels, 16
 * channels at a time (V = 4) while they fit, then 4 (V = 1). A channel's sums run down the rows in
 * order whatever the group (the same bits); sixteen channels keep eight float64 sums going at once
 * (one alone waits on its add's latency every row) and use every byte of each cache line they load.
 */
const perChannelGroup = (body) => `
    (local.set $stride (i32.mul (local.get $C) (i32.const 4)))
    (local.set $rows (f64x2.splat (f64.convert_i32_s (local.get $M))))
    (local.set $at (i32.const 0))
    (block $g16_done
      (br_if $g16_done (i32.gt_s (i32.add (local.get $at) (i32.const 64)) (local.get $stride)))
      (loop $g16
        ${body(4)}
        (local.set $at (i32.add (local.get $at) (i32.const 64)))
        (br_if $g16 (i32.le_s (i32.add (local.get $at) (i32.const 64)) (local.get $stride)))))
    (block $g4_done
      (br_if $g4_done (i32.ge_s (local.get $at) (local.get $stride)))
      (loop $g4
        ${body(1)}
        (local.set $at (i32.add (local.get $at) (i32.const 16)))
        (br_if $g4 (i32.lt_s (local.get $at) (local.get $stride)))))`

/** 0 .. V−1. */
const quads = (V) => [...Array(V).keys()]
/** Local `name` of vector q of a channel group. */
const nq = (name, q) => `${name}${q}`
/** v128 locals named `names`, one per vector of a 16-channel group. */
const perVector = (...names) => names.flatMap((n) => quads(4).map((q) => v(nq(n, q)))).join(" ")
/** f32x4 vector q of a channel group from row pointer `p`. */
const ldq = (p, q) => `(v128.load offset=${16 * q} ${p})`
/** An f32x4 per-channel array's vector q of the group ($at). */
const atq = (base, q) => ldq(`(i32.add (local.get $${base}) (local.get $at))`, q)

/**
 * Batch norm's passes go over the rows in blocks of about 8 KiB ($R rows, set by sumBlocks), every
 * channel group over one block before the next: each block comes from memory once and stays in the
 * first-level cache for the groups after the first. A group's float64 sums live in registers over
 * a block and in the kernel's scratch between blocks ($acc: one float64 per channel, `which`
 * selecting a second set, C float64s on), so a channel's sum still runs down the rows in order (the
 * same bits). `body(V)` sums the block's rows ($p the group's first, $n of them) for V vectors.
 */
const sumBlocks = (body) => `
    (local.set $R (i32.div_u (i32.const 2048) (local.get $C)))
    (if (i32.eqz (local.get $R)) (then (local.set $R (i32.const 1))))
    (local.set $r0 (i32.const 0))
    (block $blocks_done
      (br_if $blocks_done (i32.ge_s (local.get $r0) (local.get $M)))
      (loop $blocks
        (local.set $n (i32.sub (local.get $M) (local.get $r0)))
        (if (i32.gt_s (local.get $n) (local.get $R)) (then (local.set $n (local.get $R))))
        ${perChannelGroup(body)}
        (local.set $r0 (i32.add (local.get $r0) (local.get $R)))
        (br_if $blocks (i32.lt_s (local.get $r0) (local.get $M)))))`

/** The scratch's float64 sums: set 0 from $acc, set 1 C float64s on. */
const accBase = (which) => (which ? `(i32.add (local.get $acc) (i32.shl (local.get $C) (i32.const 3)))` : `(local.get $acc)`)
/** Loads (`load`) or stores the group's sums of set `which` into / from $<lo><q>, $<hi><q>. */
const accMove = (V, which, lo, hi, load) =>
  quads(V)
    .map((q) => {
      const at = `(i32.add ${accBase(which)} (i32.add (i32.shl (local.get $at) (i32.const 1)) (i32.const ${32 * q})))`
      return load
        ? `${set(nq(lo, q), `(v128.load ${at})`)} ${set(nq(hi, q), `(v128.load offset=16 ${at})`)}`
        : `(v128.store ${at} ${get(nq(lo, q))}) (v128.store offset=16 ${at} ${get(nq(hi, q))})`
    })
    .join(" ")
/** $acc's float64s [0, count·C) set to 0. */
const accZero = (count) => `
    (local.set $p (local.get $acc))
    (local.set $q (i32.add (local.get $acc) (i32.shl (local.get $C) (i32.const ${count === 2 ? 4 : 3}))))
    (block $z_done (loop $z_next
      (br_if $z_done (i32.ge_u (local.get $p) (local.get $q)))
      (v128.store (local.get $p) ${ZERO64})
      (local.set $p (i32.add (local.get $p) (i32.const 16)))
      (br $z_next)))`

/**
 * A block's rows for V vectors of a channel group: $slo<q>, $shi<q> += term(lane, the row's vector
 * q of x, the name of that half's mean local) for each half (lane: lo64 / hi64).
 */
const blockSums = (V, term) => `
      (local.set $p (i32.add (i32.add (local.get $x) (i32.mul (local.get $r0) (local.get $stride))) (local.get $at)))
      ${loop(
        "i",
        get("n"),
        `${quads(V)
          .map(
            (q) => `${set(nq("d", q), ldq(get("p"), q))}
        ${set(nq("slo", q), dadd(get(nq("slo", q)), term(lo64, get(nq("d", q)), nq("mlo", q))))}
        ${set(nq("shi", q), dadd(get(nq("shi", q)), term(hi64, get(nq("d", q)), nq("mhi", q))))}`
          )
          .join("\n        ")}
        (local.set $p (i32.add (local.get $p) (local.get $stride)))`
      )}`

/**
 * Batch normalization while training over the last axis of x [M, C] (C a multiple of 4), a group of
 * channels at a time (perChannelGroup), the rows strided by 4C bytes (batch-norm-train.ts has the
 * formulas; these are its loops). Sums over rows in float64 (two lanes per f64x2) in blocks of rows
 * (sumBlocks), per-channel factors in float64 rounded to float32 once, the element-wise passes in
 * float32 in the same blocks (a group's factors loaded from the scratch once per block,
 * elementBlocks), all in the JavaScript's order of operations: the same bits. Passes over all the rows for each channel group
 * had read every row's cache lines once per group (per vector before 56b60f6), from memory once x
 * outgrew the caches; in three alternated pairs, ms: [32768, 64] (resnet18's first stage at batch
 * 32) forward 2.87-4.05 -> 1.71-1.97, backward 5.00-5.32 -> 2.85-3.23; [8192, 128] 0.82-0.95 ->
 * 0.69-0.83 and 1.23-1.63 -> 0.91-1.02; resnet28's [25088, 32] (batch 128) and [6272, 32] 0.9-1.0x
 * the time. Blocks of 8 KiB measured best of 4, 8 and 16 (16: x, dy and dx of a block outgrew the
 * first-level cache in the backward pass).
 *
 * bnTrainForward(x, gamma, beta, y, mean, variance, M, C, eps, scratch): y, and the batch's mean
 * and population variance per channel; scratch 32·C bytes (the sums and the means in float64, then
 * the factors s, u, r, b in float32).
 */
const bnForwardMeans = (V) => `
      ${accMove(V, 0, "slo", "shi", true)}
      ${blockSums(V, (lane, d) => lane(d))}
      ${accMove(V, 0, "slo", "shi", false)}`
const bnForwardSquares = (V) => `
      ${accMove(V, 1, "mlo", "mhi", true)}
      ${accMove(V, 0, "slo", "shi", true)}
      ${blockSums(V, (lane, d, m) => dmul(dsub(lane(d), get(m)), dsub(lane(d), get(m))))}
      ${accMove(V, 0, "slo", "shi", false)}`
/** The factors' f32x4 vector q of a group in the scratch: f = 0 .. 3 for s, u, r, b (P, Q, R, u backward). */
const factorAt = (f, q) => `(i32.add (i32.add (local.get $acc) (i32.shl (local.get $C) (i32.const 4))) (i32.add (i32.mul (local.get $C) (i32.const ${4 * f})) (i32.add (local.get $at) (i32.const ${16 * q}))))`
const bnForwardFactors = (V) => `
      ${accMove(V, 0, "slo", "shi", true)}
      ${accMove(V, 1, "mlo", "mhi", true)}
      ${quads(V)
        .map(
          (q) => `${set(nq("slo", q), `(f64x2.div ${get(nq("slo", q))} ${get("rows")})`)}
      ${set(nq("shi", q), `(f64x2.div ${get(nq("shi", q))} ${get("rows")})`)}
      (v128.store offset=${16 * q} (i32.add (local.get $var) (local.get $at)) ${join32(get(nq("slo", q)), get(nq("shi", q)))})
      ;; scale = gamma / sqrt(variance + eps) in float64, rounded to float32, and y = ((x − mean) − rest)·scale
      ;; + beta in float32, mean the float64 mean rounded to float32 and rest what that rounding left
      ;; (so x − mean keeps its precision where the mean is large next to the spread), as the JavaScript
      (v128.store ${factorAt(0, q)} ${join32(`(f64x2.div ${lo64(atq("gamma", q))} (f64x2.sqrt (f64x2.add ${get(nq("slo", q))} (f64x2.splat (local.get $eps)))))`, `(f64x2.div ${hi64(atq("gamma", q))} (f64x2.sqrt (f64x2.add ${get(nq("shi", q))} (f64x2.splat (local.get $eps)))))`)})
      ${set("u4", join32(get(nq("mlo", q)), get(nq("mhi", q))))}
      (v128.store ${factorAt(1, q)} ${get("u4")})
      (v128.store ${factorAt(2, q)} ${join32(dsub(get(nq("mlo", q)), lo64(get("u4"))), dsub(get(nq("mhi", q)), hi64(get("u4"))))})
      (v128.store ${factorAt(3, q)} ${atq("beta", q)})`
        )
        .join("\n      ")}`
/**
 * An element-wise pass in the sums' blocks of rows (sumBlocks), a channel group at a time: its
 * factors (`factors`: names of v128 locals, f the factor's index in the scratch) loaded once per
 * block, then `body(q)` for vector q of the group on each of the block's rows ($p, $q, $o that row's
 * group in three arrays at `arrays`).
 */
const elementBlocks = (arrays, factors, body) =>
  sumBlocks(
    (V) => `${quads(V)
      .map((q) => factors.map((name, f) => set(nq(name, q), ld(factorAt(f, q)))).join(" "))
      .join("\n      ")}
      (local.set $p (i32.add (i32.add ${arrays[0]} (i32.mul (local.get $r0) (local.get $stride))) (local.get $at)))
      (local.set $q (i32.add (i32.add ${arrays[1]} (i32.mul (local.get $r0) (local.get $stride))) (local.get $at)))
      (local.set $o (i32.add (i32.add ${arrays[2]} (i32.mul (local.get $r0) (local.get $stride))) (local.get $at)))
      ${loop(
        "i",
        get("n"),
        `${quads(V).map(body).join("\n        ")}
        (local.set $p (i32.add (local.get $p) (local.get $stride)))
        (local.set $q (i32.add (local.get $q) (local.get $stride)))
        (local.set $o (i32.add (local.get $o) (local.get $stride)))`
      )}`
  )
const bnTrainForward = `
  (func (export "bnTrainForward") (param $x i32) (param $gamma i32) (param $beta i32) (param $y i32)
      (param $mean i32) (param $var i32) (param $M i32) (param $C i32) (param $eps f64) (param $acc i32)
    (local $i i32) (local $p i32) (local $q i32) (local $o i32) (local $stride i32) (local $at i32) (local $R i32) (local $r0 i32) (local $n i32)
    ${v("rows")} ${v("u4")}
    ${perVector("slo", "shi", "mlo", "mhi", "d", "fs", "fu", "fr", "fb")}
    ;; the sums of x, then the means in float64 (set 1) and float32 (the mean output)
    ${accZero(1)}
    ${sumBlocks(bnForwardMeans)}
    ${perChannelGroup(
      (V) => `${accMove(V, 0, "slo", "shi", true)}
      ${quads(V).map((q) => `${set(nq("mlo", q), `(f64x2.div ${get(nq("slo", q))} ${get("rows")})`)} ${set(nq("mhi", q), `(f64x2.div ${get(nq("shi", q))} ${get("rows")})`)}`).join("\n      ")}
      ${accMove(V, 1, "mlo", "mhi", false)}
      ${quads(V).map((q) => `(v128.store offset=${16 * q} (i32.add (local.get $mean) (local.get $at)) ${join32(get(nq("mlo", q)), get(nq("mhi", q)))})`).join("\n      ")}`
    )}
    ;; the sums of (x − mean)², then the variances and the factors
    ${accZero(1)}
    ${sumBlocks(bnForwardSquares)}
    ${perChannelGroup(bnForwardFactors)}
    ;; y = ((x − u) − r)·s + b
    ${elementBlocks(["(local.get $x)", "(local.get $x)", "(local.get $y)"], ["fs", "fu", "fr", "fb"], (q) => `(v128.store offset=${16 * q} (local.get $o) ${vadd(vmul(vsub(vsub(ldq(get("p"), q), get(nq("fu", q))), get(nq("fr", q))), get(nq("fs", q))), get(nq("fb", q)))})`)})`

/**
 * bnTrainBackward(dy, x, gamma, mean, variance, dmean, dvariance, dx, dgamma, dbeta, M, C, eps,
 * scratch): dx, dγ and dβ from the forward's mean and variance and the gradients reaching them;
 * scratch 32·C bytes (Σ dy and Σ dy·(x − mean) in float64, then the factors P, Q, R and the mean in
 * float32).
 */
const bnBackwardSums = (V) => `
      ${quads(V).map((q) => set(nq("u", q), atq("mean", q))).join(" ")}
      ${accMove(V, 0, "dlo", "dhi", true)}
      ${accMove(V, 1, "xlo", "xhi", true)}
      (local.set $p (i32.add (i32.add (local.get $x) (i32.mul (local.get $r0) (local.get $stride))) (local.get $at)))
      (local.set $q (i32.add (i32.add (local.get $dy) (i32.mul (local.get $r0) (local.get $stride))) (local.get $at)))
      ;; Σ dy and Σ dy·(x − mean) in float64, each dy·(x − mean) a float32 product of a float32 difference
      ${loop(
        "i",
        get("n"),
        `${quads(V)
          .map(
            (q) => `${set("d", ldq(get("q"), q))}
        ${set("xm", vmul(get("d"), vsub(ldq(get("p"), q), get(nq("u", q)))))}
        ${set(nq("dlo", q), dadd(get(nq("dlo", q)), lo64(get("d"))))}
        ${set(nq("dhi", q), dadd(get(nq("dhi", q)), hi64(get("d"))))}
        ${set(nq("xlo", q), dadd(get(nq("xlo", q)), lo64(get("xm"))))}
        ${set(nq("xhi", q), dadd(get(nq("xhi", q)), hi64(get("xm"))))}`
          )
          .join("\n        ")}
        (local.set $p (i32.add (local.get $p) (local.get $stride)))
        (local.set $q (i32.add (local.get $q) (local.get $stride)))`
      )}
      ${accMove(V, 0, "dlo", "dhi", false)}
      ${accMove(V, 1, "xlo", "xhi", false)}`
const bnBackwardFactors = (V) => `
      ${accMove(V, 0, "dlo", "dhi", true)}
      ${accMove(V, 1, "xlo", "xhi", true)}
      ${quads(V)
        .map(
          (q) => `;; r = 1 / sqrt(variance + eps) in float64
      ${set(nq("rlo", q), `(f64x2.div (f64x2.splat (f64.const 1)) (f64x2.sqrt (f64x2.add ${lo64(atq("var", q))} (f64x2.splat (local.get $eps)))))`)}
      ${set(nq("rhi", q), `(f64x2.div (f64x2.splat (f64.const 1)) (f64x2.sqrt (f64x2.add ${hi64(atq("var", q))} (f64x2.splat (local.get $eps)))))`)}
      ;; Σ dy·x̂ = r·Σ dy·(x − mean): dγ; Σ dy: dβ
      ${set(nq("xlo", q), dmul(get(nq("xlo", q)), get(nq("rlo", q))))}
      ${set(nq("xhi", q), dmul(get(nq("xhi", q)), get(nq("rhi", q))))}
      (v128.store offset=${16 * q} (i32.add (local.get $dgamma) (local.get $at)) ${join32(get(nq("xlo", q)), get(nq("xhi", q)))})
      (v128.store offset=${16 * q} (i32.add (local.get $dbeta) (local.get $at)) ${join32(get(nq("dlo", q)), get(nq("dhi", q)))})
      ;; dx = P·dy + Q·(x − mean) + R per channel, P = r·γ, Q = 2·dvariance/M − P·r·(Σdy·x̂/M), R = dmean/M −
      ;; P·(Σdy/M), each from float64 rounded to float32, then float32 arithmetic (as the JavaScript's)
      ${set("kalo", dmul(get(nq("rlo", q)), lo64(atq("gamma", q))))}
      ${set("kahi", dmul(get(nq("rhi", q)), hi64(atq("gamma", q))))}
      (v128.store ${factorAt(0, q)} ${join32(get("kalo"), get("kahi"))})
      (v128.store ${factorAt(
        1,
        q
      )} ${join32(
        dsub(`(f64x2.div (f64x2.mul ${lo64(atq("dvar", q))} (f64x2.splat (f64.const 2))) ${get("rows")})`, dmul(dmul(get("kalo"), get(nq("rlo", q))), `(f64x2.div ${get(nq("xlo", q))} ${get("rows")})`)),
        dsub(`(f64x2.div (f64x2.mul ${hi64(atq("dvar", q))} (f64x2.splat (f64.const 2))) ${get("rows")})`, dmul(dmul(get("kahi"), get(nq("rhi", q))), `(f64x2.div ${get(nq("xhi", q))} ${get("rows")})`))
      )})
      (v128.store ${factorAt(
        2,
        q
      )} ${join32(
        dsub(`(f64x2.div ${lo64(atq("dmean", q))} ${get("rows")})`, dmul(get("kalo"), `(f64x2.div ${get(nq("dlo", q))} ${get("rows")})`)),
        dsub(`(f64x2.div ${hi64(atq("dmean", q))} ${get("rows")})`, dmul(get("kahi"), `(f64x2.div ${get(nq("dhi", q))} ${get("rows")})`))
      )})
      (v128.store ${factorAt(3, q)} ${atq("mean", q)})`
        )
        .join("\n      ")}`
const bnTrainBackward = `
  (func (export "bnTrainBackward") (param $dy i32) (param $x i32) (param $gamma i32) (param $mean i32)
      (param $var i32) (param $dmean i32) (param $dvar i32) (param $dx i32) (param $dgamma i32)
      (param $dbeta i32) (param $M i32) (param $C i32) (param $eps f64) (param $acc i32)
    (local $i i32) (local $p i32) (local $q i32) (local $o i32) (local $stride i32) (local $at i32) (local $R i32) (local $r0 i32) (local $n i32)
    ${v("rows")} ${v("d")} ${v("xm")} ${v("kalo")} ${v("kahi")}
    ${perVector("rlo", "rhi", "u", "dlo", "dhi", "xlo", "xhi", "pf", "qf", "rf")}
    ${accZero(2)}
    ${sumBlocks(bnBackwardSums)}
    ${perChannelGroup(bnBackwardFactors)}
    ;; dx = P·dy + Q·(x − mean) + R
    ${elementBlocks(["(local.get $x)", "(local.get $dy)", "(local.get $dx)"], ["pf", "qf", "rf", "u"], (q) => `(v128.store offset=${16 * q} (local.get $o) ${vadd(vadd(vmul(get(nq("pf", q)), ldq(get("q"), q)), vmul(get(nq("qf", q)), vsub(ldq(get("p"), q), get(nq("u", q))))), get(nq("rf", q)))})`)})`

/** The sum of an f32x4's lanes, ((l0 + l1) + (l2 + l3)). */
const hsum = (e) => `(f32.add (f32.add (f32x4.extract_lane 0 ${e}) (f32x4.extract_lane 1 ${e})) (f32.add (f32x4.extract_lane 2 ${e}) (f32x4.extract_lane 3 ${e})))`

/**
 * Layer normalization over the last axis of x [N, D] (D a multiple of 4), a row at a time
 * (layer-norm.ts has the formulas; these are its loops), in float32.
 *
 * lnForward(x, gamma, beta, y, N, D, eps).
 */
const rowStats = `
    ;; the row's mean and r = 1 / sqrt(variance + eps), in $mean and $r (and splatted in $m4, $r4)
    ${set("acc", ZERO)}
    ${loop("j", get("q"), `${set("acc", vadd(get("acc"), ld(`(i32.add (local.get $row) (i32.shl (local.get $j) (i32.const 4)))`)))}`)}
    (local.set $mean (f32.div ${hsum(get("acc"))} (local.get $fd)))
    ${set("m4", "(f32x4.splat (local.get $mean))")}
    ${set("acc", ZERO)}
    ${loop("j", get("q"), `${set("d", vsub(ld(`(i32.add (local.get $row) (i32.shl (local.get $j) (i32.const 4)))`), get("m4")))}
      ${set("acc", vadd(get("acc"), vmul(get("d"), get("d"))))}`)}
    (local.set $r (f32.div (f32.const 1) (f32.sqrt (f32.add (f32.div ${hsum(get("acc"))} (local.get $fd)) (local.get $eps)))))
    ${set("r4", "(f32x4.splat (local.get $r))")}`
const lnLocals = `(local $n i32) (local $j i32) (local $q i32) (local $row i32) (local $at i32) (local $fd f32)
    (local $mean f32) (local $r f32) ${v("acc")} ${v("m4")} ${v("r4")} ${v("d")} ${v("xh")}`
const lnForward = `
  (func (export "lnForward") (param $x i32) (param $gamma i32) (param $beta i32) (param $y i32)
      (param $N i32) (param $D i32) (param $eps f32)
    ${lnLocals}
    (local.set $q (i32.shr_s (local.get $D) (i32.const 2)))
    (local.set $fd (f32.convert_i32_s (local.get $D)))
    ${loop(
      "n",
      get("N"),
      `(local.set $row (i32.add (local.get $x) (i32.mul (i32.mul (local.get $n) (local.get $D)) (i32.const 4))))
      ${rowStats}
      ${loop(
        "j",
        get("q"),
        `(local.set $at (i32.shl (local.get $j) (i32.const 4)))
        ${set("xh", vmul(vsub(ld(`(i32.add (local.get $row) (local.get $at))`), get("m4")), get("r4")))}
        (v128.store (i32.add (i32.sub (local.get $row) (local.get $x)) (i32.add (local.get $y) (local.get $at)))
          ${vadd(vmul(get("xh"), ld(`(i32.add (local.get $gamma) (local.get $at))`)), ld(`(i32.add (local.get $beta) (local.get $at))`))})`
      )}`
    )})`

/** lnBackward(dy, x, gamma, dx, dgamma, dbeta, N, D, eps): dγ and dβ summed over the rows in float32. */
const lnBackward = `
  (func (export "lnBackward") (param $dy i32) (param $x i32) (param $gamma i32) (param $dx i32)
      (param $dgamma i32) (param $dbeta i32) (param $N i32) (param $D i32) (param $eps f32)
    ${lnLocals} (local $off i32) (local $mg f32) (local $mgx f32) ${v("gg")} ${v("sg")} ${v("sgx")} ${v("dd")}
    (local.set $q (i32.shr_s (local.get $D) (i32.const 2)))
    (local.set $fd (f32.convert_i32_s (local.get $D)))
    ${loop("j", get("q"), `(v128.store (i32.add (local.get $dgamma) (i32.shl (local.get $j) (i32.const 4))) ${ZERO})
      (v128.store (i32.add (local.get $dbeta) (i32.shl (local.get $j) (i32.const 4))) ${ZERO})`)}
    ${loop(
      "n",
      get("N"),
      `(local.set $off (i32.mul (i32.mul (local.get $n) (local.get $D)) (i32.const 4)))
      (local.set $row (i32.add (local.get $x) (local.get $off)))
      ${rowStats}
      ${set("sg", ZERO)} ${set("sgx", ZERO)}
      ${loop(
        "j",
        get("q"),
        `(local.set $at (i32.shl (local.get $j) (i32.const 4)))
        ${set("xh", vmul(vsub(ld(`(i32.add (local.get $row) (local.get $at))`), get("m4")), get("r4")))}
        ${set("dd", ld(`(i32.add (i32.add (local.get $dy) (local.get $off)) (local.get $at))`))}
        ${set("gg", vmul(get("dd"), ld(`(i32.add (local.get $gamma) (local.get $at))`)))}
        ${set("sg", vadd(get("sg"), get("gg")))}
        ${set("sgx", vadd(get("sgx"), vmul(get("gg"), get("xh"))))}
        (v128.store (i32.add (local.get $dgamma) (local.get $at)) ${vadd(ld(`(i32.add (local.get $dgamma) (local.get $at))`), vmul(get("dd"), get("xh")))})
        (v128.store (i32.add (local.get $dbeta) (local.get $at)) ${vadd(ld(`(i32.add (local.get $dbeta) (local.get $at))`), get("dd"))})`
      )}
      (local.set $mg (f32.div ${hsum(get("sg"))} (local.get $fd)))
      (local.set $mgx (f32.div ${hsum(get("sgx"))} (local.get $fd)))
      ${loop(
        "j",
        get("q"),
        `(local.set $at (i32.shl (local.get $j) (i32.const 4)))
        ${set("xh", vmul(vsub(ld(`(i32.add (local.get $row) (local.get $at))`), get("m4")), get("r4")))}
        ${set("gg", vmul(ld(`(i32.add (i32.add (local.get $dy) (local.get $off)) (local.get $at))`), ld(`(i32.add (local.get $gamma) (local.get $at))`)))}
        (v128.store (i32.add (i32.add (local.get $dx) (local.get $off)) (local.get $at))
          ${vmul(get("r4"), vsub(vsub(get("gg"), "(f32x4.splat (local.get $mg))"), vmul(get("xh"), "(f32x4.splat (local.get $mgx))")))})`
      )}`
    )})`


/**
 * The strides of a walk over the output pixels of a convolution through its padded input
 * [N, HP, WP, C] (nextPixel): a row's bytes, SH rows', SW pixels', and what to skip at the end of
 * an output row and of an image.
 */
const paddedWalk = `
    (local.set $rowBytes (i32.mul (i32.mul (local.get $WP) (local.get $C)) (i32.const 4)))
    (local.set $SHrow (i32.mul (local.get $SH) (local.get $rowBytes)))
    (local.set $SWpix (i32.mul (i32.mul (local.get $SW) (local.get $C)) (i32.const 4)))
    (local.set $rowSkip (i32.sub (local.get $SHrow) (i32.mul (local.get $OW) (local.get $SWpix))))
    (local.set $imageSkip (i32.sub (i32.mul (local.get $HP) (local.get $rowBytes)) (i32.mul (local.get $OH) (local.get $SHrow))))`

/** $cx to the next output pixel's first tap (row by row, image by image, through the padded input). */
const nextPixel = `
          (local.set $cx (i32.add (local.get $cx) (local.get $SWpix)))
          (local.set $ow (i32.add (local.get $ow) (i32.const 1)))
          (if (i32.eq (local.get $ow) (local.get $OW))
            (then
              (local.set $ow (i32.const 0))
              (local.set $cx (i32.add (local.get $cx) (local.get $rowSkip)))
              (local.set $oh (i32.add (local.get $oh) (i32.const 1)))
              (if (i32.eq (local.get $oh) (local.get $OH))
                (then
                  (local.set $oh (i32.const 0))
                  (local.set $cx (i32.add (local.get $cx) (local.get $imageSkip)))))))`

/**
 * Stores f32x4 `v` at `at` as output columns $j + 4q ..: all four where they are inside the O
 * columns, else the 1-3 that are, else none.
 */
const storeColumns = (at, v, q) => `
          (local.set $left (i32.sub (local.get $O) (i32.add (local.get $j) (i32.const ${4 * q}))))
          (if (i32.ge_s (local.get $left) (i32.const 4))
            (then (v128.store offset=${16 * q} ${at} ${v}))
            (else
              (if (i32.ge_s (local.get $left) (i32.const 2))
                (then (v128.store64_lane offset=${16 * q} 0 ${at} ${v})
                  (if (i32.eq (local.get $left) (i32.const 3)) (then (v128.store32_lane offset=${16 * q + 8} 2 ${at} ${v}))))
                (else (if (i32.eq (local.get $left) (i32.const 1)) (then (v128.store32_lane offset=${16 * q} 0 ${at} ${v})))))))`

/**
 * One group of `pixels` output pixels (from $m, $cx at the first one's input) for the columns from
 * $j: `vecs` f32x4 accumulators per pixel (4·vecs columns), started from the bias ($b<q>), summed
 * over every tap row fh and, along it, every (fw, c) in order (contiguous in both the padded input
 * and the filter), a multiply then an add; ReLU with $relu.
 */
const convGroup = (pixels, vecs) => {
  const ps = [...Array(pixels).keys()]
  const qs = [...Array(vecs).keys()]
  const acc = (p, q) => `$a${p}_${q}`
  return `
          ${ps.map((p) => `(local.set $r${p} (local.get $cx)) ${p < pixels - 1 ? nextPixel : ""}`).join("\n")}
          ${ps.flatMap((p) => qs.map((q) => `(local.set ${acc(p, q)} (local.get $b${q}))`)).join(" ")}
          (local.set $wr (i32.add (local.get $w) (i32.shl (local.get $j) (i32.const 2))))
          ${loop(
            "fh",
            get("FH"),
            `(local.set $wp (local.get $wr))
            ${ps.map((p) => `(local.set $q${p} (local.get $r${p}))`).join(" ")}
            ${loop(
              "kk",
              get("K"),
              `${ps.map((p) => `(local.set $s${p} (v128.load32_splat (local.get $q${p})))`).join("\n              ")}
              ${qs
                .map(
                  (q) => `(local.set $wv (v128.load offset=${16 * q} (local.get $wp)))
              ${ps.map((p) => `(local.set ${acc(p, q)} (f32x4.add (local.get ${acc(p, q)}) (f32x4.mul (local.get $s${p}) (local.get $wv))))`).join("\n              ")}`
                )
                .join("\n              ")}
              ${ps.map((p) => `(local.set $q${p} (i32.add (local.get $q${p}) (i32.const 4)))`).join(" ")}
              (local.set $wp (i32.add (local.get $wp) (local.get $wstep)))`
            )}
            ${ps.map((p) => `(local.set $r${p} (i32.add (local.get $r${p}) (local.get $rowBytes)))`).join(" ")}
            (local.set $wr (i32.add (local.get $wr) (local.get $tapRow)))`
          )}
          ${ps
            .flatMap((p) =>
              qs.map((q) => {
                const value = `(if (result v128) (local.get $relu) (then (f32x4.max (local.get ${acc(p, q)}) ${ZERO})) (else (local.get ${acc(p, q)})))`
                const at = `(i32.add (local.get $y) (i32.shl (i32.add (i32.mul (i32.add (local.get $m) (i32.const ${p})) (local.get $O)) (local.get $j)) (i32.const 2)))`
                return storeColumns(at, value, q)
              })
            )
            .join("\n")}
          ${nextPixel}
          (local.set $m (i32.add (local.get $m) (i32.const ${pixels})))`
}

/**
 * conv2d's output columns `4·vecs` at a time from $j while they fit in O rounded up to 4, each
 * block over every output pixel, `pixels` at a time (their loads of w shared), then one at a time.
 */
const convColumns = (vecs, pixels) => {
  const lanes = 4 * vecs
  const name = `cols${lanes}`
  const qs = [...Array(vecs).keys()]
  const at = "(i32.add (local.get $bias) (i32.shl (local.get $j) (i32.const 2)))"
  return `
    (block $${name}_done
      (br_if $${name}_done (i32.gt_s (i32.add (local.get $j) (i32.const ${lanes})) (local.get $OP)))
      (loop $${name}
        ${qs.map((q) => `(local.set $b${q} (if (result v128) (local.get $bias) (then (v128.load offset=${16 * q} ${at})) (else ${ZERO})))`).join(" ")}
        (local.set $m (i32.const 0)) (local.set $oh (i32.const 0)) (local.set $ow (i32.const 0)) (local.set $cx (local.get $x))
        (block $${name}_g_done
          (br_if $${name}_g_done (i32.gt_u (i32.add (local.get $m) (i32.const ${pixels})) (local.get $M)))
          (loop $${name}_g
            ${convGroup(pixels, vecs)}
            (br_if $${name}_g (i32.le_u (i32.add (local.get $m) (i32.const ${pixels})) (local.get $M)))))
        (block $${name}_1_done
          (br_if $${name}_1_done (i32.ge_u (local.get $m) (local.get $M)))
          (loop $${name}_1
            ${convGroup(1, vecs)}
            (br_if $${name}_1 (i32.lt_u (local.get $m) (local.get $M)))))
        (local.set $j (i32.add (local.get $j) (i32.const ${lanes})))
        (br_if $${name} (i32.le_s (i32.add (local.get $j) (i32.const ${lanes})) (local.get $OP)))))`
}

/**
 * conv2d(x, w, bias, y, N, HP, WP, C, OH, OW, O, FH, FW, SH, SW, relu): a channels-last 2-D
 * convolution (dilation 1) of x [N, HP, WP, C], already padded (every tap of every output pixel
 * inside it), by w [FH, FW, C, O] into y [N, OH, OW, O]: y[b, oh, ow, o] = bias[o] +
 * Σ_{fh, fw, c} x[b, oh·SH + fh, ow·SW + fw, c] · w[fh, fw, c, o], then max(·, 0) with relu 1.
 * bias 0 means none. Output channels 16 at a time for two pixels at once (their loads of w shared),
 * then 8 for four pixels, then 4 for eight; sums in float32 in the order fh, fw, c. With O not a
 * multiple of 4 the last block reads up to 12 bytes past w's rows and bias's end (lanes never
 * stored): the caller keeps 16 bytes of memory after both.
 */
const conv2d = `
  (func (export "conv2d") (param $x i32) (param $w i32) (param $bias i32) (param $y i32) (param $N i32)
      (param $HP i32) (param $WP i32) (param $C i32) (param $OH i32) (param $OW i32) (param $O i32)
      (param $FH i32) (param $FW i32) (param $SH i32) (param $SW i32) (param $relu i32)
    (local $M i32) (local $m i32) (local $j i32) (local $fh i32) (local $kk i32) (local $K i32) (local $OP i32) (local $left i32)
    (local $oh i32) (local $ow i32) (local $cx i32) (local $rowSkip i32) (local $imageSkip i32)
    (local $rowBytes i32) (local $SHrow i32) (local $SWpix i32)
    (local $wstep i32) (local $tapRow i32) (local $wr i32) (local $wp i32)
    ${[...Array(8).keys()].map((p) => `(local $r${p} i32) (local $q${p} i32) (local $s${p} v128)`).join(" ")}
    (local $wv v128) ${["b0", "b1", "b2", "b3"].map(f4).join(" ")}
    ${[...Array(8).keys()].flatMap((p) => [0, 1, 2, 3].map((q) => f4(`a${p}_${q}`))).join(" ")}
    (local.set $M (i32.mul (i32.mul (local.get $N) (local.get $OH)) (local.get $OW)))
    (local.set $OP (i32.and (i32.add (local.get $O) (i32.const 3)) (i32.const -4)))
    (local.set $K (i32.mul (local.get $FW) (local.get $C)))
    ${paddedWalk}
    (local.set $wstep (i32.mul (local.get $O) (i32.const 4)))
    (local.set $tapRow (i32.mul (local.get $K) (local.get $wstep)))
    (local.set $j (i32.const 0))
    ${convColumns(4, 2)}
    ${convColumns(2, 4)}
    ${convColumns(1, 8)})`

/**
 * convFilterGrad's columns of one row of dW from $j while they fit: `wide` 16 in four accumulators,
 * `pair` 16 for input channels $ci and $ci + 1 at once (eight accumulators, dy's four loads shared),
 * `narrow` 4, `one` 1; each summed over every output pixel whose input is inside the image.
 */
const filterGradColumns = (kind) => {
  const lanes = kind === "narrow" ? 4 : kind === "one" ? 1 : 16
  const accs = kind === "wide" || kind === "pair" ? ["c0", "c1", "c2", "c3"] : ["c0"]
  const second = kind === "pair" ? ["e0", "e1", "e2", "e3"] : []
  const body =
    kind === "one"
      ? `(local.set $sx (f32.add (local.get $sx) (f32.mul (f32.load (local.get $xp)) (f32.load (local.get $dp)))))`
      : kind === "pair"
        ? `(local.set $s (v128.load32_splat (local.get $xp)))
                  (local.set $s2 (v128.load32_splat offset=4 (local.get $xp)))
                  ${accs.map((_, q) => `(local.set $d${q} (v128.load offset=${16 * q} (local.get $dp)))`).join("\n")}
                  ${accs.map((a, q) => `(local.set $${a} (f32x4.add (local.get $${a}) (f32x4.mul (local.get $s) (local.get $d${q}))))`).join("\n")}
                  ${second.map((a, q) => `(local.set $${a} (f32x4.add (local.get $${a}) (f32x4.mul (local.get $s2) (local.get $d${q}))))`).join("\n")}`
        : `(local.set $s (v128.load32_splat (local.get $xp)))
                  ${accs.map((a, q) => `(local.set $${a} (f32x4.add (local.get $${a}) (f32x4.mul (local.get $s) (v128.load offset=${16 * q} (local.get $dp)))))`).join("\n")}`
  return `(block $${kind}_done
            (br_if $${kind}_done (i32.gt_s (i32.add (local.get $j) (i32.const ${lanes})) (local.get $O)))
            (loop $${kind}
              ;; dW[fh, fw, ci, j ..]: the sums start from it with $acc set (a chunk of the batch after the first), else from 0
              (local.set $op (i32.add (local.get $dw) (i32.shl (i32.add (i32.mul (i32.add (i32.mul (i32.add (i32.mul (local.get $fh) (local.get $FW)) (local.get $fw)) (local.get $C)) (local.get $ci)) (local.get $O)) (local.get $j)) (i32.const 2))))
              ${
                kind === "one"
                  ? "(local.set $sx (if (result f32) (local.get $acc) (then (f32.load (local.get $op))) (else (f32.const 0))))"
                  : [
                      ...accs.map((a, q) => `(local.set $${a} (if (result v128) (local.get $acc) (then (v128.load offset=${16 * q} (local.get $op))) (else ${ZERO})))`),
                      ...second.map((a, q) => `(local.set $${a} (if (result v128) (local.get $acc) (then (v128.load offset=${16 * q} (i32.add (local.get $op) (local.get $ostep)))) (else ${ZERO})))`)
                    ].join("\n              ")
              }
              ${loop(
                "b",
                get("N"),
                loop(
                  "oh",
                  get("OH"),
                  `(local.set $ih (i32.sub (i32.add (i32.mul (local.get $oh) (local.get $SH)) (local.get $fh)) (local.get $top)))
                  (if (i32.and (i32.ge_s (local.get $ih) (i32.const 0)) (i32.lt_s (local.get $ih) (local.get $H)))
                    (then
                      (local.set $xp (i32.add (local.get $x) (i32.mul (i32.add (i32.mul (i32.add (i32.mul (i32.add (i32.mul (local.get $b) (local.get $H)) (local.get $ih)) (local.get $W))
                        (i32.sub (i32.add (i32.mul (local.get $first) (local.get $SW)) (local.get $fw)) (local.get $left))) (local.get $C)) (local.get $ci)) (i32.const 4))))
                      (local.set $dp (i32.add (local.get $dy) (i32.mul (i32.add (i32.mul (i32.add (i32.mul (i32.add (i32.mul (local.get $b) (local.get $OH)) (local.get $oh)) (local.get $OW)) (local.get $first)) (local.get $O)) (local.get $j)) (i32.const 4))))
                      ${loop(
                        "ow",
                        get("width"),
                        `${body}
                        (local.set $xp (i32.add (local.get $xp) (local.get $xstep)))
                        (local.set $dp (i32.add (local.get $dp) (local.get $ostep)))`
                      )}))`
                )
              )}
              ${
                kind === "one"
                  ? "(f32.store (local.get $op) (local.get $sx))"
                  : accs.map((a, q) => `(v128.store offset=${16 * q} (local.get $op) (local.get $${a}))`).join("\n")
              }
              ${second.map((a, q) => `(v128.store offset=${16 * q} (i32.add (local.get $op) (local.get $ostep)) (local.get $${a}))`).join("\n")}
              (local.set $j (i32.add (local.get $j) (i32.const ${lanes})))
              (br_if $${kind} (i32.le_s (i32.add (local.get $j) (i32.const ${lanes})) (local.get $O)))))`
}

/**
 * convFilterGrad(x, dy, dw, N, H, W, C, OH, OW, O, FH, FW, SH, SW, top, left, acc): a channels-last 2-D
 * convolution's filter gradient, dW[fh, fw, c, o] = Σ_{b, oh, ow} x[b, oh·SH + fh − top,
 * ow·SW + fw − left, c] · dy[b, oh, ow, o] (dilation 1, positions outside the image left out),
 * without a patch matrix: for each tap and input channel, one row of dW (16 output channels at a
 * time in four accumulators, two input channels at once where there are two, then 4, then one)
 * summed over every output pixel whose input is inside the image, x read in place with a stride
 * of SW·C and dy row by row. Sums in float32, in the order b, oh, ow. With acc 1 each sum starts
 * from dW's value instead of 0, so the host can go over the batch in chunks that stay in cache
 * (the sums, and so the bits, are those of one call over the whole batch).
 */
const convFilterGrad = `
  (func (export "convFilterGrad") (param $x i32) (param $dy i32) (param $dw i32) (param $N i32)
      (param $H i32) (param $W i32) (param $C i32) (param $OH i32) (param $OW i32) (param $O i32)
      (param $FH i32) (param $FW i32) (param $SH i32) (param $SW i32) (param $top i32) (param $left i32) (param $acc i32)
    (local $fh i32) (local $fw i32) (local $ci i32) (local $j i32) (local $b i32) (local $oh i32) (local $ow i32)
    (local $ih i32) (local $first i32) (local $end i32) (local $xp i32) (local $dp i32) (local $op i32)
    (local $xstep i32) (local $ostep i32) (local $width i32) (local $sx f32) (local $jr i32)
    (local $s v128) (local $s2 v128) ${["c0", "c1", "c2", "c3", "e0", "e1", "e2", "e3", "d0", "d1", "d2", "d3"].map(f4).join(" ")}
    (local.set $xstep (i32.mul (i32.mul (local.get $SW) (local.get $C)) (i32.const 4)))
    (local.set $ostep (i32.mul (local.get $O) (i32.const 4)))
    ${loop(
      "fh",
      get("FH"),
      loop(
        "fw",
        get("FW"),
        `;; the output columns whose input column ow·SW + fw − left is inside the image: [first, end)
        (local.set $first (i32.const 0))
        (if (i32.gt_s (i32.sub (local.get $left) (local.get $fw)) (i32.const 0))
          (then (local.set $first (i32.div_s (i32.add (i32.sub (local.get $left) (local.get $fw)) (i32.sub (local.get $SW) (i32.const 1))) (local.get $SW)))))
        (local.set $end (i32.const 0))
        (if (i32.ge_s (i32.sub (i32.add (local.get $W) (local.get $left)) (i32.add (local.get $fw) (i32.const 1))) (i32.const 0))
          (then (local.set $end (i32.add (i32.div_s (i32.sub (i32.add (local.get $W) (local.get $left)) (i32.add (local.get $fw) (i32.const 1))) (local.get $SW)) (i32.const 1)))))
        (if (i32.gt_s (local.get $end) (local.get $OW)) (then (local.set $end (local.get $OW))))
        (if (i32.lt_s (local.get $end) (local.get $first)) (then (local.set $end (local.get $first))))
        (local.set $width (i32.sub (local.get $end) (local.get $first)))
        (local.set $ci (i32.const 0))
        (block $ci_done
          (br_if $ci_done (i32.ge_s (local.get $ci) (local.get $C)))
          (loop $ci_next
            (if (i32.lt_s (i32.add (local.get $ci) (i32.const 1)) (local.get $C))
              (then
                ;; two input channels at once (their rows of dW share dy's loads), 16 columns at a
                ;; time; the rest of each row on its own
                (local.set $j (i32.const 0))
                ${filterGradColumns("pair")}
                (local.set $jr (local.get $j))
                ${filterGradColumns("narrow")}
                ${filterGradColumns("one")}
                (local.set $ci (i32.add (local.get $ci) (i32.const 1)))
                (local.set $j (local.get $jr))
                ${filterGradColumns("narrow")}
                ${filterGradColumns("one")})
              (else
                (local.set $j (i32.const 0))
                ${filterGradColumns("wide")}
                ${filterGradColumns("narrow")}
                ${filterGradColumns("one")}))
            (local.set $ci (i32.add (local.get $ci) (i32.const 1)))
            (br_if $ci_next (i32.lt_s (local.get $ci) (local.get $C)))))`
      )
    )})`

/** Filter taps along a row per pass of convFilterGradTaps. */
const TAPS = 4

/**
 * convFilterGradTaps(x, dy, dw, N, HP, WP, C, OH, OW, O, FH, FW, SH, SW): the same filter gradient
 * as convFilterGrad, from x [N, HP, WP, C] already padded (every tap of every output pixel inside
 * it), for layers with few input channels (where convFilterGrad's rows, one tap and channel each,
 * pass over dy once per output column block and tap): for each tap row fh and input channel c,
 * four taps fw along the row at once for eight output columns (eight accumulators, dy's two loads
 * shared by the four taps), every output pixel in order b, oh, ow; sums in float32. With O not a
 * multiple of 8 the last block reads up to 28 bytes past a pixel's dy (lanes never stored), and taps
 * past FW read up to 3 floats past x's rows: the caller keeps 32 bytes after dy and 16 after x.
 */
const convFilterGradTaps = `
  (func (export "convFilterGradTaps") (param $x i32) (param $dy i32) (param $dw i32) (param $N i32)
      (param $HP i32) (param $WP i32) (param $C i32) (param $OH i32) (param $OW i32) (param $O i32)
      (param $FH i32) (param $FW i32) (param $SH i32) (param $SW i32)
    (local $fh i32) (local $c i32) (local $fw i32) (local $j i32) (local $m i32) (local $M i32) (local $left i32)
    (local $oh i32) (local $ow i32) (local $cx i32) (local $dp i32) (local $rowSkip i32) (local $imageSkip i32)
    (local $rowBytes i32) (local $SHrow i32) (local $SWpix i32) (local $ostep i32) (local $at i32) (local $taps i32)
    (local $d0 v128) (local $d1 v128) (local $s v128)
    ${[...Array(TAPS).keys()].flatMap((f) => [f4(`t${f}_0`), f4(`t${f}_1`)]).join(" ")}
    (local.set $M (i32.mul (i32.mul (local.get $N) (local.get $OH)) (local.get $OW)))
    ${paddedWalk}
    (local.set $ostep (i32.mul (local.get $O) (i32.const 4)))
    ${loop(
      "fh",
      get("FH"),
      loop(
        "c",
        get("C"),
        `(local.set $fw (i32.const 0))
        (loop $fw_next
          (local.set $j (i32.const 0))
          (loop $j_next
            ${[...Array(TAPS).keys()].map((f) => `(local.set $t${f}_0 ${ZERO}) (local.set $t${f}_1 ${ZERO})`).join(" ")}
            (local.set $oh (i32.const 0)) (local.set $ow (i32.const 0))
            ;; x[b, oh·SH + fh, ow·SW + fw, c] for the first output pixel, dy[0, 0, 0, j]
            (local.set $cx (i32.add (local.get $x) (i32.add (i32.mul (local.get $fh) (local.get $rowBytes))
              (i32.shl (i32.add (i32.mul (local.get $fw) (local.get $C)) (local.get $c)) (i32.const 2)))))
            (local.set $dp (i32.add (local.get $dy) (i32.shl (local.get $j) (i32.const 2))))
            ${loop(
              "m",
              get("M"),
              `(local.set $d0 (v128.load (local.get $dp)))
              (local.set $d1 (v128.load offset=16 (local.get $dp)))
              ${[...Array(TAPS).keys()]
                .map(
                  (f) => `(local.set $s (v128.load32_splat (i32.add (local.get $cx) (i32.mul (local.get $C) (i32.const ${4 * f})))))
              (local.set $t${f}_0 (f32x4.add (local.get $t${f}_0) (f32x4.mul (local.get $s) (local.get $d0))))
              (local.set $t${f}_1 (f32x4.add (local.get $t${f}_1) (f32x4.mul (local.get $s) (local.get $d1))))`
                )
                .join("\n              ")}
              (local.set $dp (i32.add (local.get $dp) (local.get $ostep)))
              ${nextPixel}`
            )}
            ;; dW[fh, fw + f, c, j ..] for the taps inside the filter
            (local.set $taps (i32.sub (local.get $FW) (local.get $fw)))
            ${[...Array(TAPS).keys()]
              .map(
                (f) => `(if (i32.gt_s (local.get $taps) (i32.const ${f}))
              (then
                (local.set $at (i32.add (local.get $dw) (i32.shl (i32.add (i32.mul (i32.add (i32.mul (i32.add (i32.mul (local.get $fh) (local.get $FW)) (i32.add (local.get $fw) (i32.const ${f}))) (local.get $C)) (local.get $c)) (local.get $O)) (local.get $j)) (i32.const 2))))
                ${storeColumns("(local.get $at)", `(local.get $t${f}_0)`, 0)}
                ${storeColumns("(local.get $at)", `(local.get $t${f}_1)`, 1)}))`
              )
              .join("\n            ")}
            (local.set $j (i32.add (local.get $j) (i32.const 8)))
            (br_if $j_next (i32.lt_s (local.get $j) (local.get $O))))
          (local.set $fw (i32.add (local.get $fw) (i32.const ${TAPS})))
          (br_if $fw_next (i32.lt_s (local.get $fw) (local.get $FW))))`
      )
    )})`

/**
 * maxPoolGrad(x, dy, dx, N, H, W, C, OH, OW, FH, FW, SH, SW, top, left): a channels-last max pool's
 * gradient for windows that do not overlap (SH ≥ FH, SW ≥ FW, so each input is in one window at
 * most): per window and four channels at a time, the maximum over the taps inside the image (a
 * later tap replaces it only when strictly greater), then each tap's dx is dy where the tap is the
 * first to equal that maximum (a NaN maximum: the first NaN) and 0 elsewhere. dx is written only
 * inside windows (the caller zeroes the rest). With C not a multiple of 4 the last group reads up
 * to 12 bytes past a pixel (lanes never stored): the caller keeps 16 bytes after x and dy.
 */
const maxPoolGrad = `
  (func (export "maxPoolGrad") (param $x i32) (param $dy i32) (param $dx i32) (param $N i32) (param $H i32)
      (param $W i32) (param $C i32) (param $OH i32) (param $OW i32) (param $FH i32) (param $FW i32)
      (param $SH i32) (param $SW i32) (param $top i32) (param $left i32)
    (local $b i32) (local $oh i32) (local $ow i32) (local $g i32) (local $fh i32) (local $fw i32)
    (local $h0 i32) (local $w0 i32) (local $fhs i32) (local $fhe i32) (local $fws i32) (local $fwe i32)
    (local $groups i32) (local $pix i32) (local $row i32) (local $at i32) (local $dp i32) (local $n i32) (local $o i32)
    (local $best v128) (local $v v128) (local $d v128) (local $claimed v128) (local $eq v128) (local $take v128)
    (local.set $groups (i32.shr_u (i32.add (local.get $C) (i32.const 3)) (i32.const 2)))
    (local.set $pix (i32.shl (local.get $C) (i32.const 2)))
    (local.set $row (i32.mul (local.get $W) (local.get $pix)))
    (local.set $dp (local.get $dy))
    ${loop(
      "b",
      get("N"),
      loop(
        "oh",
        get("OH"),
        `(local.set $h0 (i32.sub (i32.mul (local.get $oh) (local.get $SH)) (local.get $top)))
        (local.set $fhs (select (i32.sub (i32.const 0) (local.get $h0)) (i32.const 0) (i32.lt_s (local.get $h0) (i32.const 0))))
        (local.set $fhe (select (i32.sub (local.get $H) (local.get $h0)) (local.get $FH) (i32.lt_s (i32.sub (local.get $H) (local.get $h0)) (local.get $FH))))
        ${loop(
          "ow",
          get("OW"),
          `(local.set $w0 (i32.sub (i32.mul (local.get $ow) (local.get $SW)) (local.get $left)))
          (local.set $fws (select (i32.sub (i32.const 0) (local.get $w0)) (i32.const 0) (i32.lt_s (local.get $w0) (i32.const 0))))
          (local.set $fwe (select (i32.sub (local.get $W) (local.get $w0)) (local.get $FW) (i32.lt_s (i32.sub (local.get $W) (local.get $w0)) (local.get $FW))))
          (if (i32.and (i32.lt_s (local.get $fhs) (local.get $fhe)) (i32.lt_s (local.get $fws) (local.get $fwe)))
            (then
              ;; the window's first tap inside the image, channel 0
              (local.set $o (i32.add (local.get $x) (i32.add (i32.mul (i32.add (i32.mul (local.get $b) (local.get $H)) (i32.add (local.get $h0) (local.get $fhs))) (local.get $row))
                (i32.mul (i32.add (local.get $w0) (local.get $fws)) (local.get $pix)))))
              ${loop(
                "g",
                get("groups"),
                `(local.set $best (v128.load (i32.add (local.get $o) (i32.shl (local.get $g) (i32.const 4)))))
                (local.set $fh (local.get $fhs))
                (loop $max_h
                  (local.set $at (i32.add (i32.add (local.get $o) (i32.mul (i32.sub (local.get $fh) (local.get $fhs)) (local.get $row))) (i32.shl (local.get $g) (i32.const 4))))
                  (local.set $fw (local.get $fws))
                  (loop $max_w
                    (local.set $v (v128.load (local.get $at)))
                    (local.set $best (v128.bitselect (local.get $v) (local.get $best) (f32x4.gt (local.get $v) (local.get $best))))
                    (local.set $at (i32.add (local.get $at) (local.get $pix)))
                    (local.set $fw (i32.add (local.get $fw) (i32.const 1)))
                    (br_if $max_w (i32.lt_s (local.get $fw) (local.get $fwe))))
                  (local.set $fh (i32.add (local.get $fh) (i32.const 1)))
                  (br_if $max_h (i32.lt_s (local.get $fh) (local.get $fhe))))
                (local.set $d (v128.load (i32.add (local.get $dp) (i32.shl (local.get $g) (i32.const 4)))))
                (local.set $claimed ${ZERO})
                (local.set $n (i32.sub (local.get $C) (i32.shl (local.get $g) (i32.const 2))))
                (local.set $fh (local.get $fhs))
                (loop $put_h
                  (local.set $at (i32.add (i32.mul (i32.sub (local.get $fh) (local.get $fhs)) (local.get $row)) (i32.shl (local.get $g) (i32.const 4))))
                  (local.set $fw (local.get $fws))
                  (loop $put_w
                    (local.set $v (v128.load (i32.add (local.get $o) (local.get $at))))
                    (local.set $eq (v128.or (f32x4.eq (local.get $v) (local.get $best))
                      (v128.and (f32x4.ne (local.get $v) (local.get $v)) (f32x4.ne (local.get $best) (local.get $best)))))
                    (local.set $take (v128.andnot (local.get $eq) (local.get $claimed)))
                    (local.set $claimed (v128.or (local.get $claimed) (local.get $eq)))
                    (local.set $v (v128.and (local.get $d) (local.get $take)))
                    ;; dx at the same offset from dx's window as x's; all four lanes or the 1-3 inside C
                    (if (i32.ge_s (local.get $n) (i32.const 4))
                      (then (v128.store (i32.add (i32.add (local.get $dx) (i32.sub (local.get $o) (local.get $x))) (local.get $at)) (local.get $v)))
                      (else
                        (v128.store32_lane 0 (i32.add (i32.add (local.get $dx) (i32.sub (local.get $o) (local.get $x))) (local.get $at)) (local.get $v))
                        (if (i32.ge_s (local.get $n) (i32.const 2))
                          (then (v128.store32_lane offset=4 1 (i32.add (i32.add (local.get $dx) (i32.sub (local.get $o) (local.get $x))) (local.get $at)) (local.get $v))))
                        (if (i32.ge_s (local.get $n) (i32.const 3))
                          (then (v128.store32_lane offset=8 2 (i32.add (i32.add (local.get $dx) (i32.sub (local.get $o) (local.get $x))) (local.get $at)) (local.get $v))))))
                    (local.set $at (i32.add (local.get $at) (local.get $pix)))
                    (local.set $fw (i32.add (local.get $fw) (i32.const 1)))
                    (br_if $put_w (i32.lt_s (local.get $fw) (local.get $fwe))))
                  (local.set $fh (i32.add (local.get $fh) (i32.const 1)))
                  (br_if $put_h (i32.lt_s (local.get $fh) (local.get $fhe))))`
              )}))
          (local.set $dp (i32.add (local.get $dp) (local.get $pix)))`
        )}`
      )
    )})`

const splat = (x) => `(f32x4.splat (f32.const ${x}))`
/**
 * Statements setting local $<dst> to e^x for the f32x4 expression `x`, Cephes' expf: x clamped to
 * [−87.33654, 88] (so 2^n stays a normal float32), n = round(x·log2 e), r = x − n·ln 2 in two
 * parts, a degree-6 polynomial in r, then scaled by 2^n through the exponent bits; within about 2
 * ulp of e^x. Uses locals $ex $en $er $ep.
 */
const expInto = (dst, x) => `
    (local.set $ex (f32x4.min (f32x4.max ${x} ${splat(-87.33654)}) ${splat(88)}))
    (local.set $en (f32x4.nearest (f32x4.mul (local.get $ex) ${splat(1.44269504088896341)})))
    (local.set $er (f32x4.sub (f32x4.sub (local.get $ex) (f32x4.mul (local.get $en) ${splat(0.693359375)})) (f32x4.mul (local.get $en) ${splat(-2.12194440e-4)})))
    (local.set $ep ${splat(1.9875691500e-4)})
    ${[1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1]
      .map((c) => `(local.set $ep (f32x4.add (f32x4.mul (local.get $ep) (local.get $er)) ${splat(c)}))`)
      .join("\n    ")}
    (local.set $ep (f32x4.add (f32x4.add (f32x4.mul (f32x4.mul (local.get $ep) (local.get $er)) (local.get $er)) (local.get $er)) ${splat(1)}))
    (local.set $${dst} (f32x4.mul (local.get $ep)
      (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $en)) (i32x4.splat (i32.const 127))) (i32.const 23))))`
/**
 * Statements setting $<dst> to tanh of local $<x>, Cephes' tanhf: for |x| < 0.625 an odd
 * polynomial, else 1 − 2/(e^{2|x|} + 1) with x's sign; within about 2 ulp. Uses locals $ta $tb
 * $tz and expInto's.
 */
const tanhInto = (dst, x) => `
    (local.set $ta (f32x4.abs (local.get $${x})))
    ${expInto("tb", `(f32x4.add (local.get $ta) (local.get $ta))`)}
    (local.set $tb (v128.or (f32x4.sub ${splat(1)} (f32x4.div ${splat(2)} (f32x4.add (local.get $tb) ${splat(1)})))
      (v128.and (local.get $${x}) (v128.const i32x4 0x80000000 0x80000000 0x80000000 0x80000000))))
    (local.set $tz (f32x4.mul (local.get $${x}) (local.get $${x})))
    (local.set $ep ${splat(-5.70498872745e-3)})
    ${[2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1]
      .map((c) => `(local.set $ep (f32x4.add (f32x4.mul (local.get $ep) (local.get $tz)) ${splat(c)}))`)
      .join("\n    ")}
    (local.set $ep (f32x4.add (f32x4.mul (f32x4.mul (local.get $ep) (local.get $tz)) (local.get $${x})) (local.get $${x})))
    (local.set $${dst} (v128.bitselect (local.get $ep) (local.get $tb) (f32x4.lt (local.get $ta) ${splat(0.625)})))`
/**
 * hardSigmoid's 0.2·x + 0.5 with tfjs's two roundings: the product goes through local $lin, so the
 * build with fused multiply-adds (FUSED below) leaves it apart from the add (fused, x = -2.5 gives
 * -7.5e-9 instead of 0, and the clip's gradient, bounds included, 0 instead of 0.2).
 */
const hardLinear = (x) => `(f32x4.add (local.tee $lin (f32x4.mul (local.get $${x}) ${splat(0.2)})) ${splat(0.5)})`
/** Statements setting $<dst> to the recurrent activation of local $<x>: hardSigmoid (clip(0.2·x + 0.5, 0, 1), tfjs's rounding) where $hard, else the logistic sigmoid. */
const gateInto = (dst, x) => `
    (if (local.get $hard)
      (then (local.set $${dst} (f32x4.min (f32x4.max ${hardLinear(x)} ${splat(0)}) ${splat(1)})))
      (else
        ${expInto(dst, `(f32x4.neg (local.get $${x}))`)}
        (local.set $${dst} (f32x4.div ${splat(1)} (f32x4.add (local.get $${dst}) ${splat(1)})))))`
/** dσ/dx from x and σ(x): 0.2 where 0.2·x + 0.5 is inside [0, 1] (bounds included), else 0 (hardSigmoid); σ·(1 − σ). */
const slope = (x, s) => `
    (if (result v128) (local.get $hard)
      (then (v128.and ${splat(0.2)} (v128.and
        (f32x4.ge (local.tee $lin ${hardLinear(x)}) ${splat(0)})
        (f32x4.le (local.get $lin) ${splat(1)}))))
      (else (f32x4.mul (local.get $${s}) (f32x4.sub ${splat(1)} (local.get $${s})))))`
const lstmLocals = `(local $b i32) (local $j i32) (local $zp i32) (local $sp i32) (local $hq i32)
    ${["ex", "en", "er", "ep", "ta", "tb", "tz", "lin", "zi", "zf", "zg", "zo", "gi", "gf", "gg", "go", "cp", "cn", "tc", "dct", "dh"].map(v).join(" ")}`
/** The gate blocks of row b, 4 units from j: $zi $zf $zg $zo; $zp and $sp the byte offsets of z's and the state's units. */
const loadGates = `
        (local.set $zp (i32.add (local.get $z) (i32.shl (i32.add (i32.mul (local.get $b) (i32.shl (local.get $H) (i32.const 2))) (local.get $j)) (i32.const 2))))
        (local.set $sp (i32.shl (i32.add (i32.mul (local.get $b) (local.get $H)) (local.get $j)) (i32.const 2)))
        (local.set $zi (v128.load (local.get $zp)))
        (local.set $zf (v128.load (i32.add (local.get $zp) (local.get $hq))))
        (local.set $zg (v128.load (i32.add (local.get $zp) (i32.shl (local.get $hq) (i32.const 1)))))
        (local.set $zo (v128.load (i32.add (local.get $zp) (i32.mul (local.get $hq) (i32.const 3)))))
        ${gateInto("gi", "zi")}
        ${gateInto("gf", "zf")}
        ${tanhInto("gg", "zg")}
        ${gateInto("go", "zo")}
        (local.set $cp (v128.load (i32.add (local.get $c) (local.get $sp))))
        (local.set $cn (f32x4.add (f32x4.mul (local.get $gf) (local.get $cp)) (f32x4.mul (local.get $gi) (local.get $gg))))
        ${tanhInto("tc", "cn")}`
/** For each row b and each 4 units from j (a do-while: H ≥ 4): loadGates, then `body`. */
const perUnits = (body) =>
  loop(
    "b",
    get("B"),
    `(local.set $j (i32.const 0))
      (loop $units
        ${loadGates}
        ${body}
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br_if $units (i32.lt_s (local.get $j) (local.get $H))))`
  )
/**
 * An LSTM time step's gates (lstm-cell.ts has the formulas; these are its loops, 4 units at a
 * time): z [B, 4H] (input, forget, cell, output blocks), c [B, H]; H a multiple of 4; $hard 1 for
 * hardSigmoid, 0 for sigmoid. lstmCellForward(z, c, h, cNext, B, H, hard).
 */
const lstmCellForward = `
  (func (export "lstmCellForward") (param $z i32) (param $c i32) (param $h i32) (param $cNext i32)
      (param $B i32) (param $H i32) (param $hard i32)
    ${lstmLocals}
    (local.set $hq (i32.shl (local.get $H) (i32.const 2)))
    ${perUnits(`
        (v128.store (i32.add (local.get $cNext) (local.get $sp)) (local.get $cn))
        (v128.store (i32.add (local.get $h) (local.get $sp)) (f32x4.mul (local.get $go) (local.get $tc)))`)})`
/** lstmCellBackward(dh, dcNext, z, c, dz, dc, B, H, hard): dz [B, 4H] and dc [B, H] from dh and dc'. */
const lstmCellBackward = `
  (func (export "lstmCellBackward") (param $dhs i32) (param $dcNext i32) (param $z i32) (param $c i32)
      (param $dz i32) (param $dc i32) (param $B i32) (param $H i32) (param $hard i32)
    ${lstmLocals} (local $dzp i32)
    (local.set $hq (i32.shl (local.get $H) (i32.const 2)))
    ${perUnits(`
        (local.set $dh (v128.load (i32.add (local.get $dhs) (local.get $sp))))
        (local.set $dct (f32x4.add (v128.load (i32.add (local.get $dcNext) (local.get $sp)))
          (f32x4.mul (f32x4.mul (local.get $dh) (local.get $go)) (f32x4.sub ${splat(1)} (f32x4.mul (local.get $tc) (local.get $tc))))))
        (local.set $dzp (i32.add (local.get $dz) (i32.sub (local.get $zp) (local.get $z))))
        (v128.store (local.get $dzp) (f32x4.mul (f32x4.mul (local.get $dct) (local.get $gg)) ${slope("zi", "gi")}))
        (v128.store (i32.add (local.get $dzp) (local.get $hq)) (f32x4.mul (f32x4.mul (local.get $dct) (local.get $cp)) ${slope("zf", "gf")}))
        (v128.store (i32.add (local.get $dzp) (i32.shl (local.get $hq) (i32.const 1)))
          (f32x4.mul (f32x4.mul (local.get $dct) (local.get $gi)) (f32x4.sub ${splat(1)} (f32x4.mul (local.get $gg) (local.get $gg)))))
        (v128.store (i32.add (local.get $dzp) (i32.mul (local.get $hq) (i32.const 3))) (f32x4.mul (f32x4.mul (local.get $dh) (local.get $tc)) ${slope("zo", "go")}))
        (v128.store (i32.add (local.get $dc) (local.get $sp)) (f32x4.mul (local.get $dct) (local.get $gf)))`)})`

/**
 * The GRU kernels' loop (gru-cell.ts has the formulas): for each row b and each 4 units from j (a
 * do-while: H ≥ 4, a multiple of 4), `body` with $mp at mx's update block ([B, 3H]: update, reset,
 * candidate), $ip at inner's update block ([B, 2H]), $sp the byte offset of the state's units
 * ([B, H]) and $hq H's bytes.
 */
const gruUnits = (body) => `
    (local.set $hq (i32.shl (local.get $H) (i32.const 2)))
    ${loop(
      "b",
      get("B"),
      `(local.set $j (i32.const 0))
      (loop $units
        (local.set $sp (i32.shl (i32.add (i32.mul (local.get $b) (local.get $H)) (local.get $j)) (i32.const 2)))
        (local.set $mp (i32.add (local.get $mx) (i32.add (i32.mul (local.get $sp) (i32.const 3)) (i32.mul (i32.sub (i32.const 0) (local.get $j)) (i32.const 8)))))
        (local.set $ip (i32.add (local.get $inner) (i32.add (i32.shl (local.get $sp) (i32.const 1)) (i32.mul (i32.sub (i32.const 0) (local.get $j)) (i32.const 4)))))
        ${body}
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br_if $units (i32.lt_s (local.get $j) (local.get $H))))`
    )}`
const gruLocals = `(local $b i32) (local $j i32) (local $sp i32) (local $mp i32) (local $ip i32) (local $hq i32)
    ${["ex", "en", "er", "ep", "ta", "tb", "tz", "lin", "pz", "pr", "ph", "gz", "gr", "hh", "hv", "d", "t"].map(v).join(" ")}`
/** The reset gate's input and value: $pr = mx_r + inner_r, $gr = σ($pr). */
const gruResetGate = `
        (local.set $pr (f32x4.add (v128.load (i32.add (local.get $mp) (local.get $hq))) (v128.load (i32.add (local.get $ip) (local.get $hq)))))
        ${gateInto("gr", "pr")}`
/** The update gate and the candidate: $pz, $gz = σ($pz), $ph = mx_h + rec, $hh = tanh($ph), $hv = h. */
const gruUpdateGate = `
        (local.set $pz (f32x4.add (v128.load (local.get $mp)) (v128.load (local.get $ip))))
        ${gateInto("gz", "pz")}
        (local.set $ph (f32x4.add (v128.load (i32.add (local.get $mp) (i32.shl (local.get $hq) (i32.const 1)))) (v128.load (i32.add (local.get $rec) (local.get $sp)))))
        ${tanhInto("hh", "ph")}
        (local.set $hv (v128.load (i32.add (local.get $h) (local.get $sp))))`
/**
 * A GRU time step's gates (gru-cell.ts has the formulas; these are its loops, 4 units at a time),
 * hard 1 for hardSigmoid, 0 for the sigmoid; H a multiple of 4, B and H ≥ 1. The backward passes
 * write 0 in the blocks of dmx and dinner their gate does not reach.
 * gruReset(mx, inner, h, rh, B, H, hard): r·h.
 */
const gruReset = `
  (func (export "gruReset") (param $mx i32) (param $inner i32) (param $h i32) (param $rh i32) (param $B i32) (param $H i32) (param $hard i32)
    ${gruLocals}
    ${gruUnits(`${gruResetGate}
        (v128.store (i32.add (local.get $rh) (local.get $sp)) (f32x4.mul (local.get $gr) (v128.load (i32.add (local.get $h) (local.get $sp)))))`)})`
/** gruResetGrad(drh, mx, inner, h, dmx, dinner, dh, B, H, hard): the reset blocks of dmx and dinner, and dh. */
const gruResetGrad = `
  (func (export "gruResetGrad") (param $drh i32) (param $mx i32) (param $inner i32) (param $h i32) (param $dmx i32) (param $dinner i32) (param $dh i32)
      (param $B i32) (param $H i32) (param $hard i32)
    ${gruLocals}
    ${gruUnits(`${gruResetGate}
        (local.set $d (v128.load (i32.add (local.get $drh) (local.get $sp))))
        (local.set $t (f32x4.mul (f32x4.mul (local.get $d) (v128.load (i32.add (local.get $h) (local.get $sp)))) ${slope("pr", "gr")}))
        (v128.store (i32.add (local.get $dmx) (i32.sub (local.get $mp) (local.get $mx))) ${ZERO})
        (v128.store (i32.add (i32.add (local.get $dmx) (i32.sub (local.get $mp) (local.get $mx))) (local.get $hq)) (local.get $t))
        (v128.store (i32.add (i32.add (local.get $dmx) (i32.sub (local.get $mp) (local.get $mx))) (i32.shl (local.get $hq) (i32.const 1))) ${ZERO})
        (v128.store (i32.add (local.get $dinner) (i32.sub (local.get $ip) (local.get $inner))) ${ZERO})
        (v128.store (i32.add (i32.add (local.get $dinner) (i32.sub (local.get $ip) (local.get $inner))) (local.get $hq)) (local.get $t))
        (v128.store (i32.add (local.get $dh) (local.get $sp)) (f32x4.mul (local.get $d) (local.get $gr)))`)})`
/** gruUpdate(mx, inner, h, rec, hNext, B, H, hard): h' = z·h + (1 − z)·hh. */
const gruUpdate = `
  (func (export "gruUpdate") (param $mx i32) (param $inner i32) (param $h i32) (param $rec i32) (param $hn i32) (param $B i32) (param $H i32) (param $hard i32)
    ${gruLocals}
    ${gruUnits(`${gruUpdateGate}
        (v128.store (i32.add (local.get $hn) (local.get $sp))
          (f32x4.add (f32x4.mul (local.get $gz) (local.get $hv)) (f32x4.mul (f32x4.sub ${splat(1)} (local.get $gz)) (local.get $hh))))`)})`
/** gruUpdateGrad(dhn, mx, inner, h, rec, dmx, dinner, dh, drec, B, H, hard): the update and candidate blocks of dmx, the update block of dinner, dh and drec. */
const gruUpdateGrad = `
  (func (export "gruUpdateGrad") (param $dhn i32) (param $mx i32) (param $inner i32) (param $h i32) (param $rec i32)
      (param $dmx i32) (param $dinner i32) (param $dh i32) (param $drec i32) (param $B i32) (param $H i32) (param $hard i32)
    ${gruLocals}
    ${gruUnits(`${gruUpdateGate}
        (local.set $d (v128.load (i32.add (local.get $dhn) (local.get $sp))))
        (local.set $t (f32x4.mul (f32x4.mul (local.get $d) (f32x4.sub (local.get $hv) (local.get $hh))) ${slope("pz", "gz")}))
        (v128.store (i32.add (local.get $dmx) (i32.sub (local.get $mp) (local.get $mx))) (local.get $t))
        (v128.store (i32.add (local.get $dinner) (i32.sub (local.get $ip) (local.get $inner))) (local.get $t))
        (v128.store (i32.add (i32.add (local.get $dmx) (i32.sub (local.get $mp) (local.get $mx))) (local.get $hq)) ${ZERO})
        (v128.store (i32.add (i32.add (local.get $dinner) (i32.sub (local.get $ip) (local.get $inner))) (local.get $hq)) ${ZERO})
        (local.set $t (f32x4.mul (f32x4.mul (local.get $d) (f32x4.sub ${splat(1)} (local.get $gz))) (f32x4.sub ${splat(1)} (f32x4.mul (local.get $hh) (local.get $hh)))))
        (v128.store (i32.add (i32.add (local.get $dmx) (i32.sub (local.get $mp) (local.get $mx))) (i32.shl (local.get $hq) (i32.const 1))) (local.get $t))
        (v128.store (i32.add (local.get $drec) (local.get $sp)) (local.get $t))
        (v128.store (i32.add (local.get $dh) (local.get $sp)) (f32x4.mul (local.get $d) (local.get $gz)))`)})`

/** matmulTB's last columns of a row ($row, from $j, output at $cp), one dot product at a time. */
const tbOne = `
        (block $one_done
          (br_if $one_done (i32.ge_s (local.get $j) (local.get $n)))
          (loop $one
            (local.set $c0 ${ZERO})
            (local.set $bp (i32.add (local.get $bt) (i32.mul (local.get $j) (local.get $kb))))
            ${loop(
              "kk",
              get("k4"),
              `(local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (v128.load (i32.add (local.get $row) (i32.shl (local.get $kk) (i32.const 4)))) (v128.load (local.get $bp)))))
              (local.set $bp (i32.add (local.get $bp) (i32.const 16)))`
            )}
            (f32.store (local.get $cp) ${hsum(get("c0"))})
            (local.set $cp (i32.add (local.get $cp) (i32.const 4)))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br_if $one (i32.lt_s (local.get $j) (local.get $n)))))`

/**
 * matmulTB(a, b, c, batches, m, k, n, sa, sb): for each batch t, C_t = A_t · B_tᵀ with A_t [m, k]
 * at a + t·sa and B_t [n, k] at b + t·sb (byte strides; 0 repeats one matrix), both row-major,
 * C_t [m, n] at c + t·m·n·4; k a multiple of 4. Each output is a dot product of two contiguous
 * rows: four partial sums (lanes) over k, added ((l0 + l1) + (l2 + l3)) at the end. Rows of A go
 * two at a time against four rows of B (eight sums; each load of B feeds both rows), then each
 * row's last n mod 4 columns one at a time; an odd last row against four rows of B at a time (A's
 * loads shared), then one. The blocking leaves every output's sums as they were (the same bits).
 */
const matmulTB = `
  (func (export "matmulTB") (param $a i32) (param $b i32) (param $c i32) (param $batches i32)
      (param $m i32) (param $k i32) (param $n i32) (param $sa i32) (param $sb i32)
    (local $t i32) (local $i i32) (local $kk i32) (local $j i32) (local $row i32) (local $bt i32)
    (local $bp i32) (local $cp i32) (local $kb i32) (local $k4 i32) (local $nb i32) (local $j0 i32)
    (local $av v128) (local $av2 v128) (local $bv v128) ${["c0", "c1", "c2", "c3", "e0", "e1", "e2", "e3"].map(f4).join(" ")}
    (local.set $kb (i32.mul (local.get $k) (i32.const 4)))
    (local.set $k4 (i32.shr_s (local.get $k) (i32.const 2)))
    (local.set $nb (i32.mul (local.get $n) (i32.const 4)))
    (local.set $cp (local.get $c))
    ${loop(
      "t",
      get("batches"),
      `(local.set $bt ${add(get("b"), mul(get("t"), get("sb")))})
      (local.set $i (i32.const 0))
      ;; rows of A two at a time, against four rows of B: each load of B feeds both rows' sums
      (block $pairs_done
        (br_if $pairs_done (i32.gt_s (i32.add (local.get $i) (i32.const 2)) (local.get $m)))
        (loop $pairs
          (local.set $row ${add(get("a"), mul(get("t"), get("sa")), mul(get("i"), get("kb")))})
          (local.set $j (i32.const 0))
          (block $pfour_done
            (br_if $pfour_done (i32.gt_s (i32.add (local.get $j) (i32.const 4)) (local.get $n)))
            (loop $pfour
              ${["c0", "c1", "c2", "c3", "e0", "e1", "e2", "e3"].map((x) => `(local.set $${x} ${ZERO})`).join(" ")}
              (local.set $bp (i32.add (local.get $bt) (i32.mul (local.get $j) (local.get $kb))))
              ${loop(
                "kk",
                get("k4"),
                `(local.set $av (v128.load (i32.add (local.get $row) (i32.shl (local.get $kk) (i32.const 4)))))
                (local.set $av2 (v128.load (i32.add (i32.add (local.get $row) (local.get $kb)) (i32.shl (local.get $kk) (i32.const 4)))))
                ${[0, 1, 2, 3]
                  .map(
                    (q) => `(local.set $bv (v128.load ${q === 0 ? "(local.get $bp)" : `(i32.add (local.get $bp) (i32.mul (local.get $kb) (i32.const ${q})))`}))
                (local.set $c${q} (f32x4.add (local.get $c${q}) (f32x4.mul (local.get $av) (local.get $bv))))
                (local.set $e${q} (f32x4.add (local.get $e${q}) (f32x4.mul (local.get $av2) (local.get $bv))))`
                  )
                  .join("\n                ")}
                (local.set $bp (i32.add (local.get $bp) (i32.const 16)))`
              )}
              ${[0, 1, 2, 3].map((q) => `(f32.store offset=${4 * q} (local.get $cp) ${hsum(`(local.get $c${q})`)})`).join("\n              ")}
              ${[0, 1, 2, 3].map((q) => `(f32.store offset=${4 * q} (i32.add (local.get $cp) (local.get $nb)) ${hsum(`(local.get $e${q})`)})`).join("\n              ")}
              (local.set $cp (i32.add (local.get $cp) (i32.const 16)))
              (local.set $j (i32.add (local.get $j) (i32.const 4)))
              (br_if $pfour (i32.le_s (i32.add (local.get $j) (i32.const 4)) (local.get $n)))))
          ;; the last n mod 4 columns of each of the two rows
          (local.set $j0 (local.get $j))
          ${tbOne}
          (local.set $row (i32.add (local.get $row) (local.get $kb)))
          (local.set $cp (i32.add (local.get $cp) (i32.shl (local.get $j0) (i32.const 2))))
          (local.set $j (local.get $j0))
          ${tbOne}
          (local.set $i (i32.add (local.get $i) (i32.const 2)))
          (br_if $pairs (i32.le_s (i32.add (local.get $i) (i32.const 2)) (local.get $m)))))
      ;; an odd last row
      (if (i32.lt_s (local.get $i) (local.get $m))
        (then
          (local.set $row ${add(get("a"), mul(get("t"), get("sa")), mul(get("i"), get("kb")))})
                  (local.set $j (i32.const 0))
        (block $four_done
          (br_if $four_done (i32.gt_s (i32.add (local.get $j) (i32.const 4)) (local.get $n)))
          (loop $four
            (local.set $c0 ${ZERO}) (local.set $c1 ${ZERO}) (local.set $c2 ${ZERO}) (local.set $c3 ${ZERO})
            (local.set $bp (i32.add (local.get $bt) (i32.mul (local.get $j) (local.get $kb))))
            ${loop(
              "kk",
              get("k4"),
              `(local.set $av (v128.load (i32.add (local.get $row) (i32.shl (local.get $kk) (i32.const 4)))))
              (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (local.get $av) (v128.load (local.get $bp)))))
              (local.set $c1 (f32x4.add (local.get $c1) (f32x4.mul (local.get $av) (v128.load (i32.add (local.get $bp) (local.get $kb))))))
              (local.set $c2 (f32x4.add (local.get $c2) (f32x4.mul (local.get $av) (v128.load (i32.add (local.get $bp) (i32.shl (local.get $kb) (i32.const 1)))))))
              (local.set $c3 (f32x4.add (local.get $c3) (f32x4.mul (local.get $av) (v128.load (i32.add (local.get $bp) (i32.mul (local.get $kb) (i32.const 3)))))))
              (local.set $bp (i32.add (local.get $bp) (i32.const 16)))`
            )}
            (f32.store (local.get $cp) ${hsum(get("c0"))})
            (f32.store offset=4 (local.get $cp) ${hsum(get("c1"))})
            (f32.store offset=8 (local.get $cp) ${hsum(get("c2"))})
            (f32.store offset=12 (local.get $cp) ${hsum(get("c3"))})
            (local.set $cp (i32.add (local.get $cp) (i32.const 16)))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br_if $four (i32.le_s (i32.add (local.get $j) (i32.const 4)) (local.get $n)))))

          ${tbOne}))`
    )})`

/**
 * Statements running `vec(p)` for each 4-float group of a row of C floats at byte offset 0 (p the
 * group's byte offset, a local $p), then `one(p)` for the last C mod 4; uses locals $col $cv.
 */
const overRow = (vec, one) => `
      (local.set $col (i32.const 0))
      (local.set $cv (i32.and (local.get $C) (i32.const -4)))
      (block $vec_done
        (br_if $vec_done (i32.ge_s (local.get $col) (local.get $cv)))
        (loop $vec
          (local.set $p (i32.shl (local.get $col) (i32.const 2)))
          ${vec}
          (local.set $col (i32.add (local.get $col) (i32.const 4)))
          (br_if $vec (i32.lt_s (local.get $col) (local.get $cv)))))
      (block $one_done
        (br_if $one_done (i32.ge_s (local.get $col) (local.get $C)))
        (loop $one
          (local.set $p (i32.shl (local.get $col) (i32.const 2)))
          ${one}
          (local.set $col (i32.add (local.get $col) (i32.const 1)))
          (br_if $one (i32.lt_s (local.get $col) (local.get $C)))))`
/**
 * reduceMaxMin(x, out, B, R, C, isMin): out[b, c] = max (min where isMin) over r of x[b, r, c], x
 * read as [B, R, C] (R ≥ 1): row 0 copied, then each further row folded in, 4 columns at a time.
 * f32x4.max / f32.max: a NaN anywhere in a column makes its result NaN.
 */
const reduceMaxMin = `
  (func (export "reduceMaxMin") (param $x i32) (param $out i32) (param $B i32) (param $R i32) (param $C i32) (param $isMin i32)
    (local $b i32) (local $r i32) (local $row i32) (local $o i32) (local $p i32) (local $col i32) (local $cv i32)
    ${loop(
      "b",
      get("B"),
      `(local.set $row (i32.add (local.get $x) (i32.mul (i32.mul (local.get $b) (i32.mul (local.get $R) (local.get $C))) (i32.const 4))))
      (local.set $o (i32.add (local.get $out) (i32.mul (i32.mul (local.get $b) (local.get $C)) (i32.const 4))))
      ${overRow(
        `(v128.store (i32.add (local.get $o) (local.get $p)) (v128.load (i32.add (local.get $row) (local.get $p))))`,
        `(f32.store (i32.add (local.get $o) (local.get $p)) (f32.load (i32.add (local.get $row) (local.get $p))))`
      )}
      (local.set $r (i32.const 1))
      (block $rows_done
        (br_if $rows_done (i32.ge_s (local.get $r) (local.get $R)))
        (loop $rows
          (local.set $row (i32.add (local.get $row) (i32.shl (local.get $C) (i32.const 2))))
          (if (local.get $isMin)
            (then ${overRow(
              `(v128.store (i32.add (local.get $o) (local.get $p)) (f32x4.min (v128.load (i32.add (local.get $o) (local.get $p))) (v128.load (i32.add (local.get $row) (local.get $p)))))`,
              `(f32.store (i32.add (local.get $o) (local.get $p)) (f32.min (f32.load (i32.add (local.get $o) (local.get $p))) (f32.load (i32.add (local.get $row) (local.get $p)))))`
            )})
            (else ${overRow(
              `(v128.store (i32.add (local.get $o) (local.get $p)) (f32x4.max (v128.load (i32.add (local.get $o) (local.get $p))) (v128.load (i32.add (local.get $row) (local.get $p)))))`,
              `(f32.store (i32.add (local.get $o) (local.get $p)) (f32.max (f32.load (i32.add (local.get $o) (local.get $p))) (f32.load (i32.add (local.get $row) (local.get $p)))))`
            )}))
          (local.set $r (i32.add (local.get $r) (i32.const 1)))
          (br_if $rows (i32.lt_s (local.get $r) (local.get $R)))))`
    )})`
/**
 * maxMinGrad(dy, x, y, dx, B, R, C): the gradient of a max or min over the middle axis of x
 * [B, R, C] as tfjs computes it, dx[b, r, c] = dy[b, c] · (x[b, r, c] == y[b, c] ? 1 : 0) (every
 * tie gets dy; a product, so a NaN or infinite dy stays NaN where the mask is 0, as in tfjs).
 */
const maxMinGrad = `
  (func (export "maxMinGrad") (param $dy i32) (param $x i32) (param $y i32) (param $dx i32) (param $B i32) (param $R i32) (param $C i32)
    (local $b i32) (local $r i32) (local $row i32) (local $o i32) (local $d i32) (local $yy i32) (local $p i32) (local $col i32) (local $cv i32)
    ${loop(
      "b",
      get("B"),
      `(local.set $d (i32.add (local.get $dy) (i32.mul (i32.mul (local.get $b) (local.get $C)) (i32.const 4))))
      (local.set $yy (i32.add (local.get $y) (i32.mul (i32.mul (local.get $b) (local.get $C)) (i32.const 4))))
      ${loop(
        "r",
        get("R"),
        `(local.set $row (i32.add (local.get $x) (i32.mul (i32.mul (i32.add (i32.mul (local.get $b) (local.get $R)) (local.get $r)) (local.get $C)) (i32.const 4))))
        (local.set $o (i32.add (local.get $dx) (i32.sub (local.get $row) (local.get $x))))
        ${overRow(
          `(v128.store (i32.add (local.get $o) (local.get $p)) (f32x4.mul (v128.load (i32.add (local.get $d) (local.get $p)))
            (v128.and (f32x4.eq (v128.load (i32.add (local.get $row) (local.get $p))) (v128.load (i32.add (local.get $yy) (local.get $p)))) ${splat(1)})))`,
          `(f32.store (i32.add (local.get $o) (local.get $p)) (f32.mul (f32.load (i32.add (local.get $d) (local.get $p)))
            (select (f32.const 1) (f32.const 0) (f32.eq (f32.load (i32.add (local.get $row) (local.get $p))) (f32.load (i32.add (local.get $yy) (local.get $p)))))))`
        )}`
      )}`
    )})`

/** The i8x16.shuffle bytes that take 32-bit lanes `lanes` (0-3 of the first operand, 4-7 of the second). */
const lanes32 = (...lanes) => lanes.flatMap((l) => [0, 1, 2, 3].map((k) => 4 * l + k)).join(" ")
/**
 * blockTranspose's walk: per batch, the (r, c) plane in 64 x 64 tiles, within a tile c and then r
 * in steps of `step`; `body` with $s at run (r, c) of src and $d at run (c, r) of dst.
 */
const transposeTiles = (step, body) =>
  loop(
    "b",
    get("batch"),
    `(local.set $r0 (i32.const 0))
      (block $r0_done
        (br_if $r0_done (i32.ge_s (local.get $r0) (local.get $rows)))
        (loop $r0_next
          (local.set $r1 (select (i32.add (local.get $r0) (i32.const 64)) (local.get $rows) (i32.lt_s (i32.add (local.get $r0) (i32.const 64)) (local.get $rows))))
          (local.set $c0 (i32.const 0))
          (block $c0_done
            (br_if $c0_done (i32.ge_s (local.get $c0) (local.get $cols)))
            (loop $c0_next
              (local.set $c1 (select (i32.add (local.get $c0) (i32.const 64)) (local.get $cols) (i32.lt_s (i32.add (local.get $c0) (i32.const 64)) (local.get $cols))))
              (local.set $c (local.get $c0))
              (loop $c_next
                (local.set $r (local.get $r0))
                (loop $r_next
                  (local.set $s (i32.add (i32.add (local.get $src) (i32.mul (local.get $b) (local.get $plane)))
                    (i32.mul (i32.add (i32.mul (local.get $r) (local.get $cols)) (local.get $c)) (local.get $runb))))
                  (local.set $d (i32.add (i32.add (local.get $dst) (i32.mul (local.get $b) (local.get $plane)))
                    (i32.mul (i32.add (i32.mul (local.get $c) (local.get $rows)) (local.get $r)) (local.get $runb))))
                  ${body}
                  (local.set $r (i32.add (local.get $r) (i32.const ${step})))
                  (br_if $r_next (i32.lt_s (local.get $r) (local.get $r1))))
                (local.set $c (i32.add (local.get $c) (i32.const ${step})))
                (br_if $c_next (i32.lt_s (local.get $c) (local.get $c1))))
              (local.set $c0 (local.get $c1))
              (br_if $c0_next (i32.lt_s (local.get $c0) (local.get $cols)))))
          (local.set $r0 (local.get $r1))
          (br_if $r0_next (i32.lt_s (local.get $r0) (local.get $rows)))))`
  )
/**
 * blockTranspose(src, dst, batch, rows, cols, inner): dst[b][c][r] = src[b][r][c] for runs of
 * `inner` 4-byte elements (float32 or int32), in 64 x 64 tiles of (r, c) so that reads and writes
 * stay within a few cache lines; a run goes 4 elements at a time (v128) while it can, then one at a
 * time. Single elements (inner 1) with rows and columns multiples of 4 go as 4 x 4 blocks, four
 * loads, eight shuffles and four stores each (a 3x3 filter's taps, 64 x 64 channels: 61 -> 5.6 µs).
 */
const blockTranspose = `
  (func (export "blockTranspose") (param $src i32) (param $dst i32) (param $batch i32) (param $rows i32) (param $cols i32) (param $inner i32)
    (local $b i32) (local $r0 i32) (local $c0 i32) (local $r1 i32) (local $c1 i32) (local $r i32) (local $c i32)
    (local $plane i32) (local $s i32) (local $d i32) (local $e i32) (local $runb i32) (local $vend i32)
    (local $srow i32) (local $drow i32) (local $q0 v128) (local $q1 v128) (local $q2 v128) (local $q3 v128)
    (local.set $plane (i32.mul (i32.mul (local.get $rows) (local.get $cols)) (i32.shl (local.get $inner) (i32.const 2))))
    (local.set $runb (i32.shl (local.get $inner) (i32.const 2)))
    (local.set $vend (i32.and (local.get $runb) (i32.const -16)))
    (if (i32.and (i32.eq (local.get $inner) (i32.const 1)) (i32.eqz (i32.and (i32.or (local.get $rows) (local.get $cols)) (i32.const 3))))
      (then
        (local.set $srow (i32.shl (local.get $cols) (i32.const 2)))
        (local.set $drow (i32.shl (local.get $rows) (i32.const 2)))
        ${transposeTiles(
          4,
          `;; rows r..r+3 = a, b, c, d: q0 = a0 a1 b0 b1, q1 = a2 a3 b2 b3, q2 = c0 c1 d0 d1, q3 = c2 c3 d2 d3
                  (local.set $e (i32.add (local.get $s) (local.get $srow)))
                  (local.set $q0 (v128.load (local.get $s)))
                  (local.set $q1 (v128.load (local.get $e)))
                  (local.set $q2 (i8x16.shuffle ${lanes32(0, 1, 4, 5)} (local.get $q0) (local.get $q1)))
                  (local.set $q3 (i8x16.shuffle ${lanes32(2, 3, 6, 7)} (local.get $q0) (local.get $q1)))
                  (local.set $e (i32.add (local.get $e) (local.get $srow)))
                  (local.set $q0 (v128.load (local.get $e)))
                  (local.set $q1 (v128.load (i32.add (local.get $e) (local.get $srow))))
                  (local.set $e (i32.add (local.get $d) (local.get $drow)))
                  (v128.store (local.get $d) (i8x16.shuffle ${lanes32(0, 2, 4, 6)} (local.get $q2) (i8x16.shuffle ${lanes32(0, 1, 4, 5)} (local.get $q0) (local.get $q1))))
                  (v128.store (local.get $e) (i8x16.shuffle ${lanes32(1, 3, 5, 7)} (local.get $q2) (i8x16.shuffle ${lanes32(0, 1, 4, 5)} (local.get $q0) (local.get $q1))))
                  (local.set $e (i32.add (local.get $e) (local.get $drow)))
                  (v128.store (local.get $e) (i8x16.shuffle ${lanes32(0, 2, 4, 6)} (local.get $q3) (i8x16.shuffle ${lanes32(2, 3, 6, 7)} (local.get $q0) (local.get $q1))))
                  (v128.store (i32.add (local.get $e) (local.get $drow)) (i8x16.shuffle ${lanes32(1, 3, 5, 7)} (local.get $q3) (i8x16.shuffle ${lanes32(2, 3, 6, 7)} (local.get $q0) (local.get $q1))))`
        )}
        (return)))
    ${transposeTiles(
      1,
      `(local.set $e (i32.const 0))
                  (block $v_done
                    (br_if $v_done (i32.ge_s (local.get $e) (local.get $vend)))
                    (loop $v
                      (v128.store (i32.add (local.get $d) (local.get $e)) (v128.load (i32.add (local.get $s) (local.get $e))))
                      (local.set $e (i32.add (local.get $e) (i32.const 16)))
                      (br_if $v (i32.lt_s (local.get $e) (local.get $vend)))))
                  (block $w_done
                    (br_if $w_done (i32.ge_s (local.get $e) (local.get $runb)))
                    (loop $w
                      (i32.store (i32.add (local.get $d) (local.get $e)) (i32.load (i32.add (local.get $s) (local.get $e))))
                      (local.set $e (i32.add (local.get $e) (i32.const 4)))
                      (br_if $w (i32.lt_s (local.get $e) (local.get $runb)))))`
    )})`

/**
 * adam(p, q, m, v, g, n, b1, c1, b2, c2, d1, d2, eps, negLr): tfjs's Adam update of n weights p
 * into q, the moments m and v in place, every operation a float32 one in tfjs's order (so the bits
 * are those of fused-adam.ts's loop and of optimizer.applyGradients):
 *   m = m·b1 + g·c1   v = v·b2 + (g·g)·c2   q = ((m / d1) / (√(v / d2) + eps))·(−lr) + p
 * four at a time, the last n mod 4 one at a time.
 */
const adamStep = (w) => {
  const op = (name) => (w === 4 ? `f32x4.${name}` : `f32.${name}`)
  const ld1 = (a) => (w === 4 ? `(v128.load ${a})` : `(f32.load ${a})`)
  const st = (a, e) => (w === 4 ? `(v128.store ${a} ${e})` : `(f32.store ${a} ${e})`)
  const k = (n) => (w === 4 ? `(f32x4.splat (local.get $${n}))` : `(local.get $${n})`)
  const at = (base) => `(i32.add (local.get $${base}) (local.get $o))`
  return `
        (local.set $${w === 4 ? "g4" : "g1"} ${ld1(at("g"))})
        (local.set $${w === 4 ? "m4" : "m1"} (${op("add")} (${op("mul")} ${ld1(at("m"))} ${k("b1")}) (${op("mul")} (local.get $${w === 4 ? "g4" : "g1"}) ${k("c1")})))
        (local.set $${w === 4 ? "v4" : "v1"} (${op("add")} (${op("mul")} ${ld1(at("v"))} ${k("b2")}) (${op("mul")} (${op("mul")} (local.get $${w === 4 ? "g4" : "g1"}) (local.get $${w === 4 ? "g4" : "g1"})) ${k("c2")})))
        ${st(at("m"), `(local.get $${w === 4 ? "m4" : "m1"})`)}
        ${st(at("v"), `(local.get $${w === 4 ? "v4" : "v1"})`)}
        ${st(
          at("q"),
          `(${op("add")} (${op("mul")} (${op("div")} (${op("div")} (local.get $${w === 4 ? "m4" : "m1"}) ${k("d1")}) (${op("add")} (${op("sqrt")} (${op("div")} (local.get $${w === 4 ? "v4" : "v1"}) ${k("d2")})) ${k("eps")})) ${k("negLr")}) ${ld1(at("p"))})`
        )}`
}
/**
 * reluGrad(dy, x, out, n): tfjs's ReLU gradient dy · step(x) (step: 1 where x > 0, 0 elsewhere, NaN
 * where x is NaN) in one pass, four at a time, then one at a time: the same bits as tfjs's Step,
 * Cast and Multiply.
 */
const reluGrad = `
  (func (export "reluGrad") (param $dy i32) (param $x i32) (param $out i32) (param $n i32)
    (local $o i32) (local $vend i32) (local $end i32) (local $v v128) (local $s v128) (local $f f32) (local $t f32)
    (local.set $end (i32.shl (local.get $n) (i32.const 2)))
    (local.set $vend (i32.and (local.get $end) (i32.const -16)))
    (local.set $o (i32.const 0))
    (block $v_done
      (br_if $v_done (i32.ge_u (local.get $o) (local.get $vend)))
      (loop $vec
        (local.set $v (v128.load (i32.add (local.get $x) (local.get $o))))
        (local.set $s (v128.bitselect ${splat(1)} ${ZERO} (f32x4.gt (local.get $v) ${ZERO})))
        (local.set $s (v128.bitselect (local.get $v) (local.get $s) (f32x4.ne (local.get $v) (local.get $v))))
        (v128.store (i32.add (local.get $out) (local.get $o)) (f32x4.mul (v128.load (i32.add (local.get $dy) (local.get $o))) (local.get $s)))
        (local.set $o (i32.add (local.get $o) (i32.const 16)))
        (br_if $vec (i32.lt_u (local.get $o) (local.get $vend)))))
    (block $s_done
      (br_if $s_done (i32.ge_u (local.get $o) (local.get $end)))
      (loop $one
        (local.set $f (f32.load (i32.add (local.get $x) (local.get $o))))
        (local.set $t (select (f32.const 1) (f32.const 0) (f32.gt (local.get $f) (f32.const 0))))
        (local.set $t (select (local.get $f) (local.get $t) (f32.ne (local.get $f) (local.get $f))))
        (f32.store (i32.add (local.get $out) (local.get $o)) (f32.mul (f32.load (i32.add (local.get $dy) (local.get $o))) (local.get $t)))
        (local.set $o (i32.add (local.get $o) (i32.const 4)))
        (br_if $one (i32.lt_u (local.get $o) (local.get $end))))))`

/**
 * sumBlock(x, out, B, R, C, scale): out[b, c] = Σ_r x[b, r, c] (times scale unless it is 1), the
 * JavaScript loop of reduce.ts (sumBlock) two channels at a time in float64: eight rows summed
 * pairwise in float64 and added to the running float32 sum (kept in out) per block of eight, the
 * rows left one at a time, then the scale: the same bits.
 */
const sumRows = (n) => {
  const row = (k) => `(f64x2.promote_low_f32x4 (v128.load64_zero (i32.add (local.get $p) (i32.mul (local.get $rowBytes) (i32.const ${k})))))`
  const tree = n === 8 ? dadd(dadd(dadd(row(0), row(1)), dadd(row(2), row(3))), dadd(dadd(row(4), row(5)), dadd(row(6), row(7)))) : row(0)
  const one = (k) => `(f64.promote_f32 (f32.load (i32.add (local.get $p) (i32.mul (local.get $rowBytes) (i32.const ${k})))))`
  const treeOne = n === 8 ? `(f64.add (f64.add (f64.add ${one(0)} ${one(1)}) (f64.add ${one(2)} ${one(3)})) (f64.add (f64.add ${one(4)} ${one(5)}) (f64.add ${one(6)} ${one(7)})))` : one(0)
  return `
        (local.set $c (i32.const 0))
        (block $pairs${n}_done
          (br_if $pairs${n}_done (i32.gt_s (i32.add (local.get $c) (i32.const 2)) (local.get $C)))
          (loop $pairs${n}
            (local.set $p (i32.add (local.get $row) (i32.shl (local.get $c) (i32.const 2))))
            (local.set $q (i32.add (local.get $o) (i32.shl (local.get $c) (i32.const 2))))
            (v128.store64_lane 0 (local.get $q) (f32x4.demote_f64x2_zero ${dadd("(f64x2.promote_low_f32x4 (v128.load64_zero (local.get $q)))", tree)}))
            (local.set $c (i32.add (local.get $c) (i32.const 2)))
            (br_if $pairs${n} (i32.le_s (i32.add (local.get $c) (i32.const 2)) (local.get $C)))))
        (if (i32.lt_s (local.get $c) (local.get $C))
          (then
            (local.set $p (i32.add (local.get $row) (i32.shl (local.get $c) (i32.const 2))))
            (local.set $q (i32.add (local.get $o) (i32.shl (local.get $c) (i32.const 2))))
            (f32.store (local.get $q) (f32.demote_f64 (f64.add (f64.promote_f32 (f32.load (local.get $q))) ${treeOne})))))`
}
const sumBlock = `
  (func (export "sumBlock") (param $x i32) (param $out i32) (param $B i32) (param $R i32) (param $C i32) (param $scale f64)
    (local $b i32) (local $r i32) (local $c i32) (local $p i32) (local $q i32) (local $o i32) (local $row i32) (local $rowBytes i32)
    (local.set $rowBytes (i32.shl (local.get $C) (i32.const 2)))
    ${loop(
      "b",
      get("B"),
      `(local.set $o (i32.add (local.get $out) (i32.mul (local.get $b) (local.get $rowBytes))))
      (memory.fill (local.get $o) (i32.const 0) (local.get $rowBytes))
      (local.set $row (i32.add (local.get $x) (i32.mul (i32.mul (local.get $b) (local.get $R)) (local.get $rowBytes))))
      (local.set $r (i32.const 0))
      (block $blocks_done
        (br_if $blocks_done (i32.gt_s (i32.add (local.get $r) (i32.const 8)) (local.get $R)))
        (loop $blocks
          ${sumRows(8)}
          (local.set $row (i32.add (local.get $row) (i32.shl (local.get $rowBytes) (i32.const 3))))
          (local.set $r (i32.add (local.get $r) (i32.const 8)))
          (br_if $blocks (i32.le_s (i32.add (local.get $r) (i32.const 8)) (local.get $R)))))
      (block $rest_done
        (br_if $rest_done (i32.ge_s (local.get $r) (local.get $R)))
        (loop $rest
          ${sumRows(1)}
          (local.set $row (i32.add (local.get $row) (local.get $rowBytes)))
          (local.set $r (i32.add (local.get $r) (i32.const 1)))
          (br_if $rest (i32.lt_s (local.get $r) (local.get $R)))))
      (if (f64.ne (local.get $scale) (f64.const 1))
        (then
          ${loop("c", get("C"), `(local.set $q (i32.add (local.get $o) (i32.shl (local.get $c) (i32.const 2))))
            (f32.store (local.get $q) (f32.demote_f64 (f64.mul (f64.promote_f32 (f32.load (local.get $q))) (local.get $scale))))`)}))`
    )})`

/**
 * gatherRows(src, dst, ids, count, outer, rowsBytes, rowBytes): for each of `outer` blocks of src
 * (rowsBytes apart), the rows named by the int32 ids (count of them, each already checked to be in
 * range) copied one after another into dst, rowBytes each (16 bytes at a time where rowBytes is a
 * multiple of 16, else by memory.copy).
 */
const gatherRows = `
  (func (export "gatherRows") (param $src i32) (param $dst i32) (param $ids i32) (param $count i32)
      (param $outer i32) (param $rowsBytes i32) (param $rowBytes i32)
    (local $o i32) (local $i i32) (local $base i32) (local $from i32) (local $k i32) (local $vec i32)
    (local.set $vec (i32.and (i32.gt_u (local.get $rowBytes) (i32.const 0)) (i32.eqz (i32.and (local.get $rowBytes) (i32.const 15)))))
    ${loop(
      "o",
      get("outer"),
      `(local.set $base (i32.add (local.get $src) (i32.mul (local.get $o) (local.get $rowsBytes))))
      ${loop(
        "i",
        get("count"),
        `(local.set $from (i32.add (local.get $base) (i32.mul (i32.load (i32.add (local.get $ids) (i32.shl (local.get $i) (i32.const 2)))) (local.get $rowBytes))))
        (if (local.get $vec)
          (then
            ;; rows of whole vectors: 16 bytes at a time
            (local.set $k (i32.const 0))
            (loop $row
              (v128.store (i32.add (local.get $dst) (local.get $k)) (v128.load (i32.add (local.get $from) (local.get $k))))
              (local.set $k (i32.add (local.get $k) (i32.const 16)))
              (br_if $row (i32.lt_u (local.get $k) (local.get $rowBytes)))))
          (else (memory.copy (local.get $dst) (local.get $from) (local.get $rowBytes))))
        (local.set $dst (i32.add (local.get $dst) (local.get $rowBytes)))`
      )}`
    )})`

const adam = `
  (func (export "adam") (param $p i32) (param $q i32) (param $m i32) (param $v i32) (param $g i32) (param $n i32)
      (param $b1 f32) (param $c1 f32) (param $b2 f32) (param $c2 f32) (param $d1 f32) (param $d2 f32) (param $eps f32) (param $negLr f32)
    (local $o i32) (local $end i32) (local $vend i32) (local $g4 v128) (local $m4 v128) (local $v4 v128) (local $g1 f32) (local $m1 f32) (local $v1 f32)
    (local.set $end (i32.shl (local.get $n) (i32.const 2)))
    (local.set $vend (i32.and (local.get $end) (i32.const -16)))
    (block $v_done
      (br_if $v_done (i32.ge_s (local.get $o) (local.get $vend)))
      (loop $vec
        ${adamStep(4)}
        (local.set $o (i32.add (local.get $o) (i32.const 16)))
        (br_if $vec (i32.lt_s (local.get $o) (local.get $vend)))))
    (block $s_done
      (br_if $s_done (i32.ge_s (local.get $o) (local.get $end)))
      (loop $one
        ${adamStep(1)}
        (local.set $o (i32.add (local.get $o) (i32.const 4)))
        (br_if $one (i32.lt_s (local.get $o) (local.get $end)))))
  )`

/**
 * clipGrad(dy, x, out, n, lo, hi): tfjs's clipByValue gradient, dy where lo ≤ x ≤ hi, else 0 (+0;
 * 0 where x is NaN), in one pass, four at a time, then one at a time: the same bits as tfjs's
 * GreaterEqual, LessEqual, LogicalAnd and Select (dy's own bits, or +0).
 */
const clipGrad = `
  (func (export "clipGrad") (param $dy i32) (param $x i32) (param $out i32) (param $n i32) (param $lo f32) (param $hi f32)
    (local $o i32) (local $vend i32) (local $end i32) (local $v v128) (local $l v128) (local $h v128) (local $f f32)
    (local.set $end (i32.shl (local.get $n) (i32.const 2)))
    (local.set $vend (i32.and (local.get $end) (i32.const -16)))
    (local.set $l (f32x4.splat (local.get $lo)))
    (local.set $h (f32x4.splat (local.get $hi)))
    (local.set $o (i32.const 0))
    (block $v_done
      (br_if $v_done (i32.ge_u (local.get $o) (local.get $vend)))
      (loop $vec
        (local.set $v (v128.load (i32.add (local.get $x) (local.get $o))))
        (v128.store (i32.add (local.get $out) (local.get $o))
          (v128.and (v128.load (i32.add (local.get $dy) (local.get $o))) (v128.and (f32x4.ge (local.get $v) (local.get $l)) (f32x4.le (local.get $v) (local.get $h)))))
        (local.set $o (i32.add (local.get $o) (i32.const 16)))
        (br_if $vec (i32.lt_u (local.get $o) (local.get $vend)))))
    (block $s_done
      (br_if $s_done (i32.ge_u (local.get $o) (local.get $end)))
      (loop $one
        (local.set $f (f32.load (i32.add (local.get $x) (local.get $o))))
        (f32.store (i32.add (local.get $out) (local.get $o))
          (select (f32.load (i32.add (local.get $dy) (local.get $o))) (f32.const 0) (i32.and (f32.ge (local.get $f) (local.get $lo)) (f32.le (local.get $f) (local.get $hi)))))
        (local.set $o (i32.add (local.get $o) (i32.const 4)))
        (br_if $one (i32.lt_u (local.get $o) (local.get $end)))))
  )`

/**
 * A depthwise filter gradient's channels `4·vecs` at a time from $j while they fit in C: each block
 * summed over every output pixel (b, oh, ow in order; $cx walks the padded input from the tap's
 * first pixel, $dp dy's pixels), then stored at dW[fh, fw, j ..].
 */
const dwFilterColumns = (vecs) => {
  const qs = [...Array(vecs).keys()]
  const name = `dwf${4 * vecs}`
  return `(block $${name}_done
          (br_if $${name}_done (i32.gt_s (i32.add (local.get $j) (i32.const ${4 * vecs})) (local.get $C)))
          (loop $${name}
            ${qs.map((q) => `(local.set $c${q} ${ZERO})`).join(" ")}
            (local.set $m (i32.const 0)) (local.set $oh (i32.const 0)) (local.set $ow (i32.const 0))
            (local.set $cx (i32.add (local.get $tap) (i32.shl (local.get $j) (i32.const 2))))
            (local.set $dp (i32.add (local.get $dy) (i32.shl (local.get $j) (i32.const 2))))
            (loop $${name}_px
              ${qs.map((q) => `(local.set $c${q} (f32x4.add (local.get $c${q}) (f32x4.mul (v128.load offset=${16 * q} (local.get $cx)) (v128.load offset=${16 * q} (local.get $dp)))))`).join("\n              ")}
              (local.set $dp (i32.add (local.get $dp) (local.get $cstep)))
              ${nextPixel}
              (local.set $m (i32.add (local.get $m) (i32.const 1)))
              (br_if $${name}_px (i32.lt_u (local.get $m) (local.get $M))))
            ${qs.map((q) => `(v128.store offset=${16 * q} (i32.add (local.get $op) (i32.shl (local.get $j) (i32.const 2))) (local.get $c${q}))`).join(" ")}
            (local.set $j (i32.add (local.get $j) (i32.const ${4 * vecs})))
            (br_if $${name} (i32.le_s (i32.add (local.get $j) (i32.const ${4 * vecs})) (local.get $C)))))`
}

/**
 * dwFilterGrad(x, dy, dw, N, HP, WP, C, OH, OW, FH, FW, SH, SW): a depthwise convolution's filter
 * gradient (channel multiplier 1, dilation 1) from x [N, HP, WP, C] padded as conv2d reads it (every
 * tap of every output pixel inside it): dW[fh, fw, c] = Σ_{b, oh, ow} x[b, oh·SH + fh, ow·SW + fw, c]
 * · dy[b, oh, ow, c], each tap's channels 16 at a time, then 4; C a multiple of 4, N·OH·OW ≥ 1.
 */
const dwFilterGrad = `
  (func (export "dwFilterGrad") (param $x i32) (param $dy i32) (param $dw i32) (param $N i32) (param $HP i32) (param $WP i32)
      (param $C i32) (param $OH i32) (param $OW i32) (param $FH i32) (param $FW i32) (param $SH i32) (param $SW i32)
    (local $M i32) (local $m i32) (local $oh i32) (local $ow i32) (local $cx i32) (local $dp i32) (local $j i32)
    (local $fh i32) (local $fw i32) (local $tap i32) (local $op i32) (local $cstep i32)
    (local $rowBytes i32) (local $SHrow i32) (local $SWpix i32) (local $rowSkip i32) (local $imageSkip i32)
    ${["c0", "c1", "c2", "c3"].map(f4).join(" ")}
    (local.set $M (i32.mul (i32.mul (local.get $N) (local.get $OH)) (local.get $OW)))
    ${paddedWalk}
    (local.set $cstep (i32.shl (local.get $C) (i32.const 2)))
    ${loop(
      "fh",
      get("FH"),
      loop(
        "fw",
        get("FW"),
        `(local.set $tap (i32.add (local.get $x) (i32.add (i32.mul (local.get $fh) (local.get $rowBytes)) (i32.mul (local.get $fw) (local.get $cstep)))))
        (local.set $op (i32.add (local.get $dw) (i32.mul (i32.add (i32.mul (local.get $fh) (local.get $FW)) (local.get $fw)) (local.get $cstep))))
        (local.set $j (i32.const 0))
        ${dwFilterColumns(4)}
        ${dwFilterColumns(1)}`
      )
    )})`

/**
 * dwInputGrad(dy, w, dx, N, H, W, C, OH, OW, FH, FW, SH, SW, top, left): a depthwise convolution's
 * input gradient (channel multiplier 1, dilation 1), added into dx [N, H, W, C] (the caller zeroes
 * it): for each output pixel (b, oh, ow in order) and each tap (fh, fw) whose input pixel (oh·SH + fh
 * − top, ow·SW + fw − left) is inside the image, dx[b, ih, iw, c] += w[fh, fw, c] · dy[b, oh, ow, c],
 * four channels at a time; C a multiple of 4.
 */
/**
 * The walk dwInputGrad and col2im share: every output pixel (b, oh, ow, in order) and each of its
 * taps (fh, fw, in order); where the tap's input pixel (ih, iw) = (oh·SH + fh − top, ow·SW + fw −
 * left) is inside the image, `atTap` (statements), then dx at that pixel ($xp) += `term` (an f32x4
 * expression of $k, the byte offset in the pixel's channels), four channels at a time; `afterTap`
 * after every tap, inside or not, and `afterPixel` after every output pixel. Uses locals $b $oh
 * $ow $fh $fw $ih $iw $xp $k $cstep (C·4).
 */
const scatterTaps = (label, { atTap = "", term, afterTap = "", afterPixel = "" }) =>
  loop(
    "b",
    get("N"),
    loop(
      "oh",
      get("OH"),
      loop(
        "ow",
        get("OW"),
        `${loop(
          "fh",
          get("FH"),
          `(local.set $ih (i32.sub (i32.add (i32.mul (local.get $oh) (local.get $SH)) (local.get $fh)) (local.get $top)))
          ${loop(
            "fw",
            get("FW"),
            `(local.set $iw (i32.sub (i32.add (i32.mul (local.get $ow) (local.get $SW)) (local.get $fw)) (local.get $left)))
            (if (i32.and (i32.lt_u (local.get $ih) (local.get $H)) (i32.lt_u (local.get $iw) (local.get $W)))
              (then
                (local.set $xp (i32.add (local.get $dx) (i32.mul (i32.add (i32.mul (i32.add (i32.mul (local.get $b) (local.get $H)) (local.get $ih)) (local.get $W)) (local.get $iw)) (local.get $cstep))))
                ${atTap}
                (local.set $k (i32.const 0))
                (loop $${label}_c
                  (v128.store (i32.add (local.get $xp) (local.get $k)) (f32x4.add (v128.load (i32.add (local.get $xp) (local.get $k))) ${term}))
                  (local.set $k (i32.add (local.get $k) (i32.const 16)))
                  (br_if $${label}_c (i32.lt_u (local.get $k) (local.get $cstep))))))
            ${afterTap}`
          )}`
        )}
        ${afterPixel}`
      )
    )
  )

const dwInputGrad = `
  (func (export "dwInputGrad") (param $dy i32) (param $w i32) (param $dx i32) (param $N i32) (param $H i32) (param $W i32)
      (param $C i32) (param $OH i32) (param $OW i32) (param $FH i32) (param $FW i32) (param $SH i32) (param $SW i32)
      (param $top i32) (param $left i32)
    (local $b i32) (local $oh i32) (local $ow i32) (local $fh i32) (local $fw i32) (local $ih i32) (local $iw i32)
    (local $dp i32) (local $xp i32) (local $wp i32) (local $k i32) (local $cstep i32)
    (local.set $cstep (i32.shl (local.get $C) (i32.const 2)))
    (local.set $dp (local.get $dy))
    ${scatterTaps("dwi", {
      atTap: "(local.set $wp (i32.add (local.get $w) (i32.mul (i32.add (i32.mul (local.get $fh) (local.get $FW)) (local.get $fw)) (local.get $cstep))))",
      term: "(f32x4.mul (v128.load (i32.add (local.get $wp) (local.get $k))) (v128.load (i32.add (local.get $dp) (local.get $k))))",
      afterPixel: "(local.set $dp (i32.add (local.get $dp) (local.get $cstep)))"
    })})`

/**
 * col2im(dcol, dx, N, H, W, C, OH, OW, FH, FW, SH, SW, top, left): each output pixel's patch
 * gradient dcol [N·OH·OW, FH·FW·C] added back into dx [N, H, W, C] (zeroed by the caller) where its
 * patch was read, taps outside the image left out; pixels in order, then taps, four channels at a
 * time (C a multiple of 4): the JavaScript loop's order, the same bits. conv2d's input gradient at
 * strides above 1 (../conv-grads.ts), after the product dcol = dy·Wᵀ.
 */
const col2im = `
  (func (export "col2im") (param $dcol i32) (param $dx i32) (param $N i32) (param $H i32) (param $W i32)
      (param $C i32) (param $OH i32) (param $OW i32) (param $FH i32) (param $FW i32) (param $SH i32) (param $SW i32)
      (param $top i32) (param $left i32)
    (local $b i32) (local $oh i32) (local $ow i32) (local $fh i32) (local $fw i32) (local $ih i32) (local $iw i32)
    (local $sp i32) (local $xp i32) (local $k i32) (local $cstep i32)
    (local.set $cstep (i32.shl (local.get $C) (i32.const 2)))
    (local.set $sp (local.get $dcol))
    ${scatterTaps("c2i", {
      term: "(v128.load (i32.add (local.get $sp) (local.get $k)))",
      afterTap: "(local.set $sp (i32.add (local.get $sp) (local.get $cstep)))"
    })})`

/**
 * im2col(x, col, N, HP, WP, C, OH, OW, FH, FW, SH, SW): the patch matrix col [N·OH·OW, FH·FW·C] of
 * x padded as conv2d reads it ([N, HP, WP, C], every tap of every output pixel inside): output pixel
 * (b, oh, ow)'s row holds, for each filter row fh, the FW·C floats from x[b, oh·SH + fh, ow·SW], one
 * contiguous run. C a multiple of 4.
 */
const im2col = `
  (func (export "im2col") (param $x i32) (param $col i32) (param $N i32) (param $HP i32) (param $WP i32) (param $C i32)
      (param $OH i32) (param $OW i32) (param $FH i32) (param $FW i32) (param $SH i32) (param $SW i32)
    (local $b i32) (local $oh i32) (local $ow i32) (local $fh i32) (local $src i32) (local $end i32) (local $o i32)
    (local $pixel i32) (local $rowBytes i32) (local $run i32) (local $image i32) (local $stepH i32) (local $stepW i32)
    (local.set $pixel (i32.shl (local.get $C) (i32.const 2)))
    (local.set $rowBytes (i32.mul (local.get $WP) (local.get $pixel)))
    (local.set $run (i32.mul (local.get $FW) (local.get $pixel)))
    (local.set $image (i32.mul (local.get $HP) (local.get $rowBytes)))
    (local.set $stepH (i32.mul (local.get $SH) (local.get $rowBytes)))
    (local.set $stepW (i32.mul (local.get $SW) (local.get $pixel)))
    (local.set $o (local.get $col))
    ${loop(
      "b",
      get("N"),
      loop(
        "oh",
        get("OH"),
        loop(
          "ow",
          get("OW"),
          `(local.set $src (i32.add (i32.add (local.get $x) (i32.mul (local.get $b) (local.get $image)))
            (i32.add (i32.mul (local.get $oh) (local.get $stepH)) (i32.mul (local.get $ow) (local.get $stepW)))))
          ${loop(
            "fh",
            get("FH"),
            `(local.set $end (i32.add (local.get $o) (local.get $run)))
            (loop $copy
              (v128.store (local.get $o) (v128.load (local.get $src)))
              (local.set $o (i32.add (local.get $o) (i32.const 16)))
              (local.set $src (i32.add (local.get $src) (i32.const 16)))
              (br_if $copy (i32.lt_u (local.get $o) (local.get $end))))
            (local.set $src (i32.add (local.get $src) (i32.sub (local.get $rowBytes) (local.get $run))))`
          )}`
        )
      )
    )})`

/**
 * padImage(x, out, N, H, W, C, HP, WP, top, left): x [N, H, W, C] copied into out [N, HP, WP, C] at
 * row `top`, column `left` (rows and columns past HP, WP left out), zeros everywhere else; C a
 * multiple of 4, 0 ≤ top, left. For the convolutions' padded inputs (../conv2d.ts padImage).
 */
const padImage = `
  (func (export "padImage") (param $x i32) (param $out i32) (param $N i32) (param $H i32) (param $W i32) (param $C i32)
      (param $HP i32) (param $WP i32) (param $top i32) (param $left i32)
    (local $b i32) (local $hp i32) (local $h i32) (local $o i32) (local $end i32) (local $mid i32) (local $src i32)
    (local $rowOut i32) (local $lead i32) (local $body i32) (local $rowIn i32)
    (local.set $rowOut (i32.mul (i32.mul (local.get $WP) (local.get $C)) (i32.const 4)))
    (local.set $rowIn (i32.mul (i32.mul (local.get $W) (local.get $C)) (i32.const 4)))
    (local.set $lead (i32.mul (i32.mul (local.get $left) (local.get $C)) (i32.const 4)))
    (if (i32.gt_s (local.get $lead) (local.get $rowOut)) (then (local.set $lead (local.get $rowOut))))
    (local.set $body (i32.sub (local.get $rowOut) (local.get $lead)))
    (if (i32.gt_s (local.get $body) (local.get $rowIn)) (then (local.set $body (local.get $rowIn))))
    (local.set $o (local.get $out))
    ${loop(
      "b",
      get("N"),
      loop(
        "hp",
        get("HP"),
        `(local.set $h (i32.sub (local.get $hp) (local.get $top)))
        (local.set $end (i32.add (local.get $o) (local.get $rowOut)))
        (if (i32.and (i32.ge_s (local.get $h) (i32.const 0)) (i32.lt_s (local.get $h) (local.get $H)))
          (then
            (local.set $mid (i32.add (local.get $o) (local.get $lead)))
            (block $lead_done (loop $lead_next
              (br_if $lead_done (i32.ge_u (local.get $o) (local.get $mid)))
              (v128.store (local.get $o) ${ZERO})
              (local.set $o (i32.add (local.get $o) (i32.const 16)))
              (br $lead_next)))
            (local.set $src (i32.add (local.get $x) (i32.mul (i32.add (i32.mul (local.get $b) (local.get $H)) (local.get $h)) (local.get $rowIn))))
            (local.set $mid (i32.add (local.get $o) (local.get $body)))
            (block $body_done (loop $body_next
              (br_if $body_done (i32.ge_u (local.get $o) (local.get $mid)))
              (v128.store (local.get $o) (v128.load (local.get $src)))
              (local.set $o (i32.add (local.get $o) (i32.const 16)))
              (local.set $src (i32.add (local.get $src) (i32.const 16)))
              (br $body_next)))))
        (block $rest_done (loop $rest_next
          (br_if $rest_done (i32.ge_u (local.get $o) (local.get $end)))
          (v128.store (local.get $o) ${ZERO})
          (local.set $o (i32.add (local.get $o) (i32.const 16)))
          (br $rest_next)))`
      )
    )})`

/**
 * Winograd's minimal filtering for 3x3 convolutions at stride 1 (Lavin and Gray, "Fast Algorithms
 * for Convolutional Neural Networks", 2015): F(m x m, 3 x 3) computes an m x m block of outputs
 * from an a x a block of input (a = m + 2) as Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A, the products summed
 * over input channels as a² matrix products [tiles, C]·[C, O]: (m + 2)² / (9m²) of a direct
 * convolution's multiply-adds (F(4x4): 0.25 of them). The transforms are linear maps with small
 * constants, applied to four channels at a time (f32x4).
 *
 * The matrices come from Toom-Cook at finite points and ∞ (toomCook below); which points changes
 * the float32 error (Barabasz et al., "Error analysis and improving the accuracy of Winograd
 * convolution for deep neural networks", 2020, study the choice). Of the sets tried here, 0, ±1,
 * 1/2, −2 gave errors 3-6x smaller than Lavin's 0, ±1, ±2: against tfjs's cpu backend, relative to
 * 1 + |value|, 4e-4 -> 6e-5 on a filter gradient summed over 3200 pixels, 1.2e-4 -> 4e-5 on an input
 * gradient; Bᵀ's rows scaled to a largest entry of 1 (G scaled back) measured best of the scalings
 * tried.
 */
const polyMul = (p, q) => {
  const c = Array(p.length + q.length - 1).fill(0)
  p.forEach((x, i) => q.forEach((y, j) => (c[i + j] += x * y)))
  return c
}
/**
 * Bᵀ (n x n), G (n x r) and Aᵀ (m x n) of correlation F(m, r), y_i = Σ_k g_k d_(i+k), from the n − 1
 * finite `points` and ∞ (n = m + r − 1): G evaluates g at each point (∞: its last coefficient), Aᵀ
 * is the transpose of that evaluation for m coefficients, and Bᵀ the transpose of the
 * interpolation (Lagrange's basis at the finite points, then Π (x − p)): the correlation is the
 * transpose of the linear convolution that these evaluate, multiply and interpolate. Each point's
 * row of Bᵀ is multiplied by a scale and its row of G divided by it (`scales`, one per point and ∞,
 * or where left out the scale that makes the row of Bᵀ's largest entry 1); `scales` in the result.
 */
const toomCook = (m, r, points, scales) => {
  const n = m + r - 1
  const powers = (count) => points.map((p) => [...Array(count).keys()].map((i) => p ** i)).concat([[...Array(count).keys()].map((i) => (i === count - 1 ? 1 : 0))])
  const interpolation = points.map((pj, j) => {
    let poly = [1]
    let den = 1
    points.forEach((pl, l) => {
      if (l !== j) {
        poly = polyMul(poly, [-pl, 1])
        den *= pj - pl
      }
    })
    return [...poly.map((x) => x / den), ...Array(n - poly.length).fill(0)]
  })
  interpolation.push(points.reduce((poly, p) => polyMul(poly, [-p, 1]), [1]))
  const G = powers(r)
  const used = []
  const BT = interpolation.map((row, j) => {
    const s = scales?.[j] ?? 1 / Math.max(...row.map(Math.abs))
    used.push(s)
    G[j] = G[j].map((v) => v / s)
    return row.map((v) => v * s)
  })
  const Ea = powers(m)
  return { BT, G, AT: [...Array(m).keys()].map((i) => Ea.map((row) => row[i])), scales: used }
}
/**
 * Tiles of 4 outputs a side, and of 3 and 2 where a side is not a multiple of 4 (winogradPlan in
 * ../conv2d.ts): a 14-wide output as 4 + 4 + 4 + 2 instead of four 4-wide tiles, 16 outputs
 * computed for 14. F(3, 3) and F(2, 3) take a prefix of F(4, 3)'s points (0, ±1, 1/2, then 0, ±1)
 * and ∞, with F(4, 3)'s scaling of each point's row of G (Bᵀ's rows scaled to match), so that each
 * of their transformed filter's planes is one of F(4x4, 3x3)'s: one transformed filter (wgFilter4)
 * and one set of filter-gradient sums serve every tile shape (wgPlanePos).
 */
const F4 = toomCook(4, 3, [0, -1, 1, 1 / 2, -2])
const WINOGRAD = {
  2: toomCook(2, 3, [0, -1, 1], [...F4.scales.slice(0, 3), F4.scales[5]]),
  3: toomCook(3, 3, [0, -1, 1, 1 / 2], [...F4.scales.slice(0, 4), F4.scales[5]]),
  4: F4
}

/** Σ_k row[k]·ins[k] as an f32x4 expression (zero terms left out, ±1 as an add or a subtract). */
const combo = (row, ins) => {
  let e
  row.forEach((c, k) => {
    if (c === 0) return
    const t = ins[k]
    if (e === undefined) e = c === 1 ? t : c === -1 ? `(f32x4.neg ${t})` : `(f32x4.mul ${t} ${splat(c)})`
    else e = c === 1 ? `(f32x4.add ${e} ${t})` : c === -1 ? `(f32x4.sub ${e} ${t})` : `(f32x4.add ${e} (f32x4.mul ${t} ${splat(c)}))`
  })
  return e ?? ZERO
}

/** out[r] = Σ_k L[r][k]·in[k] for f32x4 locals: the matrix's rows as they stand. */
const byRows = (L) => (ins, outs) => L.map((row, r) => `(local.set ${outs[r]} ${combo(row, ins.map((n) => `(local.get ${n})`))})`)

/**
 * Statements for out = L · X · Rᵀ (L p x n and R q x k, `left` being v ↦ L·v from n f32x4 locals
 * to p and `right` v ↦ R·v from k to q; X n x k) a column, then a row at a time, with few values
 * live at once: column j of X loaded by `load(i, j)` into locals $wi<i>, L times it into $wo<r> and
 * stored to the 16-byte slots of $tmp (row r, column j); then row r of that read back into $wi<j>,
 * R times it into $wo<s>, and `store(r, s, value)`. `right` defaults to `left` (L X Lᵀ).
 */
const sandwich = (left, p, n, load, store, right = left, q = p, k = n) => {
  const cols = [...Array(k).keys()].flatMap((j) => [
    ...[...Array(n).keys()].map((i) => `(local.set $wi${i} ${load(i, j)})`),
    ...left(locals("wi", n), locals("wo", p)),
    ...[...Array(p).keys()].map((r) => `(v128.store offset=${16 * (r * k + j)} (local.get $tmp) (local.get $wo${r}))`)
  ])
  const rows = [...Array(p).keys()].flatMap((r) => [
    ...[...Array(k).keys()].map((j) => `(local.set $wi${j} (v128.load offset=${16 * (r * k + j)} (local.get $tmp)))`),
    ...right(locals("wi", k), locals("wo", q)),
    ...[...Array(q).keys()].map((s) => store(r, s, `(local.get $wo${s})`))
  ])
  return [...cols, ...rows].join("\n        ")
}
/** $<name>0 .. $<name><count − 1>. */
const locals = (name, count) => [...Array(count).keys()].map((i) => `$${name}${i}`)
/** The locals sandwich uses for vectors of length up to n. */
const sandwichLocals = (n) => [...Array(n).keys()].map((i) => `(local $wi${i} v128) (local $wo${i} v128)`).join(" ")

/**
 * Bytes each plane of the Winograd kernels' transforms (a position's [tiles, channels] or [C, O]
 * block) is longer than its contents: one cache line, so that planes are never a power of two
 * apart (conv2d.ts allocates for it: WG_PLANE_PAD floats a plane).
 */
const PLANE_PAD = 64

/**
 * Where U[pos][c][o .. o + 3] lies in a plane of the transformed filter (bytes from the plane's
 * start; o a multiple of 4; rowsBytes the rows' count x 4, C by default: wgFilterGrad's D has T
 * rows): its columns in panels of C rows, as wgProduct reads them, row after row, of 16 columns
 * while they fit in O ($O16: O rounded down to 16), then of 4, a panel starting at o·C·4 either
 * way. Read in rows O·4 bytes apart, each 16 columns down all C rows again for every pair of
 * tiles, the products had taken 1.1-1.2x as long at 256 and 512 channels.
 */
const wgPanelAt = (c, o, rowsBytes = get("cBytes")) => `(if (result i32) (i32.lt_s ${o} (local.get $O16))
      (then (i32.add (i32.mul (i32.and ${o} (i32.const -16)) ${rowsBytes}) (i32.add (i32.shl ${c} (i32.const 6)) (i32.shl (i32.and ${o} (i32.const 15)) (i32.const 2)))))
      (else (i32.add (i32.mul ${o} ${rowsBytes}) (i32.shl ${c} (i32.const 4)))))`

/**
 * wgFilter4(w, u, C, O, tmp): the filter w [3, 3, C, O] transformed, U[pos][c][o] = (G g Gᵀ)[pos]
 * for every (c, o), pos = i·6 + j, F(4x4, 3x3)'s G, in panels of columns (wgPanelAt), each pos's
 * plane C·O·4 + 64 bytes after the last (36 planes of u), which every tile shape's products read
 * (wgPlanePos); O a multiple of 4; tmp 18 16-byte slots for sandwich. Panel by panel, so that each
 * plane's stores run on in order (row by row and panel by panel they went to 36 x O / 16 places at
 * once: 512 x 512 channels 9.2 ms, 5.4-7.7 ms this way, 4.3 ms into rows O·4 bytes apart). Planes a
 * power of two apart put the 36 stores of each step in one cache set: 64 x 64 channels took 105 µs,
 * 22 µs with the line between.
 */
const wgFilter4 = `
  (func (export "wgFilter4") (param $w i32) (param $u i32) (param $C i32) (param $O i32) (param $tmp i32)
    (local $c i32) (local $j i32) (local $j0 i32) (local $pw i32) (local $p i32) (local $q i32) (local $tap i32) (local $plane i32) (local $O16 i32) (local $cBytes i32)
    ${sandwichLocals(6)}
    (local.set $tap (i32.mul (i32.mul (local.get $C) (local.get $O)) (i32.const 4)))
    (local.set $plane (i32.add (local.get $tap) (i32.const ${PLANE_PAD})))
    (local.set $O16 (i32.and (local.get $O) (i32.const -16)))
    (local.set $cBytes (i32.shl (local.get $C) (i32.const 2)))
    (local.set $j0 (i32.const 0))
    (loop $wgf_panel
      (local.set $pw (select (i32.const 16) (i32.const 4) (i32.lt_s (local.get $j0) (local.get $O16))))
      ${loop(
        "c",
        get("C"),
        `(local.set $j (local.get $j0))
        (loop $wgf_j
          (local.set $p (i32.add (local.get $w) (i32.shl (i32.add (i32.mul (local.get $c) (local.get $O)) (local.get $j)) (i32.const 2))))
          (local.set $q (i32.add (local.get $u) ${wgPanelAt(get("c"), get("j"))}))
          ${sandwich(byRows(F4.G), 6, 3, (i, j) => `(v128.load (i32.add (local.get $p) (i32.mul (local.get $tap) (i32.const ${i * 3 + j}))))`, (i, j, v) => `(v128.store (i32.add (local.get $q) (i32.mul (local.get $plane) (i32.const ${i * 6 + j}))) ${v})`)}
          (local.set $j (i32.add (local.get $j) (i32.const 4)))
          (br_if $wgf_j (i32.lt_s (local.get $j) (i32.add (local.get $j0) (local.get $pw)))))`
      )}
      (local.set $j0 (i32.add (local.get $j0) (local.get $pw)))
      (br_if $wgf_panel (i32.lt_s (local.get $j0) (local.get $O))))
  )`

/**
 * The plane of F(4x4, 3x3)'s transformed filter (and of the filter gradient's sums) that position
 * $pos of an ah x aw tile's transforms uses: row i and column j of the tile's points are F(4, 3)'s
 * own, the last (∞) F(4, 3)'s last; an i32 expression.
 */
const wgPlanePos = (ah, aw) => {
  if (ah === 6 && aw === 6) return get("pos")
  const side = (index, a) => (a === 6 ? index : `(select (i32.const 5) ${index} (i32.eq ${index} (i32.const ${a - 1})))`)
  return `(i32.add (i32.mul ${side(`(i32.div_u (local.get $pos) (i32.const ${aw}))`, ah)} (i32.const 6)) ${side(`(i32.rem_u (local.get $pos) (i32.const ${aw}))`, aw)})`
}

/**
 * A tile's place: $tile (0 .. N·TH·TW − 1) to $b, $th, $tw. Uses $tpi (TH·TW).
 */
const tilePlace = `
        (local.set $b (i32.div_u (local.get $tile) (local.get $tpi)))
        (local.set $th (i32.rem_u (local.get $tile) (local.get $tpi)))
        (local.set $tw (i32.rem_u (local.get $th) (local.get $TW)))
        (local.set $th (i32.div_u (local.get $th) (local.get $TW)))`

/**
 * Where tile ($b, $th, $tw) of the region ($R0, $C0, $RH x $RW outputs) starts in an [N, OH, OW,
 * O] image from `image` ($at), how many of its rows and columns lie inside the region ($rows,
 * $cols), and whether all mh x mw do ($full: the one test most tiles need). Uses $rowOut (OW·O·4
 * bytes).
 */
const tileInImage = (mh, mw, image) => `
        (local.set $rows (i32.sub (local.get $RH) (i32.mul (local.get $th) (i32.const ${mh}))))
        (local.set $cols (i32.sub (local.get $RW) (i32.mul (local.get $tw) (i32.const ${mw}))))
        (local.set $full (i32.and (i32.ge_s (local.get $rows) (i32.const ${mh})) (i32.ge_s (local.get $cols) (i32.const ${mw}))))
        (local.set $at (i32.add ${image} (i32.add (i32.mul (i32.add (i32.add (i32.mul (local.get $b) (local.get $OH)) (local.get $R0)) (i32.mul (local.get $th) (i32.const ${mh}))) (local.get $rowOut))
          (i32.mul (i32.add (local.get $C0) (i32.mul (local.get $tw) (i32.const ${mw}))) (local.get $oBytes)))))`
/** Whether output (r, s) of the tile placed by tileInImage is inside the image. */
const insideTile = (r, s) => `(i32.or (local.get $full) (i32.and (i32.lt_s (i32.const ${r}) (local.get $rows)) (i32.lt_s (i32.const ${s}) (local.get $cols))))`
/** The address of output (r, s) of that tile, channel bytes $ob. */
const tileAddress = (r, s) => `(i32.add (i32.add (local.get $at) (local.get $ob)) (i32.add (i32.mul (local.get $rowOut) (i32.const ${r})) (i32.mul (local.get $oBytes) (i32.const ${s}))))`

/**
 * The product step of wgConv: for each pos, M[pos][t][o] = Σ_c V[pos][t][c]·U[pos][c][o], output
 * columns `4·vecs` at a time from $j while they fit in O, `tiles` tiles (2 or 1) at a time, U's
 * columns read from their panel (wgPanelAt: 16 columns for vecs 4, 4 for vecs 1), row after row.
 */
const wgProduct = (vecs, tiles) => {
  const qs = [...Array(vecs).keys()]
  const ts = [...Array(tiles).keys()]
  const name = `wgp${vecs}_${tiles}`
  return `
          (block $${name}_done
            (br_if $${name}_done (i32.gt_s (i32.add (local.get $t) (i32.const ${tiles})) (local.get $tb)))
            (loop $${name}
              ${ts.flatMap((t) => qs.map((q) => `(local.set $acc${t}_${q} ${ZERO})`)).join(" ")}
              (local.set $pv (i32.add (local.get $vp) (i32.mul (local.get $t) (local.get $cBytes))))
              (local.set $pu (i32.add (local.get $up) (i32.mul (local.get $j) (local.get $cBytes))))
              (local.set $k (i32.const 0))
              (loop $${name}_k
                ${ts.map((t) => `(local.set $s${t} (v128.load32_splat offset=0 (i32.add (local.get $pv) (i32.mul (local.get $cBytes) (i32.const ${t})))))`).join(" ")}
                ${qs.map((q) => `(local.set $wv (v128.load offset=${16 * q} (local.get $pu)))
                ${ts.map((t) => `(local.set $acc${t}_${q} (f32x4.add (local.get $acc${t}_${q}) (f32x4.mul (local.get $s${t}) (local.get $wv))))`).join(" ")}`).join("\n                ")}
                (local.set $pv (i32.add (local.get $pv) (i32.const 4)))
                (local.set $pu (i32.add (local.get $pu) (i32.const ${16 * vecs})))
                (local.set $k (i32.add (local.get $k) (i32.const 1)))
                (br_if $${name}_k (i32.lt_s (local.get $k) (local.get $C))))
              (local.set $pm (i32.add (i32.add (local.get $mp) (i32.mul (local.get $t) (local.get $oBytes))) (i32.shl (local.get $j) (i32.const 2))))
              ${ts.flatMap((t) => qs.map((q) => `(v128.store offset=${16 * q} (i32.add (local.get $pm) (i32.mul (local.get $oBytes) (i32.const ${t}))) (local.get $acc${t}_${q}))`)).join(" ")}
              (local.set $t (i32.add (local.get $t) (i32.const ${tiles})))
              (br_if $${name} (i32.le_s (i32.add (local.get $t) (i32.const ${tiles})) (local.get $tb)))))`
}

/** wgProduct's column blocks: 16 columns while they fit, then 4; tiles in pairs, then one. */
const wgColumns = (vecs) => `
      (block $wgc${vecs}_done
        (br_if $wgc${vecs}_done (i32.gt_s (i32.add (local.get $j) (i32.const ${4 * vecs})) (local.get $O)))
        (loop $wgc${vecs}
          (local.set $t (i32.const 0))
          ${wgProduct(vecs, 2)}
          ${wgProduct(vecs, 1)}
          (local.set $j (i32.add (local.get $j) (i32.const ${4 * vecs})))
          (br_if $wgc${vecs} (i32.le_s (i32.add (local.get $j) (i32.const ${4 * vecs})) (local.get $O)))))`

/**
 * The sizes wgConv and wgFilterGrad start from: $TH x $TW tiles of mh x mw outputs in each image's
 * region ($RH x $RW outputs from row $R0, column $C0) ($tpi),
 * $NT in all, a row's, an input pixel's and an output pixel's bytes, and a position's plane of V
 * (T tiles x C), of M or D (T tiles x O) and of the transformed filter or the filter gradient's sums
 * (C x O, $cPlane), each PLANE_PAD longer: planes a power of two
 * apart (16 tiles of 16 channels: 1 KiB) put the 36 a transform writes in the same few cache sets
 * ([32, 8, 8, 16] -> 16's filter gradient 157 -> 113 µs).
 */
const wgSizes = (mh, mw) => `
    (local.set $TH (i32.div_u (i32.add (local.get $RH) (i32.const ${mh - 1})) (i32.const ${mh})))
    (local.set $TW (i32.div_u (i32.add (local.get $RW) (i32.const ${mw - 1})) (i32.const ${mw})))
    (local.set $tpi (i32.mul (local.get $TH) (local.get $TW)))
    (local.set $NT (i32.mul (local.get $N) (local.get $tpi)))
    (local.set $cBytes (i32.shl (local.get $C) (i32.const 2)))
    (local.set $oBytes (i32.shl (local.get $O) (i32.const 2)))
    (local.set $rowBytes (i32.mul (local.get $WP) (local.get $cBytes)))
    (local.set $vPlane (i32.add (i32.mul (local.get $T) (local.get $cBytes)) (i32.const ${PLANE_PAD})))
    (local.set $mPlane (i32.add (i32.mul (local.get $T) (local.get $oBytes)) (i32.const ${PLANE_PAD})))
    (local.set $cPlane (i32.add (i32.mul (local.get $C) (local.get $oBytes)) (i32.const ${PLANE_PAD})))`

/** Tile $t of the block ($b, $th, $tw placed): V[pos][t][c] = (Bhᵀ d Bw)[pos] for its ah x aw block d of x, four channels at a time. */
const wgInputTiles = (mh, mw) => {
  const ah = mh + 2
  const aw = mw + 2
  return `(local.set $base (i32.add (local.get $x) (i32.add (i32.mul (i32.add (i32.add (i32.mul (local.get $b) (local.get $HP)) (local.get $R0)) (i32.mul (local.get $th) (i32.const ${mh}))) (local.get $rowBytes))
          (i32.mul (i32.add (local.get $C0) (i32.mul (local.get $tw) (i32.const ${mw}))) (local.get $cBytes)))))
        (local.set $vp (i32.add (local.get $scratch) (i32.mul (local.get $t) (local.get $cBytes))))
        (local.set $cb (i32.const 0))
        (loop $wg_in
          ${sandwich(
            byRows(WINOGRAD[mh].BT),
            ah,
            ah,
            (i, j) => `(v128.load (i32.add (i32.add (local.get $base) (local.get $cb)) (i32.add (i32.mul (local.get $rowBytes) (i32.const ${i})) (i32.mul (local.get $cBytes) (i32.const ${j})))))`,
            (i, j, v) => `(v128.store (i32.add (i32.add (local.get $vp) (local.get $cb)) (i32.mul (local.get $vPlane) (i32.const ${i * aw + j}))) ${v})`,
            byRows(WINOGRAD[mw].BT),
            aw,
            aw
          )}
          (local.set $cb (i32.add (local.get $cb) (i32.const 16)))
          (br_if $wg_in (i32.lt_s (local.get $cb) (local.get $cBytes))))`
}

/**
 * wgConv<mh><mw>(x, u, bias, y, N, HP, WP, C, OH, OW, O, relu, scratch, T, R0, C0, RH, RW): the
 * outputs of y [N, OH, OW, O] = conv2d(x, w) 3x3 at stride 1 (+ bias, ReLU with relu 1) in the
 * region of RH x RW from row R0, column C0 of each image, from x padded as conv2d reads it with HP ≥
 * R0 + mh·⌈RH/mh⌉ + 2 and WP ≥ C0 + mw·⌈RW/mw⌉ + 2 (zeros past the image), and U =
 * wgFilter4(w). Tiles of mh x mw outputs T at a time: their inputs transformed into scratch
 * (V [ah·aw, T, C], wgSizes' planes), ah·aw products into scratch after it (M [ah·aw, T, O]), then
 * transformed back into y (outputs past the region not stored); sandwich's ah·aw slots after M. U
 * is F(4x4, 3x3)'s for every tile shape (wgPlanePos). C and O multiples of 4; bias 0 for none.
 */
const wgConv = (mh, mw) => {
  const ah = mh + 2
  const aw = mw + 2
  return `
  (func (export "wgConv${mh}${mw}") (param $x i32) (param $u i32) (param $bias i32) (param $y i32) (param $N i32)
      (param $HP i32) (param $WP i32) (param $C i32) (param $OH i32) (param $OW i32) (param $O i32)
      (param $relu i32) (param $scratch i32) (param $T i32) (param $R0 i32) (param $C0 i32) (param $RH i32) (param $RW i32)
    (local $TH i32) (local $TW i32) (local $tpi i32) (local $NT i32) (local $t0 i32) (local $tb i32) (local $t i32)
    (local $tile i32) (local $b i32) (local $th i32) (local $tw i32) (local $base i32) (local $cb i32) (local $ob i32)
    (local $rowBytes i32) (local $cBytes i32) (local $oBytes i32) (local $vPlane i32) (local $mPlane i32) (local $cPlane i32) (local $mBuf i32)
    (local $pos i32) (local $vp i32) (local $up i32) (local $mp i32) (local $j i32) (local $k i32) (local $pv i32) (local $pu i32) (local $pm i32)
    (local $rows i32) (local $cols i32) (local $full i32) (local $rowOut i32) (local $at i32) (local $bv v128) (local $lo v128) (local $wv v128) (local $s0 v128) (local $s1 v128)
    ${[0, 1].flatMap((t) => [0, 1, 2, 3].map((q) => `(local $acc${t}_${q} v128)`)).join(" ")}
    ${sandwichLocals(Math.max(ah, aw))} (local $tmp i32)
    ${wgSizes(mh, mw)}
    (local.set $rowOut (i32.mul (local.get $OW) (local.get $oBytes)))
    ;; ReLU as a max with 0; without it, a max with −∞ (every value, NaN too, as it stands)
    (local.set $lo (if (result v128) (local.get $relu) (then ${ZERO}) (else ${splat("-inf")})))
    (local.set $mBuf (i32.add (local.get $scratch) (i32.mul (local.get $vPlane) (i32.const ${ah * aw}))))
    (local.set $tmp (i32.add (local.get $mBuf) (i32.mul (local.get $mPlane) (i32.const ${ah * aw}))))
    (local.set $t0 (i32.const 0))
    (block $wg_done
      (br_if $wg_done (i32.ge_s (local.get $t0) (local.get $NT)))
      (loop $wg_block
        (local.set $tb (i32.sub (local.get $NT) (local.get $t0)))
        (if (i32.gt_s (local.get $tb) (local.get $T)) (then (local.set $tb (local.get $T))))
        ;; the inputs: V[pos][t][c] = (Bhᵀ d Bw)[pos] for each tile's ah x aw block d, four channels at a time
        ${loop(
          "t",
          get("tb"),
          `(local.set $tile (i32.add (local.get $t0) (local.get $t)))
        ${tilePlace}
        ${wgInputTiles(mh, mw)}`
        )}
        ;; the products, one per pos
        ${loop(
          "pos",
          c32(ah * aw),
          `(local.set $vp (i32.add (local.get $scratch) (i32.mul (local.get $pos) (local.get $vPlane))))
        (local.set $up (i32.add (local.get $u) (i32.mul ${wgPlanePos(ah, aw)} (local.get $cPlane))))
        (local.set $mp (i32.add (local.get $mBuf) (i32.mul (local.get $pos) (local.get $mPlane))))
        (local.set $j (i32.const 0))
        ${wgColumns(4)}
        ${wgColumns(1)}`
        )}
        ;; the outputs: y = Ahᵀ M Aw (+ bias, ReLU) per tile, four channels at a time, inside the region
        ${loop(
          "t",
          get("tb"),
          `(local.set $tile (i32.add (local.get $t0) (local.get $t)))
        ${tilePlace}
        (local.set $mp (i32.add (local.get $mBuf) (i32.mul (local.get $t) (local.get $oBytes))))
        ${tileInImage(mh, mw, "(local.get $y)")}
        (local.set $ob (i32.const 0))
        (loop $wg_out
          (local.set $bv (if (result v128) (local.get $bias) (then (v128.load (i32.add (local.get $bias) (local.get $ob)))) (else ${ZERO})))
          ${sandwich(
            byRows(WINOGRAD[mh].AT),
            mh,
            ah,
            (i, j) => `(v128.load (i32.add (i32.add (local.get $mp) (local.get $ob)) (i32.mul (local.get $mPlane) (i32.const ${i * aw + j}))))`,
            (r, s, v) => `(if ${insideTile(r, s)}
            (then (v128.store ${tileAddress(r, s)} (f32x4.max (f32x4.add ${v} (local.get $bv)) (local.get $lo)))))`,
            byRows(WINOGRAD[mw].AT),
            mw,
            aw
          )}
          (local.set $ob (i32.add (local.get $ob) (i32.const 16)))
          (br_if $wg_out (i32.lt_s (local.get $ob) (local.get $oBytes))))`
        )}
        (local.set $t0 (i32.add (local.get $t0) (local.get $T)))
        (br_if $wg_block (i32.lt_s (local.get $t0) (local.get $NT))))))`
}
/** The columns of a matrix as rows. */
const transposed = (L) => L[0].map((_, j) => L.map((row) => row[j]))

/**
 * The filter gradient's product step: for each pos, P[pos][c][o] += Σ_t V[pos][t][c]·D[pos][t][o]
 * over the block's tiles (P[pos][c][o] = with $fresh: the sums' first block), input channels $c
 * two at a time (C is a multiple of 4), output columns `4·vecs` at a time from $j, D's columns
 * read from their panel of T rows (wgPanelAt), row after row, with $dPanels (else rows O·4 bytes apart).
 */
const wgGradProduct = (vecs) => {
  const qs = [...Array(vecs).keys()]
  const cs = [0, 1]
  const name = `wgg${vecs}`
  const at = (c, q) => `(i32.add (local.get $pp) (i32.add (i32.mul (local.get $oBytes) (i32.const ${c})) (i32.const ${16 * q})))`
  return `
          (block $${name}_done
            (br_if $${name}_done (i32.gt_s (i32.add (local.get $c) (i32.const ${cs.length})) (local.get $C)))
            (loop $${name}
              (local.set $pp (i32.add (i32.add (local.get $up) (i32.mul (local.get $c) (local.get $oBytes))) (i32.shl (local.get $j) (i32.const 2))))
              (if (local.get $fresh)
                (then ${cs.flatMap((c) => qs.map((q) => `(local.set $acc${c}_${q} ${ZERO})`)).join(" ")})
                (else ${cs.flatMap((c) => qs.map((q) => `(local.set $acc${c}_${q} (v128.load ${at(c, q)}))`)).join(" ")}))
              (local.set $pv (i32.add (local.get $vp) (i32.shl (local.get $c) (i32.const 2))))
              (local.set $pu (i32.add (local.get $mp) (i32.mul (local.get $j) (select (local.get $tBytes) (i32.const 4) (local.get $dPanels)))))
              (local.set $dStep (select (i32.const ${16 * vecs}) (local.get $oBytes) (local.get $dPanels)))
              (local.set $k (i32.const 0))
              (loop $${name}_k
                ${cs.map((c) => `(local.set $s${c} (v128.load32_splat offset=${4 * c} (local.get $pv)))`).join(" ")}
                ${qs.map((q) => `(local.set $wv (v128.load offset=${16 * q} (local.get $pu)))
                ${cs.map((c) => `(local.set $acc${c}_${q} (f32x4.add (local.get $acc${c}_${q}) (f32x4.mul (local.get $s${c}) (local.get $wv))))`).join(" ")}`).join("\n                ")}
                (local.set $pv (i32.add (local.get $pv) (local.get $cBytes)))
                (local.set $pu (i32.add (local.get $pu) (local.get $dStep)))
                (local.set $k (i32.add (local.get $k) (i32.const 1)))
                (br_if $${name}_k (i32.lt_s (local.get $k) (local.get $tb))))
              ${cs.flatMap((c) => qs.map((q) => `(v128.store ${at(c, q)} (local.get $acc${c}_${q}))`)).join(" ")}
              (local.set $c (i32.add (local.get $c) (i32.const ${cs.length})))
              (br_if $${name} (i32.le_s (i32.add (local.get $c) (i32.const ${cs.length})) (local.get $C)))))`
}

/** wgGradProduct's column blocks: 16 columns while they fit, then 4. */
const wgGradColumns = (vecs) => `
      (block $wgd${vecs}_done
        (br_if $wgd${vecs}_done (i32.gt_s (i32.add (local.get $j) (i32.const ${4 * vecs})) (local.get $O)))
        (loop $wgd${vecs}
          (local.set $c (i32.const 0))
          ${wgGradProduct(vecs)}
          (local.set $j (i32.add (local.get $j) (i32.const ${4 * vecs})))
          (br_if $wgd${vecs} (i32.le_s (i32.add (local.get $j) (i32.const ${4 * vecs})) (local.get $O)))))`

/**
 * wgFilterGrad<mh><mw>(x, dy, dw, N, HP, WP, C, OH, OW, O, scratch, T, R0, C0, RH, RW, first, last):
 * the filter gradient of a 3x3 convolution at stride 1, dW[fh, fw, c, o] = Σ x[b, oh + fh, ow + fw,
 * c]·dy[b, oh, ow, o], from x padded as wgConv reads it, summed over the outputs of one region (as
 * wgConv's) by the same algebra read backwards: the forward's Y = Ahᵀ[(Gh g Gwᵀ) ⊙ (Bhᵀ d Bw)]Aw
 * gives dW = Ghᵀ [Σ_tiles (Ah dY Awᵀ) ⊙ (Bhᵀ d Bw)] Gw, the sum over tiles and the product over
 * channels being ah·aw products [C, tiles]·[tiles, O]. Tiles T at a time: V [ah·aw, T, C] and D
 * [ah·aw, T, O] in scratch, then P [36, C, O] += Vᵀ·D after room for 36 planes of each: each
 * position into F(4x4, 3x3)'s plane (wgPlanePos), whose rows of G every tile shape's are, so the
 * regions of one output add into the same sums (planes a cache line longer, as wgFilter4's;
 * sandwich's 36 slots after P). P zeroed first with first 1; dW = Gᵀ P G (F(4x4, 3x3)'s G) at the
 * end with last 1. dy's rows and columns past the region read as zeros. C and O multiples of 4.
 */
const wgFilterGrad = (mh, mw) => {
  const ah = mh + 2
  const aw = mw + 2
  const [H, Wd] = [WINOGRAD[mh], WINOGRAD[mw]]
  return `
  (func (export "wgFilterGrad${mh}${mw}") (param $x i32) (param $dy i32) (param $dw i32) (param $N i32)
      (param $HP i32) (param $WP i32) (param $C i32) (param $OH i32) (param $OW i32) (param $O i32)
      (param $scratch i32) (param $T i32) (param $R0 i32) (param $C0 i32) (param $RH i32) (param $RW i32) (param $first i32) (param $last i32)
    (local $fresh i32) (local $TH i32) (local $TW i32) (local $tpi i32) (local $NT i32) (local $t0 i32) (local $tb i32) (local $t i32)
    (local $tile i32) (local $b i32) (local $th i32) (local $tw i32) (local $base i32) (local $cb i32) (local $ob i32)
    (local $rowBytes i32) (local $cBytes i32) (local $oBytes i32) (local $vPlane i32) (local $mPlane i32) (local $mBuf i32) (local $pBuf i32) (local $cPlane i32) (local $tapBytes i32)
    (local $pos i32) (local $vp i32) (local $up i32) (local $mp i32) (local $j i32) (local $k i32) (local $c i32) (local $pv i32) (local $pu i32) (local $pp i32) (local $O16 i32) (local $tBytes i32) (local $dq i32) (local $dPanels i32) (local $dStep i32)
    (local $rows i32) (local $cols i32) (local $full i32) (local $rowOut i32) (local $at i32) (local $wv v128) (local $s0 v128) (local $s1 v128)
    ${[0, 1].flatMap((t) => [0, 1, 2, 3].map((q) => `(local $acc${t}_${q} v128)`)).join(" ")}
    ${sandwichLocals(6)} (local $tmp i32)
    ${wgSizes(mh, mw)}
    (local.set $rowOut (i32.mul (local.get $OW) (local.get $oBytes)))
    (local.set $tapBytes (i32.mul (local.get $C) (local.get $oBytes)))
    ;; D's planes in panels of T rows (wgPanelAt) from 256 output channels: [32, 8, 8, 256] -> 256
    ;; 25-30 -> 17-19 ms, [32, 4, 4, 512] -> 512 33-39 -> 24-33 ms, where the product read each 16
    ;; columns down the block's rows O·4 bytes apart for every pair of input channels; at 16-128
    ;; rows as before, panels having cost 1.0-1.5x the time
    (local.set $dPanels (i32.ge_s (local.get $O) (i32.const 256)))
    (local.set $O16 (i32.and (local.get $O) (i32.const -16)))
    (local.set $tBytes (i32.shl (local.get $T) (i32.const 2)))
    (local.set $mBuf (i32.add (local.get $scratch) (i32.mul (local.get $vPlane) (i32.const 36))))
    (local.set $pBuf (i32.add (local.get $mBuf) (i32.mul (local.get $mPlane) (i32.const 36))))
    (local.set $tmp (i32.add (local.get $pBuf) (i32.mul (local.get $cPlane) (i32.const 36))))
    ${
      mh === 4 && mw === 4
        ? `;; the first region's first block stores P instead of adding to it (every plane: P's 36 zeros
    ;; took a pass over 36·C·O floats, 37.7 MB at 512 x 512 channels)`
        : `;; P = 0 for the first region (the first block does not reach every plane)
    (if (local.get $first) (then
      (local.set $pp (local.get $pBuf))
      (block $z_done (loop $z_next
        (br_if $z_done (i32.ge_u (local.get $pp) (local.get $tmp)))
        (v128.store (local.get $pp) ${ZERO})
        (local.set $pp (i32.add (local.get $pp) (i32.const 16)))
        (br $z_next)))))`
    }
    (local.set $t0 (i32.const 0))
    (block $wg_done
      (br_if $wg_done (i32.ge_s (local.get $t0) (local.get $NT)))
      (loop $wg_block
        (local.set $tb (i32.sub (local.get $NT) (local.get $t0)))
        (if (i32.gt_s (local.get $tb) (local.get $T)) (then (local.set $tb (local.get $T))))
        ${loop(
          "t",
          get("tb"),
          `(local.set $tile (i32.add (local.get $t0) (local.get $t)))
        ${tilePlace}
        ;; V[pos][t][c] = (Bhᵀ d Bw)[pos], as wgConv's
        ${wgInputTiles(mh, mw)}
        ;; D[pos][t][o] = (Ah dY Awᵀ)[pos] for the tile's mh x mw block of dy (zeros past the region), in panels or rows
        ${tileInImage(mh, mw, "(local.get $dy)")}
        (local.set $ob (i32.const 0))
        (loop $wg_dy
          (local.set $dq (i32.add (local.get $mBuf) (if (result i32) (local.get $dPanels)
            (then ${wgPanelAt(get("t"), "(i32.shr_u (local.get $ob) (i32.const 2))", get("tBytes"))})
            (else (i32.add (i32.mul (local.get $t) (local.get $oBytes)) (local.get $ob))))))
          ${sandwich(
            byRows(transposed(H.AT)),
            ah,
            mh,
            (i, j) => `(if (result v128) ${insideTile(i, j)} (then (v128.load ${tileAddress(i, j)})) (else ${ZERO}))`,
            (i, j, v) => `(v128.store (i32.add (local.get $dq) (i32.mul (local.get $mPlane) (i32.const ${i * aw + j}))) ${v})`,
            byRows(transposed(Wd.AT)),
            aw,
            mw
          )}
          (local.set $ob (i32.add (local.get $ob) (i32.const 16)))
          (br_if $wg_dy (i32.lt_s (local.get $ob) (local.get $oBytes))))`
        )}
        ;; P[pos] += V[pos]ᵀ·D[pos]
        (local.set $fresh ${mh === 4 && mw === 4 ? "(i32.and (local.get $first) (i32.eqz (local.get $t0)))" : "(i32.const 0)"})
        ${loop(
          "pos",
          c32(ah * aw),
          `(local.set $vp (i32.add (local.get $scratch) (i32.mul (local.get $pos) (local.get $vPlane))))
        (local.set $mp (i32.add (local.get $mBuf) (i32.mul (local.get $pos) (local.get $mPlane))))
        (local.set $up (i32.add (local.get $pBuf) (i32.mul ${wgPlanePos(ah, aw)} (local.get $cPlane))))
        (local.set $j (i32.const 0))
        ${wgGradColumns(4)}
        ${wgGradColumns(1)}`
        )}
        (local.set $t0 (i32.add (local.get $t0) (local.get $T)))
        (br_if $wg_block (i32.lt_s (local.get $t0) (local.get $NT)))))
    ;; dW[fh][fw][c][o] = (Gᵀ P[·][c][o] G)[fh][fw] after the last region
    (if (local.get $last) (then
      (local.set $c (i32.const 0))
      (block $dw_done
        (loop $dw_next
          (br_if $dw_done (i32.ge_u (local.get $c) (local.get $tapBytes)))
          ${sandwich(
            byRows(transposed(F4.G)),
            3,
            6,
            (i, j) => `(v128.load (i32.add (i32.add (local.get $pBuf) (local.get $c)) (i32.mul (local.get $cPlane) (i32.const ${i * 6 + j}))))`,
            (i, j, v) => `(v128.store (i32.add (i32.add (local.get $dw) (local.get $c)) (i32.mul (local.get $tapBytes) (i32.const ${i * 3 + j}))) ${v})`
          )}
          (local.set $c (i32.add (local.get $c) (i32.const 16)))
          (br $dw_next))))))`
}

/** The tile shapes the Winograd kernels are built for: sides of 4, 3 and 2 outputs (wgPlan in ../conv2d.ts). */
const WG_SIDES = [4, 3, 2]
const WG_SHAPES = WG_SIDES.flatMap((mh) => WG_SIDES.map((mw) => [mh, mw]))
const winogradKernels = [wgFilter4, ...WG_SHAPES.flatMap(([mh, mw]) => [wgConv(mh, mw), wgFilterGrad(mh, mw)])].join("\n")

/**
 * maddProbe(a, b, c): lane 0 of c + a·b in f32x4, the multiply-add shape the kernels sum with. In
 * the binary where it fuses (FUSED below) it gives a·b + c rounded once wherever the CPU has a
 * fused multiply-add, so the host learns which arithmetic the kernels run (../heap-simd.ts).
 */
const maddProbe = `
  (func (export "maddProbe") (param $a f32) (param $b f32) (param $c f32) (result f32)
    (f32x4.extract_lane 0 (f32x4.add (f32x4.splat (local.get $c)) (f32x4.mul (f32x4.splat (local.get $a)) (f32x4.splat (local.get $b))))))`

/**
 * The kernels whose f32x4 multiply-adds, c + a·b, may run as one fused multiply-add: the products,
 * convolutions (depthwise ones too), normalization and LSTM kernels, whose results are compared with the cpu backend's
 * within a tolerance anyway. scripts/build-wasm.mjs makes a second binary from this text with each
 * such (f32x4.add c (f32x4.mul a b)) in these functions written as relaxed SIMD's
 * (f32x4.relaxed_madd a b c): one instruction instead of two (an FMA on x86 with FMA3 and on
 * arm64), rounded once. Adam's update is left out: its bits are tfjs's own (fused-adam.ts), and
 * the rest have no multiply-add.
 */
export const FUSED = ["matmul", "matmulTB", "lnForward", "lnBackward", "convFilterGrad", "conv2d", "convFilterGradTaps", "lstmCellForward", "lstmCellBackward", "dwFilterGrad", "dwInputGrad", "gruReset", "gruResetGrad", "gruUpdate", "gruUpdateGrad", ...WG_SHAPES.flatMap(([mh, mw]) => [`wgConv${mh}${mw}`, `wgFilterGrad${mh}${mw}`]), "maddProbe"]

export const wat = `(module
  (import "env" "memory" (memory 1))
  ${matmul}
  ${matmulTB}
  ${bnTrainForward}
  ${bnTrainBackward}
  ${lnForward}
  ${lnBackward}
  ${convFilterGrad}
  ${conv2d}
  ${convFilterGradTaps}
  ${maxPoolGrad}
  ${lstmCellForward}
  ${lstmCellBackward}
  ${reduceMaxMin}
  ${maxMinGrad}
  ${blockTranspose}
  ${adam}
  ${reluGrad}
  ${sumBlock}
  ${gatherRows}
  ${dwFilterGrad}
  ${dwInputGrad}
  ${clipGrad}
  ${gruReset}
  ${gruResetGrad}
  ${gruUpdate}
  ${gruUpdateGrad}
  ${col2im}
  ${im2col}
  ${padImage}
  ${winogradKernels}
  ${maddProbe}
)`
