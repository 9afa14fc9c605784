// The spec a node agent hands to an actor process (actors/node/host.ts) on its stdin: where NATS is,
// which job and name, which module export to run, and the args. Encoded with the wire format (args
// may hold typed arrays or tensors) and base64 so it is one line.
import { Exit, Schema } from "effect"
import { decodeMessage, encodeMessage } from "../../core/wire.ts"

export const HostSpecSchema = Schema.Struct({
  servers: Schema.Array(Schema.String),
  user: Schema.optionalKey(Schema.String),
  password: Schema.optionalKey(Schema.String),
  token: Schema.optionalKey(Schema.String),
  creds: Schema.optionalKey(Schema.String),
  cluster: Schema.String,
  job: Schema.String,
  name: Schema.String,
  instance: Schema.String,
  node: Schema.String,
  module: Schema.String,
  export: Schema.String,
  args: Schema.Unknown,
  heartbeatMs: Schema.Number
})
export type HostSpec = typeof HostSpecSchema.Type

export const encodeHostSpec = (spec: HostSpec): string => Buffer.from(encodeMessage(spec)).toString("base64")

export const decodeHostSpec = (line: string): HostSpec => {
  const bytes = Buffer.from(line.trim(), "base64")
  // A fresh, aligned copy so tensors in args decode as views.
  const exit = Schema.decodeUnknownExit(HostSpecSchema)(decodeMessage(new Uint8Array(bytes)))
  if (Exit.isFailure(exit)) throw new Error(`invalid host spec: ${String(exit.cause)}`)
  return exit.value
}
