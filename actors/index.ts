// The actor runtime's public surface: what the trainer, worker and checkpoint actors (and users who
// write their own actors) import. The root entry point re-exports it.
export { defineProtocol, type AnySchema, type AskKindOf, type KindOf, type Protocol, type ProtocolSpec, type ReplyOf, type RequestOf } from "./protocol.ts"
export { WireTensorSchema, wireTensorOf } from "./tensor-schema.ts"
export {
  ActorSystem,
  ActorSystemFromNats,
  ActorSystemLayer,
  ActorSystemService,
  makeActorSystem,
  DEFAULT_ASK_TIMEOUT_MS,
  type ActorRef,
  type ActorSystemOptions,
  type AskOptions
} from "./system.ts"
export {
  ActorHandle,
  defineActor,
  isActorDefinition,
  launchActor,
  pingActor,
  startActor,
  stopRemoteActor,
  type ActorContext,
  type ActorDefinition,
  type ActorExit,
  type ActorStats,
  type Handlers,
  type MessageContext,
  type StartActorOptions,
  type StopOptions
} from "./actor.ts"
export { Watcher, type ActorDown, type DownReason, type WatchOptions } from "./watcher.ts"
export { DEFAULT_DEAD_AFTER_MS, DEFAULT_HEARTBEAT_MS } from "./heartbeat.ts"
export type { JobEvent } from "./events.ts"
export {
  alwaysRestart,
  escalateOnFailure,
  isNormalExit,
  launchSupervisor,
  localChild,
  restartOnFailure,
  supervise,
  type Child,
  type Decision,
  type SuperviseOptions,
  type Supervision,
  type SupervisionPolicy
} from "./supervisor.ts"
export { agentRef, spawnActor, spawnActorEffect, spawnedChild, type SpawnedActor, type SpawnOptions } from "./spawn.ts"
export { AgentProtocol } from "./agent-protocol.ts"
export { NodeAgent, launchAgent, startAgent, type AgentOptions } from "./agent.ts"
export { openConnection, type ConnectionSpec } from "./connection-spec.ts"
export { stderrLogger, silentLogger, type ActorLogger } from "./log.ts"
export {
  ActorStartError,
  ActorStopped,
  ActorUnavailable,
  AgentError,
  AgentUnreachable,
  AskTimeout,
  ChildEscalated,
  MessageRejected,
  RemoteFailure,
  SpawnError,
  type AskError,
  type TellError
} from "./errors.ts"
