// Job events: the notices published on a job's events subject about its actors' lives (ready,
// stopped, process exit, node lost) and about the job itself (ended). Watchers, supervisors and
// node agents read them; each is Schema-checked because any process of the job may send them.
import type { NatsConnection } from "@nats-io/nats-core"
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import { encodeMessage, decodeMessage } from "../../core/wire.ts"
import { NodeLostEventSchema } from "../../scheduler/node-info.ts"

const Failure = Schema.Struct({ tag: Schema.String, message: Schema.String, stack: Schema.String })

/** An actor started and serves its mailbox. */
export const ReadyEvent = Schema.Struct({
  type: Schema.Literal("ready"),
  name: Schema.String,
  instance: Schema.String,
  pid: Schema.Number,
  node: Schema.String,
  at: Schema.Number
})

/** An actor stopped: asked to (`failure` absent) or because it failed. */
export const StoppedEvent = Schema.Struct({
  type: Schema.Literal("stopped"),
  name: Schema.String,
  instance: Schema.String,
  reason: Schema.String,
  failure: Schema.optionalKey(Failure),
  at: Schema.Number
})

/** An actor process exited (published by the node agent that ran it). */
export const ExitEvent = Schema.Struct({
  type: Schema.Literal("exit"),
  name: Schema.String,
  instance: Schema.String,
  node: Schema.String,
  pid: Schema.Number,
  code: Schema.NullOr(Schema.Number),
  signal: Schema.NullOr(Schema.String),
  /** Why the agent killed it, when it did (job ended, owner gone, asked to). */
  killedBy: Schema.optionalKey(Schema.String),
  /** The process's last stderr lines: usually the reason. */
  stderrTail: Schema.String,
  at: Schema.Number
})

/** The job's driver ended the job: agents kill its processes. */
export const JobEndEvent = Schema.Struct({
  type: Schema.Literal("job-end"),
  by: Schema.String,
  at: Schema.Number
})

export const JobEventSchema = Schema.Union([ReadyEvent, StoppedEvent, ExitEvent, NodeLostEventSchema, JobEndEvent])
export type JobEvent = typeof JobEventSchema.Type
export type ReadyEvent = typeof ReadyEvent.Type
export type StoppedEvent = typeof StoppedEvent.Type
export type ExitEvent = typeof ExitEvent.Type

const decodeEvent = Schema.decodeUnknownExit(JobEventSchema)

export const publishJobEvent = (nc: NatsConnection, subject: string, event: JobEvent): void => {
  if (nc.isClosed()) return
  nc.publish(subject, encodeMessage(event))
}

/** Decodes a job event; undefined for anything malformed (events are advisory, never fatal). */
export const readJobEvent = (data: Uint8Array): JobEvent | undefined => {
  let value: unknown
  try {
    value = decodeMessage(data)
  } catch {
    return undefined
  }
  const exit = decodeEvent(value)
  return Exit.isSuccess(exit) ? exit.value : undefined
}
