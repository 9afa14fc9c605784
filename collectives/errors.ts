// Typed errors of the collectives layer. Each names the rank that hit it, the operation, and the
// peers involved, and its message says what happened and what to do next. After any of these the
// communicator is aborted on every rank (a collective that failed on one rank cannot be finished
// by the others): create a new one with a fresh group name.
import * as Schema from "effect/Schema"

const list = (ranks: ReadonlyArray<number>): string => (ranks.length === 0 ? "none" : ranks.join(", "))

/**
 * A wait passed its deadline: no message for this operation arrived for `timeoutMs`. `waitingFor`
 * are the peers this rank was waiting on; `unresponsive` are the peers that did not answer a
 * liveness probe sent after the deadline (dead, stopped or hung) - usually the culprit.
 */
export class CollectiveTimeout extends Schema.TaggedError<CollectiveTimeout>()("CollectiveTimeout", {
  op: Schema.String,
  group: Schema.String,
  rank: Schema.Number,
  seq: Schema.Number,
  waitingFor: Schema.Array(Schema.Number),
  unresponsive: Schema.Array(Schema.Number),
  /** Peers that answered the probe but had not started this call yet. */
  behind: Schema.optionalKey(Schema.Array(Schema.Number)),
  timeoutMs: Schema.Number,
  /** How long nothing had arrived when the rank gave up: the deadline, then the liveness probe. */
  silentMs: Schema.optionalKey(Schema.Number),
  /** How the deadline came about (deadlines.ts), e.g. "2 x median step 0.11 s + floor 10 s". */
  deadline: Schema.optionalKey(Schema.String),
  /** Why the peers waited for were not waited for past the deadline (what the owner said of them), where it was asked. */
  notWaitedOn: Schema.optionalKey(Schema.String)
}) {
  /** The ranks most likely at fault: the unresponsive ones, else the ones that never joined this call, else the ones waited on. */
  get failedRanks(): ReadonlyArray<number> {
    if (this.unresponsive.length > 0) return this.unresponsive
    if (this.behind && this.behind.length > 0) return this.behind
    return this.waitingFor
  }
  override get message(): string {
    const who =
      this.unresponsive.length > 0
        ? `rank(s) ${list(this.unresponsive)} did not answer a liveness probe (dead, stopped or hung)`
        : this.behind && this.behind.length > 0
          ? `every peer answered a liveness probe, but rank(s) ${list(this.behind)} had not started this call: they are stalled outside the collectives (a slow or stuck step), or call collectives in a different order`
          : `all peers answered a liveness probe, so rank(s) ${list(this.waitingFor)} are alive but stalled (a straggler, or ranks calling collectives in a different order)`
    return (
      `${this.op} (group "${this.group}", seq ${this.seq}) on rank ${this.rank}: nothing arrived for ${this.silentMs ?? this.timeoutMs} ms ` +
      `(deadline ${this.timeoutMs} ms${this.deadline ? ` = ${this.deadline}` : ""}) ` +
      `while waiting for rank(s) ${list(this.waitingFor)}; ${who}${this.notWaitedOn ? ` (not waited on: ${this.notWaitedOn})` : ""}. The group is aborted: restart the failed rank(s) ` +
      `and create a new communicator, or raise timeoutMs if ranks legitimately take longer between collectives.`
    )
  }
}

/**
 * Another rank aborted the group (it failed locally, timed out, or closed mid-operation).
 * `by` is the rank that aborted, `failedRanks` the ranks it blamed, `causeTag` the tag of its error.
 */
export class CollectiveAborted extends Schema.TaggedError<CollectiveAborted>()("CollectiveAborted", {
  op: Schema.String,
  group: Schema.String,
  rank: Schema.Number,
  by: Schema.Number,
  failedRanks: Schema.Array(Schema.Number),
  causeTag: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    const blamed = this.failedRanks.length > 0 ? ` blaming rank(s) ${list(this.failedRanks)}` : ""
    return (
      `${this.op} on rank ${this.rank} (group "${this.group}"): rank ${this.by} aborted the group${blamed} (${this.causeTag}: ` +
      `${this.reason}). Fix or restart the failed rank(s) and create a new communicator.`
    )
  }
}

/** Ranks called the same collective with buffers of different lengths. */
export class LengthMismatch extends Schema.TaggedError<LengthMismatch>()("LengthMismatch", {
  op: Schema.String,
  group: Schema.String,
  rank: Schema.Number,
  from: Schema.Number,
  expected: Schema.Number,
  got: Schema.Number
}) {
  get failedRanks(): ReadonlyArray<number> {
    return [this.from]
  }
  override get message(): string {
    return (
      `${this.op} on rank ${this.rank} (group "${this.group}"): rank ${this.from} called it with ${this.got} elements, ` +
      `this rank with ${this.expected}. Every rank must pass the same length (same model, same variable order, same bucket plan).`
    )
  }
}

/**
 * Ranks called different collectives (or the same one with a different algorithm, reduce op, wire
 * format or root) at the same position in their sequence of calls.
 */
export class OpMismatch extends Schema.TaggedError<OpMismatch>()("OpMismatch", {
  group: Schema.String,
  rank: Schema.Number,
  from: Schema.Number,
  seq: Schema.Number,
  expected: Schema.String,
  got: Schema.String
}) {
  get failedRanks(): ReadonlyArray<number> {
    return [this.from]
  }
  override get message(): string {
    return (
      `collective #${this.seq} of group "${this.group}": rank ${this.rank} called ${this.expected} but rank ${this.from} ` +
      `called ${this.got}. All ranks must call the same collectives, with the same options, in the same order.`
    )
  }
}

/** The group could not be formed: peers disagree on its size or settings, or a rank appears twice. */
export class GroupMismatch extends Schema.TaggedError<GroupMismatch>()("GroupMismatch", {
  group: Schema.String,
  rank: Schema.Number,
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot form collective group "${this.group}" on rank ${this.rank}: ${this.reason}`
  }
}

/** An argument is invalid (rank out of range, negative weight, wrong output size...). */
export class CollectiveArgumentError extends Schema.TaggedError<CollectiveArgumentError>()("CollectiveArgumentError", {
  op: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `${this.op}: ${this.reason}`
  }
}

/** A peer sent frames this rank cannot place (corrupt, out of order, or from an incompatible version). */
export class CollectiveProtocolError extends Schema.TaggedError<CollectiveProtocolError>()("CollectiveProtocolError", {
  op: Schema.String,
  group: Schema.String,
  rank: Schema.Number,
  from: Schema.Number,
  reason: Schema.String
}) {
  get failedRanks(): ReadonlyArray<number> {
    return [this.from]
  }
  override get message(): string {
    return (
      `${this.op} on rank ${this.rank} (group "${this.group}"): unexpected frame from rank ${this.from}: ${this.reason}. ` +
      `Check that every rank runs the same gradwire version.`
    )
  }
}

/** Messages for operations this rank has not started yet piled up past the limit. */
export class CollectiveOverflow extends Schema.TaggedError<CollectiveOverflow>()("CollectiveOverflow", {
  group: Schema.String,
  rank: Schema.Number,
  bytes: Schema.Number,
  limitBytes: Schema.Number
}) {
  override get message(): string {
    return (
      `group "${this.group}" rank ${this.rank}: ${this.bytes} bytes arrived for collectives this rank has not started ` +
      `(limit ${this.limitBytes}). Peers are far ahead: this rank issues collectives in a different order or ` +
      `too late; raise earlyLimitBytes only if a lag this large is expected.`
    )
  }
}

/** The communicator was closed (locally, or it was already aborted) before or during the call. */
export class CommunicatorClosed extends Schema.TaggedError<CommunicatorClosed>()("CommunicatorClosed", {
  op: Schema.String,
  group: Schema.String,
  rank: Schema.Number,
  reason: Schema.String,
  /** The ranks the failure that closed it blamed (a timeout on this rank naming a dead or hung peer), if any. */
  failedRanks: Schema.optionalKey(Schema.Array(Schema.Number)),
  /** The tag of the failure that closed it (e.g. "OpMismatch"), if one did. */
  causeTag: Schema.optionalKey(Schema.String)
}) {
  override get message(): string {
    return `${this.op} on rank ${this.rank}: communicator of group "${this.group}" is closed (${this.reason}); create a new one.`
  }
}

/** This rank's NATS connection dropped; messages sent to it meanwhile are lost, so the group cannot go on. */
export class ConnectionLost extends Schema.TaggedError<ConnectionLost>()("ConnectionLost", {
  group: Schema.String,
  rank: Schema.Number,
  event: Schema.String
}) {
  override get message(): string {
    return (
      `rank ${this.rank} of group "${this.group}": the NATS connection reported "${this.event}"; core NATS drops ` +
      `messages during a disconnect, so the group is aborted. Check the NATS server and network, then create a new communicator.`
    )
  }
}

/**
 * The direct link to a peer closed while a call still had frames to send it (collectives/direct.ts):
 * its process died, or the connection was cut. The call cannot switch to NATS halfway (a link's
 * frames must arrive in order), so the group is aborted, blaming the peer.
 */
export class PeerLinkLost extends Schema.TaggedError<PeerLinkLost>()("PeerLinkLost", {
  op: Schema.String,
  group: Schema.String,
  rank: Schema.Number,
  peer: Schema.Number
}) {
  get failedRanks(): ReadonlyArray<number> {
    return [this.peer]
  }
  override get message(): string {
    return (
      `${this.op} (group "${this.group}") on rank ${this.rank}: the direct link to rank ${this.peer} closed mid-call ` +
      `and rank ${this.peer} is gone (its process died, or the connection was cut and it did not answer a liveness probe). ` +
      `The group is aborted: restart rank ${this.peer} and create a new communicator.`
    )
  }
}

export type CollectiveError =
  | CollectiveTimeout
  | CollectiveAborted
  | LengthMismatch
  | OpMismatch
  | GroupMismatch
  | CollectiveArgumentError
  | CollectiveProtocolError
  | CollectiveOverflow
  | CommunicatorClosed
  | ConnectionLost
  | PeerLinkLost

const MISMATCH_TAGS: ReadonlySet<string> = new Set(["OpMismatch", "LengthMismatch"])

/**
 * Whether the group broke because its ranks called different collectives, or the same one with
 * different lengths (here, or on the peer that aborted or closed the group): a fault of the
 * programs the ranks run, not of a rank's process.
 */
export const isCallMismatch = (e: unknown): boolean => {
  if (e instanceof OpMismatch || e instanceof LengthMismatch) return true
  if (e instanceof CollectiveAborted) return MISMATCH_TAGS.has(e.causeTag)
  if (e instanceof CommunicatorClosed) return e.causeTag !== undefined && MISMATCH_TAGS.has(e.causeTag)
  return false
}

/** A collective failed because a member died, hung or was cut off (or the group was closed to regroup it). */
export const groupBroke = (e: unknown): boolean =>
  e instanceof CollectiveTimeout || e instanceof CollectiveAborted || e instanceof PeerLinkLost || e instanceof CommunicatorClosed || e instanceof ConnectionLost

/** The ranks an error blames, for the abort message that tells the other ranks. */
export const blamedRanks = (e: unknown): ReadonlyArray<number> => {
  if (e instanceof CollectiveTimeout || e instanceof LengthMismatch || e instanceof OpMismatch || e instanceof CollectiveProtocolError || e instanceof PeerLinkLost) {
    return e.failedRanks
  }
  if (e instanceof CollectiveAborted) return e.failedRanks
  if (e instanceof CommunicatorClosed) return e.failedRanks ?? []
  return []
}
