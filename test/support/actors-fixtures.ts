// Actors used by the actor, agent and CLI tests, and spawned by node agents in them (so each is
// an export a child process can load): echo, a counter that keeps order, a relay that asks
// another actor, one that fails, one that is slow or holds its event loop, and one that crashes its process.
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import { defineActor } from "../../actors/runtime/actor.ts"
import { defineProtocol } from "../../actors/runtime/protocol.ts"
import { WireTensorSchema } from "../../actors/runtime/tensor-schema.ts"
import type { ActorSystem } from "../../actors/runtime/system.ts"

export const EchoProtocol = defineProtocol("echo", {
  echo: { request: Schema.Unknown, reply: Schema.Unknown },
  whoami: { request: Schema.Null, reply: Schema.Struct({ name: Schema.String, pid: Schema.Number, node: Schema.String, env: Schema.Record(Schema.String, Schema.String) }) },
  tensor: { request: Schema.Struct({ t: WireTensorSchema }), reply: Schema.Struct({ sum: Schema.Number, shape: Schema.Array(Schema.Number) }) },
  relay: { request: Schema.Struct({ to: Schema.String, value: Schema.Unknown }), reply: Schema.Unknown },
  fail: { request: Schema.String, reply: Schema.Null },
  crash: { request: Schema.Number, reply: Schema.Null },
  sleep: { request: Schema.Number, reply: Schema.Number },
  /** Holds the event loop this long (a busy wait), as one long synchronous computation does. */
  hold: { request: Schema.Number, reply: Schema.Number },
  log: { request: Schema.String, reply: Schema.Null }
})

class Boom extends Schema.TaggedError<Boom>()("Boom", { detail: Schema.String }) {
  override get message(): string {
    return `boom: ${this.detail}`
  }
}

export const echoActor = defineActor(EchoProtocol, (ctx) => ({
  echo: (body) => body,
  whoami: () => {
    const env: Record<string, string> = {}
    for (const k of ["CUDA_VISIBLE_DEVICES", "GRADWIRE_TEST_ENV", "OMP_NUM_THREADS"]) if (process.env[k] !== undefined) env[k] = process.env[k] as string
    return { name: ctx.name, pid: process.pid, node: ctx.node, env }
  },
  tensor: ({ t }) => {
    let sum = 0
    for (const v of t.data as Float32Array) sum += v
    return { sum, shape: [...t.shape] }
  },
  relay: ({ to, value }) => ctx.system.ask(ctx.system.ref(EchoProtocol, to), "echo", value, { timeoutMs: 5_000 }),
  fail: (detail) => Effect.fail(new Boom({ detail })),
  crash: (code) => {
    setTimeout(() => process.exit(code), 10)
    return null
  },
  sleep: (ms) => Effect.as(Effect.sleep(ms), ms),
  hold: (ms) => {
    const until = Date.now() + ms
    while (Date.now() < until) {
      // held
    }
    return ms
  },
  log: (line) => {
    console.log(line)
    console.error(`err:${line}`)
    return null
  }
}))

export const CounterProtocol = defineProtocol("counter", {
  add: { request: Schema.Struct({ n: Schema.Number }), reply: Schema.Number },
  addSlow: { request: Schema.Struct({ n: Schema.Number, ms: Schema.Number }), reply: Schema.Number },
  bump: { request: Schema.Number },
  get: { request: Schema.Null, reply: Schema.Array(Schema.Number) }
})

/** Records every value in arrival order; addSlow awaits before recording, to test one-at-a-time. */
export const counterActor = defineActor(CounterProtocol, () => {
  const seen: number[] = []
  return {
    add: ({ n }) => {
      seen.push(n)
      return seen.length
    },
    addSlow: ({ n, ms }) =>
      new Promise<number>((resolve) =>
        setTimeout(() => {
          seen.push(n)
          resolve(seen.length)
        }, ms)
      ),
    bump: (n) => {
      seen.push(n)
    },
    get: () => seen
  }
})

/** Fails in setup: for start errors and supervisors. */
export const brokenActor = defineActor(EchoProtocol, () => {
  throw new Error("setup exploded on purpose")
})

/** Exits its process shortly after starting with the code in args (for supervision tests). */
export const shortLivedActor = defineActor(
  EchoProtocol,
  (ctx) => {
    const { exitCode, afterMs } = ctx.args as { exitCode: number; afterMs: number }
    setTimeout(() => process.exit(exitCode), afterMs)
    return echoActor.setup(ctx)
  },
  { args: Schema.Struct({ exitCode: Schema.Number, afterMs: Schema.Number }) }
)

export const askEcho = (system: ActorSystem, name: string, value: unknown, timeoutMs = 5_000) =>
  system.askPromise(system.ref(EchoProtocol, name), "echo", value, { timeoutMs })
