// Starts one OS process per rank running compression-rank.ts and drives them over IPC, like
// collectives-fleet.ts does for collectives-rank.ts (kept separate so the two rank scripts evolve
// independently). Every child is killed by stop(), by the parent's exit, and by itself when the
// IPC channel goes away.
import { startRanks, stopRanks } from "./child-ready.ts"
import type { ChildProcess } from "node:child_process"
import { fileURLToPath } from "node:url"
import { RankCallError, type Reply } from "./collectives-fleet.ts"

const RANK_SCRIPT = fileURLToPath(new URL("./compression-rank.ts", import.meta.url))

export class CompressionFleet {
  readonly children: ReadonlyArray<ChildProcess>
  readonly #pending: Array<Map<number, (r: Reply<unknown> | Error) => void>>
  #nextId = 1

  private constructor(children: ChildProcess[]) {
    this.children = children
    this.#pending = children.map(() => new Map())
    children.forEach((child, rank) => {
      child.on("message", (m: { id?: number } & Reply<unknown>) => {
        const settle = m.id === undefined ? undefined : this.#pending[rank].get(m.id)
        if (!settle || m.id === undefined) return
        this.#pending[rank].delete(m.id)
        settle(m)
      })
      child.once("exit", (code, signal) => {
        for (const settle of this.#pending[rank].values()) settle(new Error(`rank ${rank} exited (code ${code}, signal ${signal}) with a call pending`))
        this.#pending[rank].clear()
      })
    })
  }

  /**
   * Starts `size` ranks connected to `server`; all or none (a failed start stops the rest).
   * `execArgv`: node flags for the ranks (e.g. --cpu-prof; then end them with exit()).
   */
  static start(size: number, server: string, startTimeoutMs = 30_000, execArgv: ReadonlyArray<string> = []): Promise<CompressionFleet> {
    return startRanks(RANK_SCRIPT, size, () => server, { startTimeoutMs, execArgv }, (children) => new CompressionFleet(children))
  }

  get size(): number {
    return this.children.length
  }

  /** One command to one rank; throws RankCallError when the rank reports an error. */
  call<T>(rank: number, cmd: Record<string, unknown>, timeoutMs = 120_000): Promise<T> {
    const child = this.children[rank]
    const id = this.#nextId++
    return new Promise<T>((resolve, reject) => {
      if (child.exitCode !== null || child.signalCode !== null || !child.connected) {
        reject(new Error(`rank ${rank} is not running`))
        return
      }
      const timer = setTimeout(() => {
        this.#pending[rank].delete(id)
        reject(new Error(`rank ${rank} did not answer ${String(cmd.cmd)} within ${timeoutMs} ms`))
      }, timeoutMs)
      this.#pending[rank].set(id, (r) => {
        clearTimeout(timer)
        if (r instanceof Error) reject(r)
        else if (!r.ok) reject(new RankCallError(rank, r.error))
        else resolve(r.value as T)
      })
      child.send({ ...cmd, id })
    })
  }

  /** The same (rank-dependent) command on every rank at once. */
  all<T>(cmd: (rank: number) => Record<string, unknown>, timeoutMs?: number): Promise<T[]> {
    return Promise.all(this.children.map((_, r) => this.call<T>(r, cmd(r), timeoutMs)))
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

  /** Kills every rank still running and waits for them to exit. */
  async stop(): Promise<void> {
    await stopRanks(this.children)
  }
}
