// Watches one NATS connection for outages, so that no process waits on a lost bus without a
// deadline: nats.js reconnects by itself (forever, for gradwire's long-lived connections), and this
// turns its status events into "down since", "back after N ms" and "gone for longer than the
// deadline". The driver fails the run with NatsUnavailable on expiry, workers exit, agents only
// log and keep retrying.
import type { NatsConnection } from "@nats-io/nats-core"

export interface OutageInfo {
  /** Date.now() when the connection was lost. */
  readonly since: number
  /** The server it was connected to, as nats.js names it. */
  readonly server: string
}

export interface BusMonitorOptions {
  /** How long an outage may last before onExpired (0 or Infinity: never). */
  readonly timeoutMs: number
  readonly onDown?: (o: OutageInfo) => void
  readonly onUp?: (o: OutageInfo & { readonly ms: number }) => void
  /** Once per outage, when it has lasted timeoutMs. */
  readonly onExpired?: (o: OutageInfo & { readonly ms: number }) => void
  /** The connection closed for good (no more reconnects). */
  readonly onClosed?: () => void
}

export interface BusMonitor {
  /** The outage in progress, if any. */
  readonly outage: OutageInfo | undefined
  /** Outages so far (ended or not). */
  readonly outages: number
  /** Resolves when the connection is up (at once if it is), or with "expired"/"closed". */
  whenUp(): Promise<"up" | "expired" | "closed">
  /** Resolves the next time the connection comes back after an outage (never if it does not). */
  nextReconnect(): Promise<void>
  stop(): void
}

export const watchBus = (nc: NatsConnection, options: BusMonitorOptions): BusMonitor => {
  let outage: OutageInfo | undefined
  let expired = false
  let closed = false
  let count = 0
  let timer: ReturnType<typeof setTimeout> | undefined
  let stopped = false
  const waiters = new Set<(r: "up" | "expired" | "closed") => void>()
  const reconnects = new Set<() => void>()
  const settle = (r: "up" | "expired" | "closed"): void => {
    for (const w of waiters) w(r)
    waiters.clear()
  }
  const down = (server: string): void => {
    if (outage || stopped) return
    outage = { since: Date.now(), server }
    expired = false
    count++
    options.onDown?.(outage)
    if (options.timeoutMs > 0 && Number.isFinite(options.timeoutMs)) {
      const o = outage
      timer = setTimeout(() => {
        if (outage !== o || stopped) return
        expired = true
        // The timer waited timeoutMs on the monotonic clock; the wall clock may read a millisecond less.
        options.onExpired?.({ ...o, ms: Math.max(options.timeoutMs, Date.now() - o.since) })
        settle("expired")
      }, options.timeoutMs)
      // An outage timer must not keep a process alive that has nothing else to do.
      timer.unref?.()
    }
  }
  const up = (): void => {
    const o = outage
    if (!o) return
    outage = undefined
    if (timer) clearTimeout(timer)
    timer = undefined
    if (!stopped) options.onUp?.({ ...o, ms: Date.now() - o.since })
    settle("up")
    for (const r of reconnects) r()
    reconnects.clear()
  }
  const status = nc.status()
  void (async () => {
    for await (const s of status) {
      if (stopped) break
      if (s.type === "disconnect") down(s.server)
      else if (s.type === "staleConnection") down(nc.getServer())
      else if (s.type === "reconnect") up()
      else if (s.type === "close") break
    }
  })()
    .catch(() => {})
    .finally(() => {
      if (stopped) return
      closed = true
      if (timer) clearTimeout(timer)
      options.onClosed?.()
      settle("closed")
    })
  return {
    get outage() {
      return outage
    },
    get outages() {
      return count
    },
    whenUp: () => {
      if (closed) return Promise.resolve("closed")
      if (!outage) return Promise.resolve("up")
      if (expired) return Promise.resolve("expired")
      return new Promise((resolve) => waiters.add(resolve))
    },
    nextReconnect: () => new Promise<void>((resolve) => reconnects.add(resolve)),
    stop: () => {
      stopped = true
      if (timer) clearTimeout(timer)
      ;(status as unknown as { stop?: () => void }).stop?.()
      settle("closed")
    }
  }
}
