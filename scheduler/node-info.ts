// What a node agent says about its node (the advertisement it heartbeats), and the notices the
// cluster view sends when a node is lost. Schemas, because these cross machines and processes of
// possibly different gradwire versions: a malformed advertisement is dropped, never trusted.
// Lives in scheduler/ because the cluster view reads it and may only import core; the agent
// (actors/node/agent.ts) writes it.
import * as Schema from "effect/Schema"
import type { NodeResources } from "./resources.ts"

export const GpuInfoSchema = Schema.Struct({
  index: Schema.Number,
  name: Schema.String,
  memoryMiB: Schema.Number,
  /** A software WebGPU adapter standing in for a GPU (GRADWIRE_WEBGPU_SOFTWARE=1): tests only. */
  software: Schema.optional(Schema.Boolean)
})

/** The WebGPU adapter a node's probe found (core/webgpu.ts WebGpuAdapterInfo). */
export const WebGpuAdapterSchema = Schema.Struct({
  vendor: Schema.String,
  architecture: Schema.String,
  device: Schema.String,
  description: Schema.String,
  maxBufferSize: Schema.Number,
  maxStorageBufferBindingSize: Schema.Number,
  software: Schema.optional(Schema.Boolean)
})
export type WebGpuAdapter = typeof WebGpuAdapterSchema.Type

/** An actor process a node agent runs for a job. */
export const NodeProcessSchema = Schema.Struct({
  job: Schema.String,
  name: Schema.String,
  /** Unique per spawn: tells a restarted actor's events from its previous life's. */
  instance: Schema.String,
  pid: Schema.Number,
  /** The identity (driver) that spawned it; the agent kills it when the owner's heartbeats stop. */
  owner: Schema.String,
  resources: Schema.Record(Schema.String, Schema.Number),
  gpus: Schema.Array(Schema.Number),
  startedAt: Schema.Number
})
export type NodeProcess = typeof NodeProcessSchema.Type

export const NodeUsageSchema = Schema.Struct({
  cpus: Schema.Number,
  memoryBytes: Schema.Number,
  gpuIndices: Schema.Array(Schema.Number),
  /** GPUs shared by workers that asked for a fraction of one: the fraction in use, by GPU index. */
  gpuShares: Schema.optionalKey(Schema.Record(Schema.String, Schema.Number)),
  custom: Schema.Record(Schema.String, Schema.Number)
})

export const NatsOutagesSchema = Schema.Struct({
  count: Schema.Number,
  /** When the last outage began (ms since the epoch); 0 when there was none. */
  lastAt: Schema.Number,
  /** How long the last outage lasted (ms), once it ended. */
  lastMs: Schema.Number
})
export type NatsOutages = typeof NatsOutagesSchema.Type

export const SupervisedServerSchema = Schema.Struct({
  pid: Schema.Number,
  url: Schema.String,
  /** Times it was restarted after an unexpected exit. */
  restarts: Schema.Number,
  /** When it was last restarted (ms since the epoch); 0 when never. */
  lastRestartAt: Schema.Number
})
export type SupervisedServer = typeof SupervisedServerSchema.Type

export const NodeAdvertisementSchema = Schema.Struct({
  v: Schema.Literal(1),
  cluster: Schema.String,
  nodeId: Schema.String,
  hostname: Schema.String,
  /** The agent's pid. */
  pid: Schema.Number,
  head: Schema.Boolean,
  startedAt: Schema.Number,
  sentAt: Schema.Number,
  seq: Schema.Number,
  heartbeatMs: Schema.Number,
  cpus: Schema.Number,
  memoryBytes: Schema.Number,
  gpus: Schema.Array(GpuInfoSchema),
  /** tfjs backends that load here, best first; empty while the probe runs (backendsProbed false). */
  backends: Schema.Array(Schema.String),
  backendsProbed: Schema.Boolean,
  backendErrors: Schema.Record(Schema.String, Schema.String),
  /** The NATS server the agent is connected to. */
  nats: Schema.Struct({
    serverId: Schema.String,
    serverName: Schema.String,
    url: Schema.String,
    cluster: Schema.String
  }),
  labels: Schema.Record(Schema.String, Schema.String),
  custom: Schema.Record(Schema.String, Schema.Number),
  used: NodeUsageSchema,
  processes: Schema.Array(NodeProcessSchema),
  /** The agent is shutting down: treat the node as gone, not dead. */
  leaving: Schema.Boolean,
  version: Schema.String,
  // Optional (added later): advertisements of older agents lack them and still decode.
  /** The agent's NATS outages since it started: how many, and the last one's start and length. */
  natsOutages: Schema.optionalKey(NatsOutagesSchema),
  /** The nats-server this agent started and supervises (a head without --address). */
  natsServer: Schema.optionalKey(SupervisedServerSchema),
  /** The WebGPU adapter the backend probe found (absent when none, or not probed). */
  webgpu: Schema.optionalKey(WebGpuAdapterSchema)
})
export type NodeAdvertisement = typeof NodeAdvertisementSchema.Type

export const decodeAdvertisement = Schema.decodeUnknownExit(NodeAdvertisementSchema)

/**
 * Sent by a cluster view to a job's events subject for each of the job's actors on a node that
 * stopped heartbeating, so the owner learns even though the node's agent can no longer say so.
 */
export const NodeLostEventSchema = Schema.Struct({
  type: Schema.Literal("node-lost"),
  node: Schema.String,
  name: Schema.String,
  instance: Schema.String,
  owner: Schema.String,
  at: Schema.Number
})
export type NodeLostEvent = typeof NodeLostEventSchema.Type

/** The scheduler's view of an advertised node (see scheduler/resources.ts). */
export const toNodeResources = (ad: NodeAdvertisement): NodeResources => ({
  nodeId: ad.nodeId,
  hostname: ad.hostname,
  cpus: ad.cpus,
  memoryBytes: ad.memoryBytes,
  gpus: ad.gpus,
  backends: ad.backends as NodeResources["backends"],
  backendErrors: ad.backendErrors,
  natsServer: ad.nats.serverId,
  labels: ad.labels,
  custom: ad.custom,
  isHead: ad.head,
  used: ad.used
})
