// A running actor: its address (a subscription on its subject), its mailbox (one message at a
// time, in order), its handlers, heartbeat and lifecycle. Bad input (undecodable bytes, unknown
// kinds, schema violations, oversized or too many messages) is rejected with a typed
// MessageRejected that is logged (rate-limited), counted, answered to the asker when there is
// one, and never stops the actor. A handler that fails answers the asker with its error (tag,
// message, stack) and the actor keeps serving, as Ray actors do; an actor stops when asked to,
// when a handler calls ctx.stop()/ctx.fail(), or when its scope closes.
import { nuid, type Msg, type Subscription } from "@nats-io/nats-core"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { assertToken } from "../../core/subjects.ts"
import { EnvelopeReceiver, failReply, okReply, publishEnvelope, readRequest, toWireFailure, type WireFailure } from "./envelope.ts"
import { ActorStartError, ActorUnavailable, AskTimeout, MessageRejected } from "./errors.ts"
import { DEFAULT_HEARTBEAT_MS, startBeating, startThreadBeating, type Beating } from "./heartbeat.ts"
import { rateLimited, type ActorLogger } from "./log.ts"
import { Mailbox } from "./mailbox.ts"
import { TIMED_OUT, settleWithin, withDeadline } from "./deadline.ts"
import { schemaIssue, type AnySchema, type KindCodec, type KindOf, type Protocol, type ProtocolSpec, type ReplyOf, type RequestOf } from "./protocol.ts"
import { DEFAULT_MAX_MESSAGE_BYTES, type ActorRef, type ActorSystem } from "./system.ts"
import { systemProtocol } from "./system-protocol.ts"

export type HandlerResult<A> = A | PromiseLike<A> | Effect.Effect<A, unknown, never>

/** What a handler knows about the message besides its body. */
export interface MessageContext {
  readonly kind: string
  /** Where the reply goes; undefined for a tell. */
  readonly replyTo: string | undefined
  /** Encoded size in bytes. */
  readonly bytes: number
}

export type Handlers<Spec extends ProtocolSpec> = {
  readonly [K in KindOf<Spec>]: (body: RequestOf<Spec, K>, message: MessageContext) => HandlerResult<ReplyOf<Spec, K>>
}

export type Cleanup = () => void | PromiseLike<void> | Effect.Effect<void, unknown, never>

export interface StopOptions {
  /** Handle what is already queued before stopping (default true); else queued asks get ActorStopped. */
  readonly drain?: boolean
  /** Deadline for draining and cleanup together (default 10 s); past it the rest is dropped. */
  readonly timeoutMs?: number
  readonly reason?: string
  /**
   * Publish the "stopped" notice (default true). A process host that is being killed passes false:
   * its node agent's exit notice (code, signal, why it was killed) is the one watchers should see.
   */
  readonly announce?: boolean
}

/** What the actor's setup gets. */
export interface ActorContext<Args = unknown> {
  readonly name: string
  readonly instance: string
  readonly job: string
  readonly cluster: string
  readonly node: string
  readonly args: Args
  readonly self: ActorRef
  /** The system the actor runs in: use it to ask or tell other actors. */
  readonly system: ActorSystem
  readonly log: ActorLogger
  /** Stops this actor after the current message (not awaited: a handler may call it). */
  stop(options?: StopOptions): void
  /** Stops this actor as failed: watchers and supervisors see `error`. */
  fail(error: unknown): void
  /** Runs at stop, last registered first, before the stop notice goes out. */
  onStop(cleanup: Cleanup): void
}

export type Setup<Spec extends ProtocolSpec, Args> = (
  ctx: ActorContext<Args>
) => Handlers<Spec> | PromiseLike<Handlers<Spec>> | Effect.Effect<Handlers<Spec>, unknown, Scope.Scope>

export interface ActorDefinition<Spec extends ProtocolSpec = ProtocolSpec, Args = unknown> {
  readonly _tag: "ActorDefinition"
  readonly protocol: Protocol<Spec>
  readonly setup: Setup<Spec, Args>
  /** Validates args (they may come over the wire from another process). */
  readonly args?: AnySchema
}

/**
 * Declares an actor: its protocol and a setup that returns one handler per kind. Setup may return
 * the handlers directly, as a Promise, or as an Effect (which may acquire scoped resources: they
 * are released when the actor stops).
 */
export const defineActor = <Spec extends ProtocolSpec, Args = unknown>(
  protocol: Protocol<Spec>,
  setup: Setup<Spec, Args>,
  options: { readonly args?: AnySchema } = {}
): ActorDefinition<Spec, Args> => ({ _tag: "ActorDefinition", protocol, setup, ...(options.args ? { args: options.args } : {}) })

export const isActorDefinition = (u: unknown): u is ActorDefinition =>
  typeof u === "object" && u !== null && (u as { _tag?: unknown })._tag === "ActorDefinition"

/** Why an actor stopped. */
export type ActorExit =
  | { readonly _tag: "Stopped"; readonly reason: string }
  | { readonly _tag: "Failed"; readonly failure: WireFailure }

export interface ActorStats {
  readonly handled: number
  readonly failed: number
  readonly rejected: number
  readonly queued: number
}

export interface StartActorOptions<Args = unknown> {
  readonly name: string
  readonly args?: Args
  /** Incarnation id (a node agent passes the spawn's); default a fresh one. */
  readonly instance?: string
  /** Default the job's actor subject for `name`. */
  readonly subject?: string
  /** Queued messages beyond this are rejected (default 10 000). */
  readonly mailboxCapacity?: number
  /** Largest request accepted, whole or reassembled (default 512 MiB). */
  readonly maxMessageBytes?: number
  readonly heartbeat?: boolean
  readonly heartbeatMs?: number
  /**
   * Beat from a thread with a connection of its own (heartbeat.ts startThreadBeating), each beat
   * saying how long the main thread's event loop has been held, when the system knows its
   * connection (actor processes a node agent spawns). Default false: beats from a timer.
   */
  readonly beatThread?: boolean
  /** Refuse to start when another actor already answers at the address (default true). */
  readonly checkAddress?: boolean
  /** Deadline for the definition's setup (default 120 s). */
  readonly setupTimeoutMs?: number
  /** Called for every rejected message (after logging). */
  readonly onRejected?: (error: MessageRejected) => void
  readonly log?: ActorLogger
}

type AnyHandlers = Record<string, (body: unknown, message: MessageContext) => unknown>

interface Mail {
  readonly kind: string
  readonly body: unknown
  readonly replyTo: string | undefined
  readonly bytes: number
  readonly codec: KindCodec
  /** Set when the actor stopped without handling (or finishing) it: its reply is suppressed. */
  abandoned: boolean
}

const isPromiseLike = (u: unknown): u is PromiseLike<unknown> =>
  typeof u === "object" && u !== null && typeof (u as { then?: unknown }).then === "function"

/** A started actor. Stop it with `stop` (Promise) or `stopEffect`. */
export class ActorHandle<Spec extends ProtocolSpec = ProtocolSpec> {
  readonly name: string
  readonly instance: string
  readonly ref: ActorRef<Spec>
  readonly system: ActorSystem
  // Untyped inside: keeps ActorHandle<Spec> assignable to ActorHandle (the fields are private).
  readonly #protocol: Protocol
  readonly #log: ActorLogger
  readonly #logRejected: (message: string) => void
  readonly #onRejected: ((error: MessageRejected) => void) | undefined
  readonly #receiver: EnvelopeReceiver
  readonly #mailbox: Mailbox<Mail>
  readonly #scope: Scope.Closeable
  readonly #cleanups: Cleanup[] = []
  readonly #heartbeat: boolean
  readonly #heartbeatMs: number
  readonly #beatThread: boolean
  readonly #setupTimeoutMs: number
  #handlers: AnyHandlers | undefined
  #sub: Subscription | undefined
  #beating: Beating | undefined
  #current: { mail: Mail; fiber: Fiber.Fiber<unknown, unknown> | undefined } | undefined
  #stopping: Promise<void> | undefined
  #exit: ActorExit | undefined
  readonly #exitWaiters: Array<(exit: ActorExit) => void> = []
  #handled = 0
  #failed = 0
  #rejected = 0

  /** @internal use launchActor / launchActorEffect */
  constructor(system: ActorSystem, protocol: Protocol<Spec>, options: StartActorOptions<unknown>) {
    this.system = system
    this.name = options.name
    this.instance = options.instance ?? nuid.next()
    this.#protocol = protocol
    this.ref = system.refAt(protocol, options.name, options.subject ?? system.subjects.actor(options.name))
    this.#log = options.log ?? system.log
    this.#logRejected = rateLimited((m) => this.#log.warn(m))
    this.#onRejected = options.onRejected
    this.#receiver = new EnvelopeReceiver({ maxMessageBytes: options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES })
    this.#mailbox = new Mailbox<Mail>(options.mailboxCapacity ?? 10_000, (mail) => this.#handle(mail), (e) =>
      this.#log.error(`actor "${this.name}": mailbox handler threw: ${String(e)}`)
    )
    this.#scope = Scope.makeUnsafe()
    this.#heartbeat = options.heartbeat ?? true
    this.#heartbeatMs = options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS
    this.#beatThread = options.beatThread ?? false
    this.#setupTimeoutMs = options.setupTimeoutMs ?? 120_000
  }

  get subject(): string {
    return this.ref.subject
  }

  /** Undefined while running. */
  get exitReason(): ActorExit | undefined {
    return this.#exit
  }

  stats(): ActorStats {
    return { handled: this.#handled, failed: this.#failed, rejected: this.#rejected, queued: this.#mailbox.size }
  }

  /** Resolves when the actor has stopped (for any reason), with why. */
  awaitExit(): Promise<ActorExit> {
    if (this.#exit) return Promise.resolve(this.#exit)
    return new Promise((resolve) => this.#exitWaiters.push(resolve))
  }

  get exit(): Effect.Effect<ActorExit> {
    return Effect.promise(() => this.awaitExit())
  }

  /** Stops the actor; see StopOptions. Idempotent: later calls wait for the first. */
  stop(options: StopOptions = {}): Promise<void> {
    return this.#stop(options, undefined)
  }

  stopEffect(options: StopOptions = {}): Effect.Effect<void> {
    return Effect.promise(() => this.stop(options))
  }

  // -- start ----------------------------------------------------------------------------------

  /** @internal */
  async start(definition: ActorDefinition<ProtocolSpec, unknown>, args: unknown): Promise<void> {
    const system = this.system
    if (definition.args) {
      const decoded = Schema.decodeUnknownExit(definition.args)(args)
      if (Exit.isFailure(decoded)) throw new ActorStartError({ actor: this.name, reason: `invalid args: ${schemaIssue(decoded)}` })
      args = decoded.value
    }
    const ctx: ActorContext<unknown> = {
      name: this.name,
      instance: this.instance,
      job: system.job,
      cluster: system.cluster,
      node: system.node,
      args,
      self: this.ref,
      system,
      log: this.#log,
      stop: (options) => void this.stop(options),
      fail: (error) => void this.#stop({ drain: false, reason: "failed" }, toWireFailure(error)),
      onStop: (cleanup) => void this.#cleanups.push(cleanup)
    }
    try {
      const made = definition.setup(ctx)
      const pending = Effect.isEffect(made)
        ? Effect.runPromiseExit(Scope.provide(this.#scope)(made)).then((exit) => {
            if (Exit.isFailure(exit)) throw Cause.squash(exit.cause)
            return exit.value
          })
        : Promise.resolve(made)
      const handlers = await withDeadline(pending, this.#setupTimeoutMs)
      if (handlers === TIMED_OUT) throw new ActorStartError({ actor: this.name, reason: `setup did not finish within ${this.#setupTimeoutMs} ms` })
      this.#handlers = handlers as unknown as AnyHandlers
      const missing = [...this.#protocol.codecs.keys()].filter((k) => typeof (this.#handlers as Record<string, unknown>)[k] !== "function")
      if (missing.length > 0) throw new Error(`setup returned no handler for kind(s) ${missing.join(", ")}`)
    } catch (e) {
      await this.#runCleanups(5_000)
      if (e instanceof ActorStartError) throw e
      const f = toWireFailure(e)
      throw new ActorStartError({ actor: this.name, reason: `setup failed: ${f.tag}: ${f.message}` })
    }
    await this.#claimAddress()
    if (this.#heartbeat) {
      const subject = system.subjects.heartbeat(this.name)
      const beat = { name: this.name, instance: this.instance, pid: process.pid, node: system.node, intervalMs: this.#heartbeatMs }
      this.#beating =
        this.#beatThread && system.connection
          ? startThreadBeating(
              system.nc,
              subject,
              beat,
              system.connection,
              `gradwire ${system.job}/${this.name}`,
              undefined,
              (why) => this.#log.warn(`actor "${this.name}" beats from its event loop (a long computation there silences it): its beat thread ${why}`),
              system.subjects.stack(this.name)
            )
          : startBeating(system.nc, subject, beat)
    }
    system.publishEvent({ type: "ready", name: this.name, instance: this.instance, pid: process.pid, node: system.node, at: Date.now() })
  }

  async #claimAddress(): Promise<void> {
    try {
      const found = await this.system.askPromise(this.system.refAt(systemProtocol, this.name, this.subject), "$ping", null, { timeoutMs: 1_500 })
      await this.#runCleanups(5_000)
      throw new ActorStartError({
        actor: this.name,
        reason: `another actor already serves ${this.subject} (instance ${found.instance}, pid ${found.pid} on node ${found.node}); stop it or pick another name`
      })
    } catch (e) {
      if (e instanceof ActorStartError) throw e
      // ActorUnavailable: the address is free. A timeout: nobody answered either; go ahead.
      if (!(e instanceof ActorUnavailable) && !(e instanceof AskTimeout)) this.#log.debug(`address check for "${this.name}": ${String(e)}`)
    }
    this.#sub = this.system.nc.subscribe(this.subject, { callback: (_err, msg) => this.#onMessage(msg) })
    // Make sure the server has the subscription before we announce that we are ready.
    await settleWithin(this.system.nc.flush(), 5_000)
  }

  // -- receive --------------------------------------------------------------------------------

  #onMessage(msg: Msg): void {
    // The client reports "no reply subject" as an empty string.
    const replyTo = msg.reply || undefined
    const got = this.#receiver.receive(msg.data)
    if (got.type === "partial") return
    if (got.type === "error") return this.#reject(replyTo, "", got.reason)
    const envelope = readRequest(got.value)
    if (typeof envelope === "string") return this.#reject(replyTo, "", envelope)
    const kind = envelope.kind
    if (kind.charCodeAt(0) === 36 /* $ */) return this.#system(kind, envelope.body, replyTo)
    const codec = this.#protocol.codecs.get(kind)
    if (codec === undefined) return this.#reject(replyTo, kind, `unknown message kind "${kind}" (protocol "${this.#protocol.name}")`)
    const decoded = codec.decodeRequest(envelope.body)
    if (Exit.isFailure(decoded)) return this.#reject(replyTo, kind, `body does not match the schema: ${schemaIssue(decoded)}`)
    const mail: Mail = { kind, body: decoded.value, replyTo, bytes: got.bytes, codec, abandoned: false }
    // An immediate kind does not wait behind a running handler (which may be waiting for it).
    if (codec.immediate && this.#handlers !== undefined && !this.#mailbox.closed) {
      void this.#handle(mail)
      return
    }
    if (this.#mailbox.offer(mail)) return
    if (this.#mailbox.closed) this.#replyFailure(replyTo, { tag: "ActorStopped", message: `actor "${this.name}" is stopping`, stack: "" })
    else this.#reject(replyTo, kind, `mailbox full (${this.#mailbox.capacity} messages queued); the actor is overloaded`)
  }

  #reject(replyTo: string | undefined, kind: string, reason: string): void {
    this.#rejected++
    const error = new MessageRejected({ actor: this.name, kind, direction: "request", reason })
    this.#logRejected(error.message)
    this.#onRejected?.(error)
    this.#replyFailure(replyTo, { tag: "MessageRejected", message: reason, stack: "" })
  }

  #system(kind: string, body: unknown, replyTo: string | undefined): void {
    const codec = systemProtocol.codecs.get(kind)
    const decoded = codec?.decodeRequest(body)
    if (codec === undefined || decoded === undefined || Exit.isFailure(decoded)) {
      return this.#reject(replyTo, kind, `unknown or malformed system message "${kind}"`)
    }
    if (kind === "$ping") {
      // Answered outside the mailbox: liveness must not wait behind a long handler.
      this.#replyOk(replyTo, codec, {
        name: this.name,
        instance: this.instance,
        pid: process.pid,
        node: this.system.node,
        queued: this.#mailbox.size,
        handled: this.#handled
      })
      return
    }
    if (kind === "$stop") {
      const request = decoded.value as { drain: boolean; reason: string }
      void this.stop({ drain: request.drain, reason: request.reason || "asked to stop" }).then(() => this.#replyOk(replyTo, codec, null))
    }
  }

  // -- handle ---------------------------------------------------------------------------------

  #handle(mail: Mail): void | Promise<void> {
    const handler = this.#handlers![mail.kind]
    let result: unknown
    try {
      result = handler(mail.body, mail)
    } catch (e) {
      this.#done(mail, Exit.fail(e))
      return
    }
    if (Effect.isEffect(result)) {
      const fiber = Effect.runFork(result as Effect.Effect<unknown, unknown>)
      let settled = false
      let wake: (() => void) | undefined
      fiber.addObserver((exit) => {
        settled = true
        if (this.#current?.mail === mail) this.#current = undefined
        this.#done(mail, exit)
        wake?.()
      })
      if (settled) return
      this.#current = { mail, fiber }
      return new Promise<void>((resolve) => (wake = resolve))
    }
    if (isPromiseLike(result)) {
      this.#current = { mail, fiber: undefined }
      return Promise.resolve(result).then(
        (value) => {
          if (this.#current?.mail === mail) this.#current = undefined
          this.#done(mail, Exit.succeed(value))
        },
        (e: unknown) => {
          if (this.#current?.mail === mail) this.#current = undefined
          this.#done(mail, Exit.fail(e))
        }
      )
    }
    this.#done(mail, Exit.succeed(result))
  }

  #done(mail: Mail, exit: Exit.Exit<unknown, unknown>): void {
    if (mail.abandoned) return
    if (Exit.isSuccess(exit)) {
      this.#handled++
      this.#replyOk(mail.replyTo, mail.codec, exit.value)
      return
    }
    this.#failed++
    const failure = Cause.hasInterrupts(exit.cause) && !Cause.hasFails(exit.cause)
      ? { tag: "ActorStopped", message: `actor "${this.name}" stopped while handling "${mail.kind}"`, stack: "" }
      : toWireFailure(Cause.squash(exit.cause))
    if (mail.replyTo === undefined) {
      this.#log.warn(`actor "${this.name}": tell "${mail.kind}" failed: ${failure.tag}: ${failure.message}`)
      return
    }
    this.#replyFailure(mail.replyTo, failure)
  }

  #replyOk(replyTo: string | undefined, codec: KindCodec, value: unknown): void {
    if (replyTo === undefined) return
    const encoded = codec.encodeReply(value)
    if (Exit.isFailure(encoded)) {
      this.#replyFailure(replyTo, { tag: "InvalidReply", message: `the handler's reply does not match the schema: ${schemaIssue(encoded)}`, stack: "" })
      return
    }
    this.#send(replyTo, okReply(encoded.value))
  }

  #replyFailure(replyTo: string | undefined, failure: WireFailure): void {
    if (replyTo === undefined) return
    this.#send(replyTo, failReply(failure))
  }

  #send(subject: string, envelope: unknown): void {
    try {
      publishEnvelope(this.system.nc, subject, envelope, this.system.maxPayload)
    } catch (e) {
      this.#log.warn(`actor "${this.name}": cannot send reply: ${e instanceof Error ? e.message : String(e)}`)
    }
  }

  // -- stop -----------------------------------------------------------------------------------

  #stop(options: StopOptions, failure: WireFailure | undefined): Promise<void> {
    this.#stopping ??= this.#doStop(options, failure)
    return this.#stopping
  }

  async #doStop(options: StopOptions, failure: WireFailure | undefined): Promise<void> {
    const deadline = Date.now() + (options.timeoutMs ?? 10_000)
    const left = (): number => Math.max(0, deadline - Date.now())
    const drain = (options.drain ?? true) && failure === undefined
    const sub = this.#sub
    this.#sub = undefined
    if (drain) {
      // Let the server stop sending and hand us what it already sent, then work through it.
      if (sub && !this.system.nc.isClosed()) await settleWithin(sub.drain(), left())
      this.#mailbox.seal()
      if ((await withDeadline(this.#mailbox.idle(), left())) === TIMED_OUT) {
        this.#log.warn(`actor "${this.name}": mailbox not drained within the stop deadline; dropping the rest`)
      }
    } else {
      try {
        sub?.unsubscribe()
      } catch {
        // connection closed
      }
    }
    const stopped: WireFailure = { tag: "ActorStopped", message: `actor "${this.name}" stopped before handling the message`, stack: "" }
    for (const mail of this.#mailbox.close()) {
      mail.abandoned = true
      this.#replyFailure(mail.replyTo, stopped)
    }
    const current = this.#current
    if (current) {
      current.mail.abandoned = true
      this.#replyFailure(current.mail.replyTo, { ...stopped, message: `actor "${this.name}" stopped while handling "${current.mail.kind}"` })
      if (current.fiber) Effect.runFork(Fiber.interrupt(current.fiber))
    }
    this.#beating?.stop()
    await this.#runCleanups(left())
    const reason = options.reason ?? (failure ? "failed" : "stopped")
    if (options.announce !== false) this.system.publishEvent({
      type: "stopped",
      name: this.name,
      instance: this.instance,
      reason,
      ...(failure ? { failure } : {}),
      at: Date.now()
    })
    this.#exit = failure ? { _tag: "Failed", failure } : { _tag: "Stopped", reason }
    for (const w of this.#exitWaiters.splice(0)) w(this.#exit)
  }

  async #runCleanups(ms: number): Promise<void> {
    const deadline = Date.now() + ms
    for (const cleanup of this.#cleanups.splice(0).reverse()) {
      try {
        const r = cleanup()
        const p = Effect.isEffect(r) ? Effect.runPromise(r as Effect.Effect<void, unknown>) : isPromiseLike(r) ? r : undefined
        if (p && (await withDeadline(p, deadline - Date.now())) === TIMED_OUT) {
          this.#log.warn(`actor "${this.name}": a stop hook did not finish in time`)
        }
      } catch (e) {
        this.#log.warn(`actor "${this.name}": stop hook failed: ${String(e)}`)
      }
    }
    const closed = Effect.runPromise(Scope.close(this.#scope, Exit.void))
    if ((await withDeadline(closed, Math.max(0, deadline - Date.now())).catch(() => TIMED_OUT)) === TIMED_OUT) {
      this.#log.warn(`actor "${this.name}": releasing its resources did not finish in time`)
    }
  }
}

/** Starts an actor; stop it with `handle.stop()`. Rejects with ActorStartError. */
export const launchActor = async <Spec extends ProtocolSpec, Args>(
  system: ActorSystem,
  definition: ActorDefinition<Spec, Args>,
  options: StartActorOptions<Args>
): Promise<ActorHandle<Spec>> => {
  assertToken("actor name", options.name)
  if (system.closed) throw new ActorStartError({ actor: options.name, reason: "the actor system is closed" })
  const handle = new ActorHandle<Spec>(system, definition.protocol, options as StartActorOptions<unknown>)
  await handle.start(definition as unknown as ActorDefinition<ProtocolSpec, unknown>, options.args)
  return handle
}

/** Starts an actor that lives as long as the enclosing scope (stopped without draining at its end). */
export const launchActorEffect = <Spec extends ProtocolSpec, Args>(
  system: ActorSystem,
  definition: ActorDefinition<Spec, Args>,
  options: StartActorOptions<Args>
): Effect.Effect<ActorHandle<Spec>, ActorStartError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => launchActor(system, definition, options),
      catch: (e) => (e instanceof ActorStartError ? e : new ActorStartError({ actor: options.name, reason: String(e) }))
    }),
    (handle) => Effect.promise(() => handle.stop({ drain: false, reason: "scope closed" }))
  )

/** Asks a (possibly remote) actor for its liveness details, answered outside its mailbox. */
export const pingActor = (system: ActorSystem, name: string, timeoutMs = 2_000) =>
  system.askPromise(system.refAt(systemProtocol, name, system.subjects.actor(name)), "$ping", null, { timeoutMs })

/** Asks a (possibly remote) actor to stop; resolves once it has. */
export const stopRemoteActor = (system: ActorSystem, name: string, options: { drain?: boolean; reason?: string; timeoutMs?: number } = {}) =>
  system.askPromise(
    system.refAt(systemProtocol, name, system.subjects.actor(name)),
    "$stop",
    { drain: options.drain ?? true, reason: options.reason ?? "" },
    { timeoutMs: options.timeoutMs ?? 15_000 }
  )
