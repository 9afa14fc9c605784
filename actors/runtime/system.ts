// The actor system of one process in one job: it holds the NATS connection, sends `tell`s and
// `ask`s, receives replies through one wildcard inbox subscription (so replies may be chunked and
// no per-request subscription is made), heartbeats this process's identity (node agents kill a
// job's processes when their owner's beats stop), and owns the job's death watcher.
// Effect API (`makeActorSystemEffect`, `ActorSystemService`, `ask`/`tell` returning Effects) plus
// Promise conveniences (`askPromise`, `tellPromise`) on the same object.
import { hostname } from "node:os"
import { nuid, type Msg, type NatsConnection, type Subscription } from "@nats-io/nats-core"
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import { Nats } from "../../core/connection.ts"
import { NATS_MAX_PAYLOAD_BYTES } from "../../core/defaults.ts"
import type { ConnectionSpec } from "../../core/connection-spec.ts"
import { NatsOperationError } from "../../core/errors.ts"
import { assertToken, jobSubjects, type JobSubjects } from "../../core/subjects.ts"
import { settleWithin } from "./deadline.ts"
import { EnvelopeReceiver, publishEnvelope, readReply, requestEnvelope } from "./envelope.ts"
import {
  ActorStopped,
  ActorUnavailable,
  AskTimeout,
  MessageRejected,
  RemoteFailure,
  type AskError,
  type TellError
} from "./errors.ts"
import { publishJobEvent, type JobEvent } from "./events.ts"
import { DEFAULT_HEARTBEAT_MS, startBeating, type Beating } from "./heartbeat.ts"
import { stderrLogger, type ActorLogger } from "./log.ts"
import { schemaIssue, type AskKindOf, type KindCodec, type KindOf, type Protocol, type ProtocolSpec, type ReplyOf, type RequestOf } from "./protocol.ts"
import { Watcher, type ActorDown, type WatchOptions } from "./watcher.ts"

export const DEFAULT_ASK_TIMEOUT_MS = 30_000
/** Default cap on one message (request or reply), whole or reassembled from chunks. */
export const DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024

export interface ActorSystemOptions {
  readonly nc: NatsConnection
  /** The gradwire cluster name (first subject token after "gw"). */
  readonly cluster: string
  readonly job: string
  /** Largest NATS message; default the server's max_payload from the connection. */
  readonly maxPayload?: number
  /** This process's name in the job (reply inbox, heartbeat). Default "drv-<random>". */
  readonly identity?: string
  /** Heartbeat the identity (default true): node agents kill a job's processes when it stops. */
  readonly heartbeat?: boolean
  readonly heartbeatMs?: number
  /** Node id written into events and beats; default the hostname. */
  readonly node?: string
  readonly askTimeoutMs?: number
  /** Largest reply accepted (default 512 MiB). */
  readonly maxMessageBytes?: number
  readonly log?: ActorLogger
  /**
   * How this process connected (set in actor processes, actors/node/host.ts): actors that open
   * connections of their own, such as a worker's collective connections, open this one.
   */
  readonly connection?: ConnectionSpec
  /**
   * Modules besides its own that this process's agent allowed its actor to import (a worker's
   * train loop); undefined outside agent-spawned processes.
   */
  readonly allowedImports?: ReadonlyArray<string>
}

/** Where an actor lives and what it speaks. Plain data: can be sent to other actors. */
export interface ActorRef<Spec extends ProtocolSpec = ProtocolSpec> {
  readonly name: string
  readonly subject: string
  readonly protocol: Protocol<Spec>
}

export interface AskOptions {
  /** Deadline for the reply, in ms (default the system's askTimeoutMs, 30 s). */
  readonly timeoutMs?: number
  /**
   * An actor nobody subscribes to (the server's "no responders") is asked again every
   * UNAVAILABLE_RETRY_MS for this long, within timeoutMs, before ActorUnavailable: an actor whose
   * subscription is not back yet after a reconnect (a worker's connection can come back before
   * its driver's), or that is about to start. Only for asks that may be sent twice.
   */
  readonly unavailableForMs?: number
}

/** How often an ask with unavailableForMs is sent again to an actor nobody subscribes to. */
export const UNAVAILABLE_RETRY_MS = 200

interface Pending {
  readonly actor: string
  readonly kind: string
  readonly subject: string
  readonly codec: KindCodec
  timer: ReturnType<typeof setTimeout> | undefined
  /** Sends the ask again (unavailableForMs), until this time; undefined: ActorUnavailable at once. */
  readonly again?: { readonly until: number; readonly send: () => void }
  readonly done: (exit: Exit.Exit<unknown, AskError>) => void
}

export class ActorSystem {
  readonly nc: NatsConnection
  readonly cluster: string
  readonly job: string
  readonly subjects: JobSubjects
  readonly identity: string
  /** Incarnation of this process's identity (changes on every start). */
  readonly instance: string
  readonly node: string
  readonly maxMessageBytes: number
  readonly askTimeoutMs: number
  readonly heartbeatMs: number
  readonly log: ActorLogger
  readonly connection: ConnectionSpec | undefined
  readonly allowedImports: ReadonlyArray<string> | undefined
  readonly #pending = new Map<number, Pending>()
  readonly #receiver: EnvelopeReceiver
  readonly #replySub: Subscription
  readonly #replyPrefixLength: number
  readonly #beating: Beating | undefined
  readonly #maxPayload: number | undefined
  #seq = 0
  #watcher: Watcher | undefined
  #watcherReady: Promise<Watcher> | undefined
  #closed = false

  constructor(options: ActorSystemOptions) {
    assertToken("cluster", options.cluster)
    assertToken("job", options.job)
    this.nc = options.nc
    this.cluster = options.cluster
    this.job = options.job
    this.subjects = jobSubjects(options.cluster, options.job)
    this.identity = options.identity ?? `drv-${nuid.next()}`
    assertToken("identity", this.identity)
    this.instance = nuid.next()
    this.node = options.node ?? hostname()
    this.#maxPayload = options.maxPayload
    this.maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES
    this.askTimeoutMs = options.askTimeoutMs ?? DEFAULT_ASK_TIMEOUT_MS
    this.heartbeatMs = options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS
    this.log = options.log ?? stderrLogger(`${options.job}/${this.identity}`)
    this.connection = options.connection
    this.allowedImports = options.allowedImports
    this.#receiver = new EnvelopeReceiver({ maxMessageBytes: this.maxMessageBytes })
    this.#replyPrefixLength = this.subjects.reply(this.identity, 0).length - 1
    this.#replySub = this.nc.subscribe(this.subjects.replies(this.identity), { callback: (_err, msg) => this.#onReply(msg) })
    this.#beating =
      options.heartbeat === false
        ? undefined
        : startBeating(this.nc, this.subjects.heartbeat(this.identity), {
            name: this.identity,
            instance: this.instance,
            pid: process.pid,
            node: this.node,
            intervalMs: this.heartbeatMs
          })
  }

  /**
   * Largest NATS message: the option, else the connected server's max_payload, read on every use
   * because a reconnect may land on a server of the cluster with another limit.
   */
  get maxPayload(): number {
    return this.#maxPayload ?? this.nc.info?.max_payload ?? NATS_MAX_PAYLOAD_BYTES
  }

  get closed(): boolean {
    return this.#closed
  }

  /** A reference to actor `name` of this job speaking `protocol`. */
  ref<Spec extends ProtocolSpec>(protocol: Protocol<Spec>, name: string): ActorRef<Spec> {
    assertToken("actor name", name)
    return { name, subject: this.subjects.actor(name), protocol }
  }

  /** A reference to an actor at an explicit subject (node agents live outside any job). */
  refAt<Spec extends ProtocolSpec>(protocol: Protocol<Spec>, name: string, subject: string): ActorRef<Spec> {
    return { name, subject, protocol }
  }

  /**
   * Sends `body` as message `kind` and waits for the reply, at most `timeoutMs`. Fails with
   * AskTimeout, RemoteFailure (the handler failed; remote tag, message and stack), ActorUnavailable
   * (nobody at the address), ActorStopped, MessageRejected (either side refused the message) or
   * NatsOperationError. Interrupting the effect forgets the request.
   */
  ask<Spec extends ProtocolSpec, K extends AskKindOf<Spec>>(
    ref: ActorRef<Spec>,
    kind: K,
    body: RequestOf<Spec, K>,
    options?: AskOptions
  ): Effect.Effect<ReplyOf<Spec, K>, AskError> {
    return Effect.callback<ReplyOf<Spec, K>, AskError>((resume) => {
      const cancel = this.#ask(ref, kind, body, options, (exit) => resume(exit as Exit.Exit<ReplyOf<Spec, K>, AskError>))
      return Effect.sync(cancel)
    })
  }

  /** `ask` as a Promise; rejects with the same typed errors. */
  askPromise<Spec extends ProtocolSpec, K extends AskKindOf<Spec>>(
    ref: ActorRef<Spec>,
    kind: K,
    body: RequestOf<Spec, K>,
    options?: AskOptions
  ): Promise<ReplyOf<Spec, K>> {
    return new Promise((resolve, reject) => {
      this.#ask(ref, kind, body, options, (exit) => {
        if (Exit.isSuccess(exit)) resolve(exit.value as ReplyOf<Spec, K>)
        else reject(Cause.squash(exit.cause))
      })
    })
  }

  /** Fire and forget: sends `body` as message `kind`. Only local problems are reported. */
  tell<Spec extends ProtocolSpec, K extends KindOf<Spec>>(ref: ActorRef<Spec>, kind: K, body: RequestOf<Spec, K>): Effect.Effect<void, TellError> {
    return Effect.suspend(() => {
      const error = this.#tell(ref, kind, body)
      return error ? Effect.fail(error) : Effect.void
    })
  }

  tellPromise<Spec extends ProtocolSpec, K extends KindOf<Spec>>(ref: ActorRef<Spec>, kind: K, body: RequestOf<Spec, K>): Promise<void> {
    const error = this.#tell(ref, kind, body)
    return error ? Promise.reject(error) : Promise.resolve()
  }

  /** The job's death watcher (created on first use). */
  watcher(): Watcher {
    if (!this.#watcher) this.#watcher = new Watcher(this.nc, this.subjects)
    return this.#watcher
  }

  /**
   * The watcher, once the server has its subscriptions: events published after this resolves
   * are seen (spawning waits on it so a fast child's ready notice is not missed).
   */
  watcherReady(): Promise<Watcher> {
    this.#watcherReady ??= (async () => {
      const watcher = this.watcher()
      // Bounded: while reconnecting a flush waits for the server; the subscription goes out anyway.
      await settleWithin(this.nc.flush(), 5_000)
      return watcher
    })()
    return this.#watcherReady
  }

  /** Completes when actor `name` is down (see Watcher); never fails. */
  watch(name: string, options: WatchOptions = {}): Effect.Effect<ActorDown> {
    return Effect.callback<ActorDown>((resume) => {
      const cancel = this.watcher().watch(name, options, (down) => resume(Effect.succeed(down)))
      return Effect.sync(cancel)
    })
  }

  watchPromise(name: string, options: WatchOptions = {}): Promise<ActorDown> {
    return new Promise((resolve) => this.watcher().watch(name, options, resolve))
  }

  publishEvent(event: JobEvent): void {
    publishJobEvent(this.nc, this.subjects.events, event)
  }

  /** Tells every node agent to kill this job's processes (the job is over). */
  endJob(): void {
    this.publishEvent({ type: "job-end", by: this.identity, at: Date.now() })
  }

  /** Stops heartbeating, fails pending asks with ActorStopped, drops the subscriptions. Idempotent. */
  close(): void {
    if (this.#closed) return
    this.#closed = true
    this.#beating?.stop()
    this.#watcher?.close()
    try {
      this.#replySub.unsubscribe()
    } catch {
      // connection already closed
    }
    for (const p of [...this.#pending.values()]) {
      p.done(Exit.fail(new ActorStopped({ actor: p.actor, reason: "the asking actor system was closed before the reply came" })))
    }
  }

  // -- internals ------------------------------------------------------------------------------

  #codec(ref: ActorRef, kind: string): KindCodec | MessageRejected {
    return (
      ref.protocol.codecs.get(kind) ??
      new MessageRejected({
        actor: ref.name,
        kind,
        direction: "request",
        reason: `protocol "${ref.protocol.name}" has no kind "${kind}" (kinds: ${[...ref.protocol.codecs.keys()].join(", ")})`
      })
    )
  }

  #encode(ref: ActorRef, kind: string, codec: KindCodec, body: unknown): unknown {
    const encoded = codec.encodeRequest(body)
    if (Exit.isFailure(encoded)) {
      return new MessageRejected({ actor: ref.name, kind, direction: "request", reason: `body does not match the schema: ${schemaIssue(encoded)}` })
    }
    return requestEnvelope(kind, encoded.value)
  }

  #publish(subject: string, envelope: unknown, reply?: string): NatsOperationError | undefined {
    try {
      publishEnvelope(this.nc, subject, envelope, this.maxPayload, reply)
      return undefined
    } catch (e) {
      return new NatsOperationError({ operation: `publish to ${subject}`, reason: e instanceof Error ? e.message : String(e) })
    }
  }

  #tell(ref: ActorRef, kind: string, body: unknown): TellError | undefined {
    const codec = this.#codec(ref, kind)
    if (codec instanceof MessageRejected) return codec
    const envelope = this.#encode(ref, kind, codec, body)
    if (envelope instanceof MessageRejected) return envelope
    return this.#publish(ref.subject, envelope)
  }

  #ask(ref: ActorRef, kind: string, body: unknown, options: AskOptions | undefined, done: (exit: Exit.Exit<unknown, AskError>) => void): () => void {
    if (this.#closed) {
      done(Exit.fail(new ActorStopped({ actor: ref.name, reason: "this actor system is closed" })))
      return () => {}
    }
    const codec = this.#codec(ref, kind)
    if (codec instanceof MessageRejected) {
      done(Exit.fail(codec))
      return () => {}
    }
    const envelope = this.#encode(ref, kind, codec, body)
    if (envelope instanceof MessageRejected) {
      done(Exit.fail(envelope))
      return () => {}
    }
    const seq = ++this.#seq
    const ms = options?.timeoutMs ?? this.askTimeoutMs
    const replyTo = this.subjects.reply(this.identity, seq)
    let retry: ReturnType<typeof setTimeout> | undefined
    const send = (): void => {
      const error = this.#publish(ref.subject, envelope, replyTo)
      if (error) pending.done(Exit.fail(error))
    }
    const unavailableForMs = Math.min(options?.unavailableForMs ?? 0, ms)
    const pending: Pending = {
      actor: ref.name,
      kind,
      subject: ref.subject,
      codec,
      timer: undefined,
      ...(unavailableForMs > 0
        ? {
            again: {
              until: Date.now() + unavailableForMs,
              send: () => {
                // once per attempt: a request sent in frames (above max_payload) is answered "no
                // responders" once per frame
                if (retry !== undefined) return
                retry = setTimeout(() => {
                  retry = undefined
                  if (this.#pending.get(seq) === pending) send()
                }, UNAVAILABLE_RETRY_MS)
              }
            }
          }
        : {}),
      done: (exit) => {
        if (this.#pending.get(seq) !== pending) return
        this.#pending.delete(seq)
        clearTimeout(pending.timer)
        clearTimeout(retry)
        done(exit)
      }
    }
    this.#pending.set(seq, pending)
    pending.timer = setTimeout(() => pending.done(Exit.fail(new AskTimeout({ actor: ref.name, kind, timeoutMs: ms }))), ms)
    send()
    return () => {
      if (this.#pending.get(seq) === pending) {
        this.#pending.delete(seq)
        clearTimeout(pending.timer)
        clearTimeout(retry)
      }
    }
  }

  #onReply(msg: Msg): void {
    const seq = Number(msg.subject.slice(this.#replyPrefixLength))
    const p = this.#pending.get(seq)
    if (p === undefined) return // late (timed out) or foreign
    const data = msg.data
    if (data.length === 0) {
      // The server answers a request nobody subscribes to with an empty 503 status message.
      if (msg.headers?.code === 503) {
        if (p.again !== undefined && Date.now() + UNAVAILABLE_RETRY_MS < p.again.until) p.again.send()
        else p.done(Exit.fail(new ActorUnavailable({ actor: p.actor, kind: p.kind, subject: p.subject })))
      }
      else p.done(Exit.fail(this.#rejectedReply(p, "empty reply")))
      return
    }
    const got = this.#receiver.receive(data)
    if (got.type === "partial") {
      // A chunked reply is arriving: its frames follow back to back, but give it time.
      p.timer?.refresh()
      return
    }
    if (got.type === "error") {
      p.done(Exit.fail(this.#rejectedReply(p, got.reason)))
      return
    }
    const reply = readReply(got.value)
    if (typeof reply === "string") {
      p.done(Exit.fail(this.#rejectedReply(p, reply)))
      return
    }
    if (reply.ok) {
      const decoded = p.codec.decodeReply(reply.body)
      if (Exit.isSuccess(decoded)) p.done(Exit.succeed(decoded.value))
      else p.done(Exit.fail(this.#rejectedReply(p, `reply does not match the schema: ${schemaIssue(decoded)}`)))
      return
    }
    const f = reply.failure
    switch (f.tag) {
      case "ActorStopped":
        p.done(Exit.fail(new ActorStopped({ actor: p.actor, reason: f.message })))
        return
      case "MessageRejected":
        p.done(Exit.fail(new MessageRejected({ actor: p.actor, kind: p.kind, direction: "request", reason: f.message })))
        return
      default:
        p.done(Exit.fail(new RemoteFailure({ actor: p.actor, kind: p.kind, tag: f.tag, remoteMessage: f.message, remoteStack: f.stack })))
    }
  }

  #rejectedReply(p: Pending, reason: string): MessageRejected {
    const error = new MessageRejected({ actor: p.actor, kind: p.kind, direction: "reply", reason })
    this.log.warn(error.message)
    return error
  }
}

/** An actor system living as long as the enclosing scope. */
export const makeActorSystemEffect = (options: ActorSystemOptions): Effect.Effect<ActorSystem, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => new ActorSystem(options)),
    (system) => Effect.sync(() => system.close())
  )

/** The current actor system, for Effect code that is handed one through a Layer. */
export class ActorSystemService extends Context.Service<ActorSystemService, ActorSystem>()("gradwire/ActorSystem") {}

export const ActorSystemLayer = (options: ActorSystemOptions): Layer.Layer<ActorSystemService> =>
  Layer.effect(ActorSystemService, makeActorSystemEffect(options))

/** The actor system on the process's NATS connection (core/connection.ts `Nats`). */
export const ActorSystemFromNatsLayer = (options: Omit<ActorSystemOptions, "nc">): Layer.Layer<ActorSystemService, never, Nats> =>
  Layer.effect(
    ActorSystemService,
    Effect.gen(function* () {
      const nats = yield* Nats
      return yield* makeActorSystemEffect({ ...options, nc: nats.nc })
    })
  )
