// Bad input sent straight to an actor's subject: malformed bytes and msgpack, foreign and
// truncated messages, unknown kinds, schema violations, junk chunk frames and oversized chunked
// messages. Each is rejected with a logged, typed MessageRejected (answered to the sender when it
// asked), and the actor keeps serving, in order, the valid messages sent in between.
import type { NatsConnection } from "@nats-io/nats-core"
import fc from "fast-check"
import { pack } from "msgpackr"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchActor, type ActorHandle } from "../actors/runtime/actor.ts"
import { readReply } from "../actors/runtime/envelope.ts"
import { MessageRejected } from "../actors/runtime/errors.ts"
import type { ActorLogger } from "../actors/runtime/log.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { encodeFrames } from "../core/chunking.ts"
import { decodeMessage, encodeMessage } from "../core/wire.ts"
import { CounterProtocol, counterActor } from "./support/actors-fixtures.ts"
import { TestRig, eventually } from "./support/actors-processes.ts"

const rig = new TestRig()
let nc: NatsConnection
let raw: NatsConnection
let system: ActorSystem
let handle: ActorHandle
const warnings: string[] = []
const rejected: MessageRejected[] = []
const MAX_PAYLOAD = 64 * 1024
const MAX_MESSAGE = 256 * 1024

const capture: ActorLogger = { debug: () => {}, info: () => {}, warn: (m) => void warnings.push(m), error: (m) => void warnings.push(m) }

beforeAll(async () => {
  const server = await rig.server({ maxPayload: MAX_PAYLOAD })
  nc = await rig.connect(server.url)
  raw = await rig.connect(server.url)
  system = new ActorSystem({ nc, cluster: "fz", job: "j", log: capture })
  handle = await launchActor(system, counterActor, {
    name: "target",
    maxMessageBytes: MAX_MESSAGE,
    onRejected: (e) => void rejected.push(e)
  })
  rig.onCleanup(async () => {
    await handle.stop({ drain: false })
    system.close()
  })
})

afterAll(() => rig.cleanup())

/** Random payloads of every kind of badness, deterministic (seeded). */
const badPayloads = (count: number): Uint8Array[] => {
  const g = { seed: 4242, numRuns: count }
  const anything = fc.anything({ maxDepth: 2, maxKeys: 4, withTypedArray: true })
  const kinds = fc.oneof(
    // random bytes
    fc.uint8Array({ minLength: 0, maxLength: 600 }),
    // msgpack without the wire header
    anything.map((v) => {
      try {
        return new Uint8Array(pack(v))
      } catch {
        return new Uint8Array([0xc1])
      }
    }),
    // well-formed wire messages that are not request envelopes
    anything.map((v) => {
      try {
        return encodeMessage(v)
      } catch {
        return encodeMessage(null)
      }
    }),
    // envelopes with unknown kinds
    fc.tuple(fc.string({ maxLength: 20 }), anything).map(([k, v]) => {
      try {
        return encodeMessage([`zz${k}`, v])
      } catch {
        return encodeMessage(["zz", null])
      }
    }),
    // known kinds with bodies that violate the schema
    fc.tuple(fc.constantFrom("add", "addSlow", "bump", "get"), fc.oneof(fc.string(), fc.record({ n: fc.string() }), fc.array(fc.integer()))).map(([k, v]) =>
      encodeMessage([k, v])
    ),
    // truncated valid requests
    fc.integer({ min: 1, max: 30 }).map((cut) => {
      const ok = encodeMessage(["add", { n: 1 }])
      return ok.subarray(0, Math.max(0, ok.length - cut))
    }),
    // junk chunk frames: right magic, random rest
    fc.uint8Array({ minLength: 0, maxLength: 200 }).map((rest) => new Uint8Array([0x47, 0x57, 0x43, 1, ...rest])),
    // bad system messages
    fc.constantFrom(encodeMessage(["$nope", null]), encodeMessage(["$stop", "now"]))
  )
  return fc.sample(kinds, g)
}

describe("bad input to an actor", () => {
  it("rejects thousands of random payloads with typed, logged errors and keeps serving in order", async () => {
    const started = Date.now()
    const payloads = badPayloads(3_000)
    const subject = handle.subject
    let replies = 0
    let failures = 0
    const inbox = `fz-inbox-${Date.now()}`
    const sub = raw.subscribe(`${inbox}.*`, {
      callback: (_e, msg) => {
        replies++
        try {
          const r = readReply(decodeMessage(msg.data))
          if (typeof r !== "string" && !r.ok) failures++
        } catch {
          // counted as a reply anyway
        }
      }
    })
    rig.onCleanup(() => sub.unsubscribe())
    let asked = 0
    const valid: number[] = []
    for (let i = 0; i < payloads.length; i++) {
      // Half ask (with a reply subject), half tell.
      if (i % 2 === 0) {
        raw.publish(subject, payloads[i], { reply: `${inbox}.${i}` })
        asked++
      } else {
        raw.publish(subject, payloads[i])
      }
      // A valid message now and then: it must still be handled, in order.
      if (i % 100 === 0) {
        valid.push(i)
        raw.publish(subject, encodeMessage(["bump", i]))
      }
      if (i % 500 === 0) await raw.flush()
      expect(Date.now() - started).toBeLessThan(30_000)
    }
    // Oversized: a chunked message above the actor's maxMessageBytes, asked.
    for (const frame of encodeFrames(["bump", new Uint8Array(MAX_MESSAGE + 10_000)], MAX_PAYLOAD)) raw.publish(subject, frame, { reply: `${inbox}.big` })
    await raw.flush()

    const seen = await system.askPromise(system.ref(CounterProtocol, "target"), "get", null, { timeoutMs: 20_000 })
    expect(seen).toEqual(valid)
    expect(await system.askPromise(system.ref(CounterProtocol, "target"), "add", { n: 1 })).toBe(valid.length + 1)

    // Everything not valid was rejected and counted; asked payloads got an answer (not silence),
    // except chunk frames that never complete (they expire instead).
    await eventually("rejection replies", 10_000, () => replies >= asked * 0.8)
    expect(failures).toBe(replies)
    expect(rejected.length).toBeGreaterThan(payloads.length * 0.8)
    expect(rejected.every((e) => e instanceof MessageRejected && e._tag === "MessageRejected")).toBe(true)
    expect(handle.stats().rejected).toBe(rejected.length)
    const reasons = new Set(rejected.map((e) => e.reason.replace(/[0-9"].*$/, "")))
    expect([...reasons].some((r) => r.startsWith("unknown message kind"))).toBe(true)
    expect([...reasons].some((r) => r.startsWith("body does not match the schema"))).toBe(true)
    expect(rejected.some((e) => /above the limit/.test(e.reason))).toBe(true)
    // Logged, but rate-limited: far fewer lines than rejections.
    expect(warnings.some((w) => w.includes("rejected"))).toBe(true)
    expect(warnings.length).toBeLessThan(50)
    expect(Date.now() - started).toBeLessThan(60_000)
  })
})
