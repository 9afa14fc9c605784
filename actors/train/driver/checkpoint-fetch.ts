// A run's checkpoint read back in the driver or any later process, wherever the run kept it: a
// directory, or a JetStream object store bucket (checkpointConfig.objectStore), as Ray's Checkpoint
// from cloud storage downloads itself. A checkpoint of a Result (result.checkpoint, one of
// result.bestCheckpoints, or loadResult(dir)'s) says where its bucket is (CheckpointInfo.objectStore):
// a joined cluster's servers, read over NATS with the credentials the caller passes (a Result never
// holds a secret), or the embedded cluster's JetStream data in the run directory, read through a
// short-lived nats-server of its own since the run's stopped with fit(). The object reads are the
// store's own (object-checkpoint-store.ts). `checkpointLoader` puts a fetch in front of a loader
// that builds a model from files (the public loadCheckpointModel and loadPipelineCheckpoint, made in
// index.ts: the model code lives with the workers, which the driver's folder does not import).
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { nkeys } from "@nats-io/nats-core"
import { ConfigError, NatsConnectError } from "../../../core/errors.ts"
import { isTf, type Tf } from "../../../core/engine.ts"
import { EMBEDDED_MAX_PAYLOAD_BYTES } from "../../../core/defaults.ts"
import { launchNatsServer } from "../../../core/nats-server.ts"
import { connectionFromAddress, describeConnection, hasCredentials, openConnection, type ConnectionAuth, type ConnectionSpec } from "../../../core/connection-spec.ts"
import { readCheckpoint } from "./checkpoint-store.ts"
import { isObjectCheckpointUrl, readObjectCheckpoint } from "./object-checkpoint-store.ts"
import { holdRunDir } from "./run-dir.ts"
import type { CheckpointInfo, ObjectStoreLocation } from "./result.ts"

/** Where to read a checkpoint kept in an object store from, when its CheckpointInfo does not say or says it differently. */
export interface FetchCheckpointOptions extends ConnectionAuth {
  /**
   * A NATS server of the cluster whose bucket holds the checkpoint ("nats://head:4222", or several):
   * needed for a bare nats-obj:// path; for a Result's checkpoint it replaces the servers the run used.
   */
  readonly address?: string | ReadonlyArray<string>
}

/** A checkpoint as fetchCheckpoint and the loaders take it: a Result's CheckpointInfo, a directory, or a nats-obj:// path. */
export type CheckpointSource = string | CheckpointInfo

const OPTION_KEYS = new Set(["address", "user", "password", "token", "nkeySeed", "credsFile", "tls"])

const usage = (field: string): string =>
  `${field}(checkpoint, { address, user, password, token, nkeySeed, credsFile, tls }) or ${field}(tf, checkpoint, { ... })`

const checkOptions = (field: string, options: unknown): FetchCheckpointOptions => {
  if (options === undefined) return {}
  if (typeof options !== "object" || options === null || Array.isArray(options) || "path" in options) {
    throw new ConfigError({ field, reason: `takes ${usage(field)}: its first argument is not tfjs, and its last is not an options object` })
  }
  const unknown = Object.keys(options).filter((k) => !OPTION_KEYS.has(k))
  if (unknown.length > 0) throw new ConfigError({ field, reason: `unknown option(s) ${unknown.join(", ")}: it takes ${[...OPTION_KEYS].join(", ")}` })
  return options as FetchCheckpointOptions
}

const pathOf = (checkpoint: unknown): string | undefined =>
  typeof checkpoint === "string"
    ? checkpoint
    : typeof checkpoint === "object" && checkpoint !== null && typeof (checkpoint as { path?: unknown }).path === "string"
      ? (checkpoint as { path: string }).path
      : undefined

const messageOf = (e: unknown): string => (e instanceof NatsConnectError ? e.reason : e instanceof Error ? e.message : String(e))

/** The credentials a caller passes, as the option names it gives them with. */
const credentialsHint = (kind: string): string =>
  kind.startsWith("user") ? "{ user, password }" : kind.startsWith("a token") ? "{ token }" : kind.startsWith("nkey") ? "{ nkeySeed }" : kind.startsWith("creds file") ? "{ credsFile }" : "its credentials"

/** What a checkpoint holds: its files, and the metrics and metadata saved with them. */
type CheckpointRead = Awaited<ReturnType<typeof readCheckpoint>>

/** The checkpoint read over a NATS connection to the cluster that holds its bucket. */
const readOverNats = async (field: string, url: string, spec: ConnectionSpec, fromRun: boolean): Promise<CheckpointRead> => {
  let opened: Awaited<ReturnType<typeof openConnection>>
  try {
    opened = await openConnection(spec, "gradwire checkpoint reader", { maxReconnectAttempts: 0 })
  } catch (e) {
    const why = messageOf(e)
    const auth = /authoriz|authenticat|permission/i.test(why)
    throw new ConfigError({
      field,
      reason:
        `cannot reach the NATS server at ${describeConnection(spec)}, whose object store holds ${url} (${why}): ` +
        (auth
          ? "pass the credentials the cluster takes ({ user, password }, { token }, { nkeySeed } or { credsFile })"
          : `start that cluster again (\`gradwire start --head\` keeps its JetStream data, the bucket too, in its state dir)${fromRun ? ", or pass { address } of a server of it" : " and pass { address } of a server of it"}`)
    })
  }
  try {
    return await readObjectCheckpoint(opened.nc, url)
  } finally {
    await opened.close().catch(() => undefined)
  }
}

/**
 * The checkpoint's files from the embedded cluster's JetStream data, through a nats-server of its
 * own on that data (loopback, a fresh nkey), holding the run directory meanwhile so that no fit()
 * of the run starts its server on the same data.
 */
const readEmbedded = async (field: string, url: string, jetstreamDir: string): Promise<CheckpointRead> => {
  const runDir = path.dirname(jetstreamDir)
  if (!(await fs.stat(jetstreamDir).then((s) => s.isDirectory(), () => false))) {
    throw new ConfigError({
      field,
      reason:
        `${url} was kept by the embedded cluster of the run in ${runDir}, whose nats-server stopped with fit() and left the bucket's data in ${jetstreamDir}, ` +
        "which is not there (deleted or moved): if you moved the run directory, read the checkpoint through loadResult(<its new path>); " +
        "if a nats-server holding the bucket runs, pass its { address }"
    })
  }
  const release = await holdRunDir(runDir, (by) =>
    new ConfigError({
      field,
      reason:
        `${url} is in ${jetstreamDir}, which the embedded nats-server of a fit() ${by} has open: ` +
        "read it once that fit() has returned (its Result's checkpoints load then)"
    })
  )
  try {
    const user = nkeys.createUser()
    const seed = new TextDecoder().decode(user.getSeed())
    const server = await launchNatsServer({ jetstreamStoreDir: jetstreamDir, maxPayload: EMBEDDED_MAX_PAYLOAD_BYTES, auth: { nkey: user.getPublicKey() } })
    try {
      return await readOverNats(field, url, { servers: [server.url], nkeySeed: seed }, true)
    } finally {
      await server.stop()
    }
  } finally {
    await release()
  }
}

/** The connection to read a checkpoint's bucket with: `options.address`, else the servers the run used, with the caller's credentials. */
const connectionFor = (field: string, url: string, where: ObjectStoreLocation | undefined, options: FetchCheckpointOptions): ConnectionSpec | undefined => {
  const { address, ...given } = options
  const auth: ConnectionAuth = { ...(where?.tls !== undefined && given.tls === undefined ? { tls: where.tls } : {}), ...given }
  if (address !== undefined) return connectionFromAddress(address, auth, `${field}.address`)
  if (where?.servers === undefined || where.servers.length === 0) return undefined
  if (where.credentials !== undefined && !hasCredentials(given)) {
    throw new ConfigError({
      field,
      reason:
        `${url} is in the object store of the NATS server at ${where.servers.join(", ")}, which the run reached with ${where.credentials}; ` +
        `gradwire never keeps credentials with a Result: pass them, ${field}(checkpoint, ${credentialsHint(where.credentials)})`
    })
  }
  return connectionFromAddress(where.servers, auth, field)
}

/**
 * A checkpoint's files, fetched from wherever its run kept them: `checkpoint` is result.checkpoint
 * (or one of result.bestCheckpoints, or loadResult(dir)'s), a checkpoint directory, or a
 * `nats-obj://` path. A Result's checkpoint in an object store says where its bucket is: the
 * cluster's servers (pass the credentials the run used, if any) or, for the embedded cluster, the
 * run directory's JetStream data. A bare `nats-obj://` path needs `{ address }`.
 */
export const fetchCheckpoint = async (checkpoint: CheckpointSource, options?: FetchCheckpointOptions, field = "fetchCheckpoint"): Promise<Record<string, Uint8Array>> =>
  (await fetchCheckpointData(checkpoint, options, field)).files

/** fetchCheckpoint's read, with the metrics and metadata saved with the files (a resume needs them). */
export const fetchCheckpointData = async (checkpoint: CheckpointSource, options?: FetchCheckpointOptions, field = "fetchCheckpoint"): Promise<CheckpointRead> => {
  const opts = checkOptions(field, options)
  const url = pathOf(checkpoint)
  if (url === undefined) {
    throw new ConfigError({
      field,
      reason: `got ${checkpoint === null ? "null" : typeof checkpoint} for the checkpoint: pass result.checkpoint (or one of result.bestCheckpoints), a checkpoint directory, or a nats-obj:// path`
    })
  }
  if (!isObjectCheckpointUrl(url)) return readCheckpoint(url)
  const where = typeof checkpoint === "object" ? checkpoint.objectStore : undefined
  const spec = connectionFor(field, url, where, opts)
  if (spec) return readOverNats(field, url, spec, where?.servers !== undefined && opts.address === undefined)
  if (where?.jetstreamDir !== undefined) return readEmbedded(field, url, where.jetstreamDir)
  throw new ConfigError({
    field,
    reason:
      `${url} is in an object store, and a bare path does not say on which NATS server: pass its address, ${field}(checkpoint, { address: "nats://head:4222" }) ` +
      "(with the credentials it takes), or pass result.checkpoint (or one of result.bestCheckpoints, or loadResult(dir)'s), which carries where its run kept it"
  })
}

/** A loader of a model from a checkpoint directory or its files: `(tf, checkpoint)` or `(checkpoint)`. */
export interface FilesLoader<A, M> {
  (checkpoint: A): Promise<M>
  (tf: Tf, checkpoint: A): Promise<M>
}

/** A public checkpoint loader: `(checkpoint, options?)` or `(tf, checkpoint, options?)`, a checkpoint in an object store fetched first. */
export interface CheckpointLoader<A, M> {
  (checkpoint: A | CheckpointSource, options?: FetchCheckpointOptions): Promise<M>
  (tf: Tf, checkpoint: A | CheckpointSource, options?: FetchCheckpointOptions): Promise<M>
}

/**
 * `load` with a fetch in front: a checkpoint in an object store (a nats-obj:// path, or a Result's
 * checkpoint with one) is fetched (fetchCheckpoint) and its files are loaded; anything else goes to
 * `load` as given.
 */
export const checkpointLoader = <A, M>(field: string, load: FilesLoader<A | Readonly<Record<string, Uint8Array>>, M>): CheckpointLoader<A, M> =>
  (async (...args: unknown[]): Promise<M> => {
    const tf = isTf(args[0]) ? args[0] : undefined
    const [checkpoint, options] = tf ? [args[1], args[2]] : [args[0], args[1]]
    const opts = checkOptions(field, options)
    const where = pathOf(checkpoint)
    // A checkpoint in a bucket goes to `load` as its files, a CheckpointInfo of a directory as its path.
    const given =
      where === undefined ? (checkpoint as A) : isObjectCheckpointUrl(where) ? await fetchCheckpoint(checkpoint as CheckpointSource, opts, field) : (where as A)
    return tf ? load(tf, given) : load(given)
  }) as CheckpointLoader<A, M>
