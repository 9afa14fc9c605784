// An actor's mailbox: a bounded FIFO whose items are handled one at a time, in arrival order.
// Plain JS on purpose: it sits on the ask hot path, and a handler that completes synchronously
// runs inside the NATS callback that delivered its message (no extra scheduler hop), while an
// asynchronous one holds the mailbox until it settles.

export type MailboxHandler<T> = (item: T) => void | PromiseLike<void>

export class Mailbox<T> {
  readonly capacity: number
  readonly #handle: MailboxHandler<T>
  readonly #onError: (error: unknown) => void
  #items: T[] = []
  #head = 0
  #busy = false
  #closed = false
  #idleWaiters: Array<() => void> = []

  constructor(capacity: number, handle: MailboxHandler<T>, onError: (error: unknown) => void) {
    this.capacity = capacity
    this.#handle = handle
    this.#onError = onError
  }

  /** Messages waiting (not counting the one being handled). */
  get size(): number {
    return this.#items.length - this.#head
  }

  get busy(): boolean {
    return this.#busy
  }

  get closed(): boolean {
    return this.#closed
  }

  /** Adds an item; false when the mailbox is full or closed (the caller rejects the message). */
  offer(item: T): boolean {
    if (this.#closed || this.size >= this.capacity) return false
    this.#items.push(item)
    if (!this.#busy) this.#run()
    return true
  }

  /** Stops accepting items and hands back those not yet started (the one in progress finishes). */
  close(): T[] {
    this.#closed = true
    const rest = this.#items.slice(this.#head)
    this.#items = []
    this.#head = 0
    if (!this.#busy) this.#settle()
    return rest
  }

  /** Stops accepting items but keeps those queued: they are handled, then `idle()` resolves. */
  seal(): void {
    this.#closed = true
  }

  /** Resolves once nothing is queued and nothing is in progress. */
  idle(): Promise<void> {
    if (!this.#busy && this.size === 0) return Promise.resolve()
    return new Promise((resolve) => this.#idleWaiters.push(resolve))
  }

  #take(): T {
    const item = this.#items[this.#head] as T
    this.#items[this.#head] = undefined as T
    this.#head++
    // Compact now and then so a long-lived mailbox does not keep a growing array.
    if (this.#head > 1024 && this.#head * 2 > this.#items.length) {
      this.#items = this.#items.slice(this.#head)
      this.#head = 0
    }
    return item
  }

  #run(): void {
    this.#busy = true
    while (this.#head < this.#items.length) {
      const item = this.#take()
      let result: void | PromiseLike<void>
      try {
        result = this.#handle(item)
      } catch (e) {
        this.#onError(e)
        continue
      }
      if (result !== undefined && typeof (result as PromiseLike<void>).then === "function") {
        ;(result as PromiseLike<void>).then(
          () => this.#run(),
          (e: unknown) => {
            this.#onError(e)
            this.#run()
          }
        )
        return
      }
    }
    this.#busy = false
    this.#settle()
  }

  #settle(): void {
    if (this.#idleWaiters.length === 0 || this.size > 0) return
    const waiters = this.#idleWaiters
    this.#idleWaiters = []
    for (const w of waiters) w()
  }
}
