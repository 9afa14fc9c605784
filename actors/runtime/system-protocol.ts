// The messages every actor understands besides its own protocol, answered by the runtime itself:
// `$ping` (liveness and identity, outside the mailbox) and `$stop` (stop, optionally draining).
// The "$" prefix cannot clash with user kinds, which must start with a letter.
import * as Schema from "effect/Schema"
import { buildProtocol } from "./protocol.ts"

export const PingReply = Schema.Struct({
  name: Schema.String,
  instance: Schema.String,
  pid: Schema.Number,
  node: Schema.String,
  queued: Schema.Number,
  handled: Schema.Number
})

export const systemProtocol = buildProtocol("$system", {
  $ping: { request: Schema.Null, reply: PingReply },
  $stop: { request: Schema.Struct({ drain: Schema.Boolean, reason: Schema.String }), reply: Schema.Null }
})
