// Supervision: a parent starts a child (an in-process actor or a process spawned by a node agent),
// learns why it stopped (exit code, signal, the error it failed with, lost heartbeats, lost node)
// and asks its policy what to do: restart it, stop supervising, or escalate (fail with
// ChildEscalated so the parent's own supervisor or caller deals with it). Restarts back off
// exponentially so a child that dies on start does not spin.
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Scope from "effect/Scope"
import type { ActorDefinition, ActorExit, StartActorOptions } from "./actor.ts"
import { launchActor } from "./actor.ts"
import { ActorStartError, ChildEscalated } from "./errors.ts"
import type { ProtocolSpec } from "./protocol.ts"
import type { ActorSystem } from "./system.ts"
import type { ActorDown } from "./watcher.ts"

export type Decision = "restart" | "stop" | "escalate"

/** Decides what to do about a child that went down; `restarts` counts restarts so far. */
export type SupervisionPolicy = (down: ActorDown, restarts: number) => Decision

/** Something a supervisor can watch and stop. */
export interface Child {
  readonly name: string
  readonly instance: string
  /** Completes once, when the child is down. */
  readonly down: Effect.Effect<ActorDown>
  /** Stops it (best effort; a dead child is already stopped). */
  readonly stop: Effect.Effect<void>
}

/** A clean end: asked to stop, or a process that exited 0 on its own. */
export const isNormalExit = (down: ActorDown): boolean =>
  down.reason === "stopped" || (down.reason === "exited" && down.code === 0 && !down.signal)

/** Restart after abnormal ends up to `maxRestarts` times, then escalate; stop after normal ends. */
export const restartOnFailure =
  (maxRestarts = 3): SupervisionPolicy =>
  (down, restarts) =>
    isNormalExit(down) ? "stop" : restarts < maxRestarts ? "restart" : "escalate"

/** Restart after any end, normal or not, up to `maxRestarts` times, then escalate. */
export const alwaysRestart =
  (maxRestarts = 3): SupervisionPolicy =>
  (_down, restarts) =>
    restarts < maxRestarts ? "restart" : "escalate"

/** Never restart: escalate failures, stop after normal ends. */
export const escalateOnFailure: SupervisionPolicy = (down) => (isNormalExit(down) ? "stop" : "escalate")

export interface SuperviseOptions<E> {
  /** The child's name (for errors). */
  readonly name: string
  /** Starts (or restarts) the child. */
  readonly start: Effect.Effect<Child, E>
  /** Default restartOnFailure(3). */
  readonly policy?: SupervisionPolicy
  /** Wait before restart number n (0-based); default 100 ms * 2^n, at most 5 s. */
  readonly backoffMs?: (restart: number) => number
  /** Told of every down child and the decision taken (logging, metrics, tests). */
  readonly onDecision?: (down: ActorDown, decision: Decision, restarts: number) => void
}

export interface Supervision {
  /** The child currently running (or the last one). */
  readonly current: () => Child
  readonly restarts: () => number
  /** Completes with the last down when the policy said stop; fails with ChildEscalated when it escalated. */
  readonly result: Effect.Effect<ActorDown, ChildEscalated>
}

const defaultBackoff = (n: number): number => Math.min(5_000, 100 * 2 ** n)

/**
 * Starts the child and supervises it for as long as the scope lives; the scope's end stops the
 * current child. Fails only if the first start fails (later start failures go to the policy).
 */
export const launchSupervisorEffect = <E>(options: SuperviseOptions<E>): Effect.Effect<Supervision, E, Scope.Scope> =>
  Effect.gen(function* () {
    const policy = options.policy ?? restartOnFailure()
    const backoff = options.backoffMs ?? defaultBackoff
    let child = yield* options.start
    let restarts = 0
    const result = yield* Deferred.make<ActorDown, ChildEscalated>()
    yield* Effect.addFinalizer(() => Effect.suspend(() => child.stop))
    const loop = Effect.gen(function* () {
      for (;;) {
        const down = yield* child.down
        const decision = policy(down, restarts)
        options.onDecision?.(down, decision, restarts)
        if (decision === "stop") return yield* Deferred.succeed(result, down)
        if (decision === "escalate") {
          return yield* Deferred.fail(result, new ChildEscalated({ child: options.name, reason: `${down.reason}: ${down.detail}`, restarts }))
        }
        // A child declared dead by silence may still be running somewhere: make sure it is not.
        yield* child.stop
        yield* Effect.sleep(backoff(restarts))
        restarts++
        const next = yield* Effect.exit(options.start)
        if (Exit.isSuccess(next)) {
          child = next.value
        } else {
          const reason = next.cause
          const failed: ActorDown = {
            name: options.name,
            instance: "",
            reason: "failed",
            detail: `restart failed: ${String(reason)}`,
            at: Date.now()
          }
          child = { name: options.name, instance: "", down: Effect.succeed(failed), stop: Effect.void }
        }
      }
    })
    yield* Effect.forkScoped(loop)
    return {
      current: () => child,
      restarts: () => restarts,
      result: Deferred.await(result)
    } satisfies Supervision
  })

/** How an in-process actor's exit looks to a supervisor. */
export const downFromExit = (name: string, instance: string, exit: ActorExit): ActorDown =>
  exit._tag === "Failed"
    ? { name, instance, reason: "failed", failure: exit.failure, detail: `failed: ${exit.failure.tag}: ${exit.failure.message}`, at: Date.now() }
    : { name, instance, reason: "stopped", detail: `stopped: ${exit.reason}`, at: Date.now() }

/** A child that is an actor in this process. */
export const localChild = <Spec extends ProtocolSpec, Args>(
  system: ActorSystem,
  definition: ActorDefinition<Spec, Args>,
  options: StartActorOptions<Args>
): Effect.Effect<Child, ActorStartError> =>
  Effect.map(
    Effect.tryPromise({
      try: () => launchActor(system, definition, options),
      catch: (e) => (e instanceof ActorStartError ? e : new ActorStartError({ actor: options.name, reason: String(e) }))
    }),
    (handle): Child => ({
      name: handle.name,
      instance: handle.instance,
      down: Effect.map(handle.exit, (exit) => downFromExit(handle.name, handle.instance, exit)),
      stop: handle.stopEffect({ drain: false, reason: "stopped by its supervisor" })
    })
  )

/** `launchSupervisorEffect` for Promise code: returns the supervision and a `close()` that stops it and the child. */
export const launchSupervisor = async <E>(
  options: SuperviseOptions<E>
): Promise<{ readonly current: () => Child; readonly restarts: () => number; readonly result: Promise<ActorDown>; close(): Promise<void> }> => {
  const scope = Scope.makeUnsafe()
  const exit = await Effect.runPromiseExit(Scope.provide(scope)(launchSupervisorEffect(options)))
  if (Exit.isFailure(exit)) {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    throw Exit.isFailure(exit) ? squash(exit) : undefined
  }
  const s = exit.value
  return {
    current: s.current,
    restarts: s.restarts,
    result: Effect.runPromise(s.result),
    close: () => Effect.runPromise(Scope.close(scope, Exit.void))
  }
}

const squash = (exit: Exit.Failure<unknown, unknown>): unknown => {
  const e = Exit.findErrorOption(exit)
  return e._tag === "Some" ? e.value : new Error(String(exit.cause))
}
