// gradwire's SIMD kernels for the data path (WebAssembly 128-bit SIMD, 4 x f32 per instruction),
// written as WebAssembly text. The text is built by the small template functions below so that the
// per-vector conversions are inlined into each loop (V8 does not inline wasm calls that pass v128
// values, and a call per vector costs as much as the conversion). `node scripts/build-wasm.mjs`
// assembles it into kernels-wasm.ts.
//
// Every kernel takes byte addresses for its arrays. The JavaScript side (../simd.ts) either points
// them at arrays that live in the instance's memory (a "space": the scratch below plus regions
// for residuals and working copies, grown once when the space is made, never after, so views of
// it stay valid), or copies blocks of at most BLOCK elements into the fixed scratch regions below,
// calls a kernel, and copies the result out. Every kernel's result is bit-for-bit that of the scalar loops in ../float16.ts,
// ../kernels.ts and ../gradient-reducer.ts (tested), so ranks agree whichever path they take.
//
// Scratch memory (the first 2 MiB, 32 pages), byte offsets:
//   A   0x000000  f32[BLOCK]     (256 KiB)
//   B   0x040000  f32[BLOCK]     (256 KiB)
//   H   0x080000  u16[BLOCK]     (128 KiB)
//   QC  0x0A0000  f32[4][MAXM]   PowerSGD: the 4 columns of a thin factor Q, column-major, 64 KiB apart
//   WC  0x0E0000  f32[4][MAXM]   PowerSGD: the columns of this rank's own Q_w (256 KiB)
//   ACC 0x120000  f32[4][MAXM]   PowerSGD: the columns of Mᵀ·P being accumulated (256 KiB)
//   PR  0x160000  f32[BLOCK/4][4] PowerSGD: rows of P, 4 columns each, zero-padded (256 KiB)
//   O   0x1A0000  f32[BLOCK]     PowerSGD: a block of the decoded aggregate, or (feedbackMatMul with
//                                $owed) rows of last step's P̂, 4 columns each, zero-padded (256 KiB)
// BLOCK = 65536 elements, MAXM = 16384. Lengths need not be multiples of the vector width (tails
// go 1 by 1), except the PowerSGD row length m, which must be a multiple of 4.

const QC = 0x0a0000
const WC = 0x0e0000
const ACC = 0x120000
const PR = 0x160000
const O = 0x1a0000
const C = (v) => `(v128.const i32x4 ${v} ${v} ${v} ${v})`

/**
 * binary16 bits (low 16 bits of each i32 lane) of the f32 lanes in local $x<s>: F. Giesen's
 * round-to-nearest-even "fast3", branch-free. The absolute value's bits are < 2^31, so the signed
 * compares (one SSE instruction each, the unsigned ones are not) give the same answer.
 * Uses locals $x<s> $sign<s> $f<s>.
 */
const enc4 = (s) => `
    (local.set $sign${s} (v128.and (local.get $x${s}) ${C("0x80000000")}))
    (local.set $f${s} (v128.xor (local.get $x${s}) (local.get $sign${s})))
    (v128.or
      (v128.bitselect
        ;; overflow -> Inf, NaN -> quiet NaN
        (v128.bitselect ${C("0x7e00")} ${C("0x7c00")} (i32x4.gt_s (local.get $f${s}) ${C("0x7f800000")}))
        (v128.bitselect
          ;; subnormal or zero: bits(|x| + 0.5) - bits(0.5); fp32's own rounding rounds to nearest even
          (i32x4.sub (f32x4.add (local.get $f${s}) ${C("0x3f000000")}) ${C("0x3f000000")})
          ;; normal: (f + ((15 - 127) << 23) + 0xfff + ((f >> 13) & 1)) >> 13
          (i32x4.shr_u
            (i32x4.add (i32x4.add (local.get $f${s}) ${C("0xc8000fff")}) (v128.and (i32x4.shr_u (local.get $f${s}) (i32.const 13)) ${C("1")}))
            (i32.const 13))
          (i32x4.lt_s (local.get $f${s}) ${C("0x38800000")}))
        (i32x4.ge_s (local.get $f${s}) ${C("0x47800000")}))
      (i32x4.shr_u (local.get $sign${s}) (i32.const 16)))`

/**
 * f32 lanes from the binary16 bits in the i32 lanes of local $w<s>, with integer arithmetic only,
 * but for one subtraction of normal numbers: the bits shifted into place and the exponent re-biased
 * (by 112, and by 112 more for Inf/NaN, which keeps a NaN's payload); a zero or subnormal m·2^-24
 * as (2^-14 + m·2^-24) - 2^-14, exact. No lane ever holds an fp32 subnormal: multiplying one (the
 * usual shift-and-scale trick) takes a microcode assist on x86, ten times slower per element, and
 * gradients below 2^-14 (binary16's subnormals) are common. Uses locals $w<s> $o<s> $z<s>.
 */
const dec4 = (s) => `
    (local.set $o${s} (i32x4.shl (v128.and (local.get $w${s}) ${C("0x7fff")}) (i32.const 13)))
    (local.set $z${s} (v128.and (local.get $o${s}) ${C("0x0f800000")}))
    (local.set $o${s}
      (i32x4.add
        (i32x4.add (local.get $o${s}) ${C("0x38000000")})
        (v128.and (i32x4.eq (local.get $z${s}) ${C("0x0f800000")}) ${C("0x38000000")})))
    (v128.or
      (v128.bitselect
        (f32x4.sub (i32x4.add (local.get $o${s}) ${C("0x00800000")}) ${C("0x38800000")})
        (local.get $o${s})
        (i32x4.eq (local.get $z${s}) ${C("0")}))
      (i32x4.shl (v128.and (local.get $w${s}) ${C("0x8000")}) (i32.const 16)))`

/**
 * value(half(x)) for the f32 lanes in local $x<s>, computed in fp32 without the binary16 bits:
 * the same values (and NaN bits) as dec4 after enc4, in about half the instructions. |x| below
 * 2^-14 (binary16's subnormals): (|x| + 0.5) - 0.5, the add rounding to a multiple of 2^-24 to
 * nearest even; from 65520 (the tie above 65504, which rounds up): Inf, NaN -> quiet NaN;
 * otherwise the low 13 mantissa bits rounded off to nearest even in the integer domain (a carry
 * into the exponent is the right answer). Uses locals $x<s> $sign<s> $f<s>.
 */
const round4 = (s) => `
    (local.set $sign${s} (v128.and (local.get $x${s}) ${C("0x80000000")}))
    (local.set $f${s} (v128.xor (local.get $x${s}) (local.get $sign${s})))
    (v128.or
      (v128.bitselect
        (f32x4.sub (f32x4.add (local.get $f${s}) ${C("0x3f000000")}) ${C("0x3f000000")})
        (v128.bitselect
          (v128.bitselect ${C("0x7fc00000")} ${C("0x7f800000")} (i32x4.gt_s (local.get $f${s}) ${C("0x7f800000")}))
          (v128.and
            (i32x4.add (i32x4.add (local.get $f${s}) ${C("0xfff")}) (v128.and (i32x4.shr_u (local.get $f${s}) (i32.const 13)) ${C("1")}))
            ${C("0xffffe000")})
          (i32x4.ge_s (local.get $f${s}) ${C("0x477ff000")}))
        (i32x4.lt_s (local.get $f${s}) ${C("0x38800000")}))
      (local.get $sign${s}))`

/**
 * enc4 and round4 at once, for the f32 lanes in local $x<s>: the binary16 bits to $w<s> (as enc4)
 * and their value to $v<s> (as dec4 of them, or round4), sharing the work: |x| + 0.5 serves the
 * subnormal bits and value, and the normal bits are the rounded value's bits shifted down (its low
 * 13 bits are zero, the exponent re-biased by 112 << 23). About 25 instructions a vector instead of
 * enc4 and dec4's 32; the constant selects for Inf and NaN are an or and an and (a bitselect is
 * three instructions on SSE). Uses locals $x<s> $sign<s> $f<s> $t<s> $o<s> $small<s> $big<s>
 * $nan<s> $w<s> $v<s>.
 */
const encRound4 = (s) => `
    (local.set $sign${s} (v128.and (local.get $x${s}) ${C("0x80000000")}))
    (local.set $f${s} (v128.xor (local.get $x${s}) (local.get $sign${s})))
    (local.set $t${s} (f32x4.add (local.get $f${s}) ${C("0x3f000000")}))
    (local.set $o${s}
      (v128.and
        (i32x4.add (i32x4.add (local.get $f${s}) ${C("0xfff")}) (v128.and (i32x4.shr_u (local.get $f${s}) (i32.const 13)) ${C("1")}))
        ${C("0xffffe000")}))
    (local.set $small${s} (i32x4.lt_s (local.get $f${s}) ${C("0x38800000")}))
    (local.set $big${s} (i32x4.ge_s (local.get $f${s}) ${C("0x477ff000")}))
    (local.set $nan${s} (i32x4.gt_s (local.get $f${s}) ${C("0x7f800000")}))
    (local.set $w${s}
      (v128.or
        (v128.bitselect
          (i32x4.sub (local.get $t${s}) ${C("0x3f000000")})
          (v128.bitselect
            (v128.or ${C("0x7c00")} (v128.and (local.get $nan${s}) ${C("0x200")}))
            (i32x4.shr_u (i32x4.sub (local.get $o${s}) ${C("0x38000000")}) (i32.const 13))
            (local.get $big${s}))
          (local.get $small${s}))
        (i32x4.shr_u (local.get $sign${s}) (i32.const 16))))
    (local.set $v${s}
      (v128.or
        (v128.bitselect
          (f32x4.sub (local.get $t${s}) ${C("0x3f000000")})
          (v128.bitselect
            (v128.or ${C("0x7f800000")} (v128.and (local.get $nan${s}) ${C("0x00400000")}))
            (local.get $o${s})
            (local.get $big${s}))
          (local.get $small${s}))
        (local.get $sign${s})))`

const encRoundLocals = (...ss) =>
  ss.map((s) => ["x", "sign", "f", "t", "o", "small", "big", "nan", "w", "v"].map((n) => `(local $${n}${s} v128)`).join(" ")).join(" ")

const encLocals = (...ss) => ss.map((s) => `(local $x${s} v128) (local $sign${s} v128) (local $f${s} v128)`).join(" ")
const decLocals = (...ss) => ss.map((s) => `(local $w${s} v128) (local $o${s} v128) (local $z${s} v128)`).join(" ")

/**
 * A loop over i = 0, step, 2·step, ... while i + step <= n, then a scalar tail loop i < n. Sets the
 * element addresses $p = $a + 4i, and when the kernel has them $r = $b + 4i and $q = $h + 2i.
 */
const loops = (step, body, tail, { b = false, h = false } = {}) => {
  const at = `(local.set $p (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2))))
      ${b ? "(local.set $r (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2))))" : ""}
      ${h ? "(local.set $q (i32.add (local.get $h) (i32.shl (local.get $i) (i32.const 1))))" : ""}`
  return `
    (block $done (loop $l
      (br_if $done (i32.gt_u (i32.add (local.get $i) (i32.const ${step})) (local.get $n)))
      ${at}
      ${body}
      (local.set $i (i32.add (local.get $i) (i32.const ${step})))
      (br $l)))
    (block $tdone (loop $t
      (br_if $tdone (i32.ge_u (local.get $i) (local.get $n)))
      ${at}
      ${tail}
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $t)))`
}

/**
 * When `cond`, records index $base + $i + lane at $c[$count] and `value` at $cv[$count] (if
 * $count < $cap), and counts it.
 */
const keep = (cond, lane, value) => `(if ${cond} (then
           (if (i32.lt_u (local.get $count) (local.get $cap)) (then
             (i32.store (i32.add (local.get $c) (i32.shl (local.get $count) (i32.const 2)))
               (i32.add (local.get $base) (i32.add (local.get $i) (i32.const ${lane}))))
             (f32.store (i32.add (local.get $cv) (i32.shl (local.get $count) (i32.const 2))) ${value})))
           (local.set $count (i32.add (local.get $count) (i32.const 1)))))`

const idx = "(local $i i32) (local $p i32) (local $q i32) (local $r i32)"

/** The two f32 lanes of an f64x2 pair, packed as lanes 0-1 (a) and 2-3 (b) of one f32x4. */
const pack = (a, b) => `(i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (f32x4.demote_f64x2_zero ${a}) (f32x4.demote_f64x2_zero ${b}))`
const hiLanes = (v) => `(i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 ${v} ${v})`


/** f32((f64(a) + f64(b)) / $dv) for two f32x4 expressions, in double as the scalar loops compute it. */
const addDivideF64 = (a, b) =>
  pack(
    `(f64x2.div (f64x2.add (f64x2.promote_low_f32x4 ${a}) (f64x2.promote_low_f32x4 ${b})) (local.get $dv))`,
    `(f64x2.div (f64x2.add (f64x2.promote_low_f32x4 ${hiLanes(a)}) (f64x2.promote_low_f32x4 ${hiLanes(b)})) (local.get $dv))`
  )

/**
 * f32(x·s) for the f32 lanes in local `x`: one f32 multiply when s is an f32 value (then the product
 * is the same correctly rounded one), else in double as Math.fround(x * s) computes it. Uses
 * locals $sf (s as f32x4) and $sv (s as f64x2).
 */
const scaledF32 = (x) => `(f32x4.mul (local.get ${x}) (local.get $sf))`
const scaledF64 = (x) =>
  pack(
    `(f64x2.mul (f64x2.promote_low_f32x4 (local.get ${x})) (local.get $sv))`,
    `(f64x2.mul (f64x2.promote_low_f32x4 ${hiLanes(`(local.get ${x})`)}) (local.get $sv))`
  )

/** f32(a[i]·s) for the one element at $p, in double as Math.fround(x * s) computes it (the tails' scaledF32/F64). */
const scaledAt = `(f32.demote_f64 (f64.mul (f64.promote_f32 (f32.load (local.get $p))) (local.get $s)))`

/**
 * `loop(scaled)` twice, with the f32 product when $exact and the double one otherwise: the choice
 * made once per call, outside the loop (a branch per vector inside it costs ~20%).
 */
const eachScale = (loop) => `(if (local.get $exact) (then ${loop(scaledF32)}) (else ${loop(scaledF64)}))`

/** `loop(owed)` for both values of $owed, chosen once per call like eachScale. */
const eachOwed = (loop) => `(if (local.get $owed) (then ${loop(true)}) (else ${loop(false)}))`

/** Lanes summed in a fixed order: (l0 + l1) + (l2 + l3). */
const hsum = (v) => `(f32.add
        (f32.add (f32x4.extract_lane 0 (local.get ${v})) (f32x4.extract_lane 1 (local.get ${v})))
        (f32.add (f32x4.extract_lane 2 (local.get ${v})) (f32x4.extract_lane 3 (local.get ${v}))))`

/** ((p0·c0 + p1·c1) + p2·c2) + p3·c3 for the 4 column vectors at `base` + $q. */
const dot4 = (base) => `(f32x4.add (f32x4.add (f32x4.add
          (f32x4.mul (local.get $p0) (v128.load offset=${base} (local.get $q)))
          (f32x4.mul (local.get $p1) (v128.load offset=${base + 65536} (local.get $q))))
          (f32x4.mul (local.get $p2) (v128.load offset=${base + 2 * 65536} (local.get $q))))
          (f32x4.mul (local.get $p3) (v128.load offset=${base + 3 * 65536} (local.get $q))))`

/**
 * For each row i < $rows, with $p0..$p3 the 4 columns of PR row i splatted, and each j < $m in steps
 * of 4: `body`. Uses locals $i $j $p $p0..$p3.
 */
/**
 * For each row i < $rows, with $p0..$p3 = the 4 columns of PR row i (each splatted), and each
 * j < $m in steps of 4: `body`. Uses locals $i $j $p $p0 $p1 $p2 $p3.
 */
const overRowsOfP = (body) => `
    (block $rdone (loop $rows_l
      (br_if $rdone (i32.ge_u (local.get $i) (local.get $rows)))
      (local.set $p (i32.shl (local.get $i) (i32.const 4)))
      (local.set $p0 (v128.load32_splat offset=${PR} (local.get $p)))
      (local.set $p1 (v128.load32_splat offset=${PR + 4} (local.get $p)))
      (local.set $p2 (v128.load32_splat offset=${PR + 8} (local.get $p)))
      (local.set $p3 (v128.load32_splat offset=${PR + 12} (local.get $p)))
      (local.set $j (i32.const 0))
      (block $jdone (loop $j_l
        (br_if $jdone (i32.ge_u (local.get $j) (local.get $m)))
${body}
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $j_l)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rows_l)))`

/**
 * addScaledIntoHalf's vector body, 8 elements: the residual at $r when `withB`; with `store`, the
 * new binary16 value also goes to a[i] (encRound4 gives bits and value together). The message's
 * bits are decoded in slots 2 and 3.
 */
const addScaledBody = (scaled, withB, store) => `
       (local.set $hv (v128.load (local.get $q)))
       (local.set $w2 (i32x4.extend_low_i16x8_u (local.get $hv)))
       (local.set $w3 (i32x4.extend_high_i16x8_u (local.get $hv)))
       (local.set $x0 (v128.load (local.get $p)))
       (local.set $x1 (v128.load offset=16 (local.get $p)))
       (local.set $x0 ${withB ? `(f32x4.add ${scaled("$x0")} (v128.load (local.get $r)))` : scaled("$x0")})
       (local.set $x1 ${withB ? `(f32x4.add ${scaled("$x1")} (v128.load offset=16 (local.get $r)))` : scaled("$x1")})
       ${withB ? `(v128.store (local.get $r) ${C("0")}) (v128.store offset=16 (local.get $r) ${C("0")})` : ""}
       (local.set $x0 (f32x4.add (local.get $x0) (block (result v128) ${dec4(2)})))
       (local.set $x1 (f32x4.add (local.get $x1) (block (result v128) ${dec4(3)})))
       ${
         store
           ? `${encRound4(0)}
       ${encRound4(1)}
       (v128.store (local.get $q) (i16x8.narrow_i32x4_u (local.get $w0) (local.get $w1)))
       (v128.store (local.get $p) (local.get $v0))
       (v128.store offset=16 (local.get $p) (local.get $v1))`
           : `(v128.store (local.get $q) (i16x8.narrow_i32x4_u (block (result v128) ${enc4(0)}) (block (result v128) ${enc4(1)})))`
       }`

/** addScaledIntoHalf's tail, one element (the product in double: the same value when s is an f32). */
const addScaledTail = (withB, store) => {
  const x = withB ? `(f32.add ${scaledAt} (f32.load (local.get $r)))` : scaledAt
  return `(local.set $bits (call $enc1 (i32.reinterpret_f32 (f32.add ${x} (call $dec1 (i32.load16_u (local.get $q)))))))
       (i32.store16 (local.get $q) (local.get $bits))
       ${withB ? "(f32.store (local.get $r) (f32.const 0))" : ""}
       ${store ? "(f32.store (local.get $p) (call $dec1 (local.get $bits)))" : ""}`
}


// ---- int8 (QSGD) ----

/** mulberry32's increment, and its multiples (the states of consecutive draws). */
const MB = 0x6d2b79f5
const mbStep = (k) => Math.imul(MB, k) >>> 0

/** mulberry32's output for the i32x4 states in `st` into $t (int8.ts's recurrence, lane-wise; imul is i32x4.mul). */
const mulberry4 = (st) => `
    (local.set $t (i32x4.mul (v128.xor ${st} (i32x4.shr_u ${st} (i32.const 15))) (v128.or ${st} ${C(1)})))
    (local.set $t (v128.xor
      (i32x4.add (local.get $t) (i32x4.mul (v128.xor (local.get $t) (i32x4.shr_u (local.get $t) (i32.const 7))) (v128.or (local.get $t) ${C(61)})))
      (local.get $t)))
    (local.set $t (v128.xor (local.get $t) (i32x4.shr_u (local.get $t) (i32.const 14))))`

/** f32 lanes (d + 0.5)·2^-16 of the u16 values in the i32 lanes of `d` (exact in f32). */
const dither4 = (d) => `(f32x4.mul (f32x4.add (f32x4.convert_i32x4_u ${d}) (v128.const f32x4 0.5 0.5 0.5 0.5)) (v128.const f32x4 0x1p-16 0x1p-16 0x1p-16 0x1p-16))`

/**
 * floor(f64(a)·inv + f64(d)) for the two low f32 lanes of `a` and `d`, in double as int8.ts
 * computes it (there `| 0` of a value in [0, 129)), as the low 32 bits of each f64 lane: floor(y)
 * + 2^52 holds the integer in its low mantissa bits (three instructions where trunc_sat takes eight).
 */
const quant2 = (a, d) =>
  `(f64x2.add (f64x2.floor (f64x2.add (f64x2.mul (f64x2.promote_low_f32x4 ${a}) (local.get $invv)) (f64x2.promote_low_f32x4 ${d}))) (v128.const f64x2 0x1p52 0x1p52))`

/**
 * The signed levels of the 4 f32 lanes of local `x` with the f32 dither lanes `d`: quant2 of
 * |x|, at most 127, negated where x's sign bit is set ((v ^ m) - m with m = x >> 31, as int8.ts does).
 */
const levels4 = (x, d) => `(i32x4.sub
      (v128.xor
        (i32x4.min_s
          (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27
            ${quant2(`(f32x4.abs (local.get ${x}))`, d)}
            ${quant2(hiLanes(`(f32x4.abs (local.get ${x}))`), hiLanes(d))})
          ${C(127)})
        (i32x4.shr_s (local.get ${x}) (i32.const 31)))
      (i32x4.shr_s (local.get ${x}) (i32.const 31)))`

/** f32(f64(q)·step) for the i32 lanes of `q` (the decoded value of int8 levels, in double as int8.ts computes it). */
const dequant4 = (q) =>
  pack(
    `(f64x2.mul (f64x2.convert_low_i32x4_s ${q}) (local.get $stepv))`,
    `(f64x2.mul (f64x2.convert_low_i32x4_s ${hiLanes(q)}) (local.get $stepv))`
  )

export const wat = `
(module
  (memory (export "memory") 32)

  ;; one-lane helpers for the tails
  (func $enc1 (param $v i32) (result i32) ${encLocals(0)}
    (local.set $x0 (i32x4.splat (local.get $v)))
    (i32x4.extract_lane 0 ${enc4(0)}))
  (func $dec1 (param $h i32) (result f32) ${decLocals(0)}
    (local.set $w0 (i32x4.splat (local.get $h)))
    (f32x4.extract_lane 0 ${dec4(0)}))

  ;; h[i] = half(a[i])
  (func (export "encode") (param $n i32) (param $a i32) (param $h i32) ${idx} ${encLocals(0, 1)}
    ${loops(
      8,
      `(local.set $x0 (v128.load (local.get $p)))
       (local.set $x1 (v128.load offset=16 (local.get $p)))
       (v128.store (local.get $q) (i16x8.narrow_i32x4_u (block (result v128) ${enc4(0)}) (block (result v128) ${enc4(1)})))`,
      `(i32.store16 (local.get $q) (call $enc1 (i32.load (local.get $p))))`,
      { h: true }
    )})

  ;; a[i] = value(h[i]) ($add = 0), or a[i] += value(h[i]) (f32 addition, as a Float32Array store of a JS sum)
  (func (export "decode") (param $n i32) (param $a i32) (param $h i32) (param $add i32) ${idx} ${decLocals(0, 1)} (local $hv v128) (local $lo v128) (local $hi v128)
    ${loops(
      8,
      `(local.set $hv (v128.load (local.get $q)))
       (local.set $w0 (i32x4.extend_low_i16x8_u (local.get $hv)))
       (local.set $w1 (i32x4.extend_high_i16x8_u (local.get $hv)))
       (local.set $lo (block (result v128) ${dec4(0)}))
       (local.set $hi (block (result v128) ${dec4(1)}))
       (if (local.get $add) (then
         (local.set $lo (f32x4.add (v128.load (local.get $p)) (local.get $lo)))
         (local.set $hi (f32x4.add (v128.load offset=16 (local.get $p)) (local.get $hi)))))
       (v128.store (local.get $p) (local.get $lo))
       (v128.store offset=16 (local.get $p) (local.get $hi))`,
      `(f32.store (local.get $p)
         (f32.add (if (result f32) (local.get $add) (then (f32.load (local.get $p))) (else (f32.const 0)))
                  (call $dec1 (i32.load16_u (local.get $q)))))`,
      { h: true }
    )})

  ;; h[i] = half(a[i] + value(h[i])) (f32 addition): a ring relay's partial sum, added into the received
  ;; binary16 message itself and sent on as is; a is only read
  (func (export "addIntoHalf") (param $n i32) (param $a i32) (param $h i32) ${idx} ${encLocals(0, 1)} ${decLocals(0, 1)} (local $hv v128)
    ${loops(
      8,
      `(local.set $hv (v128.load (local.get $q)))
       (local.set $w0 (i32x4.extend_low_i16x8_u (local.get $hv)))
       (local.set $w1 (i32x4.extend_high_i16x8_u (local.get $hv)))
       (local.set $x0 (f32x4.add (v128.load (local.get $p)) (block (result v128) ${dec4(0)})))
       (local.set $x1 (f32x4.add (v128.load offset=16 (local.get $p)) (block (result v128) ${dec4(1)})))
       (v128.store (local.get $q) (i16x8.narrow_i32x4_u (block (result v128) ${enc4(0)}) (block (result v128) ${enc4(1)})))`,
      `(i32.store16 (local.get $q)
         (call $enc1 (i32.reinterpret_f32 (f32.add (f32.load (local.get $p)) (call $dec1 (i32.load16_u (local.get $q)))))))`,
      { h: true }
    )})

  ;; h[i] = half(value(a[i]) + value(h[i])) (f32 addition) with a binary16 too: a relay's partial sum when
  ;; its own values are binary16 bits (halfInput); the same bits as decoding a into f32 and addIntoHalf
  (func (export "addHalfIntoHalf") (param $n i32) (param $a i32) (param $h i32) ${idx} ${encLocals(0, 1)} ${decLocals(0, 1, 2, 3)} (local $hv v128) (local $av v128)
    ${loops(
      8,
      `(local.set $hv (v128.load (local.get $q)))
       (local.set $av (v128.load (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 1)))))
       (local.set $w0 (i32x4.extend_low_i16x8_u (local.get $hv)))
       (local.set $w1 (i32x4.extend_high_i16x8_u (local.get $hv)))
       (local.set $w2 (i32x4.extend_low_i16x8_u (local.get $av)))
       (local.set $w3 (i32x4.extend_high_i16x8_u (local.get $av)))
       (local.set $x0 (f32x4.add (block (result v128) ${dec4(2)}) (block (result v128) ${dec4(0)})))
       (local.set $x1 (f32x4.add (block (result v128) ${dec4(3)}) (block (result v128) ${dec4(1)})))
       (v128.store (local.get $q) (i16x8.narrow_i32x4_u (block (result v128) ${enc4(0)}) (block (result v128) ${enc4(1)})))`,
      `(i32.store16 (local.get $q)
         (call $enc1 (i32.reinterpret_f32 (f32.add
           (call $dec1 (i32.load16_u (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 1)))))
           (call $dec1 (i32.load16_u (local.get $q)))))))`,
      { h: true }
    )})

  ;; h[i] = half(x + value(h[i])) (f32 addition) with x = f32(a[i]·s) ($withB = 0), or x = f32(f32(a[i]·s) + b[i])
  ;; and then b[i] = 0 ($withB = 1): a ring relay's (or owner's) partial sum when its own values are still
  ;; an fp32 gradient to be scaled, with an error-feedback residual that may hold something there, folded
  ;; in and spent. With $store, a[i] = value(h[i]) afterwards (the owner's finished values); otherwise a is
  ;; only read. f32(a·s) as in halfFeedbackBits ($exact: one f32 multiply).
  (func (export "addScaledIntoHalf") (param $n i32) (param $a i32) (param $b i32) (param $h i32) (param $s f64) (param $exact i32) (param $withB i32) (param $store i32)
    ${idx} ${encRoundLocals(0, 1)} ${decLocals(2, 3)} (local $hv v128) (local $sv v128) (local $sf v128) (local $bits i32)
    (local.set $sv (f64x2.splat (local.get $s)))
    (local.set $sf (f32x4.splat (f32.demote_f64 (local.get $s))))
    ${[true, false]
      .map(
        (store) => `(if (i32.eq (local.get $store) (i32.const ${store ? 1 : 0})) (then
    (if (local.get $withB)
      (then ${eachScale((scaled) => loops(8, addScaledBody(scaled, true, store), addScaledTail(true, store), { b: true, h: true }))})
      (else ${eachScale((scaled) => loops(8, addScaledBody(scaled, false, store), addScaledTail(false, store), { h: true }))}))))`
      )
      .join("\n    ")})

  ;; a[i] = f32((f64(a[i]) + f64(value(h[i]))) / d): a region owner's last addition and a mean's division,
  ;; in double as the scalar loop computes it
  (func (export "decodeAddDivide") (param $n i32) (param $a i32) (param $h i32) (param $d f64) ${idx} ${decLocals(0)} (local $s v128) (local $av v128) (local $dv v128)
    (local.set $dv (f64x2.splat (local.get $d)))
    ${loops(
      4,
      `(local.set $w0 (i32x4.extend_low_i16x8_u (v128.load64_zero (local.get $q))))
       (local.set $s (block (result v128) ${dec4(0)}))
       (local.set $av (v128.load (local.get $p)))
       (v128.store (local.get $p)
         ${addDivideF64("(local.get $av)", "(local.get $s)")})`,
      `(f32.store (local.get $p)
         (f32.demote_f64 (f64.div
           (f64.add (f64.promote_f32 (f32.load (local.get $p))) (f64.promote_f32 (call $dec1 (i32.load16_u (local.get $q)))))
           (local.get $d))))`,
      { h: true }
    )})

  ;; ---- fp32 on the wire: the reductions of the plain all-reduce, as the scalar loops of ../kernels.ts
  ;; compute them (a JavaScript double rounded to f32 on store). An f32 sum, product or quotient of
  ;; two f32 values is the same whether rounded once or through double, so where the scalar loop's
  ;; other operand is an f32 value one f32 instruction gives its bits.

  ;; a[i] = f32(a[i] + b[i])
  (func (export "addF32") (param $n i32) (param $a i32) (param $b i32) ${idx}
    ${loops(
      8,
      `(v128.store (local.get $p) (f32x4.add (v128.load (local.get $p)) (v128.load (local.get $r))))
       (v128.store offset=16 (local.get $p) (f32x4.add (v128.load offset=16 (local.get $p)) (v128.load offset=16 (local.get $r))))`,
      `(f32.store (local.get $p) (f32.add (f32.load (local.get $p)) (f32.load (local.get $r))))`,
      { b: true }
    )})

  ;; a[i] = f32((f64(a[i]) + f64(b[i])) / d): a region owner's last addition and a mean's division, in double
  (func (export "addDivideF32") (param $n i32) (param $a i32) (param $b i32) (param $d f64) ${idx} (local $av v128) (local $bv v128) (local $dv v128)
    (local.set $dv (f64x2.splat (local.get $d)))
    ${loops(
      4,
      `(local.set $av (v128.load (local.get $p)))
       (local.set $bv (v128.load (local.get $r)))
       (v128.store (local.get $p)
         ${addDivideF64("(local.get $av)", "(local.get $bv)")})`,
      `(f32.store (local.get $p)
         (f32.demote_f64 (f64.div (f64.add (f64.promote_f32 (f32.load (local.get $p))) (f64.promote_f32 (f32.load (local.get $r)))) (local.get $d))))`,
      { b: true }
    )})

  ;; a[i] = f32(a[i]·s), the product in double unless s is an f32 value ($exact)
  (func (export "scaleF32") (param $n i32) (param $a i32) (param $s f64) (param $exact i32) ${idx} (local $x v128) (local $sv v128) (local $sf v128)
    (local.set $sv (f64x2.splat (local.get $s)))
    (local.set $sf (f32x4.splat (f32.demote_f64 (local.get $s))))
    ${eachScale((scaled) =>
      loops(
        4,
        `(local.set $x (v128.load (local.get $p)))
         (v128.store (local.get $p) ${scaled("$x")})`,
        `(f32.store (local.get $p) ${scaledAt})`
      )
    )})

  ;; a[i] = f32(a[i] / d), the quotient in double unless d is an f32 value ($exact)
  (func (export "divideF32") (param $n i32) (param $a i32) (param $d f64) (param $exact i32) ${idx} (local $x v128) (local $dv v128) (local $df v128)
    (local.set $dv (f64x2.splat (local.get $d)))
    (local.set $df (f32x4.splat (f32.demote_f64 (local.get $d))))
    (if (local.get $exact)
      (then ${loops(
        4,
        `(v128.store (local.get $p) (f32x4.div (v128.load (local.get $p)) (local.get $df)))`,
        `(f32.store (local.get $p) (f32.div (f32.load (local.get $p)) (f32.demote_f64 (local.get $d))))`
      )})
      (else ${loops(
        4,
        `(local.set $x (v128.load (local.get $p)))
         (v128.store (local.get $p)
           ${pack(
             `(f64x2.div (f64x2.promote_low_f32x4 (local.get $x)) (local.get $dv))`,
             `(f64x2.div (f64x2.promote_low_f32x4 ${hiLanes("(local.get $x)")}) (local.get $dv))`
           )})`,
        `(f32.store (local.get $p) (f32.demote_f64 (f64.div (f64.promote_f32 (f32.load (local.get $p))) (local.get $d))))`
      )})))

  ;; a[i] = value(half(a[i])): round to the nearest binary16 value, in place
  (func (export "roundHalf") (param $n i32) (param $a i32) ${idx} ${encLocals(0)} ${decLocals(0)}
    ${loops(
      4,
      `(local.set $x0 (v128.load (local.get $p)))
       (v128.store (local.get $p) (block (result v128) ${round4(0)}))`,
      `(f32.store (local.get $p) (call $dec1 (call $enc1 (i32.load (local.get $p)))))`
    )})

  ;; fp16 error feedback into binary16 bits: p = f32(f32(a·s) + b); h = half(p) (the bits sent); b = p - value(h).
  ;; a is only read. f32(a·s) is computed in double, as Math.fround(a * s) does: s need not be an f32
  ;; value. When it is ($exact = 1: every rank has the same weight, s = 1/p for p a power of two, or
  ;; s = 1), the f32 product is the same correctly rounded value and costs one instruction instead of eight.
  (func (export "halfFeedbackBits") (param $n i32) (param $a i32) (param $b i32) (param $h i32) (param $s f64) (param $exact i32)
    ${idx} ${encRoundLocals(0, 1)} (local $sv v128) (local $sf v128)
    (local.set $sv (f64x2.splat (local.get $s)))
    (local.set $sf (f32x4.splat (f32.demote_f64 (local.get $s))))
    ${eachScale((scaled) => loops(
      8,
      `(local.set $x0 (v128.load (local.get $p)))
       (local.set $x1 (v128.load offset=16 (local.get $p)))
       (local.set $x0 (f32x4.add ${scaled("$x0")} (v128.load (local.get $r))))
       (local.set $x1 (f32x4.add ${scaled("$x1")} (v128.load offset=16 (local.get $r))))
       ${encRound4(0)}
       ${encRound4(1)}
       (v128.store (local.get $q) (i16x8.narrow_i32x4_u (local.get $w0) (local.get $w1)))
       (v128.store (local.get $r) (f32x4.sub (local.get $x0) (local.get $v0)))
       (v128.store offset=16 (local.get $r) (f32x4.sub (local.get $x1) (local.get $v1)))`,
      `(local.set $x0 (f32x4.splat (f32.add
         ${scaledAt}
         (f32.load (local.get $r)))))
       ${encRound4(0)}
       (i32.store16 (local.get $q) (i32x4.extract_lane 0 (local.get $w0)))
       (f32.store (local.get $r) (f32x4.extract_lane 0 (f32x4.sub (local.get $x0) (local.get $v0))))`,
      { b: true, h: true }
    ))})

  ;; top-k error feedback, fused: b = f32(b + f32(a·s)) (the compensated p, as halfFeedback computes it);
  ;; the indices base + i of the elements with |p| >= thr or p NaN go to the u32 array at c and their
  ;; values p to the f32 array at cv, at most cap of them; returns how many there were (more than cap
  ;; means the threshold was too low).
  (func (export "topkCompensate") (param $n i32) (param $a i32) (param $b i32) (param $s f64) (param $exact i32)
    (param $thr f32) (param $c i32) (param $cv i32) (param $cap i32) (param $base i32) (result i32)
    ${idx} (local $x v128) (local $sv v128) (local $sf v128) (local $tv v128) (local $mask v128) (local $count i32) (local $x1 f32)
    (local.set $sv (f64x2.splat (local.get $s)))
    (local.set $sf (f32x4.splat (f32.demote_f64 (local.get $s))))
    (local.set $tv (f32x4.splat (local.get $thr)))
    ${eachScale((scaled) => loops(
      4,
      `(local.set $x (v128.load (local.get $p)))
       (local.set $x
         (f32x4.add
           ${scaled("$x")}
           (v128.load (local.get $r))))
       (v128.store (local.get $r) (local.get $x))
       (local.set $mask (v128.or (f32x4.ge (f32x4.abs (local.get $x)) (local.get $tv)) (f32x4.ne (local.get $x) (local.get $x))))
       (if (v128.any_true (local.get $mask)) (then
         ${[0, 1, 2, 3].map((l) => keep(`(i32x4.extract_lane ${l} (local.get $mask))`, l, `(f32x4.extract_lane ${l} (local.get $x))`)).join("\n         ")}))`,
      `(local.set $x1 (f32.add
         ${scaledAt}
         (f32.load (local.get $r))))
       (f32.store (local.get $r) (local.get $x1))
       ${keep("(i32.or (f32.ge (f32.abs (local.get $x1)) (local.get $thr)) (f32.ne (local.get $x1) (local.get $x1)))", 0, "(local.get $x1)")}`,
      { b: true }
    ))}
    (local.get $count))

  ;; ---- PowerSGD, rank <= 4 (columns beyond r are zero), rows of m floats, m a multiple of 4 ----
  ;; Sums run in f32 lanes. Only the decoded aggregate must be bitwise the same on every rank; its
  ;; order is fixed: ((p0·q0 + p1·q1) + p2·q2) + p3·q3 per element (matrix.ts's scalar loop does the same).

  ;; B = f32(B + f32(A·s)) (the residual becomes M = G·s + e); PR[i] = (M row i) · QC, 4 columns.
  ;; With $owed, the residual first pays the correction the last step left owing (PowerSGD defers
  ;; e -= P̂·Q_wᵀ to here): B = f32(f32(B - O[i]·WCᵀ) + f32(A·s)), the product formed as decodeOuter
  ;; forms it, so the residual is bitwise what the two passes would have made.
  (func (export "feedbackMatMul") (param $rows i32) (param $m i32) (param $s f64) (param $exact i32) (param $owed i32) (param $a i32) (param $b i32)
    (local $i i32) (local $j i32) (local $p i32) (local $v v128) (local $sf v128) (local $sv v128)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128) (local $q i32) (local $pr i32)
    (local $p0 v128) (local $p1 v128) (local $p2 v128) (local $p3 v128)
    (local.set $sf (f32x4.splat (f32.demote_f64 (local.get $s))))
    (local.set $sv (f64x2.splat (local.get $s)))
    ${eachOwed((owed) => eachScale((scaled) => `(local.set $i (i32.const 0)) (block $rdone (loop $rows_l
      (br_if $rdone (i32.ge_u (local.get $i) (local.get $rows)))
      (local.set $a0 (v128.const i32x4 0 0 0 0)) (local.set $a1 (v128.const i32x4 0 0 0 0))
      (local.set $a2 (v128.const i32x4 0 0 0 0)) (local.set $a3 (v128.const i32x4 0 0 0 0))
      (local.set $pr (i32.shl (local.get $i) (i32.const 4)))
      ${owed ? [0, 1, 2, 3].map((c) => `(local.set $p${c} (v128.load32_splat offset=${O + 4 * c} (local.get $pr)))`).join(" ") : ""}
      (local.set $j (i32.const 0))
      (block $jdone (loop $j_l
        (br_if $jdone (i32.ge_u (local.get $j) (local.get $m)))
        (local.set $p (i32.shl (i32.add (i32.mul (local.get $i) (local.get $m)) (local.get $j)) (i32.const 2)))
        (local.set $q (i32.shl (local.get $j) (i32.const 2)))
        (local.set $v (v128.load (i32.add (local.get $a) (local.get $p))))
        (local.set $v
          (f32x4.add ${owed ? `(f32x4.sub (v128.load (i32.add (local.get $b) (local.get $p))) ${dot4(WC)})` : "(v128.load (i32.add (local.get $b) (local.get $p)))"}
            ${scaled("$v")}))
        (v128.store (i32.add (local.get $b) (local.get $p)) (local.get $v))
        (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $v) (v128.load offset=${QC} (local.get $q)))))
        (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $v) (v128.load offset=${QC + 65536} (local.get $q)))))
        (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (local.get $v) (v128.load offset=${QC + 2 * 65536} (local.get $q)))))
        (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (local.get $v) (v128.load offset=${QC + 3 * 65536} (local.get $q)))))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $j_l)))
      (f32.store offset=${PR} (local.get $pr) ${hsum("$a0")})
      (f32.store offset=${PR + 4} (local.get $pr) ${hsum("$a1")})
      (f32.store offset=${PR + 8} (local.get $pr) ${hsum("$a2")})
      (f32.store offset=${PR + 12} (local.get $pr) ${hsum("$a3")})
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rows_l)))`))})

  ;; ACC[c][j] += a[i][j] · PR[i][c] over the rows of the block (ACC is zeroed by the caller per matrix).
  ;; Two rows per pass over ACC, (ACC + row i · PR[i]) + row i+1 · PR[i+1]: the same additions in the
  ;; same order as one row at a time, with half the loads and stores of ACC; an odd last row alone.
  (func (export "matMulT") (param $rows i32) (param $m i32) (param $a i32)
    (local $i i32) (local $j i32) (local $p i32) (local $q i32) (local $v v128) (local $w v128) (local $x i32) (local $y i32)
    (local $p0 v128) (local $p1 v128) (local $p2 v128) (local $p3 v128)
    (local $r0 v128) (local $r1 v128) (local $r2 v128) (local $r3 v128)
    (block $pdone (loop $pairs_l
      (br_if $pdone (i32.ge_u (i32.add (local.get $i) (i32.const 1)) (local.get $rows)))
      (local.set $p (i32.shl (local.get $i) (i32.const 4)))
      (local.set $p0 (v128.load32_splat offset=${PR} (local.get $p)))
      (local.set $p1 (v128.load32_splat offset=${PR + 4} (local.get $p)))
      (local.set $p2 (v128.load32_splat offset=${PR + 8} (local.get $p)))
      (local.set $p3 (v128.load32_splat offset=${PR + 12} (local.get $p)))
      (local.set $r0 (v128.load32_splat offset=${PR + 16} (local.get $p)))
      (local.set $r1 (v128.load32_splat offset=${PR + 20} (local.get $p)))
      (local.set $r2 (v128.load32_splat offset=${PR + 24} (local.get $p)))
      (local.set $r3 (v128.load32_splat offset=${PR + 28} (local.get $p)))
      (local.set $x (i32.add (local.get $a) (i32.shl (i32.mul (local.get $i) (local.get $m)) (i32.const 2))))
      (local.set $y (i32.add (local.get $x) (i32.shl (local.get $m) (i32.const 2))))
      (local.set $q (i32.const 0))
      (block $jdone (loop $j_l
        (br_if $jdone (i32.ge_u (local.get $q) (i32.shl (local.get $m) (i32.const 2))))
        (local.set $v (v128.load (i32.add (local.get $x) (local.get $q))))
        (local.set $w (v128.load (i32.add (local.get $y) (local.get $q))))
        ${[0, 1, 2, 3]
          .map(
            (c) => `(v128.store offset=${ACC + c * 65536} (local.get $q)
          (f32x4.add (f32x4.add (v128.load offset=${ACC + c * 65536} (local.get $q)) (f32x4.mul (local.get $v) (local.get $p${c})))
            (f32x4.mul (local.get $w) (local.get $r${c}))))`
          )
          .join("\n        ")}
        (local.set $q (i32.add (local.get $q) (i32.const 16)))
        (br $j_l)))
      (local.set $i (i32.add (local.get $i) (i32.const 2)))
      (br $pairs_l)))
    ${overRowsOfP(`
        (local.set $v (v128.load (i32.add (local.get $a) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $m)) (local.get $j)) (i32.const 2)))))
        (local.set $q (i32.shl (local.get $j) (i32.const 2)))
        (v128.store offset=${ACC} (local.get $q) (f32x4.add (v128.load offset=${ACC} (local.get $q)) (f32x4.mul (local.get $v) (local.get $p0))))
        (v128.store offset=${ACC + 65536} (local.get $q) (f32x4.add (v128.load offset=${ACC + 65536} (local.get $q)) (f32x4.mul (local.get $v) (local.get $p1))))
        (v128.store offset=${ACC + 2 * 65536} (local.get $q) (f32x4.add (v128.load offset=${ACC + 2 * 65536} (local.get $q)) (f32x4.mul (local.get $v) (local.get $p2))))
        (v128.store offset=${ACC + 3 * 65536} (local.get $q) (f32x4.add (v128.load offset=${ACC + 3 * 65536} (local.get $q)) (f32x4.mul (local.get $v) (local.get $p3))))`)})

  ;; o = PR · QCᵀ (the decoded aggregate)
  (func (export "decodeOuter") (param $rows i32) (param $m i32) (param $o i32)
    (local $i i32) (local $j i32) (local $p i32) (local $q i32) (local $x i32)
    (local $p0 v128) (local $p1 v128) (local $p2 v128) (local $p3 v128)
    ${overRowsOfP(`
        (local.set $x (i32.shl (i32.add (i32.mul (local.get $i) (local.get $m)) (local.get $j)) (i32.const 2)))
        (local.set $q (i32.shl (local.get $j) (i32.const 2)))
        (v128.store (i32.add (local.get $o) (local.get $x)) ${dot4(QC)})`)})

  ;; ---- int8 stochastic quantization (int8.ts), error feedback fused ----

  ;; mulberry32's output for the state $s (already advanced)
  (func $mb (param $s i32) (result i32) (local $t i32)
    (local.set $t (i32.mul (i32.xor (local.get $s) (i32.shr_u (local.get $s) (i32.const 15))) (i32.or (local.get $s) (i32.const 1))))
    (local.set $t (i32.xor (i32.add (local.get $t) (i32.mul (i32.xor (local.get $t) (i32.shr_u (local.get $t) (i32.const 7))) (i32.or (local.get $t) (i32.const 61)))) (local.get $t)))
    (i32.xor (local.get $t) (i32.shr_u (local.get $t) (i32.const 14))))

  ;; the signed level of x with the 16-bit dither d: as int8.ts's scalar loop
  (func $q1 (param $x f32) (param $inv f64) (param $d i32) (result i32) (local $v i32) (local $m i32)
    (local.set $v (i32.trunc_sat_f64_s (f64.add
      (f64.mul (f64.promote_f32 (f32.abs (local.get $x))) (local.get $inv))
      (f64.mul (f64.add (f64.convert_i32_u (local.get $d)) (f64.const 0.5)) (f64.const 0x1p-16)))))
    (if (i32.gt_s (local.get $v) (i32.const 127)) (then (local.set $v (i32.const 127))))
    (local.set $m (i32.shr_s (i32.reinterpret_f32 (local.get $x)) (i32.const 31)))
    (i32.sub (i32.xor (local.get $v) (local.get $m)) (local.get $m)))

  ;; b[i] = p = f32(b[i] + f32(a[i]·s)); then per chunk of $c elements the int8 message of p as
  ;; Int8Compressor.encode writes it (scale f32 at $sc + 4k, levels at $q + i, the dither drawn from
  ;; mulberry32 state $seed on) and the residual b[i] = f32(p - f32(level·scale/127)), as
  ;; accumulate(message, b, -1) leaves it. Returns the state after the last draw.
  (func (export "int8Feedback") (param $n i32) (param $a i32) (param $b i32) (param $s f64) (param $exact i32)
    (param $c i32) (param $q i32) (param $sc i32) (param $seed i32) (result i32)
    (local $i i32) (local $j i32) (local $p i32) (local $r i32) (local $lo i32) (local $hi i32) (local $k i32)
    (local $x v128) (local $mx v128) (local $m f32) (local $x1 f32)
    (local $sv v128) (local $sf v128) (local $inv f64) (local $step f64) (local $invv v128) (local $stepv v128)
    (local $t v128) (local $d0 v128) (local $d1 v128) (local $x0 v128) (local $xh v128) (local $v0 v128) (local $v1 v128)
    (local $tt i32) (local $l i32) (local $lv i32)
    (local.set $sv (f64x2.splat (local.get $s)))
    (local.set $sf (f32x4.splat (f32.demote_f64 (local.get $s))))
    (block $cdone (loop $chunks
      (br_if $cdone (i32.ge_u (local.get $lo) (local.get $n)))
      (local.set $hi (i32.add (local.get $lo) (local.get $c)))
      (if (i32.gt_u (local.get $hi) (local.get $n)) (then (local.set $hi (local.get $n))))
      ;; compensate, and the chunk's max |p| (NaN when any p is NaN): as unsigned integers the bits of
      ;; |p| order as their values do, with every NaN above infinity, and pmaxud is one instruction
      ;; (f32x4.max's NaN rules take eight, in a chain carried from each iteration to the next)
      (local.set $mx (v128.const i32x4 0 0 0 0))
      (local.set $i (local.get $lo))
      ${eachScale((scaled) => `
      (block $vdone (loop $vl
        (br_if $vdone (i32.gt_u (i32.add (local.get $i) (i32.const 4)) (local.get $hi)))
        (local.set $p (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $r (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $x (v128.load (local.get $p)))
        (local.set $x (f32x4.add ${scaled("$x")} (v128.load (local.get $r))))
        (v128.store (local.get $r) (local.get $x))
        (local.set $mx (i32x4.max_u (local.get $mx) (f32x4.abs (local.get $x))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $vl)))`)}
      (block $tdone (loop $tl
        (br_if $tdone (i32.ge_u (local.get $i) (local.get $hi)))
        (local.set $p (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $r (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $x1 (f32.add
          ${scaledAt}
          (f32.load (local.get $r))))
        (f32.store (local.get $r) (local.get $x1))
        (local.set $mx (i32x4.max_u (local.get $mx) (f32x4.splat (f32.abs (local.get $x1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tl)))
      (local.set $mx (i32x4.max_u (local.get $mx) (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $mx) (local.get $mx))))
      (local.set $m (f32.reinterpret_i32 (select
        (i32x4.extract_lane 0 (local.get $mx)) (i32x4.extract_lane 1 (local.get $mx))
        (i32.gt_u (i32x4.extract_lane 0 (local.get $mx)) (i32x4.extract_lane 1 (local.get $mx))))))
      (local.set $l (i32.sub (local.get $hi) (local.get $lo)))
      (if (f32.lt (local.get $m) (f32.const inf))
        (then
          (f32.store (i32.add (local.get $sc) (i32.shl (local.get $k) (i32.const 2))) (local.get $m))
          (if (f32.gt (local.get $m) (f32.const 0))
            (then
              (local.set $inv (f64.div (f64.const 127) (f64.promote_f32 (local.get $m))))
              (local.set $step (f64.div (f64.promote_f32 (local.get $m)) (f64.const 127)))
              (local.set $invv (f64x2.splat (local.get $inv)))
              (local.set $stepv (f64x2.splat (local.get $step)))
              (local.set $i (local.get $lo))
              (block $qdone (loop $ql
                (br_if $qdone (i32.gt_u (i32.add (local.get $i) (i32.const 8)) (local.get $hi)))
                (local.set $r (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2))))
                ;; four draws, each dithering two elements (low 16 bits, then high)
                (local.set $x (i32x4.add (i32x4.splat (local.get $seed)) (v128.const i32x4 ${mbStep(1)} ${mbStep(2)} ${mbStep(3)} ${mbStep(4)})))
                ${mulberry4("(local.get $x)")}
                (local.set $seed (i32.add (local.get $seed) (i32.const ${mbStep(4) | 0})))
                (local.set $d0 (v128.and (local.get $t) ${C("0xffff")}))
                (local.set $d1 (i32x4.shr_u (local.get $t) (i32.const 16)))
                (local.set $t (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $d0) (local.get $d1)))
                (local.set $d1 (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $d0) (local.get $d1)))
                (local.set $d0 ${dither4("(local.get $t)")})
                (local.set $d1 ${dither4("(local.get $d1)")})
                (local.set $x0 (v128.load (local.get $r)))
                (local.set $xh (v128.load offset=16 (local.get $r)))
                (local.set $v0 ${levels4("$x0", "(local.get $d0)")})
                (local.set $v1 ${levels4("$xh", "(local.get $d1)")})
                (v128.store64_lane 0 (i32.add (local.get $q) (local.get $i))
                  (i8x16.narrow_i16x8_s (i16x8.narrow_i32x4_s (local.get $v0) (local.get $v1)) (i16x8.narrow_i32x4_s (local.get $v0) (local.get $v1))))
                (v128.store (local.get $r) (f32x4.sub (local.get $x0) ${dequant4("(local.get $v0)")}))
                (v128.store offset=16 (local.get $r) (f32x4.sub (local.get $xh) ${dequant4("(local.get $v1)")}))
                (local.set $i (i32.add (local.get $i) (i32.const 8)))
                (br $ql)))
              ;; the rest: a draw per pair, and one for a last single element
              (block $pdone (loop $pl
                (br_if $pdone (i32.ge_u (local.get $i) (local.get $hi)))
                (local.set $seed (i32.add (local.get $seed) (i32.const ${MB})))
                (local.set $tt (call $mb (local.get $seed)))
                (local.set $j (i32.const 0))
                (block $edone (loop $el
                  (br_if $edone (i32.or (i32.ge_u (local.get $j) (i32.const 2)) (i32.ge_u (local.get $i) (local.get $hi))))
                  (local.set $r (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2))))
                  (local.set $x1 (f32.load (local.get $r)))
                  (local.set $lv (call $q1 (local.get $x1) (local.get $inv) (i32.and (local.get $tt) (i32.const 0xffff))))
                  (i32.store8 (i32.add (local.get $q) (local.get $i)) (local.get $lv))
                  (f32.store (local.get $r) (f32.sub (local.get $x1) (f32.demote_f64 (f64.mul (f64.convert_i32_s (local.get $lv)) (local.get $step)))))
                  (local.set $tt (i32.shr_u (local.get $tt) (i32.const 16)))
                  (local.set $i (i32.add (local.get $i) (i32.const 1)))
                  (local.set $j (i32.add (local.get $j) (i32.const 1)))
                  (br $el)))
                (br $pl))))
            (else (memory.fill (i32.add (local.get $q) (local.get $lo)) (i32.const 0) (local.get $l)))))
        (else
          ;; a NaN or an infinity: scale NaN, levels 0, and the residual b + NaN (accumulate adds -1·NaN)
          (f32.store (i32.add (local.get $sc) (i32.shl (local.get $k) (i32.const 2))) (f32.const nan))
          (memory.fill (i32.add (local.get $q) (local.get $lo)) (i32.const 0) (local.get $l))
          (local.set $i (local.get $lo))
          (block $ndone (loop $nl
            (br_if $ndone (i32.ge_u (local.get $i) (local.get $hi)))
            (local.set $r (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2))))
            (f32.store (local.get $r) (f32.add (f32.load (local.get $r)) (f32.const nan)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $nl)))))
      (local.set $lo (local.get $hi))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $chunks)))
    (local.get $seed))

  ;; a[i] = f32(level·scale/127) ($assign) or a[i] = f32(a[i] + f32(level·scale/127)): an int8 message's
  ;; levels at $q + i and scales (f32, one per chunk of $c) at $sc, as accumulate(message, a, 1) adds them
  (func (export "int8AddInto") (param $n i32) (param $a i32) (param $q i32) (param $sc i32) (param $c i32) (param $assign i32)
    (local $i i32) (local $p i32) (local $lo i32) (local $hi i32) (local $k i32) (local $step f64) (local $stepv v128)
    (local $w v128) (local $v0 v128) (local $v1 v128) (local $y f32)
    (block $cdone (loop $chunks
      (br_if $cdone (i32.ge_u (local.get $lo) (local.get $n)))
      (local.set $hi (i32.add (local.get $lo) (local.get $c)))
      (if (i32.gt_u (local.get $hi) (local.get $n)) (then (local.set $hi (local.get $n))))
      (local.set $step (f64.div (f64.promote_f32 (f32.load (i32.add (local.get $sc) (i32.shl (local.get $k) (i32.const 2))))) (f64.const 127)))
      (local.set $stepv (f64x2.splat (local.get $step)))
      (local.set $i (local.get $lo))
      ${[true, false]
        .map(
          (assign) => `(if (i32.eq (local.get $assign) (i32.const ${assign ? 1 : 0})) (then
      (block $vdone (loop $vl
        (br_if $vdone (i32.gt_u (i32.add (local.get $i) (i32.const 8)) (local.get $hi)))
        (local.set $p (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $w (i16x8.extend_low_i8x16_s (v128.load64_zero (i32.add (local.get $q) (local.get $i)))))
        (local.set $v0 (i32x4.extend_low_i16x8_s (local.get $w)))
        (local.set $v1 (i32x4.extend_high_i16x8_s (local.get $w)))
        (v128.store (local.get $p) ${assign ? dequant4("(local.get $v0)") : `(f32x4.add (v128.load (local.get $p)) ${dequant4("(local.get $v0)")})`})
        (v128.store offset=16 (local.get $p) ${assign ? dequant4("(local.get $v1)") : `(f32x4.add (v128.load offset=16 (local.get $p)) ${dequant4("(local.get $v1)")})`})
        (local.set $i (i32.add (local.get $i) (i32.const 8)))
        (br $vl)))))`
        )
        .join("\n      ")}
      (block $tdone (loop $tl
        (br_if $tdone (i32.ge_u (local.get $i) (local.get $hi)))
        (local.set $p (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $y (f32.demote_f64 (f64.mul (f64.convert_i32_s (i32.load8_s (i32.add (local.get $q) (local.get $i)))) (local.get $step))))
        (f32.store (local.get $p) (if (result f32) (local.get $assign) (then (local.get $y)) (else (f32.add (f32.load (local.get $p)) (local.get $y)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tl)))
      (local.set $lo (local.get $hi))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $chunks))))
)
`
