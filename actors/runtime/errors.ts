// Typed errors of the actor runtime (the node agent's are in actors/node/errors.ts). Each names
// the actor involved and says what to do, because these surface far from where the problem is (a
// remote process, another machine).
import * as Schema from "effect/Schema"
import type { NatsOperationError } from "../../core/errors.ts"

/** An `ask` got no reply before its deadline. */
export class AskTimeout extends Schema.TaggedError<AskTimeout>()("AskTimeout", {
  actor: Schema.String,
  kind: Schema.String,
  timeoutMs: Schema.Number
}) {
  override get message(): string {
    return (
      `ask "${this.kind}" to actor "${this.actor}" got no reply within ${this.timeoutMs} ms: the actor is busy ` +
      `(its mailbox handles one message at a time), dead, or unreachable; check its liveness or raise timeoutMs`
    )
  }
}

/** The remote handler failed; carries the remote error's tag, message and stack. */
export class RemoteFailure extends Schema.TaggedError<RemoteFailure>()("RemoteFailure", {
  actor: Schema.String,
  kind: Schema.String,
  tag: Schema.String,
  remoteMessage: Schema.String,
  remoteStack: Schema.String
}) {
  override get message(): string {
    return `actor "${this.actor}" failed handling "${this.kind}": ${this.tag}: ${this.remoteMessage}`
  }
}

/** The actor is stopped (or stopped before it handled the message). */
export class ActorStopped extends Schema.TaggedError<ActorStopped>()("ActorStopped", {
  actor: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `actor "${this.actor}" is stopped: ${this.reason}`
  }
}

/** Nobody listens at the actor's address (never started, stopped, or its process died). */
export class ActorUnavailable extends Schema.TaggedError<ActorUnavailable>()("ActorUnavailable", {
  actor: Schema.String,
  kind: Schema.String,
  subject: Schema.String
}) {
  override get message(): string {
    return (
      `no actor "${this.actor}" listens at ${this.subject} (sending "${this.kind}"): it was never started, ` +
      `has stopped, or its process died; check the job and actor name and that the actor is running`
    )
  }
}

/**
 * A message was refused: undecodable bytes, an unknown kind, a body that violates the kind's
 * schema, too large, or a full mailbox. `direction` says whether a request (at the actor) or a
 * reply (at the asker) was refused.
 */
export class MessageRejected extends Schema.TaggedError<MessageRejected>()("MessageRejected", {
  actor: Schema.String,
  kind: Schema.String,
  direction: Schema.Literals(["request", "reply"]),
  reason: Schema.String
}) {
  override get message(): string {
    return `${this.direction} "${this.kind || "?"}" for actor "${this.actor}" rejected: ${this.reason}`
  }
}

/** An actor could not start (its setup failed, or its address is taken). */
export class ActorStartError extends Schema.TaggedError<ActorStartError>()("ActorStartError", {
  actor: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `actor "${this.actor}" could not start: ${this.reason}`
  }
}

/** A supervised child failed and the policy escalated. */
export class ChildEscalated extends Schema.TaggedError<ChildEscalated>()("ChildEscalated", {
  child: Schema.String,
  reason: Schema.String,
  restarts: Schema.Number
}) {
  override get message(): string {
    return `child "${this.child}" stopped (${this.reason}) after ${this.restarts} restart(s); the supervisor escalated`
  }
}

/** Any error an `ask` can end with. */
export type AskError = AskTimeout | RemoteFailure | ActorStopped | ActorUnavailable | MessageRejected | NatsOperationError
/** Any error a `tell` can end with (a tell has no reply, so remote failures are not seen). */
export type TellError = MessageRejected | NatsOperationError
