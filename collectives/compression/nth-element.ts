// Selection without sorting: the k-th largest of an array in expected O(n), for top-k. A
// three-way partition keeps it linear when many values are equal (gradients full of zeros, or
// top-k of an all-zero tensor), where a two-way quickselect degrades to O(n²). For magnitudes
// (no negative values), a radix select on the fp32 bits does the same in three counting passes
// that never move an element.

/**
 * Returns the k-th largest value (k >= 1) among a[0..len-1]. Permutes a[0..len-1]. Values must be
 * comparable (no NaN): top-k maps NaN magnitudes to +Infinity first.
 */
export const kthLargest = (a: Float32Array, len: number, k: number): number => {
  if (k < 1 || k > len) throw new RangeError(`kthLargest: k=${k} outside 1..${len}`)
  const t = len - k // rank in ascending order
  let lo = 0
  let hi = len - 1
  let seed = 0x2545f491 ^ len
  while (hi > lo) {
    // median of three pseudo-random samples: robust to sorted input and cheap
    seed = (Math.imul(seed, 1103515245) + 12345) | 0
    const span = hi - lo + 1
    const x = a[lo + ((seed >>> 8) % span)]
    const y = a[lo + ((seed >>> 3) % span)]
    const z = a[(lo + hi) >>> 1]
    const p = x < y ? (y < z ? y : x < z ? z : x) : x < z ? x : y < z ? z : y
    let lt = lo
    let i = lo
    let gt = hi
    while (i <= gt) {
      const v = a[i]
      if (v < p) {
        a[i] = a[lt]
        a[lt] = v
        lt++
        i++
      } else if (v > p) {
        a[i] = a[gt]
        a[gt] = v
        gt--
      } else i++
    }
    // a[lo..lt-1] < p, a[lt..gt] == p, a[gt+1..hi] > p
    if (t < lt) hi = lt - 1
    else if (t > gt) lo = gt + 1
    else return p
  }
  return a[lo]
}

/** Histogram for kthLargestMagnitude (2^11 buckets), reused. */
const hist = new Uint32Array(2048)

/**
 * The k-th largest value (k >= 1) among a[0..len-1], for values that are all >= 0 or +0 (+Infinity
 * allowed; no NaN, no negative value or -0): top-k's magnitudes. The same value as kthLargest,
 * without permuting `a`: the bits of a non-negative fp32 value order like the value, so the answer
 * is found 11, 11, then 10 bits at a time, each pass counting the elements that share the bits
 * found so far. Three passes over a, whatever the values.
 */
export const kthLargestMagnitude = (a: Float32Array, len: number, k: number): number => {
  if (k < 1 || k > len) throw new RangeError(`kthLargestMagnitude: k=${k} outside 1..${len}`)
  const u = new Uint32Array(a.buffer, a.byteOffset, len)
  let prefix = 0
  let known = 0 // mask of the bits found so far
  let want = k // rank among the elements that share `prefix`, from the top
  for (const [shift, width] of [
    [21, 11],
    [10, 11],
    [0, 10]
  ]) {
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
  return new Float32Array(new Uint32Array([prefix]).buffer)[0]
}
