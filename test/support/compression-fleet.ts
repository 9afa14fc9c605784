// Starts one OS process per rank running compression-rank.ts and drives them over IPC, like
// collectives-fleet.ts does for collectives-rank.ts (kept separate so the two rank scripts evolve
// independently). Every child is killed by stop(), by the parent's exit, and by itself when the
// IPC channel goes away.
import { startRanks } from "./child-ready.ts"
import { fileURLToPath } from "node:url"
import { RankProcesses } from "./collectives-fleet.ts"

const RANK_SCRIPT = fileURLToPath(new URL("./compression-rank.ts", import.meta.url))

export class CompressionFleet extends RankProcesses {
  /**
   * Starts `size` ranks connected to `server`; all or none (a failed start stops the rest).
   * `execArgv`: node flags for the ranks (e.g. --cpu-prof; then end them with exit()); `wrap`: a
   * command per rank that execs node (e.g. `ip netns exec NS` to run it in a namespace).
   */
  static start(
    size: number,
    server: string,
    startTimeoutMs = 30_000,
    execArgv: ReadonlyArray<string> = [],
    wrap?: (rank: number) => ReadonlyArray<string>
  ): Promise<CompressionFleet> {
    return startRanks(RANK_SCRIPT, size, () => server, { startTimeoutMs, execArgv, wrap }, (children) => new CompressionFleet(children))
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
}
