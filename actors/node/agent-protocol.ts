// The node agent's protocol: what drivers (and the CLI) can ask an agent. The agent is itself an
// actor, addressed at its node's control subject (gw.<cluster>.node.<id>.ctl), so these requests
// get the runtime's deadlines, typed errors and validation for free.
import * as Schema from "effect/Schema"
import { NodeAdvertisementSchema, NodeProcessSchema } from "../../scheduler/node-info.ts"
import { defineProtocol } from "../runtime/protocol.ts"

export const SpawnRequest = Schema.Struct({
  job: Schema.String,
  /** Actor name in the job; also the process's name in logs and events. */
  name: Schema.String,
  /** Incarnation id, chosen by the spawner so it can watch events before the reply comes. */
  instance: Schema.String,
  /** Identity of the spawning driver; its heartbeats keep the process alive. */
  owner: Schema.String,
  /** Module to load in the child: an absolute path, a file URL, or a package specifier. */
  module: Schema.String,
  /** Export of the module holding the ActorDefinition (default "default"). */
  export: Schema.String,
  args: Schema.Unknown,
  /**
   * Modules the actor will import besides `module` (a worker's train loop). The agent checks them
   * against its allowed roots and the actor imports no others.
   */
  imports: Schema.optionalKey(Schema.Array(Schema.String)),
  env: Schema.Record(Schema.String, Schema.String),
  /** What the process holds (CPU, GPU, memory, custom), for the node's "used" figures. */
  resources: Schema.Record(Schema.String, Schema.Number),
  /** CUDA device indices given to it: CUDA_VISIBLE_DEVICES unless env sets it. */
  gpus: Schema.Array(Schema.Number),
  cwd: Schema.optionalKey(Schema.String),
  /** Log line prefix, e.g. "worker rank=2" (default the name). */
  logPrefix: Schema.optionalKey(Schema.String),
  /** Kill the process when the owner has not heartbeat for this long (default the agent's). */
  ownerTimeoutMs: Schema.optionalKey(Schema.Number),
  heartbeatMs: Schema.optionalKey(Schema.Number)
})
export type SpawnRequest = typeof SpawnRequest.Type

export const SpawnReply = Schema.Struct({ pid: Schema.Number, node: Schema.String, instance: Schema.String })

export const AgentProtocol = defineProtocol("agent", {
  spawn: { request: SpawnRequest, reply: SpawnReply },
  /** Kills one actor process (SIGTERM, SIGKILL after the grace period). */
  kill: {
    request: Schema.Struct({ job: Schema.String, name: Schema.String, reason: Schema.String }),
    reply: Schema.Struct({ killed: Schema.Boolean })
  },
  /** Kills every process of a job on this node. */
  killJob: { request: Schema.Struct({ job: Schema.String, reason: Schema.String }), reply: Schema.Struct({ killed: Schema.Number }) },
  list: { request: Schema.Null, reply: Schema.Array(NodeProcessSchema) },
  info: { request: Schema.Null, reply: NodeAdvertisementSchema },
  /** Stops the agent (and its processes). */
  shutdown: { request: Schema.Struct({ reason: Schema.String }), reply: Schema.Null }
})
export type AgentProtocol = typeof AgentProtocol

/**
 * The agents running in this very process (the embedded cluster's, actors/train/driver/cluster.ts),
 * as "cluster/node": one of them that does not answer is running but starved of CPU, which
 * spawn.ts says instead of pointing at `gradwire status`, which cannot see it.
 */
export const agentsInThisProcess = new Set<string>()
