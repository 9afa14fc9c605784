// Whether our own NATS connection is up. Liveness clocks (cluster view, death watcher, the agent's
// owner check) must pause while we ourselves are cut off: silence then says nothing about the
// others, and declaring every node and actor dead after a server restart would be wrong. On
// reconnect, listeners restart their clocks from now.
import type { NatsConnection } from "@nats-io/nats-core"

export class LinkState {
  #up = true
  readonly #listeners = new Set<() => void>()
  readonly #iterator: AsyncIterable<{ type: string }> & { stop?: () => void }

  constructor(nc: NatsConnection) {
    const iterator = nc.status() as AsyncIterable<{ type: string }> & { stop?: () => void }
    this.#iterator = iterator
    void (async () => {
      try {
        for await (const s of iterator) {
          if (s.type === "disconnect" || s.type === "reconnecting" || s.type === "staleConnection") this.#up = false
          else if (s.type === "reconnect") {
            this.#up = true
            for (const l of this.#listeners) l()
          }
        }
      } catch {
        // the connection closed
      }
    })()
  }

  /** False while disconnected or reconnecting. */
  get up(): boolean {
    return this.#up
  }

  /** Called after every reconnect. Returns an unsubscribe. */
  onResume(listener: () => void): () => void {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }

  close(): void {
    this.#listeners.clear()
    this.#iterator.stop?.()
  }
}
