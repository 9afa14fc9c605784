// Credit-based flow control per link. Core NATS drops what a receiver cannot take (a slow
// consumer is disconnected and its backlog lost, silently for the senders), so no sender may get
// far ahead of what its receiver has consumed: each sender has at most a window of bytes not yet
// acknowledged per destination, and each receiver acknowledges the bytes it has consumed
// (cumulatively, so a lost or late ack is made good by the next). A fan-out publish is
// acknowledged by each of its receivers; its window is bounded by the slowest one.
//
// Liveness: a receiver acks every `ackEvery` bytes consumed (a steady stream of credit), and at
// once for a frame flagged ackNow, which a sender sets on the frame after which its window cannot
// take another full frame. So the last frame before a sender blocks always brings an ack back,
// whatever the window and frame sizes; and a frame may always go when nothing is outstanding.

/** The sender side of one direct link (this rank -> one peer) within one operation. */
export class SendWindow {
  sent = 0
  acked = 0
  readonly windowBytes: number
  constructor(windowBytes: number) {
    this.windowBytes = windowBytes
  }
  /** A frame may always go when nothing is outstanding, so one larger than the window cannot deadlock. */
  canSend(bytes: number): boolean {
    const outstanding = this.sent - this.acked
    return outstanding === 0 || outstanding + bytes <= this.windowBytes
  }
  onAck(consumed: number): void {
    if (consumed > this.acked) this.acked = consumed
  }
}

/** The sender side of a fan-out subject: one window per receiver, the slowest one gates. */
export class FanoutWindow {
  sent = 0
  readonly windowBytes: number
  readonly receivers: ReadonlyArray<number>
  readonly #acked: Map<number, number>
  #minAcked = 0
  constructor(windowBytes: number, receivers: ReadonlyArray<number>) {
    this.windowBytes = windowBytes
    this.receivers = receivers
    this.#acked = new Map(receivers.map((r) => [r, 0]))
  }
  canSend(bytes: number): boolean {
    const outstanding = this.sent - this.#minAcked
    return outstanding === 0 || outstanding + bytes <= this.windowBytes
  }
  onAck(from: number, consumed: number): void {
    const prev = this.#acked.get(from)
    if (prev === undefined || consumed <= prev) return
    this.#acked.set(from, consumed)
    let min = Infinity
    for (const v of this.#acked.values()) if (v < min) min = v
    this.#minAcked = min
  }
  /** Receivers whose acknowledgements hold the window back. */
  laggards(): number[] {
    const out: number[] = []
    for (const [r, v] of this.#acked) if (v === this.#minAcked && this.sent > v) out.push(r)
    return out
  }
}

/** The receiver side of one inbound link: counts consumed bytes and says when to acknowledge. */
export class AckLedger {
  consumed = 0
  #lastAcked = 0
  readonly ackEvery: number
  constructor(ackEvery: number) {
    this.ackEvery = ackEvery
  }
  /** Records consumed bytes; returns the cumulative count to acknowledge now, or -1. */
  consume(bytes: number, ackNow: boolean): number {
    this.consumed += bytes
    if (!ackNow && this.consumed - this.#lastAcked < this.ackEvery) return -1
    this.#lastAcked = this.consumed
    return this.consumed
  }
}
