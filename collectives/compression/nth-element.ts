// Selection without sorting: the k-th largest of an array in expected O(n), for top-k. A
// three-way partition keeps it linear when many values are equal (gradients full of zeros, or
// top-k of an all-zero tensor), where a two-way quickselect degrades to O(n²).

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
