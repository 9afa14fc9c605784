// Typed errors shared by every part of gradwire. Each one carries the data a caller needs to act
// on it, and a message that says what went wrong and what to do about it.
import * as Schema from "effect/Schema"

/** An error message's first line, for one-line summaries in events, incidents and progress lines. */
export const firstLine = (text: string): string => text.split("\n")[0] ?? ""

/** The nats-server binary could not be found. */
export class NatsServerNotFound extends Schema.TaggedError<NatsServerNotFound>()("NatsServerNotFound", {
  binary: Schema.String
}) {
  override get message(): string {
    return (
      `nats-server binary not found (looked for "${this.binary}"). Install it: ` +
      `Debian/Ubuntu "sudo apt-get install -y nats-server", macOS "brew install nats-server", ` +
      `or download a release from https://github.com/nats-io/nats-server/releases and put it on PATH. ` +
      `Or set NATS_SERVER_BIN=/path/to/nats-server, or connect to an existing server with ` +
      `cluster: { address: "nats://host:4222" } (CLI: --address nats://host:4222).`
    )
  }
}

/** nats-server started but did not come up (bad config, port in use, crashed, too slow). */
export class NatsServerStartError extends Schema.TaggedError<NatsServerStartError>()("NatsServerStartError", {
  reason: Schema.String,
  log: Schema.String
}) {
  override get message(): string {
    return `nats-server failed to start: ${this.reason}${this.log ? `\n--- server log ---\n${this.log}` : ""}`
  }
}

/**
 * A model uses a kernel (an op, or the gradient of one) that the backend it runs on cannot run,
 * found by prepareModel's dry step before training starts.
 */
export class UnsupportedKernel extends Schema.TaggedError<UnsupportedKernel>()("UnsupportedKernel", {
  kernel: Schema.String,
  /** The layer whose forward or backward pass needs it ("" when no single layer could be named). */
  layer: Schema.String,
  backend: Schema.String,
  /** The implementations looked in, in order (the backend's own kernels, gradwire's, the cpu fallback). */
  tried: Schema.Array(Schema.String),
  reason: Schema.String
}) {
  override get message(): string {
    return (
      `the model cannot train on the "${this.backend}" backend: ${this.layer ? `layer "${this.layer}" needs` : "it needs"} kernel ${this.kernel}, ` +
      `which none of ${this.tried.join(", ")} has (${this.reason}). Replace the layer, or run this model with scalingConfig.backend "cpu"` +
      ` (every kernel tfjs has), or with "tensorflow" where @tensorflow/tfjs-node installs`
    )
  }
}

/**
 * The wasm backend's memory cannot hold a tensor: its heap (WebAssembly memory, at most 4 GiB per
 * process) could not grow for it. Where tfjs's allocation failed, its view of the tensor's bytes
 * runs past the heap: a RangeError about a typed array's length, which this replaces.
 */
export class HeapExhausted extends Schema.TaggedError<HeapExhausted>()("HeapExhausted", {
  backend: Schema.String,
  shape: Schema.Array(Schema.Number),
  /** The tensor's bytes. */
  bytes: Schema.Number,
  /** The heap's bytes when it failed. */
  heapBytes: Schema.Number
}) {
  override get message(): string {
    const mib = (b: number): string => `${(b / 2 ** 20).toFixed(0)} MiB`
    return (
      `the ${this.backend} backend's memory cannot hold a tensor of shape [${this.shape.join(", ")}] (${mib(this.bytes)}; its heap has ${mib(this.heapBytes)} ` +
      `and a WebAssembly heap grows to at most 4 GiB a process): lower the batch size (or split it with accumulation: dp.trainStep(x, y, { accumulate: true }), ` +
      `dp.fit's accumulationSteps), or give the rows to more workers`
    )
  }
}

/** Could not connect to NATS (unreachable, refused, bad credentials). */
export class NatsConnectError extends Schema.TaggedError<NatsConnectError>()("NatsConnectError", {
  servers: Schema.String,
  reason: Schema.String,
  /**
   * Set when the server answered with an authorization violation: "refused" the credentials given,
   * or "required" credentials that were not given. The reason already says what to do.
   */
  credentials: Schema.optionalKey(Schema.Literals(["refused", "required"]))
}) {
  override get message(): string {
    return `cannot connect to NATS at ${this.servers}: ${this.reason}`
  }
}

/** The NATS connection was lost and did not come back within the outage deadline. */
export class NatsUnavailable extends Schema.TaggedError<NatsUnavailable>()("NatsUnavailable", {
  servers: Schema.String,
  outageMs: Schema.Number,
  timeoutMs: Schema.Number,
  hint: Schema.String
}) {
  override get message(): string {
    return (
      `lost the NATS connection to ${this.servers} for ${Math.round(this.outageMs / 100) / 10} s, longer than ` +
      `failureConfig.natsOutageTimeoutMs (${this.timeoutMs} ms): ${this.hint}`
    )
  }
}

/** A NATS operation (publish, subscribe, request, flush) failed. */
export class NatsOperationError extends Schema.TaggedError<NatsOperationError>()("NatsOperationError", {
  operation: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `NATS ${this.operation} failed: ${this.reason}`
  }
}

/** Bytes that are not a valid gradwire message: malformed, truncated, foreign, or inconsistent. */
export class WireDecodeError extends Schema.TaggedError<WireDecodeError>()("WireDecodeError", {
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot decode gradwire message: ${this.reason}`
  }
}

/** A value that cannot be put on the wire (unsupported dtype, shape/byte-length mismatch). */
export class WireEncodeError extends Schema.TaggedError<WireEncodeError>()("WireEncodeError", {
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot encode gradwire message: ${this.reason}`
  }
}

/** A chunked message could not be reassembled (missing, duplicated, out-of-order or foreign chunk). */
export class ChunkError extends Schema.TaggedError<ChunkError>()("ChunkError", {
  reason: Schema.String,
  messageId: Schema.String
}) {
  override get message(): string {
    return `chunked message ${this.messageId || "?"}: ${this.reason}`
  }
}

/** A configuration value is invalid. Names the field, what was given and what is allowed. */
export class ConfigError extends Schema.TaggedError<ConfigError>()("ConfigError", {
  field: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `invalid config at "${this.field}": ${this.reason}`
  }
}

/** A wait passed its deadline. */
export class DeadlineExceeded extends Schema.TaggedError<DeadlineExceeded>()("DeadlineExceeded", {
  operation: Schema.String,
  timeoutMs: Schema.Number
}) {
  override get message(): string {
    return `${this.operation} did not complete within ${this.timeoutMs} ms`
  }
}
