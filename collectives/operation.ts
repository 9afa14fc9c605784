// One running collective on one rank: the state an algorithm (ring.ts, tree.ts, ...) works with.
// It checks every inbound data frame against this rank's own call (same collective, options and
// length), hands it to the algorithm, acknowledges consumed bytes (flow control), gates sends on
// credits, and turns "nothing happened for timeoutMs" into a failure. Algorithms are written as
// plain async code: consume frames in a synchronous handler, send with `send`/`sendFanout`, and
// wait with `until(condition, whoWeWaitOn)`, which wakes on every inbound frame or ack.
import { AckLedger, FanoutWindow, SendWindow } from "./flow-control.ts"
import { CollectiveProtocolError, LengthMismatch, OpMismatch } from "./errors.ts"
import { encodeHalf } from "./float16.ts"
import type { MsgHdrs } from "@nats-io/nats-core"
import { Flag, HEADER_BYTES, Kind, frameHeaders, type Frame } from "./frames.ts"

/** What an operation needs from its communicator. */
export interface OperationHost {
  readonly group: string
  readonly rank: number
  readonly worldSize: number
  /** Credits a receiver grants per operation, split over its concurrent inbound links. */
  readonly windowBytes: number
  /** Wire bytes of a full data frame (header + a full chunk of fp32). */
  readonly fullFrame: number
  /** A receiver acks at least every this many consumed bytes (see flow-control.ts). */
  readonly ackEvery: number
  /**
   * Publishes data to one rank. With `written` the data is handed over: the host calls it once
   * when it no longer reads `data` (at once when it copied it, as NATS does; the direct path
   * writes a large one from where it lies and calls it when the kernel has the bytes).
   */
  publishTo(seq: number, dst: number, data: Uint8Array, headers: MsgHdrs, written?: () => void): void
  /** Publishes an ack to one rank, on the control connection (so it does not queue behind data). */
  publishAck(seq: number, dst: number, headers: MsgHdrs): void
  /** Publishes once to every rank of the group ("all") or of one node (its subject token); `written` as for publishTo, once for all. */
  publishFanout(seq: number, target: string, data: Uint8Array, headers: MsgHdrs, written?: () => void): void
}

/** The part of an op's identity that every rank must agree on. */
export interface OpSignature {
  readonly name: string
  readonly opcode: number
  readonly variant: number
  readonly length: number
  readonly half: boolean
}

export type FrameHandler = (frame: Frame) => boolean

/**
 * A sent body handed over to the transport (sendBody's last argument): the caller leaves the memory
 * as it is until the transport is done with it, which may let the direct path write it without a
 * copy; `release` runs then (e.g. gives a received payload back to its pool). The operation
 * resolves only after every handed-over body is written, so a caller may reuse its buffer once
 * the call returns. For views of the call's own buffer only where the algorithm writes that region
 * again no sooner than after a frame that causally follows the send (a peer's data that needed it).
 */
export interface Handover {
  readonly release?: () => void
}

/** A handover with nothing to release: the body is a view the algorithm leaves alone (see Handover). */
export const HANDED_OVER: Handover = Object.freeze({})

interface Wait {
  readonly who: () => Iterable<number>
}

export class Operation {
  readonly host: OperationHost
  readonly seq: number
  readonly sig: OpSignature
  readonly describe: (opcode: number, variant: number) => string
  /** Set by the algorithm before its first await. Returns false to leave a frame queued for later. */
  handler: FrameHandler = () => false
  lastProgress = Date.now()
  /**
   * Set by an algorithm that can take a data frame straight into its result: given the frame's
   * header (payload empty) and its payload's byte count before the payload is read, a view of
   * exactly that many bytes where it goes, or undefined. Asked only for the frame the algorithm
   * expects next from that sender; its handler then gets the frame with that view as payload.
   */
  place: ((head: Frame, bytes: number) => Uint8Array | undefined) | undefined = undefined
  /** This call's deadline when it differs from the communicator's. */
  timeoutMs: number | undefined = undefined
  failure: unknown = undefined
  readonly #windows = new Map<number, SendWindow>()
  #fanout: FanoutWindow | undefined
  /** Concurrent inbound links at the receivers of this op's sends (direct, fan-out): their share of the window. */
  #directFanIn = 1
  #fanoutFanIn = 1
  readonly #ledgers = new Map<number, AckLedger>()
  readonly #blocked = new Map<number, Frame[]>()
  readonly #waits = new Set<Wait>()
  #wake: Promise<void> | undefined
  #resolveWake: (() => void) | undefined
  /** Handed-over bodies not yet written, by receiver. */
  readonly #writing = new Map<number, number>()

  constructor(host: OperationHost, seq: number, sig: OpSignature, describe: (opcode: number, variant: number) => string) {
    this.host = host
    this.seq = seq
    this.sig = sig
    this.describe = describe
  }

  get rank(): number {
    return this.host.rank
  }

  // ------------------------------------------------------------------------------------------
  // waiting

  /** Wakes every `until` so it re-checks its condition. */
  notify(): void {
    const resolve = this.#resolveWake
    if (resolve) {
      this.#wake = undefined
      this.#resolveWake = undefined
      resolve()
    }
  }

  /** Resolves once `cond()` holds; rejects when the operation fails. `who`: the ranks we wait on. */
  async until(cond: () => boolean, who: () => Iterable<number>): Promise<void> {
    if (this.failure !== undefined) throw this.failure
    if (cond()) return
    const wait: Wait = { who }
    this.#waits.add(wait)
    try {
      while (!cond()) {
        if (this.failure !== undefined) throw this.failure
        if (!this.#wake) this.#wake = new Promise<void>((resolve) => (this.#resolveWake = resolve))
        await this.#wake
        if (this.failure !== undefined) throw this.failure
      }
    } finally {
      this.#waits.delete(wait)
    }
    this.lastProgress = Date.now()
  }

  /** Where a frame's payload may be read (see place), once it matches this call's signature. */
  placement(head: Frame, bytes: number): Uint8Array | undefined {
    const sig = this.sig
    if (this.place === undefined || this.failure !== undefined || head.opcode !== sig.opcode || head.variant !== sig.variant || head.length !== sig.length) return undefined
    if ((this.#blocked.get(head.src)?.length ?? 0) > 0) return undefined
    return this.place(head, bytes)
  }

  /** Per peer, frames this call sent it on a direct link that are not yet in the kernel (see flushing). */
  readonly #unflushed = new Map<number, number>()

  /**
   * Counts a frame sent on a direct link until the returned callback says the kernel has it. A
   * call waits for none to be left before it returns (Communicator): bytes still in this process
   * move only when its event loop runs, so a rank that went on to a long computation held a
   * peer's last frames back until it was done (a tree root's 400 KiB result chunk reached the
   * other rank of a 2-rank group a backward pass, about 45 ms, late on every step).
   */
  flushing(dst: number): () => void {
    return this.#counted(this.#unflushed, [dst])
  }

  /** Resolves once every frame counted by flushing is in the kernel; rejects when the operation fails. */
  async flushed(): Promise<void> {
    await this.#emptied(this.#unflushed)
  }

  /** Resolves once every body handed over to the transport is written (see Handover). */
  async written(): Promise<void> {
    await this.#emptied(this.#writing)
  }

  /** Counts a body handed over for `dsts` until the transport calls the returned callback (once). */
  #handedOver(dsts: ReadonlyArray<number>, handover: Handover): () => void {
    return this.#counted(this.#writing, dsts, () => handover.release?.())
  }

  /**
   * Counts one item for each of `dsts` in `pending` (per peer) until the returned callback is called
   * (once; later calls do nothing): then `then`, and every `until` re-checks once none is left.
   */
  #counted(pending: Map<number, number>, dsts: ReadonlyArray<number>, then?: () => void): () => void {
    for (const dst of dsts) pending.set(dst, (pending.get(dst) ?? 0) + 1)
    let done = false
    return () => {
      if (done) return
      done = true
      for (const dst of dsts) {
        const left = (pending.get(dst) ?? 1) - 1
        if (left > 0) pending.set(dst, left)
        else pending.delete(dst)
      }
      then?.()
      if (pending.size === 0) this.notify()
    }
  }

  /** Resolves once `pending` holds no peer (waiting on the peers it holds); rejects when the operation fails. */
  async #emptied(pending: Map<number, number>): Promise<void> {
    if (pending.size > 0) await this.until(() => pending.size === 0, () => pending.keys())
  }

  /** The ranks this operation is currently waiting on (for timeout errors). */
  waitingFor(): number[] {
    const set = new Set<number>()
    for (const w of this.#waits) for (const r of w.who()) set.add(r)
    return [...set].sort((a, b) => a - b)
  }

  get waiting(): boolean {
    return this.#waits.size > 0
  }

  fail(e: unknown): void {
    if (this.failure !== undefined) return
    this.failure = e
    this.notify()
  }

  // ------------------------------------------------------------------------------------------
  // inbound

  /** Replaces the handler and offers it the frames the previous one left queued. */
  setHandler(handler: FrameHandler): void {
    this.handler = handler
    try {
      if (this.#blocked.size > 0) this.#drainBlocked()
    } catch (e) {
      this.fail(e)
    }
    this.notify()
  }

  /** A data frame for this operation arrived (or was buffered before the op started). */
  deliver(frame: Frame): void {
    if (this.failure !== undefined) return
    this.lastProgress = Date.now()
    try {
      this.#check(frame)
      const queue = this.#blocked.get(frame.src)
      if (queue !== undefined && queue.length > 0) {
        queue.push(frame)
        return
      }
      if (!this.handler(frame)) {
        if (queue) queue.push(frame)
        else this.#blocked.set(frame.src, [frame])
        return
      }
      this.#consumed(frame)
      if (this.#blocked.size > 0) this.#drainBlocked()
      this.notify()
    } catch (e) {
      this.fail(e)
    }
  }

  /** Retries queued frames until none can be consumed; a consumed one may unblock another link. */
  #drainBlocked(): void {
    let progress = true
    while (progress) {
      progress = false
      for (const [src, queue] of this.#blocked) {
        while (queue.length > 0 && this.handler(queue[0])) {
          this.#consumed(queue.shift() as Frame)
          progress = true
        }
        if (queue.length === 0) this.#blocked.delete(src)
      }
    }
  }

  #consumed(frame: Frame): void {
    const fanout = (frame.flags & Flag.fanout) !== 0
    // Direct and fan-out traffic from one src are separate links with separate windows at the sender.
    const key = fanout ? -1 - frame.src : frame.src
    let ledger = this.#ledgers.get(key)
    if (!ledger) this.#ledgers.set(key, (ledger = new AckLedger(this.host.ackEvery)))
    const ack = ledger.consume(frame.wireBytes, (frame.flags & Flag.ackNow) !== 0)
    if (ack >= 0) {
      const h = frameHeaders(Kind.ack, fanout ? Flag.fanout : 0, this.sig.opcode, this.sig.variant, this.seq, this.host.rank, 0, 0, 0, 0, ack)
      this.host.publishAck(this.seq, frame.src, h)
    }
  }

  #check(frame: Frame): void {
    const sig = this.sig
    if (frame.opcode !== sig.opcode || frame.variant !== sig.variant) {
      throw new OpMismatch({
        group: this.host.group,
        rank: this.host.rank,
        from: frame.src,
        seq: this.seq,
        expected: this.describe(sig.opcode, sig.variant),
        got: this.describe(frame.opcode, frame.variant)
      })
    }
    if (frame.length !== sig.length) {
      throw new LengthMismatch({
        op: sig.name,
        group: this.host.group,
        rank: this.host.rank,
        from: frame.src,
        expected: sig.length,
        got: frame.length
      })
    }
  }

  /** A typed error for a frame the algorithm cannot place. */
  protocolError(frame: Frame, reason: string): CollectiveProtocolError {
    return new CollectiveProtocolError({ op: this.sig.name, group: this.host.group, rank: this.host.rank, from: frame.src, reason })
  }

  /** An acknowledgement from `frame.src` for frames this rank sent it. */
  onAck(frame: Frame): void {
    this.lastProgress = Date.now()
    if ((frame.flags & Flag.fanout) !== 0) this.#fanout?.onAck(frame.src, frame.value)
    else this.#windows.get(frame.src)?.onAck(frame.value)
    this.notify()
  }

  // ------------------------------------------------------------------------------------------
  // outbound

  /**
   * The body of a data frame: a byte view of `data` itself for fp32 (the NATS client copies it into
   * its outbound buffer before anything can change it), or its fp16 encoding.
   */
  #body(data: Float32Array): Uint8Array {
    const n = data.length
    if (!this.sig.half) return new Uint8Array(data.buffer, data.byteOffset, n * 4)
    const out = new Uint16Array(n)
    encodeHalf(data, out)
    return new Uint8Array(out.buffer)
  }

  /**
   * Declares how many links feed a receiver at once (e.g. a tree parent: its children), so each
   * sender gets that share of the receiver's window. Call before the first send.
   */
  setFanIn(direct: number, fanout = direct): void {
    this.#directFanIn = Math.max(1, direct)
    this.#fanoutFanIn = Math.max(1, fanout)
  }

  #linkWindow(fanIn: number): number {
    // At least one full frame per link: with many links feeding one receiver, each runs
    // stop-and-wait rather than the receiver taking more than its window.
    return Math.max(Math.floor(this.host.windowBytes / fanIn), this.host.fullFrame)
  }

  /** Wire size of a data frame of n elements. */
  frameBytes(n: number): number {
    return HEADER_BYTES + n * (this.sig.half ? 2 : 4)
  }

  /** Sends `data` (a view into the buffer, read now) to `dst`, once the link has credit. */
  async send(dst: number, step: number, chunk: number, offset: number, data: Float32Array, value = 0, handover?: Handover): Promise<void> {
    return this.sendBody(dst, step, chunk, offset, data.length, data, value, handover)
  }

  /**
   * Like send, with the body given either as values or as ready wire bytes (n*4 bytes of fp32, or
   * n*2 of binary16 when the wire is fp16: e.g. a received payload reduced in place and passed on
   * without touching the buffer). With `handover` the body is handed to the transport (Handover).
   */
  async sendBody(dst: number, step: number, chunk: number, offset: number, n: number, body: Float32Array | Uint8Array, value = 0, handover?: Handover): Promise<void> {
    let win = this.#windows.get(dst)
    if (!win) this.#windows.set(dst, (win = new SendWindow(this.#linkWindow(this.#directFanIn))))
    const bytes = this.frameBytes(n)
    if (!win.canSend(bytes)) {
      const w = win
      await this.until(() => w.canSend(bytes), () => [dst])
    }
    if (this.failure !== undefined) throw this.failure
    const sig = this.sig
    win.sent += bytes
    const ackNow = win.canSend(this.host.fullFrame) ? 0 : Flag.ackNow
    const h = frameHeaders(Kind.data, (sig.half ? Flag.half : 0) | ackNow, sig.opcode, sig.variant, this.seq, this.host.rank, step, chunk, sig.length, offset, value)
    const data = body instanceof Float32Array ? this.#body(body) : body
    if (handover === undefined) return this.host.publishTo(this.seq, dst, data, h)
    const written = this.#handedOver([dst], handover)
    try {
      this.host.publishTo(this.seq, dst, data, h, written)
    } catch (e) {
      written()
      throw e
    }
  }

  /**
   * Publishes `data` once to a fan-out subject (`target`: "all" or a node token) that `receivers`
   * subscribe to; the NATS server copies it to each, so it takes the bytes in only once.
   */
  async sendFanout(target: string, receivers: ReadonlyArray<number>, step: number, chunk: number, offset: number, data: Float32Array, value = 0): Promise<void> {
    return this.sendFanoutBody(target, receivers, step, chunk, offset, data.length, data, value)
  }

  /** Like sendFanout, with the body given either as values or as ready bytes of n elements (see sendBody). */
  async sendFanoutBody(
    target: string,
    receivers: ReadonlyArray<number>,
    step: number,
    chunk: number,
    offset: number,
    n: number,
    body: Float32Array | Uint8Array,
    value = 0,
    handover?: Handover
  ): Promise<void> {
    if (!this.#fanout) this.#fanout = new FanoutWindow(this.#linkWindow(this.#fanoutFanIn), receivers)
    const win = this.#fanout
    const bytes = this.frameBytes(n)
    if (!win.canSend(bytes)) await this.until(() => win.canSend(bytes), () => win.laggards())
    if (this.failure !== undefined) throw this.failure
    const sig = this.sig
    win.sent += bytes
    const flags = Flag.fanout | (sig.half ? Flag.half : 0) | (win.canSend(this.host.fullFrame) ? 0 : Flag.ackNow)
    const h = frameHeaders(Kind.data, flags, sig.opcode, sig.variant, this.seq, this.host.rank, step, chunk, sig.length, offset, value)
    const data = body instanceof Float32Array ? this.#body(body) : body
    if (handover === undefined) return this.host.publishFanout(this.seq, target, data, h)
    const written = this.#handedOver(receivers, handover)
    try {
      this.host.publishFanout(this.seq, target, data, h, written)
    } catch (e) {
      written()
      throw e
    }
  }
}
