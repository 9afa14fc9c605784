// Selection without sorting, for top-k: the k-th largest magnitude of an array by a radix select
// on the fp32 bits, three counting passes that never move an element, whatever the values (many
// equal ones included: gradients full of zeros, or top-k of an all-zero tensor).

/** Histogram for the counting passes (2^11 buckets), reused. */
const hist = new Uint32Array(2048)

/**
 * The counting passes of a radix select over fp32 magnitude bits u[0..len): for each [shift,
 * width], among the elements whose `known` bits equal `prefix`, counts their next `width` bits and
 * keeps the bucket that holds the element of rank `want` from the top. Returns the bits found
 * (`prefix`) and `want`, now the rank of that element among the elements equal to it (how many of
 * them to take, for ties). u is only read.
 */
export const radixRefine = (
  u: Uint32Array,
  len: number,
  passes: ReadonlyArray<readonly [shift: number, width: number]>,
  prefix: number,
  known: number,
  want: number
): { readonly prefix: number; readonly want: number } => {
  for (const [shift, width] of passes) {
    const mask = (1 << width) - 1
    hist.fill(0, 0, mask + 1)
    for (let i = 0; i < len; i++) {
      const v = u[i]
      if (((v & known) >>> 0) === prefix) hist[(v >>> shift) & mask]++
    }
    let b = mask
    while (hist[b] < want) want -= hist[b--]
    prefix = (prefix | (b << shift)) >>> 0
    known = (known | (mask << shift)) >>> 0
  }
  return { prefix, want }
}

const ALL_BITS: ReadonlyArray<readonly [number, number]> = [
  [21, 11],
  [10, 11],
  [0, 10]
]

/**
 * The k-th largest value (k >= 1) among a[0..len-1], for values that are all >= 0 or +0 (+Infinity
 * allowed; no NaN, no negative value or -0): top-k's magnitudes. `a` is left as it is: the bits of a non-negative fp32 value order like the value, so the answer
 * is found 11, 11, then 10 bits at a time, each pass counting the elements that share the bits
 * found so far. Three passes over a, whatever the values.
 */
export const kthLargestMagnitude = (a: Float32Array, len: number, k: number): number => {
  if (k < 1 || k > len) throw new RangeError(`kthLargestMagnitude: k=${k} outside 1..${len}`)
  const { prefix } = radixRefine(new Uint32Array(a.buffer, a.byteOffset, len), len, ALL_BITS, 0, 0, k)
  return new Float32Array(new Uint32Array([prefix]).buffer)[0]
}
