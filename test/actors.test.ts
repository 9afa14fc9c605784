// The actor runtime in one process against a real nats-server: tell/ask, order and one message
// at a time, deadlines, remote failures, unknown addresses, stop with and without draining,
// cleanup, address conflicts, tensors (chunked above max_payload), death watching, supervision,
// and the Effect API.
import type { NatsConnection } from "@nats-io/nats-core"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { defineActor, launchActor, pingActor, launchActorEffect, stopRemoteActor } from "../actors/runtime/actor.ts"
import { ActorStartError, ActorStopped, ActorUnavailable, AskTimeout, ChildEscalated, MessageRejected, RemoteFailure } from "../actors/runtime/errors.ts"
import { defineProtocol } from "../actors/runtime/protocol.ts"
import { launchSupervisor, localChild, restartOnFailure, launchSupervisorEffect } from "../actors/runtime/supervisor.ts"
import { ActorSystem, makeActorSystemEffect } from "../actors/runtime/system.ts"
import { wireTensor, WireTensor } from "../core/wire.ts"
import { CounterProtocol, EchoProtocol, brokenActor, counterActor, echoActor } from "./support/actors-fixtures.ts"
import { TestRig, eventually } from "./support/actors-processes.ts"
import { freePort } from "../core/nats-server.ts"
import { silentLogger } from "../actors/runtime/log.ts"
import { beatTemplate, describeStack, readBeat, withHeld } from "../actors/runtime/heartbeat.ts"

const rig = new TestRig()
let url: string
let ncA: NatsConnection
let ncB: NatsConnection
let a: ActorSystem // hosts actors
let b: ActorSystem // asks them (its own connection, as another process would)
let n = 0
const fresh = (prefix: string): string => `${prefix}-${++n}`

beforeAll(async () => {
  // A small max_payload so that tensors of a few hundred KiB are chunked.
  const server = await rig.server({ maxPayload: 64 * 1024 })
  url = server.url
  ncA = await rig.connect(url)
  ncB = await rig.connect(url)
  a = new ActorSystem({ nc: ncA, cluster: "t", job: "j", log: silentLogger })
  b = new ActorSystem({ nc: ncB, cluster: "t", job: "j", log: silentLogger })
  // The watcher's subscriptions reach the server before any test stops an actor: a stop notice
  // published earlier is lost, and the watch would end by silence instead.
  await b.watcherReady()
  rig.onCleanup(() => {
    a.close()
    b.close()
  })
})

afterAll(() => rig.cleanup())

describe("tell and ask", () => {
  it("answers asks and keeps messages in order, one at a time", async () => {
    const name = fresh("counter")
    const h = await launchActor(a, counterActor, { name })
    const ref = b.ref(CounterProtocol, name)
    for (let i = 0; i < 200; i++) await b.tellPromise(ref, "bump", i)
    // Asks that take a while each: if two ran at once, the counts would not be 201..205 in order.
    const slow = await Promise.all([0, 1, 2, 3, 4].map((i) => b.askPromise(ref, "addSlow", { n: 1000 + i, ms: 15 })))
    expect(slow).toEqual([201, 202, 203, 204, 205])
    const seen = await b.askPromise(ref, "get", null)
    expect(seen).toEqual([...Array.from({ length: 200 }, (_, i) => i), 1000, 1001, 1002, 1003, 1004])
    expect(h.stats()).toMatchObject({ handled: 206, rejected: 0 })
    await h.stop()
  })

  it("times out with a typed error naming the actor, the kind and the deadline", async () => {
    const name = fresh("echo")
    const h = await launchActor(a, echoActor, { name })
    const e = await b.askPromise(b.ref(EchoProtocol, name), "sleep", 2_000, { timeoutMs: 150 }).catch((x: unknown) => x)
    expect(e).toBeInstanceOf(AskTimeout)
    expect(e).toMatchObject({ actor: name, kind: "sleep", timeoutMs: 150 })
    expect(String((e as AskTimeout).message)).toContain("150 ms")
    await h.stop({ drain: false })
  })

  it("carries the remote failure's tag, message and stack", async () => {
    const name = fresh("echo")
    const h = await launchActor(a, echoActor, { name })
    const e = await b.askPromise(b.ref(EchoProtocol, name), "fail", "disk full").catch((x: unknown) => x)
    expect(e).toBeInstanceOf(RemoteFailure)
    expect(e).toMatchObject({ actor: name, kind: "fail", tag: "Boom", remoteMessage: "boom: disk full" })
    expect((e as RemoteFailure).remoteStack).toContain("Boom")
    // The actor keeps serving after a failed message.
    expect(await b.askPromise(b.ref(EchoProtocol, name), "echo", 7)).toBe(7)
    await h.stop()
  })

  it("fails fast with ActorUnavailable when nobody is at the address", async () => {
    const started = Date.now()
    const e = await b.askPromise(b.ref(EchoProtocol, "nobody-here"), "echo", 1, { timeoutMs: 10_000 }).catch((x: unknown) => x)
    expect(e).toBeInstanceOf(ActorUnavailable)
    expect(Date.now() - started).toBeLessThan(5_000)
  })

  it("with unavailableForMs, asks an address nobody holds again until its actor subscribes (a driver resubscribing after a reconnect), and gives up with ActorUnavailable after that long", async () => {
    const name = fresh("echo")
    const ref = b.ref(EchoProtocol, name)
    // the actor starts 600 ms after the ask went out: the server said "no responders" meanwhile
    let h: Awaited<ReturnType<typeof launchActor>> | undefined
    const late = new Promise<void>((resolve) => setTimeout(() => void launchActor(a, echoActor, { name }).then((x) => ((h = x), resolve())), 600))
    const got = await b.askPromise(ref, "echo", 41, { timeoutMs: 10_000, unavailableForMs: 5_000 })
    await late
    expect(got).toBe(41)
    await h!.stop()
    // a request in frames (above max_payload: a report with a checkpoint) is answered "no
    // responders" once per frame, and still sent again once per attempt, not once per answer
    const big = fresh("echo")
    let hb: Awaited<ReturnType<typeof launchActor>> | undefined
    const lateBig = new Promise<void>((resolve) => setTimeout(() => void launchActor(a, echoActor, { name: big }).then((x) => ((hb = x), resolve())), 700))
    const data = new Float32Array(250_000).fill(1) // 1 MB: 16 frames of 64 KiB
    const sentBefore = b.nc.stats().outMsgs
    const reply = await b.askPromise(b.ref(EchoProtocol, big), "tensor", { t: wireTensor("float32", [250_000], data) }, { timeoutMs: 10_000, unavailableForMs: 5_000 })
    await lateBig
    expect(reply.sum).toBe(250_000)
    // about 700 / 200 attempts of 16 frames; one attempt per answer would have been 16, 256, 4096... frames
    expect(b.nc.stats().outMsgs - sentBefore).toBeLessThan(16 * 12)
    await hb!.stop()
    // nobody comes: ActorUnavailable once unavailableForMs has passed, not the ask's timeout
    const started = Date.now()
    const e = await b.askPromise(b.ref(EchoProtocol, "still-nobody"), "echo", 1, { timeoutMs: 20_000, unavailableForMs: 800 }).catch((x: unknown) => x)
    expect(e).toBeInstanceOf(ActorUnavailable)
    expect(Date.now() - started).toBeGreaterThanOrEqual(600)
    expect(Date.now() - started).toBeLessThan(15_000)
  })

  it("refuses a body that violates the schema before sending it", async () => {
    const e = await b.askPromise(b.ref(CounterProtocol, "whoever"), "add", { n: "one" } as never).catch((x: unknown) => x)
    expect(e).toBeInstanceOf(MessageRejected)
    expect((e as MessageRejected).direction).toBe("request")
  })

  it("moves tensors, chunked above max_payload, both ways", async () => {
    const name = fresh("echo")
    const h = await launchActor(a, echoActor, { name })
    const ref = b.ref(EchoProtocol, name)
    const data = new Float32Array(250_000).map((_, i) => (i % 7) - 3) // 1 MB: 16 chunks of 64 KiB
    const reply = await b.askPromise(ref, "tensor", { t: wireTensor("float32", [500, 500], data) })
    expect(reply.shape).toEqual([500, 500])
    expect(reply.sum).toBe(data.reduce((s, v) => s + v, 0))
    const back = (await b.askPromise(ref, "echo", { t: wireTensor("int32", [100_000], new Int32Array(100_000).fill(-5)) })) as { t: WireTensor }
    expect(back.t).toBeInstanceOf(WireTensor)
    expect(back.t.shape).toEqual([100_000])
    expect((back.t.data as Int32Array).every((v) => v === -5)).toBe(true)
    await h.stop()
  })
})

describe("lifecycle", () => {
  it("stop with drain handles what is queued; without drain queued asks get ActorStopped", async () => {
    const name = fresh("counter")
    const h = await launchActor(a, counterActor, { name })
    const ref = b.ref(CounterProtocol, name)
    const drained = [1, 2, 3].map((i) => b.askPromise(ref, "addSlow", { n: i, ms: 150 }))
    await eventually("asks to arrive", 5_000, () => h.stats().queued >= 2)
    await h.stop({ drain: true })
    expect(await Promise.all(drained)).toEqual([1, 2, 3])

    const name2 = fresh("counter")
    const h2 = await launchActor(a, counterActor, { name: name2 })
    const ref2 = b.ref(CounterProtocol, name2)
    const dropped = [1, 2, 3].map((i) => b.askPromise(ref2, "addSlow", { n: i, ms: 200 }).then(
      (v) => v,
      (e: unknown) => e
    ))
    await eventually("asks to arrive", 5_000, () => h2.stats().queued >= 2)
    await h2.stop({ drain: false })
    const results = await Promise.all(dropped)
    expect(results.every((r) => r instanceof ActorStopped)).toBe(true)
    expect(await h2.awaitExit()).toEqual({ _tag: "Stopped", reason: "stopped" })
  })

  it("cleans up after stop: hooks and scoped resources run, the address is released", async () => {
    const log: string[] = []
    const P = defineProtocol("cleanup", { ping: { request: Schema.Null, reply: Schema.String } })
    const def = defineActor(P, (ctx) =>
      Effect.gen(function* () {
        yield* Effect.acquireRelease(Effect.sync(() => log.push("acquired")), () => Effect.sync(() => log.push("released")))
        ctx.onStop(() => void log.push("hook"))
        return { ping: () => "pong" }
      })
    )
    const name = fresh("cleanup")
    const h = await launchActor(a, def, { name })
    expect(await b.askPromise(b.ref(P, name), "ping", null)).toBe("pong")
    // A long silence deadline: this is about the stop notice, not heartbeats (on a loaded machine
    // 2 s without a heartbeat can pass while the actor stops).
    const down = b.watchPromise(name, { deadAfterMs: 20_000 })
    await h.stop()
    expect(log).toEqual(["acquired", "hook", "released"])
    expect((await down).reason).toBe("stopped")
    await expect(b.askPromise(b.ref(P, name), "ping", null)).rejects.toBeInstanceOf(ActorUnavailable)
  })

  it("refuses to start where another actor already answers, and reports setup failures", async () => {
    const name = fresh("echo")
    const h = await launchActor(a, echoActor, { name })
    await expect(launchActor(b, echoActor, { name })).rejects.toBeInstanceOf(ActorStartError)
    const e = await launchActor(a, brokenActor, { name: fresh("broken") }).catch((x: unknown) => x)
    expect(e).toBeInstanceOf(ActorStartError)
    expect(String((e as Error).message)).toContain("setup exploded on purpose")
    await h.stop()
  })

  it("answers $ping outside the mailbox and stops on a remote $stop", async () => {
    const name = fresh("echo")
    const h = await launchActor(a, echoActor, { name })
    const busy = b.askPromise(b.ref(EchoProtocol, name), "sleep", 500)
    const ping = await pingActor(b, name, 300)
    expect(ping).toMatchObject({ name, instance: h.instance, pid: process.pid })
    await busy
    await stopRemoteActor(b, name, { drain: true })
    expect(h.exitReason?._tag).toBe("Stopped")
  })
})

/** A handler that waits for a message of its own protocol: `wait` is answered once `release` came. */
const GateProtocol = defineProtocol("gate", {
  wait: { request: Schema.Null, reply: Schema.String },
  release: { request: Schema.String, immediate: true },
  queuedRelease: { request: Schema.String }
})
const gateActor = defineActor(GateProtocol, () => {
  let open: ((s: string) => void) | undefined
  const opened = new Promise<string>((r) => (open = r))
  return {
    wait: () => opened,
    release: (s) => {
      open!(s)
    },
    queuedRelease: (s) => {
      open!(s)
    }
  }
})

describe("immediate kinds", () => {
  it("an immediate kind is handled while another handler runs (one that waits for it); an ordinary kind waits its turn", async () => {
    const name = fresh("gate")
    const h = await launchActor(a, gateActor, { name })
    const ref = b.ref(GateProtocol, name)
    // Through the mailbox the release would queue behind the wait it is to end: a timeout.
    const stuck = b.askPromise(ref, "wait", null, { timeoutMs: 600 })
    await b.tellPromise(ref, "queuedRelease", "late")
    await expect(stuck).rejects.toBeInstanceOf(AskTimeout)
    await h.stop({ drain: false })
    const name2 = fresh("gate")
    const h2 = await launchActor(a, gateActor, { name: name2 })
    const ref2 = b.ref(GateProtocol, name2)
    const waiting = b.askPromise(ref2, "wait", null, { timeoutMs: 5_000 })
    await b.tellPromise(ref2, "release", "now")
    expect(await waiting).toBe("now")
    await h2.stop()
  })
})

describe("liveness", () => {
  it("a watcher learns of a silent death within the dead-after time", async () => {
    // The actor lives on a connection we then close without stopping it: beats just stop.
    const nc = await rig.connect(url)
    const host = new ActorSystem({ nc, cluster: "t", job: "j", log: silentLogger })
    const name = fresh("silent")
    await launchActor(host, echoActor, { name, heartbeatMs: 100 })
    const down = b.watchPromise(name, { deadAfterMs: 600 })
    await new Promise((r) => setTimeout(r, 300))
    const closedAt = Date.now()
    await nc.close()
    const d = await down
    expect(d.reason).toBe("missed-heartbeats")
    expect(Date.now() - closedAt).toBeLessThan(3_000)
  })

  it("a beat thread's beat: the template's last 8 bytes take the held time, the 8 before its key the CPU time, and the beat decodes with them", () => {
    const beat = { name: "w", instance: "i1", pid: 42, node: "n1", intervalMs: 500 }
    const template = beatTemplate({ ...beat, heldMs: 7, cpuMs: 9 })!
    expect(template).toBeDefined()
    for (const held of [0, 1234, 86_400_000.5]) {
      for (const cpuMs of [0, 52.5, 3_600_000]) expect(readBeat(withHeld(template, held, cpuMs))).toEqual({ ...beat, cpuMs, heldMs: held })
    }
    // the template itself is left as it was
    expect(readBeat(template)).toMatchObject({ heldMs: 0.1, cpuMs: 0.2 })
  })

  it("a held stack in one phrase: where it runs and the first frame of the user's own code below it", () => {
    // a synchronous model.evaluate on rank 0, as the beat thread took it (frames innermost first)
    const evaluate = [
      "$conv2d (wasm://wasm/000c155a:1:22192)",
      "simdConv2d (core/kernels/conv2d.ts:118:13)",
      "<anonymous> (core/kernels/conv2d.ts:312:12)",
      "kernelFunc (node_modules/@tensorflow/tfjs-core/dist/tf-core.node.js:4707:32)",
      "LayersModel.evaluate (node_modules/@tensorflow/tfjs-layers/dist/tf-layers.node.js:24152:33)",
      "rank0EvalLoop (/home/me/project/train.ts:37:25)",
      "processTicksAndRejections (node:internal/process/task_queues:103:5)"
    ]
    expect(describeStack(evaluate)).toBe("in rank0EvalLoop (/home/me/project/train.ts:37:25), at $conv2d (wasm://wasm/000c155a:1:22192)")
    // installed gradwire is not the user's code either
    expect(describeStack(["f (node_modules/gradwire/dist/core/x.js:1:2)", "loop (train.ts:3:4)"])).toBe("in loop (train.ts:3:4), at f (node_modules/gradwire/dist/core/x.js:1:2)")
    // the user's own loop innermost: just where
    expect(describeStack(["stepLoop (test/support/step-loop.ts:96:7)"])).toBe("at stepLoop (test/support/step-loop.ts:96:7)")
    // none of it the user's: the innermost three
    expect(describeStack(["a (node_modules/x.js:1:1)", "b (core/y.ts:2:2)", "c (node:internal/z:3:3)", "d (actors/w.ts:4:4)"])).toBe(
      "at a (node_modules/x.js:1:1) < b (core/y.ts:2:2) < c (node:internal/z:3:3)"
    )
    expect(describeStack([])).toBe("")
  })

  it("beats with a held time: silence counts after silentAfterMs, a held event loop after heldAfterMs, each named", async () => {
    const template = (name: string) => beatTemplate({ name, instance: "i1", pid: 1, node: "n", intervalMs: 100 })!
    const beatFor = (name: string, heldMs: () => number) => {
      const t = template(name)
      const timer = setInterval(() => ncA.publish(a.subjects.heartbeat(name), withHeld(t, heldMs())), 100)
      return () => clearInterval(timer)
    }
    // held: the beats go on, the held time grows past 1.2 s; silence alone (deadAfterMs) would never count
    const heldName = fresh("held")
    const heldSince = Date.now()
    const stopHeld = beatFor(heldName, () => Date.now() - heldSince)
    const told: number[] = []
    const heldDown = b.watchPromise(heldName, { deadAfterMs: 500, silentAfterMs: 30_000, heldAfterMs: 1_200, onHeld: { afterMs: 600, call: (ms) => void told.push(ms) } })
    // silent: the beats stop while the event loop was fine; the long deadAfterMs must not apply
    const silentName = fresh("silent")
    const stopSilent = beatFor(silentName, () => 0)
    const silentDown = b.watchPromise(silentName, { deadAfterMs: 30_000, silentAfterMs: 600 })
    // alive: beats with a short held time go on past both deadlines
    const aliveName = fresh("alive")
    const stopAlive = beatFor(aliveName, () => 50)
    let aliveDown: unknown
    let aliveTold = 0
    // (deadlines of 2 s: this process both beats and watches, and a loaded machine can stall it for a while)
    void b.watchPromise(aliveName, { deadAfterMs: 2_000, silentAfterMs: 2_000, heldAfterMs: 2_000, onHeld: { afterMs: 1_500, call: () => void aliveTold++ } }).then((d) => (aliveDown = d))
    try {
      await new Promise((r) => setTimeout(r, 400))
      const stoppedAt = Date.now()
      stopSilent()
      const s = await silentDown
      expect(s.reason).toBe("missed-heartbeats")
      expect(s.detail).toMatch(/^no heartbeat for \d+ ms \(dead after 600 ms of silence\)$/)
      expect(Date.now() - stoppedAt).toBeLessThan(5_000)
      const h = await heldDown
      expect(h.detail).toMatch(/^its event loop has been held for \d+ ms \(taken for hung after 1200 ms\)/)
      // told once, past 600 ms and before it was taken for hung
      expect(told).toHaveLength(1)
      expect(told[0]).toBeGreaterThan(600)
      expect(told[0]).toBeLessThanOrEqual(1_200)
      expect(Date.now() - heldSince).toBeGreaterThanOrEqual(1_200)
      expect(aliveDown).toBeUndefined()
      expect(aliveTold).toBe(0)
    } finally {
      stopHeld()
      stopSilent()
      stopAlive()
    }
  })

  it("an actor beating from a thread: beats say how long its event loop is held; a thread that cannot connect leaves the beats to the event loop, saying why", async () => {
    // every beat heard, by actor name: its held time, or -1 for a beat without one
    const beats = new Map<string, number[]>()
    const sub = ncB.subscribe(b.subjects.heartbeats, {
      callback: (_e, m) => {
        const beat = readBeat(m.data)
        if (beat) beats.set(beat.name, [...(beats.get(beat.name) ?? []), beat.heldMs ?? -1])
      }
    })
    const warnings: string[] = []
    const log = { ...silentLogger, warn: (m: string) => void warnings.push(m) }
    const up = new ActorSystem({ nc: ncA, cluster: "t", job: "j", log: silentLogger, connection: { servers: [url] } })
    const down = new ActorSystem({ nc: ncA, cluster: "t", job: "j", log: silentLogger, connection: { servers: [`nats://127.0.0.1:${await freePort()}`] } })
    const [upName, downName] = [fresh("threaded"), fresh("unthreaded")]
    const hUp = await launchActor(up, echoActor, { name: upName, beatThread: true, heartbeatMs: 100, log })
    const hDown = await launchActor(down, echoActor, { name: downName, beatThread: true, heartbeatMs: 100, log })
    try {
      await eventually("a beat from the beat thread", 10_000, () => beats.get(upName)?.some((h) => h >= 0))
      await eventually("the warning", 10_000, () => warnings.length > 0)
      // its beats go on from the event loop, without a held time
      const before = beats.get(downName)?.length ?? 0
      await eventually("beats after the warning", 5_000, () => (beats.get(downName)?.length ?? 0) >= before + 3)
      expect(beats.get(downName)!.every((h) => h === -1)).toBe(true)
      expect(warnings).toHaveLength(1)
      expect(warnings[0]).toMatch(new RegExp(`^actor "${downName}" beats from its event loop \\(a long computation there silences it\\): its beat thread it failed: `))
    } finally {
      sub.unsubscribe()
      await hUp.stop()
      await hDown.stop()
      up.close()
      down.close()
    }
  })

  it("ctx.fail stops the actor as failed and the watcher sees the error", async () => {
    const P = defineProtocol("failer", { die: { request: Schema.String } })
    const def = defineActor(P, (ctx) => ({ die: (why) => ctx.fail(new Error(why)) }))
    const name = fresh("failer")
    const h = await launchActor(a, def, { name })
    const down = b.watchPromise(name)
    await b.tellPromise(b.ref(P, name), "die", "out of memory")
    const d = await down
    expect(d.reason).toBe("failed")
    expect(d.failure?.message).toBe("out of memory")
    expect(await h.awaitExit()).toMatchObject({ _tag: "Failed", failure: { message: "out of memory" } })
  })
})

describe("supervision", () => {
  it("restarts a failed child per policy, then escalates", async () => {
    const P = defineProtocol("fragile", { die: { request: Schema.Null }, ping: { request: Schema.Null, reply: Schema.String } })
    const def = defineActor(P, (ctx) => ({ die: () => ctx.fail(new Error("crashed")), ping: () => ctx.instance }))
    const name = fresh("fragile")
    const decisions: string[] = []
    const sup = await launchSupervisor({
      name,
      start: localChild(a, def, { name }),
      policy: restartOnFailure(2),
      backoffMs: () => 10,
      onDecision: (down, decision) => decisions.push(`${down.reason}:${decision}`)
    })
    const ref = b.ref(P, name)
    const first = await b.askPromise(ref, "ping", null)
    for (let i = 0; i < 3; i++) {
      const before = sup.current().instance
      await b.tellPromise(ref, "die", null)
      if (i < 2) await eventually("restart", 5_000, () => sup.current().instance !== before && sup.restarts() === i + 1)
    }
    const e = await sup.result.catch((x: unknown) => x)
    expect(e).toBeInstanceOf(ChildEscalated)
    expect(decisions).toEqual(["failed:restart", "failed:restart", "failed:escalate"])
    expect(first).not.toBe(sup.current().instance)
    await sup.close()
  })

  it("stops supervising after a normal stop", async () => {
    const name = fresh("echo")
    const exit = await Effect.runPromiseExit(
      Effect.scoped(
        Effect.gen(function* () {
          const s = yield* launchSupervisorEffect({ name, start: localChild(a, echoActor, { name }) })
          yield* Effect.promise(() => stopRemoteActor(b, name))
          return yield* s.result
        })
      )
    )
    expect(Exit.isSuccess(exit) && exit.value.reason).toBe("stopped")
  })
})

describe("Effect API", () => {
  it("scoped system and actor, ask as an Effect with typed errors", async () => {
    const name = fresh("echo")
    const result = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const host = yield* makeActorSystemEffect({ nc: ncA, cluster: "t", job: "fx", log: silentLogger })
          const client = yield* makeActorSystemEffect({ nc: ncB, cluster: "t", job: "fx", log: silentLogger })
          yield* launchActorEffect(host, echoActor, { name })
          const ref = client.ref(EchoProtocol, name)
          const echoed = yield* client.ask(ref, "echo", { x: [1, 2, 3] })
          const failed = yield* Effect.flip(client.ask(ref, "fail", "nope"))
          const timedOut = yield* Effect.flip(client.ask(ref, "sleep", 1_000, { timeoutMs: 50 }))
          return { echoed, failed: failed._tag, timedOut: timedOut._tag }
        })
      )
    )
    expect(result).toEqual({ echoed: { x: [1, 2, 3] }, failed: "RemoteFailure", timedOut: "AskTimeout" })
    // The scope stopped the actor.
    await expect(b.askPromise(b.ref(EchoProtocol, name), "echo", 1)).rejects.toBeInstanceOf(ActorUnavailable)
  })
})
