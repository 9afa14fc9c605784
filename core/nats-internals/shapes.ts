// The one place that checks what read.ts, receive.ts and send.ts rely on inside nats.js, before any
// of them is installed: prototype methods, the fields they read and write, and a small run of the
// parser over a message split across two reads (so a renamed field or a changed buffering scheme is
// seen, not only a missing method). nats.js does not promise any of this: these are internals of
// @nats-io/nats-core and a deep import of @nats-io/transport-node (see README.md), written against
// NATS_JS_MADE_FOR, which package.json pins exactly (a comment there is not possible: it is here and
// in README.md). test/nats-internals.test.ts runs this check on the installed nats.js, so an upgrade
// that changes a shape fails the tests naming the member.
import * as fs from "node:fs"
import { createRequire } from "node:module"
import * as path from "node:path"
import * as Schema from "effect/Schema"

/** The nats.js release (@nats-io/nats-core and @nats-io/transport-node) the patches were written and measured against. */
export const NATS_JS_MADE_FOR = "3.4.0"

type AnyClass = abstract new (...args: any[]) => unknown

/** The nats.js classes the patches touch (the real ones, or a stand-in in tests). */
export interface NatsInternals {
  /** @nats-io/transport-node/lib/node_transport.js: dial is wrapped (read.ts). */
  readonly NodeTransport: AnyClass
  /** @nats-io/nats-core/internal: parse is wrapped (receive.ts). */
  readonly Parser: AnyClass
  /** @nats-io/nats-core/internal: flushPending and sendCommand are wrapped (send.ts). */
  readonly ProtocolHandler: AnyClass
  /** @nats-io/nats-core/internal: the handler's outbound queue, read and reset by send.ts. */
  readonly DataBuffer: AnyClass
  /** The versions found, for the error message ("transport-node x, nats-core y"). */
  readonly version: string
}

/** nats.js lacks a shape the patches rely on; gradwire then runs on nats.js's own paths (index.ts). */
export class NatsInternalsMismatch extends Schema.TaggedError<NatsInternalsMismatch>()("NatsInternalsMismatch", {
  found: Schema.String,
  madeFor: Schema.String,
  missing: Schema.Array(Schema.String)
}) {
  override get message(): string {
    return (
      `nats.js ${this.found} differs from ${this.madeFor}, the version gradwire's NATS buffer pools were made for: ` +
      `${this.missing.join("; ")}. gradwire runs on nats.js's own read, receive and send paths instead (correct, but ` +
      `large messages cost more allocation and garbage collection). To get the pools back, install the versions ` +
      `gradwire pins (npm ci; @nats-io/nats-core and @nats-io/transport-node ${this.madeFor}).`
    )
  }
}

const isFn = (x: unknown): boolean => typeof x === "function"
const protoOf = (c: AnyClass): Record<PropertyKey, unknown> => (c as unknown as { prototype: Record<PropertyKey, unknown> }).prototype ?? {}

/** `name` on `proto` is a method (own or inherited), else a line for the missing list. */
const method = (missing: string[], cls: string, proto: Record<PropertyKey, unknown>, name: string): void => {
  if (!isFn(proto[name])) missing.push(`${cls}.prototype.${name} is not a method`)
}

/** Runs `probe`, turning a throw into a missing-list line (a constructor that now wants other arguments). */
const attempt = (missing: string[], what: string, probe: () => void): void => {
  try {
    probe()
  } catch (e) {
    missing.push(`${what} threw: ${e instanceof Error ? e.message : String(e)}`)
  }
}

const checkTransport = (missing: string[], NodeTransport: AnyClass): void => {
  const proto = protoOf(NodeTransport)
  for (const m of ["dial", "connect", "_send"]) method(missing, "NodeTransport", proto, m)
  // read.ts replaces dial; that only matters if connect still dials through it
  if (isFn(proto.connect) && !/\.dial\(/.test(String(proto.connect))) missing.push("NodeTransport.prototype.connect no longer calls this.dial()")
}

const checkParser = (missing: string[], Parser: AnyClass): void => {
  method(missing, "Parser", protoOf(Parser), "parse")
  if (!isFn(protoOf(Parser).parse)) return
  attempt(missing, "a run of Parser over a split message", () => {
    const pushed: Array<{ msg?: { subject?: unknown; size?: unknown }; data?: unknown }> = []
    const dispatcher = { push: (item: (typeof pushed)[number]) => void pushed.push(item) }
    const parser = new (Parser as unknown as new (d: typeof dispatcher) => Record<string, any>)(dispatcher)
    if (parser.dispatcher !== dispatcher) missing.push("Parser keeps its dispatcher in a field other than `dispatcher`")
    const enc = new TextEncoder()
    // a 10-byte message whose payload arrives in two reads: the parser keeps a pending buffer
    parser.parse(enc.encode("MSG a.b 1 10\r\n12345"))
    const pending = parser.msgBuf as Record<string, unknown> | undefined
    if (parser.ma?.size !== 10) missing.push("Parser's message argument `ma.size` does not hold the payload size")
    if (pending === undefined) missing.push("Parser keeps no pending `msgBuf` for a message that spans reads")
    else {
      if (typeof pending.capacity !== "number" || typeof pending.length !== "number") missing.push("Parser's `msgBuf` has no numeric `capacity` and `length`")
      if (!isFn(pending.grow)) missing.push("Parser's `msgBuf` has no `grow()`")
      if (!(pending._buf instanceof Uint8Array) || typeof pending._off !== "number") missing.push("Parser's `msgBuf` keeps its bytes elsewhere than `_buf` from `_off`")
    }
    parser.parse(enc.encode("67890\r\n"))
    const got = pushed.find((p) => p.msg !== undefined)
    if (!got) missing.push("Parser dispatched no message for a complete MSG")
    else {
      if (!(got.data instanceof Uint8Array) || new TextDecoder().decode(got.data) !== "1234567890") missing.push("Parser dispatches a message's payload elsewhere than `data`")
      if (!(got.msg?.subject instanceof Uint8Array)) missing.push("Parser dispatches the subject elsewhere than `msg.subject` (bytes)")
    }
  })
}

const checkSend = (missing: string[], ProtocolHandler: AnyClass, DataBuffer: AnyClass): void => {
  const proto = protoOf(ProtocolHandler)
  for (const m of ["flushPending", "sendCommand"]) method(missing, "ProtocolHandler", proto, m)
  for (const m of ["fill", "reset", "size"]) method(missing, "DataBuffer", protoOf(DataBuffer), m)
  attempt(missing, "a DataBuffer filled and reset", () => {
    const ob = new (DataBuffer as unknown as new () => Record<string, any>)()
    if (!isFn(ob.fill) || !isFn(ob.reset)) return
    ob.fill(new Uint8Array(3), new Uint8Array(5))
    if (!Array.isArray(ob.buffers) || ob.buffers.length !== 2 || ob.byteLength !== 8) missing.push("DataBuffer keeps its queue elsewhere than `buffers` and `byteLength`")
    ob.reset()
    if (ob.byteLength !== 0) missing.push("DataBuffer.reset() does not empty `byteLength`")
  })
  attempt(missing, "a ProtocolHandler built without connecting", () => {
    const h = new (ProtocolHandler as unknown as new (o: unknown, p: unknown) => Record<string, unknown>)({ servers: "127.0.0.1:4222" }, {})
    if (typeof h.infoReceived !== "boolean" || typeof h.connected !== "boolean") missing.push("ProtocolHandler has no boolean `infoReceived` and `connected`")
    if (!(h.outbound instanceof (DataBuffer as unknown as new () => object))) missing.push("ProtocolHandler's `outbound` is not a DataBuffer")
  })
}

/**
 * Checks every shape the patches rely on. Returns undefined when all are there, else a
 * NatsInternalsMismatch listing each one that is not (it does not throw: index.ts decides).
 */
export const checkNatsInternals = (nats: NatsInternals): NatsInternalsMismatch | undefined => {
  const missing: string[] = []
  checkTransport(missing, nats.NodeTransport)
  checkParser(missing, nats.Parser)
  checkSend(missing, nats.ProtocolHandler, nats.DataBuffer)
  return missing.length === 0 ? undefined : new NatsInternalsMismatch({ found: nats.version, madeFor: NATS_JS_MADE_FOR, missing })
}

/** The installed @nats-io/nats-core's version (its package.json; its exports map hides version.js). */
export const installedNatsCoreVersion = (): string => {
  try {
    const main = createRequire(import.meta.url).resolve("@nats-io/nats-core")
    const pkg = JSON.parse(fs.readFileSync(path.join(path.dirname(main), "..", "package.json"), "utf8")) as { version?: unknown }
    return typeof pkg.version === "string" ? pkg.version : "unknown"
  } catch {
    return "unknown"
  }
}
