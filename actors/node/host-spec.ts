// The spec a node agent hands to an actor process (actors/node/host.ts) on its stdin: where NATS is
// and with which credentials, which job and name, which module export to run, the modules it may
// import besides, and the args. Encoded with the wire format (args may hold typed arrays or
// tensors) and base64 so it is one line.
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import { decodeMessage, encodeMessage } from "../../core/wire.ts"
import { ConnectionSpec, scrubSecrets } from "../../core/connection-spec.ts"

export const HostSpecSchema = Schema.Struct({
  /** The agent's own connection (servers and credentials): only ever on stdin, never argv or env. */
  connection: ConnectionSpec,
  cluster: Schema.String,
  job: Schema.String,
  name: Schema.String,
  instance: Schema.String,
  node: Schema.String,
  module: Schema.String,
  export: Schema.String,
  args: Schema.Unknown,
  /** Modules besides `module` the agent allowed this actor to import (a worker's train loop). */
  imports: Schema.Array(Schema.String),
  heartbeatMs: Schema.Number,
  /**
   * A warm host's environment for this actor (the spawn request's variables, already held to the
   * allow-list, and the agent's GRADWIRE_JOB and the like), set before the actor starts; a cold
   * start has it from its parent instead.
   */
  env: Schema.optional(Schema.Record(Schema.String, Schema.String)),
  /** A warm host's working directory for this actor. */
  cwd: Schema.optional(Schema.String)
})
export type HostSpec = typeof HostSpecSchema.Type

export const encodeHostSpec = (spec: HostSpec): string => Buffer.from(encodeMessage(spec)).toString("base64")

export const decodeHostSpec = (line: string): HostSpec => {
  const bytes = Buffer.from(line.trim(), "base64")
  // A fresh, aligned copy so tensors in args decode as views.
  const raw = decodeMessage(new Uint8Array(bytes))
  const exit = Schema.decodeUnknownExit(HostSpecSchema)(raw)
  if (Exit.isFailure(exit)) {
    // The issue text may quote values: mask the credentials among them.
    const c = ((raw as { connection?: unknown } | null)?.connection ?? {}) as Record<string, unknown>
    const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined)
    const reason = scrubSecrets(String(exit.cause), { password: str(c.password), token: str(c.token), nkeySeed: str(c.nkeySeed) })
    throw new Error(`invalid host spec (is the agent the same gradwire version as this install?): ${reason}`)
  }
  return exit.value
}
