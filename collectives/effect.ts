// Effect entry points for the collectives: the communicator as a scoped resource (closed when the
// scope ends, also on interruption), for code that runs the worker loop as an Effect program.
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { NatsOperationError } from "../core/errors.ts"
import { Communicator, type CommunicatorOptions } from "./communicator.ts"
import type { CollectiveError } from "./errors.ts"

/** Collective errors pass through; anything else came from NATS (subscribe, flush) during the handshake. */
const asError = (e: unknown): CollectiveError | NatsOperationError =>
  typeof e === "object" && e !== null && "_tag" in e
    ? (e as CollectiveError)
    : new NatsOperationError({ operation: "collectives handshake", reason: e instanceof Error ? e.message : String(e) })

/** Joins the group for the lifetime of the enclosing scope. */
export const createCommunicatorEffect = (opts: CommunicatorOptions): Effect.Effect<Communicator, CollectiveError | NatsOperationError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({ try: () => Communicator.create(opts), catch: asError }),
    (comm) => Effect.promise(() => comm.close())
  )
