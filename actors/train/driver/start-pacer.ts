// Paces the start of a job's processes on each node: at most `limit(node)` of them starting at
// once (asked of the node's agent and not yet ready), the rest queued in the order they were asked.
// A process's start is its busiest time (Node loads some 600 modules, about 0.6 s of CPU), so more
// starts than the node has cores at once only share them, and starve the node's agent meanwhile:
// 50 workers asked at once of a 2-core machine's embedded cluster left its agent (in the driver's
// own process) unable to answer within its 10 s deadline, and the job failed before any worker ran.
// Paced three at a time, the same job trained (its 50 starts took 31 s; the cores were the bound).

/** Starts at once on a node with `cpus` cores: one more than its cores (so no core waits between two starts); no bound when unknown. */
export const startsAtOnce = (cpus: number | undefined): number =>
  cpus !== undefined && Number.isFinite(cpus) && cpus >= 1 ? Math.floor(cpus) + 1 : Infinity

export class StartPacer {
  /** Starts under way, by node. */
  readonly #running = new Map<string, number>()
  /** Starts waiting for a free place, by node, first asked first. */
  readonly #waiting = new Map<string, Array<() => void>>()
  readonly #limit: (node: string) => number

  /** `limit(node)`: how many starts may be under way on `node` at once (read at each start). */
  constructor(limit: (node: string) => number) {
    this.#limit = limit
  }

  /** Runs `start` once fewer than the node's limit are under way; its place is given back when it settles. */
  async run<T>(node: string, start: () => Promise<T>): Promise<T> {
    await this.#acquire(node)
    try {
      return await start()
    } finally {
      this.#release(node)
    }
  }

  /** Starts under way on `node` now. */
  running(node: string): number {
    return this.#running.get(node) ?? 0
  }

  /** Starts waiting on `node` now. */
  waiting(node: string): number {
    return this.#waiting.get(node)?.length ?? 0
  }

  #acquire(node: string): Promise<void> {
    const n = this.#running.get(node) ?? 0
    if (n < Math.max(1, this.#limit(node))) {
      this.#running.set(node, n + 1)
      return Promise.resolve()
    }
    return new Promise<void>((resolve) => {
      const queue = this.#waiting.get(node) ?? []
      queue.push(resolve)
      this.#waiting.set(node, queue)
    })
  }

  #release(node: string): void {
    const queue = this.#waiting.get(node)
    const next = queue?.shift()
    if (queue !== undefined && queue.length === 0) this.#waiting.delete(node)
    // The place passes straight to the next in line; otherwise it is freed.
    if (next !== undefined) next()
    else {
      const n = (this.#running.get(node) ?? 1) - 1
      if (n > 0) this.#running.set(node, n)
      else this.#running.delete(node)
    }
  }
}
