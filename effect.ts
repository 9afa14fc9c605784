// gradwire's Effect entry point ("gradwire/effect"): the Effect versions of the root entry's
// Promise functions, each named after its Promise twin with "Effect" added (openNats ->
// openNatsEffect, launchActor -> launchActorEffect), scoped where the Promise version hands back
// something to stop or close (released when the scope closes, also on interruption), and the
// Layers and services for code that runs as an Effect program. Types, configs and errors are the
// root's: import them from "gradwire".
// The Node version check comes first, before any other module runs.
import "./core/node-version.ts"

// NATS
export { openNatsEffect, Nats, NatsLayer } from "./core/connection.ts"

// The actor runtime
export { makeActorSystemEffect, ActorSystemService, ActorSystemLayer, ActorSystemFromNatsLayer } from "./actors/runtime/system.ts"
export { launchActorEffect } from "./actors/runtime/actor.ts"
export { spawnActorEffect } from "./actors/node/spawn.ts"

// Collectives: a communicator that leaves the group when the scope closes
export { createCommunicatorEffect } from "./collectives/effect.ts"
