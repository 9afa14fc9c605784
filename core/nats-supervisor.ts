// Supervision of a nats-server that gradwire started (the embedded one of Trainer.fit(), the head's
// of `gradwire start --head`): when the server exits without being asked to, it is started again on
// the same host and ports with the same config and JetStream store directory (so object-store
// checkpoints and streams survive), with backoff between failed attempts. Clients reconnect by
// themselves; every exit and restart is reported to the owner, which records it.
import type { NatsServerProcess } from "./nats-server.ts"

export interface NatsSupervisionEvents {
  /** The server exited unexpectedly. */
  readonly onExit?: (info: { readonly pid: number; readonly at: number; readonly log: string }) => void
  /** It is up again: the `restarts`-th restart, `downMs` after it exited. */
  readonly onRestart?: (info: { readonly restarts: number; readonly downMs: number; readonly pid: number }) => void
  /** A restart attempt failed (it is retried after the next backoff). */
  readonly onRestartFailed?: (info: { readonly attempt: number; readonly error: unknown }) => void
}

export interface NatsSupervisionOptions extends NatsSupervisionEvents {
  /** Wait before restart attempt n (0-based) of one outage; default 0, 250, 500, 1000, 2000, then 5000 ms. */
  readonly backoffMs?: (attempt: number) => number
}

export interface NatsSupervision {
  readonly restarts: number
  /** Ends supervision (the server itself is stopped by its owner). */
  stop(): void
}

const defaultBackoff = (n: number): number => (n === 0 ? 0 : Math.min(5_000, 250 * 2 ** (n - 1)))

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

/** Supervises `server` until stop(); call it after the server started. */
export const superviseNatsServer = (server: NatsServerProcess, options: NatsSupervisionOptions = {}): NatsSupervision => {
  const backoff = options.backoffMs ?? defaultBackoff
  let stopped = false
  let restarts = 0
  void (async () => {
    while (!stopped && !server.stopped) {
      const pid = server.pid
      await server.exited()
      if (stopped || server.stopped) return
      const at = Date.now()
      options.onExit?.({ pid, at, log: server.log() })
      for (let attempt = 0; !stopped; attempt++) {
        await sleep(backoff(attempt))
        if (stopped || server.stopped) return
        try {
          await server.restart()
          restarts++
          options.onRestart?.({ restarts, downMs: Date.now() - at, pid: server.pid })
          break
        } catch (error) {
          if (stopped || server.stopped) return
          options.onRestartFailed?.({ attempt, error })
        }
      }
    }
  })().catch(() => {})
  return {
    get restarts() {
      return restarts
    },
    stop: () => {
      stopped = true
    }
  }
}
