// A small key-value bucket on JetStream, spoken through its JSON API ($JS.API.*) with plain
// requests: no JetStream client library is a dependency of gradwire, and the few calls needed
// (make the stream, put, get the last value of a key, list the keys) work on nats-server 2.9.
// The stream has the layout of a NATS KV bucket (KV_<bucket>, subjects $KV.<bucket>.<key>, one
// value per key), so `nats kv ls/get` read it too. A server without JetStream yields no bucket:
// callers go on without one.
import type { NatsConnection } from "@nats-io/nats-core"

export interface KvBucket {
  readonly name: string
  /** Stores `value` under `key` (replacing the last one); resolves once the server stored it. */
  put(key: string, value: Uint8Array): Promise<void>
  /** The last value of `key`, or undefined. */
  get(key: string): Promise<Uint8Array | undefined>
  /** Every key that holds a value. */
  keys(): Promise<string[]>
}

export interface KvOptions {
  /** Values older than this are dropped by the server. */
  readonly maxAgeMs: number
  /** Deadline of each request. Default 2 s. */
  readonly timeoutMs?: number
  /** At most this many values in the bucket (the oldest go first). Default 10,000. */
  readonly maxValues?: number
  /** Make the bucket when it is missing (default true); false: no bucket then (a reader's view). */
  readonly create?: boolean
}

const enc = new TextEncoder()
const dec = new TextDecoder()

interface ApiError {
  readonly code: number
  readonly err_code?: number
  readonly description?: string
}

const NS_PER_MS = 1_000_000

/** A JetStream API request; its parsed JSON answer (an `error` field when the API refused). */
const api = async (nc: NatsConnection, subject: string, body: unknown, timeoutMs: number): Promise<Record<string, unknown> & { error?: ApiError }> => {
  const msg = await nc.request(subject, body === undefined ? new Uint8Array(0) : enc.encode(JSON.stringify(body)), { timeout: timeoutMs })
  return JSON.parse(dec.decode(msg.data)) as Record<string, unknown> & { error?: ApiError }
}

const apiError = (what: string, e: ApiError): Error => new Error(`${what}: ${e.description ?? "error"} (${e.code}${e.err_code !== undefined ? `/${e.err_code}` : ""})`)

/** Keys are subject tokens: letters, digits, "-", "_", "=", "/" and ".": the caller's names stay within [A-Za-z0-9_-]. */
const checkKey = (key: string): void => {
  if (!/^[A-Za-z0-9_=-]+$/.test(key)) throw new Error(`invalid key "${key}": use letters, digits, "_", "-" or "="`)
}

/**
 * Opens (creating it when missing, unless create is false) the bucket `name`; undefined when the
 * server has no JetStream (or it does not answer within the deadline).
 */
export const openKvBucket = async (nc: NatsConnection, name: string, options: KvOptions): Promise<KvBucket | undefined> => {
  const timeoutMs = options.timeoutMs ?? 2_000
  const stream = `KV_${name}`
  const prefix = `$KV.${name}.`
  try {
    const info = await api(nc, `$JS.API.STREAM.INFO.${stream}`, undefined, timeoutMs)
    if (info.error) {
      // 10059: no such stream. Anything else (JetStream disabled, no permission): no bucket.
      if (info.error.err_code !== 10059 || options.create === false) return undefined
      const created = await api(
        nc,
        `$JS.API.STREAM.CREATE.${stream}`,
        {
          name: stream,
          subjects: [`${prefix}>`],
          retention: "limits",
          max_consumers: -1,
          max_msgs: options.maxValues ?? 10_000,
          max_bytes: -1,
          max_age: Math.round(options.maxAgeMs * NS_PER_MS),
          max_msgs_per_subject: 1,
          max_msg_size: -1,
          discard: "old",
          storage: "file",
          num_replicas: 1,
          duplicate_window: Math.min(120_000, options.maxAgeMs) * NS_PER_MS,
          allow_rollup_hdrs: true,
          deny_delete: true,
          deny_purge: false,
          allow_direct: true
        },
        timeoutMs
      )
      // 10058: made meanwhile by another process (with its own config): use it.
      if (created.error && created.error.err_code !== 10058) return undefined
    }
  } catch {
    // no responders (no JetStream), or a timeout
    return undefined
  }
  return {
    name,
    put: async (key, value) => {
      checkKey(key)
      const msg = await nc.request(`${prefix}${key}`, value, { timeout: timeoutMs })
      const ack = JSON.parse(dec.decode(msg.data)) as { error?: ApiError }
      if (ack.error) throw apiError(`storing ${key} in ${name}`, ack.error)
    },
    get: async (key) => {
      checkKey(key)
      const r = await api(nc, `$JS.API.STREAM.MSG.GET.${stream}`, { last_by_subj: `${prefix}${key}` }, timeoutMs)
      if (r.error) {
        if (r.error.code === 404) return undefined
        throw apiError(`reading ${key} from ${name}`, r.error)
      }
      const m = r.message as { data?: string } | undefined
      return m?.data ? new Uint8Array(Buffer.from(m.data, "base64")) : new Uint8Array(0)
    },
    keys: async () => {
      const out: string[] = []
      // Stream info lists the subjects with messages, in pages.
      for (let offset = 0; ; ) {
        const r = await api(nc, `$JS.API.STREAM.INFO.${stream}`, { subjects_filter: `${prefix}>`, offset }, timeoutMs)
        if (r.error) throw apiError(`listing ${name}`, r.error)
        const subjects = Object.keys(((r.state as { subjects?: Record<string, number> } | undefined)?.subjects) ?? {})
        out.push(...subjects.map((s) => s.slice(prefix.length)))
        const total = typeof r.total === "number" ? r.total : 0
        const limit = typeof r.limit === "number" ? r.limit : 0
        offset += subjects.length
        if (subjects.length === 0 || limit === 0 || offset >= total) break
      }
      return out
    }
  }
}
