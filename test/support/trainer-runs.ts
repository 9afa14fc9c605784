// What the Trainer's end-to-end tests check of a run: every rank's last weights (the digits loop
// reports a hash of them), and the run directory's events.jsonl.
import * as fs from "node:fs/promises"
import * as path from "node:path"
import type { Result } from "../../index.ts"

/** Whether every rank reported the same weights in the last round. */
export const sameWeights = (r: Result): boolean => new Set(r.metricsPerRank.at(-1)!.map((m) => m.weights)).size === 1

/** The run's events.jsonl, one object per line. */
export const readEvents = async (dir: string): Promise<Array<Record<string, unknown>>> =>
  (await fs.readFile(path.join(dir, "events.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as Record<string, unknown>)
