// How a buffer is cut: into p segments (one per rank, for reduce-scatter ownership) and segments
// into chunks (the unit of pipelining and of one NATS message). Every rank computes the same cuts
// from (length, p, chunk size), so frames need not describe them and receivers can verify them.

/** Start of segment k of n elements over p parts: sizes differ by at most one, any n >= 0. */
export const segmentStart = (n: number, p: number, k: number): number => Math.floor((k * n) / p)

/** [start, end) of the segment rank `k` owns after a reduce-scatter of n elements over p ranks. */
export const segmentBounds = (n: number, p: number, k: number): readonly [number, number] => [segmentStart(n, p, k), segmentStart(n, p, k + 1)]

/**
 * Chunks of a region of `len` elements: at least one, so every step sends at least one frame
 * (an empty one for an empty region). That keeps the protocol uniform for any length, and every
 * receiver sees the sender's buffer length, which is how mismatched lengths are caught.
 */
export const chunkCount = (len: number, chunkElems: number): number => Math.max(1, Math.ceil(len / chunkElems))

/** Elements in chunk c of a region of `len` elements. */
export const chunkLength = (len: number, chunkElems: number, c: number): number => Math.max(0, Math.min(chunkElems, len - c * chunkElems))

export const mod = (a: number, m: number): number => ((a % m) + m) % m
