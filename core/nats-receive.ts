// Receiving large messages without the quadratic-ish buffer growth of the nats.js parser.
//
// nats.js (@nats-io/nats-core 3.x) reassembles a message that spans socket reads in a DenoBuffer
// that starts at the size of the first read's remainder and doubles as reads arrive: a 1 MiB
// message read in 64 KiB pieces is allocated 4 times and its bytes copied about 2.6 times. The
// parser knows the final size (the MSG line's byte count) from the start, so before each read is
// parsed we grow a pending message buffer once to hold the whole message: one allocation and one
// copy of what had arrived. The parser's own logic is untouched; we only reserve capacity through
// DenoBuffer's public grow(). Measured on a 64 MiB all-reduce at p = 4 (bench compression):
// see README, Benchmarks.
//
// The hook checks the shapes it relies on (a `parse` method, `msgBuf` with `capacity`, `length`
// and `grow`, `ma.size`) and does nothing when a future nats.js changes them.
import { Parser } from "@nats-io/nats-core/internal"

interface PendingBuffer {
  readonly capacity: number
  readonly length: number
  grow(n: number): void
}
interface ParserState {
  msgBuf?: PendingBuffer
  ma?: { size?: number }
}

const MARK = Symbol.for("gradwire.natsReceivePatch")

const install = (): boolean => {
  const proto = (Parser as unknown as { prototype: Record<PropertyKey, unknown> }).prototype
  if (!proto || typeof proto.parse !== "function") return false
  if (proto[MARK]) return true
  const parse = proto.parse as (this: ParserState, buf: Uint8Array) => void
  proto.parse = function (this: ParserState, buf: Uint8Array): void {
    const pending = this.msgBuf
    const size = this.ma?.size
    if (pending && typeof size === "number" && typeof pending.grow === "function" && pending.capacity < size && size > pending.length) {
      pending.grow(size - pending.length)
    }
    parse.call(this, buf)
  }
  proto[MARK] = true
  return true
}

/** Whether the hook is in place (false: this nats.js differs, and it receives as it always did). */
export const natsReceivePatched: boolean = install()
