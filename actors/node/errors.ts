// Typed errors of the node agent, the processes it spawns and the CLI that drives it. Each names
// the node involved and says what to do.
import * as Schema from "effect/Schema"

/** The node agent could not spawn an actor process, or it died before it was ready. */
export class SpawnError extends Schema.TaggedError<SpawnError>()("SpawnError", {
  node: Schema.String,
  actor: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `spawning actor "${this.actor}" on node ${this.node} failed: ${this.reason}`
  }
}

/** The node agent does not answer. */
export class AgentUnreachable extends Schema.TaggedError<AgentUnreachable>()("AgentUnreachable", {
  node: Schema.String,
  reason: Schema.String,
  /** The embedded cluster's agent, which runs in the asking process: it is running, and "gradwire status" cannot see it. */
  embedded: Schema.optionalKey(Schema.Boolean)
}) {
  override get message(): string {
    return this.embedded
      ? `the embedded cluster's node agent (in this process) does not answer: ${this.reason}; this machine's cores were too busy for it (fewer workers, or fewer other busy processes, would let it answer)`
      : `node agent ${this.node} does not answer: ${this.reason}; is it running ("gradwire status")?`
  }
}

/** The agent could not start or stop (state dir, already running, NATS). Used by the CLI too. */
export class AgentError extends Schema.TaggedError<AgentError>()("AgentError", {
  reason: Schema.String
}) {
  override get message(): string {
    return this.reason
  }
}

/** A node agent refused to run a module: it lies outside the roots the agent allows. */
export class ModuleNotAllowed extends Schema.TaggedError<ModuleNotAllowed>()("ModuleNotAllowed", {
  node: Schema.String,
  module: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return (
      `node ${this.node} refuses to run module ${this.module}: ${this.reason}; to allow it, start that node's agent with ` +
      `--allow-module-root <a folder holding it> (gradwire start --allow-module-root DIR, repeatable)`
    )
  }
}

/**
 * A node agent refused a spawn request that sets environment variables off its allow-list
 * (env-policy.ts): such variables (NODE_OPTIONS, LD_PRELOAD, ...) could make the process run code
 * the agent does not allow. Nothing was started.
 */
export class EnvNotAllowed extends Schema.TaggedError<EnvNotAllowed>()("EnvNotAllowed", {
  node: Schema.String,
  actor: Schema.String,
  variables: Schema.Array(Schema.String),
  allowed: Schema.Array(Schema.String)
}) {
  override get message(): string {
    const s = this.variables.length === 1 ? "" : "s"
    return (
      `node ${this.node} refuses to spawn actor "${this.actor}" with environment variable${s} ${this.variables.join(", ")}: ` +
      `a spawn request may set only ${this.allowed.join(", ")}; to give that node's processes other variables, ` +
      `set them in the environment its agent (gradwire start) runs in, which they inherit`
    )
  }
}
