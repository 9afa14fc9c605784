// The driver's side of node agents: spawn an actor process on a node and wait until it is ready
// (its actor announced itself), kill it, and wrap it as a supervised Child. Readiness and death
// come from the job's events and heartbeats, so a process that crashes while starting turns into
// a SpawnError carrying its last stderr lines instead of a wait until the deadline.
import { nuid } from "@nats-io/nats-core"
import * as Effect from "effect/Effect"
import { clusterSubjects } from "../../core/subjects.ts"
import { AgentProtocol, agentsInThisProcess } from "./agent-protocol.ts"
import { ActorUnavailable, AskTimeout, RemoteFailure } from "../runtime/errors.ts"
import { AgentUnreachable, EnvNotAllowed, ModuleNotAllowed, SpawnError } from "./errors.ts"
import { SPAWN_ENV_ALLOWED } from "./env-policy.ts"
import type { JobEvent } from "../runtime/events.ts"
import type { ProtocolSpec, Protocol } from "../runtime/protocol.ts"
import type { Child } from "../runtime/supervisor.ts"
import type { ActorRef, ActorSystem } from "../runtime/system.ts"
import { downFromEvent, type ActorDown, type WatchOptions } from "../runtime/watcher.ts"

export interface SpawnOptions {
  /** Node id of the agent that runs the process. */
  readonly node: string
  /** Actor name in the job. */
  readonly name: string
  /** Module holding the ActorDefinition: an absolute path or file URL (on that node), or a package. */
  readonly module: string
  /** Export name (default "default"). */
  readonly export?: string
  readonly args?: unknown
  /** Modules the actor will import besides its own (a worker's train loop), for the agent's check. */
  readonly imports?: ReadonlyArray<string>
  readonly env?: Readonly<Record<string, string>>
  readonly resources?: Readonly<Record<string, number>>
  /** CUDA devices for CUDA_VISIBLE_DEVICES. */
  readonly gpus?: ReadonlyArray<number>
  readonly cwd?: string
  /** Prefix of its forwarded log lines, e.g. "worker rank=2". */
  readonly logPrefix?: string
  /** The agent kills the process when this system has not heartbeat for this long (default 5 s). */
  readonly ownerTimeoutMs?: number
  readonly heartbeatMs?: number
  /** Deadline for the process to be ready (default 60 s: loading tfjs can be slow). */
  readonly readyTimeoutMs?: number
  /** Deadline for the agent to answer (default 10 s). */
  readonly requestTimeoutMs?: number
}

export interface SpawnedActor {
  readonly name: string
  readonly node: string
  readonly pid: number
  readonly instance: string
  /** Milliseconds from the spawn request to the actor's ready notice. */
  readonly readyMs: number
  ref<Spec extends ProtocolSpec>(protocol: Protocol<Spec>): ActorRef<Spec>
  /** Kills the process through its agent; resolves when it has exited (false if it was gone). */
  kill(reason?: string): Promise<boolean>
  /** Resolves when the actor is down (exit notice, stop notice, lost node or silence). */
  down(options?: Omit<WatchOptions, "instance">): Promise<ActorDown>
}

/** The agent of `node` as an actor reference. */
export const agentRef = (system: ActorSystem, node: string) =>
  system.refAt(AgentProtocol, `agent-${node}`, clusterSubjects(system.cluster).nodeControl(node))

/** What spawning can fail with. */
export type SpawnFailure = SpawnError | AgentUnreachable | ModuleNotAllowed | EnvNotAllowed

const toAgentError = (node: string, name: string, cluster: string, e: unknown): SpawnFailure => {
  if (e instanceof RemoteFailure && e.tag === "ModuleNotAllowed") {
    // The agent's message: "node N refuses to run module M: <reason>; to allow it, ...".
    const m = /refuses to run module (.*?): (.*?); to allow it/.exec(e.remoteMessage)
    return new ModuleNotAllowed({ node, module: m?.[1] ?? "(unknown)", reason: m?.[2] ?? e.remoteMessage })
  }
  if (e instanceof RemoteFailure && e.tag === "EnvNotAllowed") {
    // The agent's message: "... with environment variable(s) A, B: a spawn request may set only C, D; to give ...".
    const m = /with environment variables? (.*?): a spawn request may set only (.*?); to give/.exec(e.remoteMessage)
    return new EnvNotAllowed({ node, actor: name, variables: m ? m[1].split(", ") : ["(unknown)"], allowed: m ? m[2].split(", ") : [...SPAWN_ENV_ALLOWED] })
  }
  if (e instanceof ActorUnavailable) return new AgentUnreachable({ node, reason: `no agent runs for node "${node}" in cluster "${cluster}"` })
  if (e instanceof AskTimeout)
    return new AgentUnreachable({ node, reason: `no answer within ${e.timeoutMs} ms`, ...(agentsInThisProcess.has(`${cluster}/${node}`) ? { embedded: true } : {}) })
  if (e instanceof RemoteFailure && e.tag === "SpawnError") return new SpawnError({ node, actor: name, reason: e.remoteMessage.replace(/^spawning actor "[^"]*" on node \S+ failed: /, "") })
  return new SpawnError({ node, actor: name, reason: e instanceof Error ? e.message : String(e) })
}

/** Spawns an actor process on a node and resolves once it is ready. */
export const spawnActor = async (system: ActorSystem, options: SpawnOptions): Promise<SpawnedActor> => {
  const instance = nuid.next()
  const started = performance.now()
  const watcher = await system.watcherReady()
  const { node, name } = options
  let onEvent: (event: JobEvent) => void = () => {}
  const ready = new Promise<void>((resolve, reject) => {
    onEvent = (event) => {
      if (!("instance" in event) || event.instance !== instance) return
      if (event.type === "ready") return resolve()
      const down = downFromEvent(event)
      if (down) reject(new SpawnError({ node, actor: name, reason: `it went down before it was ready: ${down.detail}` }))
    }
  })
  ready.catch(() => {})
  const unlisten = watcher.onEvent((e) => onEvent(e))
  const agent = agentRef(system, node)
  try {
    const reply = await system
      .askPromise(
        agent,
        "spawn",
        {
          job: system.job,
          name,
          instance,
          owner: system.identity,
          module: options.module,
          export: options.export ?? "default",
          args: options.args ?? null,
          ...(options.imports !== undefined ? { imports: [...options.imports] } : {}),
          env: { ...options.env },
          resources: { ...options.resources },
          gpus: [...(options.gpus ?? [])],
          ...(options.cwd !== undefined ? { cwd: options.cwd } : {}),
          ...(options.logPrefix !== undefined ? { logPrefix: options.logPrefix } : {}),
          ...(options.ownerTimeoutMs !== undefined ? { ownerTimeoutMs: options.ownerTimeoutMs } : {}),
          ...(options.heartbeatMs !== undefined ? { heartbeatMs: options.heartbeatMs } : {})
        },
        { timeoutMs: options.requestTimeoutMs ?? 10_000 }
      )
      .catch((e: unknown) => {
        throw toAgentError(node, name, system.cluster, e)
      })
    const readyTimeoutMs = options.readyTimeoutMs ?? 60_000
    let timer: ReturnType<typeof setTimeout> | undefined
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new SpawnError({ node, actor: name, reason: `not ready within ${readyTimeoutMs} ms (pid ${reply.pid}); it was killed` })),
        readyTimeoutMs
      )
    })
    try {
      await Promise.race([ready, timedOut])
    } catch (e) {
      // Gone already when it failed; still running when it was too slow.
      const reason = /not ready within/.test(String((e as Error).message)) ? "not ready in time" : "failed to start"
      await system.askPromise(agent, "kill", { job: system.job, name, reason }, { timeoutMs: 10_000 }).catch(() => {})
      throw e
    } finally {
      clearTimeout(timer)
    }
    const readyMs = performance.now() - started
    return {
      name,
      node,
      pid: reply.pid,
      instance,
      readyMs,
      ref: (protocol) => system.ref(protocol, name),
      kill: (reason = "killed by its owner") =>
        system
          .askPromise(agent, "kill", { job: system.job, name, reason }, { timeoutMs: 15_000 })
          .then((r) => r.killed)
          .catch(() => false),
      down: (watch = {}) => system.watchPromise(name, { ...watch, instance })
    }
  } finally {
    unlisten()
  }
}

/** `spawnActor` as an Effect. */
export const spawnActorEffect = (
  system: ActorSystem,
  options: SpawnOptions
): Effect.Effect<SpawnedActor, SpawnFailure> =>
  Effect.tryPromise({
    try: () => spawnActor(system, options),
    catch: (e) =>
      e instanceof SpawnError || e instanceof AgentUnreachable || e instanceof ModuleNotAllowed || e instanceof EnvNotAllowed
        ? e
        : new SpawnError({ node: options.node, actor: options.name, reason: String(e) })
  })

/** A spawned actor process as a supervised Child (see supervisor.ts). */
export const spawnedChild = (
  system: ActorSystem,
  options: SpawnOptions,
  watch: Omit<WatchOptions, "instance"> = {}
): Effect.Effect<Child, SpawnFailure> =>
  Effect.map(
    spawnActorEffect(system, options),
    (spawned): Child => ({
      name: spawned.name,
      instance: spawned.instance,
      down: Effect.promise(() => spawned.down(watch)),
      stop: Effect.promise(() => spawned.kill("stopped by its supervisor")).pipe(Effect.asVoid)
    })
  )
