// Idle ArrayBuffers by size, for the NATS send and receive pools (nats-send.ts, nats-receive.ts):
// a buffer of at least n bytes is taken from the pool or made, and given back when its user is
// done. Sizes are rounded up to a step, so messages of one chunk size share buffers; past a cap
// on idle bytes, a buffer given back is left to the collector.
export class BufferPool {
  readonly #step: number
  readonly #maxIdleBytes: number
  readonly #idle = new Map<number, ArrayBuffer[]>()
  #idleBytes = 0
  /** Buffers taken, of those how many came from the pool, and buffers given back (tests). */
  readonly stats = { taken: 0, reused: 0, returned: 0 }

  constructor(step: number, maxIdleBytes: number) {
    this.#step = step
    this.#maxIdleBytes = maxIdleBytes
  }

  /** An idle buffer of at least n bytes, or a new one (`made` is told about new ones). */
  take(n: number, made?: (b: ArrayBuffer) => void): ArrayBuffer {
    const size = Math.ceil(n / this.#step) * this.#step
    this.stats.taken++
    const b = this.#idle.get(size)?.pop()
    if (b) {
      this.#idleBytes -= size
      this.stats.reused++
      return b
    }
    const fresh = new ArrayBuffer(size)
    made?.(fresh)
    return fresh
  }

  /** Makes `b` available to take; false when the pool is full and leaves it to the collector. */
  give(b: ArrayBuffer): boolean {
    this.stats.returned++
    if (this.#idleBytes + b.byteLength > this.#maxIdleBytes) return false
    let list = this.#idle.get(b.byteLength)
    if (!list) this.#idle.set(b.byteLength, (list = []))
    list.push(b)
    this.#idleBytes += b.byteLength
    return true
  }
}
