// The start-up check of what core/nats-internals/ patches in nats.js: the installed nats.js passes
// it (so a nats.js upgrade that moves a method or field fails here, naming it), and a stand-in with
// a member missing or renamed is reported with the version found and the one the patches were
// made for, and is left unpatched.
import * as fs from "node:fs"
import { Parser, ProtocolHandler } from "@nats-io/nats-core/internal"
import { describe, expect, it } from "vitest"
import {
  NATS_JS_MADE_FOR,
  NatsInternalsMismatch,
  checkNatsInternals,
  installNatsPatches,
  installNatsPatchesInto,
  installedNatsInternals,
  type NatsInternals
} from "../core/nats-internals/index.ts"

const pkg = JSON.parse(fs.readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { dependencies: Record<string, string> }

const real = installedNatsInternals()

/** The real classes with one replaced. */
const withClass = (name: "NodeTransport" | "Parser" | "ProtocolHandler" | "DataBuffer", cls: NatsInternals[typeof name]): NatsInternals => ({
  ...real,
  [name]: cls,
  version: "transport-node 9.9.9, nats-core 9.9.9"
})

const missingOf = (nats: NatsInternals): readonly string[] => {
  const m = checkNatsInternals(nats)
  expect(m).toBeInstanceOf(NatsInternalsMismatch)
  return m!.missing
}

describe("nats.js shapes the patches rely on", () => {
  it("the installed nats.js has every one of them", () => {
    const m = checkNatsInternals(real)
    // on failure this prints what a nats.js upgrade changed
    expect(m?.message).toBeUndefined()
    expect(real.version).toBe(`transport-node ${NATS_JS_MADE_FOR}, nats-core ${NATS_JS_MADE_FOR}`)
  })

  it("package.json pins exactly the nats.js the patches were made for", () => {
    const deps = pkg.dependencies
    for (const name of Object.keys(deps).filter((n) => n.startsWith("@nats-io/"))) expect(`${name}@${deps[name]}`).toBe(`${name}@${NATS_JS_MADE_FOR}`)
  })

  it("the real install patches the prototypes, once", () => {
    expect(installNatsPatches()).toEqual({ installed: true })
    const parse = (Parser.prototype as { parse: unknown }).parse
    expect(installNatsPatches()).toEqual({ installed: true })
    expect((Parser.prototype as { parse: unknown }).parse).toBe(parse)
    expect((Parser.prototype as unknown as Record<symbol, unknown>)[Symbol.for("gradwire.natsReceivePatch")]).toBe(true)
    expect((ProtocolHandler.prototype as unknown as Record<symbol, unknown>)[Symbol.for("gradwire.natsSendPatch")]).toBe(true)
    expect((real.NodeTransport.prototype as Record<symbol, unknown>)[Symbol.for("gradwire.natsReadPatch")]).toBe(true)
  })

  it("a missing method is named, with the version found and the one made for", () => {
    class NoFlush extends (ProtocolHandler as unknown as new (...a: any[]) => object) {}
    Object.defineProperty(NoFlush.prototype, "flushPending", { value: undefined })
    const m = checkNatsInternals(withClass("ProtocolHandler", NoFlush))
    expect(m?.missing).toEqual(["ProtocolHandler.prototype.flushPending is not a method"])
    expect(m?.message).toContain("nats.js transport-node 9.9.9, nats-core 9.9.9 differs from 3.4.0")
    expect(m?.message).toContain("ProtocolHandler.prototype.flushPending is not a method")
  })

  it("a field the parser renamed is found by running it over a split message", () => {
    // the same parser, its pending-message buffer under another name
    class Renamed {
      readonly dispatcher: unknown
      readonly inner: Record<string, any>
      constructor(dispatcher: unknown) {
        this.dispatcher = dispatcher
        this.inner = new (Parser as unknown as new (d: unknown) => Record<string, any>)(dispatcher)
      }
      get ma(): unknown {
        return this.inner.ma
      }
      parse(buf: Uint8Array): void {
        this.inner.parse(buf)
      }
    }
    expect(missingOf(withClass("Parser", Renamed as unknown as NatsInternals["Parser"]))).toEqual(["Parser keeps no pending `msgBuf` for a message that spans reads"])
  })

  it("a transport whose connect no longer dials through dial() is reported", () => {
    class Direct {
      dial(): void {}
      connect(): string {
        return "tlsFirst"
      }
      _send(): void {}
    }
    expect(missingOf(withClass("NodeTransport", Direct))).toEqual(["NodeTransport.prototype.connect no longer calls this.dial()"])
  })

  it("an outbound queue that keeps its bytes elsewhere is reported", () => {
    class Queue {
      chunks: Uint8Array[] = []
      fill(...b: Uint8Array[]): void {
        this.chunks.push(...b)
      }
      reset(): void {
        this.chunks = []
      }
      size(): number {
        return this.chunks.length
      }
    }
    const missing = missingOf(withClass("DataBuffer", Queue))
    expect(missing).toContain("DataBuffer keeps its queue elsewhere than `buffers` and `byteLength`")
    expect(missing).toContain("ProtocolHandler's `outbound` is not a DataBuffer")
  })

  it("on a mismatch nothing is patched, and the warning comes once with the error", () => {
    class Transport {
      dial(): string {
        return "own"
      }
      connect(): void {
        this.dial()
      }
      _send(): void {}
    }
    class NoParse {}
    const warned: NatsInternalsMismatch[] = []
    const status = installNatsPatchesInto({ ...withClass("Parser", NoParse), NodeTransport: Transport }, (m) => warned.push(m))
    expect(status.installed).toBe(false)
    expect(warned).toHaveLength(1)
    expect(warned[0].missing).toEqual(["Parser.prototype.parse is not a method"])
    expect(!status.installed && status.mismatch).toBe(warned[0])
    // the transport stand-in passed its own checks but is left alone: all or none
    expect(new Transport().dial()).toBe("own")
    expect((Transport.prototype as unknown as Record<symbol, unknown>)[Symbol.for("gradwire.natsReadPatch")]).toBeUndefined()
  })
})
