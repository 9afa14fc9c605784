// The worker group of one generation, as the driver sees it: one worker actor process per rank,
// spawned through the node agents of the placement plan, watched until it goes down, and killed
// when the generation ends. What a death means is the controller's business (controller.ts):
// this module only reports it.
import { fileURLToPath } from "node:url"
// Silence after which a worker counts as dead (core/defaults.ts says why it is 10 s).
import { WORKER_DEAD_AFTER_MS } from "../../core/defaults.ts"
import type { PlacementPlan } from "../../scheduler/placement.ts"
import type { ActorSystem } from "../runtime/system.ts"
import { agentRef, spawnActor, type SpawnedActor } from "../node/spawn.ts"
import { WorkerProtocol, type WorkerArgs } from "./train-protocol.ts"


/** A worker that stops right after telling the controller it finished is fine: give that message a moment. */
const DOWN_GRACE_MS = 300

const WORKER_MODULE = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "./worker.ts" : "./worker.js", import.meta.url))

/** What every rank's WorkerArgs share in a generation. */
export type GroupArgs = Omit<WorkerArgs, "attempt" | "rank" | "worldSize" | "localRank" | "localWorldSize" | "nodeRank" | "nodes" | "group" | "backend">

export interface GroupStart {
  readonly attempt: number
  readonly plan: PlacementPlan
  readonly args: GroupArgs
  /** A rank's process went down (not called for ranks the controller says are done). */
  readonly onDown: (rank: number, down: { readonly reason: string; readonly detail: string }) => void
  /** Whether rank's going down still matters (false once the generation settled or the rank finished). */
  readonly stillMatters: (rank: number) => boolean
}

export class WorkerGroup {
  readonly #system: ActorSystem
  #workers: SpawnedActor[] = []

  constructor(system: ActorSystem) {
    this.#system = system
  }

  /** The live workers (any generation not yet killed). */
  get workers(): ReadonlyArray<SpawnedActor> {
    return this.#workers
  }

  /**
   * Spawns every rank of the plan and starts their loops. Resolves with undefined once all run, or
   * with a description of what failed (a spawn, or the `run` request).
   */
  async start(s: GroupStart): Promise<{ readonly tag: string; readonly message: string } | undefined> {
    const ranks = s.plan.ranks
    const nodes = ranks.map((r) => r.nodeId)
    const spawned: SpawnedActor[] = []
    const group = `g${s.attempt}`
    try {
      await Promise.all(
        ranks.map(async (r) => {
          const args: WorkerArgs = {
            ...s.args,
            attempt: s.attempt,
            rank: r.rank,
            worldSize: ranks.length,
            localRank: r.localRank,
            localWorldSize: r.localWorldSize,
            nodeRank: r.nodeRank,
            nodes,
            group,
            backend: r.backend
          }
          const w = await spawnActor(this.#system, {
            node: r.nodeId,
            name: `w${s.attempt}-${r.rank}`,
            module: WORKER_MODULE,
            export: "trainWorker",
            args,
            // The agent checks the loop module against its allowed roots before the worker imports it.
            imports: [s.args.loopModule],
            gpus: r.gpuIndices,
            env: { CUDA_VISIBLE_DEVICES: r.cudaVisibleDevices, GRADWIRE_RANK: String(r.rank), GRADWIRE_WORLD_SIZE: String(ranks.length) },
            resources: s.plan.resourcesPerWorker,
            logPrefix: `worker rank=${r.rank}`,
            readyTimeoutMs: 60_000
          })
          spawned[r.rank] = w
          this.#workers.push(w)
        })
      )
    } catch (e) {
      const err = e as { message?: string; _tag?: string }
      return { tag: err._tag ?? "SpawnError", message: err.message ?? String(e) }
    }
    spawned.forEach((w, rank) => {
      void w.down({ deadAfterMs: WORKER_DEAD_AFTER_MS }).then((down) => {
        if (!s.stillMatters(rank)) return
        setTimeout(() => {
          if (s.stillMatters(rank)) s.onDown(rank, { reason: down.reason, detail: `worker process (pid ${w.pid} on node ${w.node}) went down: ${down.detail}` })
        }, DOWN_GRACE_MS)
      })
    })
    try {
      await Promise.all(spawned.map((w) => this.#system.askPromise(w.ref(WorkerProtocol), "run", null, { timeoutMs: 15_000 })))
    } catch (e) {
      return { tag: "StartError", message: `could not start the loops: ${String(e)}` }
    }
    return undefined
  }

  /**
   * Kills every worker through its node's agent and waits until the agent says they are gone, so
   * the next placement sees their resources free. An agent that does not answer (still
   * reconnecting after a NATS outage) is asked again until `timeoutMs`; one on a node the cluster
   * no longer sees alive is asked once.
   */
  async kill(job: string, reason: string, options: { readonly alive?: (node: string) => boolean; readonly timeoutMs?: number } = {}): Promise<void> {
    const nodes = new Set(this.#workers.map((w) => w.node))
    this.#workers = []
    const deadline = Date.now() + (options.timeoutMs ?? KILL_TIMEOUT_MS)
    await Promise.all(
      [...nodes].map(async (node) => {
        for (;;) {
          const left = deadline - Date.now()
          try {
            await this.#system.askPromise(agentRef(this.#system, node), "killJob", { job, reason }, { timeoutMs: Math.max(1_000, Math.min(5_000, left)) })
            return
          } catch {
            if (Date.now() >= deadline || options.alive?.(node) === false) return
            await new Promise((r) => setTimeout(r, 250))
          }
        }
      })
    )
  }
}

/** How long kill() keeps asking an agent that does not answer. */
const KILL_TIMEOUT_MS = 20_000
