// The actor runtime's public surface for users who write their own actors, in its Promise form: the
// root entry re-exports it. The Effect versions (launchActorEffect, launchSupervisorEffect,
// spawnActorEffect, makeActorSystemEffect and the Layers) are in the root's effect.ts
// (`gradwire/effect`); the node agent itself is run by `gradwire start`, not imported.
export { defineProtocol, type KindSpec, type AnySchema, type AskKindOf, type KindOf, type Protocol, type ProtocolSpec, type ReplyOf, type RequestOf } from "./runtime/protocol.ts"
export { WireTensorSchema, wireTensorOf } from "./runtime/tensor-schema.ts"
export {
  ActorSystem,
  DEFAULT_ASK_TIMEOUT_MS,
  type ActorRef,
  type ActorSystemOptions,
  type AskOptions
} from "./runtime/system.ts"
export {
  ActorHandle,
  defineActor,
  isActorDefinition,
  launchActor,
  pingActor,
  stopRemoteActor,
  type ActorContext,
  type ActorDefinition,
  type ActorExit,
  type ActorStats,
  type Handlers,
  type MessageContext,
  type StartActorOptions,
  type StopOptions,
  type Setup,
  type HandlerResult,
  type Cleanup
} from "./runtime/actor.ts"
export type { WireFailure } from "./runtime/envelope.ts"
export { Watcher, type ActorDown, type DownReason, type WatchOptions } from "./runtime/watcher.ts"
export { DEFAULT_DEAD_AFTER_MS, DEFAULT_HEARTBEAT_MS } from "./runtime/heartbeat.ts"
export type { JobEvent } from "./runtime/events.ts"
// Supervision (runtime/supervisor.ts: restart policies for a child actor or process) stays internal:
// the trainer restarts and regroups its workers through its own controller (train/controller.ts),
// whose decisions depend on the whole group, not on one child.
export { agentRef, spawnActor, type SpawnedActor, type SpawnOptions, type SpawnFailure } from "./node/spawn.ts"
export {
  connectionFromAddress,
  openConnection,
  redactConnection,
  type ConnectionSpec,
  type OpenConnectionOptions,
  type OpenedConnection
} from "../core/connection-spec.ts"
export { stderrLogger, silentLogger, type ActorLogger } from "./runtime/log.ts"
export {
  ActorStartError,
  ActorStopped,
  ActorUnavailable,
  AskTimeout,
  ChildEscalated,
  MessageRejected,
  RemoteFailure,
  type AskError,
  type TellError
} from "./runtime/errors.ts"
export { AgentError, AgentUnreachable, EnvNotAllowed, ModuleNotAllowed, SpawnError } from "./node/errors.ts"
export { SPAWN_ENV_ALLOWED } from "./node/env-policy.ts"
