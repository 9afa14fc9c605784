// Unit tests of the pure pieces of the actor runtime: the mailbox (order, one at a time, bounds,
// close and seal), envelopes, protocol definitions and the rate-limited log.
import * as Schema from "effect/Schema"
import { describe, expect, it } from "vitest"
import { readReply, readRequest, toWireFailure } from "../actors/runtime/envelope.ts"
import { rateLimited } from "../actors/runtime/log.ts"
import { Mailbox } from "../actors/runtime/mailbox.ts"
import { defineProtocol } from "../actors/runtime/protocol.ts"

describe("Mailbox", () => {
  it("handles items in order, one at a time, sync and async alike", async () => {
    const log: string[] = []
    let active = 0
    const box = new Mailbox<number>(100, (n) => {
      active++
      expect(active).toBe(1)
      log.push(`start ${n}`)
      if (n % 2 === 0) {
        active--
        log.push(`end ${n}`)
        return
      }
      return new Promise<void>((resolve) =>
        setTimeout(() => {
          active--
          log.push(`end ${n}`)
          resolve()
        }, 5)
      )
    }, (e) => {
      throw e
    })
    for (let i = 0; i < 6; i++) expect(box.offer(i)).toBe(true)
    await box.idle()
    expect(log).toEqual([0, 1, 2, 3, 4, 5].flatMap((n) => [`start ${n}`, `end ${n}`]))
  })

  it("refuses items beyond its capacity and after close; close hands back the queued ones", async () => {
    let release!: () => void
    const box = new Mailbox<number>(2, () => new Promise<void>((r) => (release = r)), () => {})
    expect(box.offer(1)).toBe(true) // in progress
    expect(box.offer(2)).toBe(true)
    expect(box.offer(3)).toBe(true)
    expect(box.offer(4)).toBe(false) // full
    expect(box.close()).toEqual([2, 3])
    expect(box.offer(5)).toBe(false)
    release()
    await box.idle()
  })

  it("seal keeps queued items and finishes them; a throwing handler does not stop the box", async () => {
    const seen: number[] = []
    const errors: unknown[] = []
    const box = new Mailbox<number>(10, (n) => {
      if (n === 2) throw new Error("bad item")
      seen.push(n)
    }, (e) => errors.push(e))
    box.offer(1)
    box.offer(2)
    box.offer(3)
    box.seal()
    expect(box.offer(4)).toBe(false)
    await box.idle()
    expect(seen).toEqual([1, 3])
    expect(errors).toHaveLength(1)
  })
})

describe("envelopes and protocols", () => {
  it("reads requests and replies, and says what is wrong with anything else", () => {
    expect(readRequest(["add", { n: 1 }])).toEqual({ kind: "add", body: { n: 1 } })
    expect(typeof readRequest({ kind: "add" })).toBe("string")
    expect(typeof readRequest([1, 2])).toBe("string")
    expect(readReply([0, 5])).toEqual({ ok: true, body: 5 })
    expect(readReply([1, "Boom", "msg", "stack"])).toEqual({ ok: false, failure: { tag: "Boom", message: "msg", stack: "stack" } })
    expect(typeof readReply([2, 1])).toBe("string")
  })

  it("turns any failure into tag, message and stack", () => {
    class Tagged extends Schema.TaggedError<Tagged>()("Tagged", { x: Schema.Number }) {}
    expect(toWireFailure(new Tagged({ x: 1 })).tag).toBe("Tagged")
    expect(toWireFailure(new TypeError("t"))).toMatchObject({ tag: "TypeError", message: "t" })
    expect(toWireFailure("plain")).toEqual({ tag: "Error", message: "plain", stack: "" })
    expect(toWireFailure({ _tag: "Obj", message: "m" })).toEqual({ tag: "Obj", message: "m", stack: "" })
  })

  it("validates kind names and builds validators per kind", () => {
    expect(() => defineProtocol("p", { $bad: { request: Schema.Null } })).toThrow(/must start with a letter/)
    const P = defineProtocol("p", { add: { request: Schema.Struct({ n: Schema.Number }), reply: Schema.Number }, note: { request: Schema.String } })
    expect(P.codecs.get("add")?.hasReply).toBe(true)
    expect(P.codecs.get("note")?.hasReply).toBe(false)
    expect(P.codecs.get("add")?.decodeRequest({ n: 1 })._tag).toBe("Success")
    expect(P.codecs.get("add")?.decodeRequest({ n: "1" })._tag).toBe("Failure")
  })

  it("rate-limits repeated log lines", () => {
    const lines: string[] = []
    const log = rateLimited((m) => lines.push(m), 3, 100)
    for (let i = 0; i < 1000; i++) log("x")
    expect(lines.length).toBe(3 + 10)
  })
})
