// Test and benchmark harness for collectives: starts one OS process per rank (collectives-rank.ts)
// and drives them over the IPC channel with small JSON commands, so one process can run many
// cases. Every child is killed by stop(), by the parent's exit, and by the child itself when the
// IPC channel goes away (parent crashed).
import { startRanks, stopRanks } from "./child-ready.ts"
import type { ChildProcess } from "node:child_process"
import { fileURLToPath } from "node:url"

const RANK_SCRIPT = fileURLToPath(new URL("./collectives-rank.ts", import.meta.url))

export interface RankError {
  readonly tag: string
  readonly message: string
  readonly fields: Record<string, unknown>
}

export type Reply<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly error: RankError }

export class RankCallError extends Error {
  readonly rank: number
  readonly error: RankError
  constructor(rank: number, error: RankError) {
    super(`rank ${rank}: ${error.tag}: ${error.message}`)
    this.rank = rank
    this.error = error
  }
}

export interface FleetOptions {
  readonly size: number
  /** NATS URL for each rank. */
  readonly server: (rank: number) => string
  /** How long to wait for a rank to start and connect. Default 30 s. */
  readonly startTimeoutMs?: number
  /** Node flags for the rank processes (e.g. --cpu-prof when profiling a benchmark). */
  readonly execArgv?: ReadonlyArray<string>
  /** A command that execs node in its place, per rank (e.g. `ip netns exec NS`). */
  readonly wrap?: (rank: number) => ReadonlyArray<string>
}

interface Pending {
  readonly resolve: (r: Reply<unknown>) => void
  readonly reject: (e: Error) => void
}

/**
 * Rank processes driven over IPC, one command at a time per call: the request/reply bookkeeping
 * shared by this fleet and compression-fleet.ts (a call pending when its rank exits is rejected).
 */
export class RankProcesses {
  readonly children: ChildProcess[]
  readonly #pending: Array<Map<number, Pending>>
  #nextId = 1

  protected constructor(children: ChildProcess[]) {
    this.children = children
    this.#pending = children.map(() => new Map())
    children.forEach((child, rank) => {
      child.on("message", (m: { id: number } & Reply<unknown>) => {
        const p = this.#pending[rank].get(m.id)
        if (!p) return
        this.#pending[rank].delete(m.id)
        p.resolve(m)
      })
      child.once("exit", (code, signal) => {
        for (const p of this.#pending[rank].values()) p.reject(new Error(`rank ${rank} exited (code ${code}, signal ${signal}) with a call pending`))
        this.#pending[rank].clear()
      })
    })
  }

  get size(): number {
    return this.children.length
  }

  /** Sends one command to one rank; resolves with its reply (errors come back as values). */
  request<T>(rank: number, cmd: Record<string, unknown>, timeoutMs = 120_000): Promise<Reply<T>> {
    const child = this.children[rank]
    const id = this.#nextId++
    return new Promise<Reply<T>>((resolve, reject) => {
      if (child.exitCode !== null || child.signalCode !== null || !child.connected) {
        reject(new Error(`rank ${rank} is not running`))
        return
      }
      const timer = setTimeout(() => {
        this.#pending[rank].delete(id)
        reject(new Error(`rank ${rank} did not answer ${String(cmd.cmd)} within ${timeoutMs} ms`))
      }, timeoutMs)
      this.#pending[rank].set(id, {
        resolve: (r) => {
          clearTimeout(timer)
          resolve(r as Reply<T>)
        },
        reject: (e) => {
          clearTimeout(timer)
          reject(e)
        }
      })
      child.send({ ...cmd, id })
    })
  }

  /** Like request, but throws RankCallError when the rank reports an error. */
  async call<T>(rank: number, cmd: Record<string, unknown>, timeoutMs?: number): Promise<T> {
    const r = await this.request<T>(rank, cmd, timeoutMs)
    if (!r.ok) throw new RankCallError(rank, r.error)
    return r.value
  }

  /** Kills every rank still running and waits for them to exit. */
  async stop(): Promise<void> {
    await stopRanks(this.children)
  }

  /** Asks every rank to exit by itself (so --cpu-prof profiles get written), then stop(). */
  async exit(timeoutMs = 10_000): Promise<void> {
    const gone = this.children.map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) resolve()
          else child.once("exit", () => resolve())
        })
    )
    await Promise.allSettled(this.children.map((_, r) => this.call(r, { cmd: "exit" }, timeoutMs)))
    await Promise.race([Promise.all(gone), new Promise((resolve) => setTimeout(resolve, timeoutMs).unref())])
    await this.stop()
  }
}

export class RankFleet extends RankProcesses {
  static start(opts: FleetOptions): Promise<RankFleet> {
    return startRanks(RANK_SCRIPT, opts.size, opts.server, opts, (children) => new RankFleet(children))
  }

  /** Runs a command on ranks 0..count-1 at once (cmd may depend on the rank). */
  all<T>(count: number, cmd: (rank: number) => Record<string, unknown>, timeoutMs?: number): Promise<T[]> {
    return Promise.all(Array.from({ length: count }, (_, r) => this.call<T>(r, cmd(r), timeoutMs)))
  }

  kill(rank: number, signal: NodeJS.Signals = "SIGKILL"): void {
    this.children[rank].kill(signal)
  }
}
