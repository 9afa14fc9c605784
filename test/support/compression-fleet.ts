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
}
