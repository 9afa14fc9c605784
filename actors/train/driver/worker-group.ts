// The worker group of one generation, as the driver sees it: one worker actor process per rank,
// spawned through the node agents of the placement, watched until it goes down, and killed when the
// generation ends. A regrouped generation keeps the surviving processes (under their new ranks) and
// adds joiners. What a death means is the controller's business (controller.ts): this module only
// reports it.
import { randomBytes } from "node:crypto"
import { fileURLToPath } from "node:url"
// Silence after which a worker counts as dead (core/defaults.ts says why it is 10 s); the driver
// lengthens it for workers whose steps measured long (collectives/deadlines.ts HeartbeatDeadline).
import { WORKER_DEAD_AFTER_MS } from "../../../core/defaults.ts"
import { standbyNice } from "../../../core/settings.ts"
import { SERVER_CPUS, type PlacementPlan, type PlacementRequest } from "../../../scheduler/placement.ts"
import { isGpuShare } from "../../../scheduler/resources.ts"
import type { ActorSystem } from "../../runtime/system.ts"
import type { ActorDown, WatchOptions } from "../../runtime/watcher.ts"
import { TIMED_OUT, withDeadline } from "../../runtime/deadline.ts"
import { agentRef, spawnActor, type SpawnedActor } from "../../node/spawn.ts"
import { StartPacer } from "./start-pacer.ts"
import { WorkerProtocol, type JoinPosition, type Placement, type WarmUp, type WorkerArgs } from "../common/train-protocol.ts"
import { datasetModules } from "./dataset-payloads.ts"
import type { Resolved } from "./options.ts"

/**
 * A worker that stops right after telling the controller it finished (or why it failed) is fine:
 * give that message a moment before its exit counts as a death. A process killed by a signal
 * (kill -9, the OOM killer, a crash), a node lost and missed heartbeats send nothing first, so
 * they count at once: the grace was 0.3 s of every worker kill's 0.43 s pause.
 */
const DOWN_GRACE_MS = 300
/** How workers that beat from their thread are judged (collectives/deadlines.ts HeartbeatDeadline), and who hears of a long-held event loop. */
export interface ThreadedLiveness {
  readonly silentAfterMs: () => number
  readonly heldAfterMs: (instance: string) => number
  /** A member's event loop held past its heartbeat deadline (once a stretch), and when it would be taken for hung; `name` is its actor's. */
  readonly onHeld?: (rank: number, heldMs: number, hungAfterMs: number, name: string) => void
}

const graceFor = (down: ActorDown): number => ((down.reason === "exited" && down.signal) || down.reason === "node-lost" || down.reason === "missed-heartbeats" ? 0 : DOWN_GRACE_MS)

/** How long kill() keeps asking an agent that does not answer. */
const KILL_TIMEOUT_MS = 20_000

const WORKER_MODULE = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "../worker/worker.ts" : "../worker/worker.js", import.meta.url))
const SERVER_MODULE = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "../parameter-server/ps-server.ts" : "../parameter-server/ps-server.js", import.meta.url))

/** A process of the job started (a worker, a standby, a parameter server, a spare): events.jsonl's process-start. */
export interface ProcessStart {
  readonly name: string
  readonly node: string
  readonly pid: number
  /** ms it waited for a place among its node's starts (start-pacer.ts). */
  readonly queuedMs: number
  /** ms from the spawn request to the process's ready notice. */
  readonly readyMs: number
}

/** What every rank's WorkerArgs share in a generation. */
export type GroupArgs = Omit<WorkerArgs, "attempt" | "rank" | "worldSize" | "localRank" | "localWorldSize" | "nodeRank" | "nodes" | "group" | "measured" | "backend" | "join">

/** What the run asks the scheduler to place, from the Trainer's options (the world size apart). */
export const placementRequestOf = (cfg: Resolved, job: string): Omit<PlacementRequest, "numWorkers"> => ({
  jobId: job,
  ...(cfg.scaling.useGpu !== undefined ? { useGpu: cfg.scaling.useGpu } : {}),
  ...(cfg.scaling.resourcesPerWorker !== undefined ? { resourcesPerWorker: cfg.scaling.resourcesPerWorker } : {}),
  ...(cfg.scaling.placementStrategy !== undefined ? { placementStrategy: cfg.scaling.placementStrategy } : {}),
  ...(cfg.scaling.acceleratorType !== undefined ? { acceleratorType: cfg.scaling.acceleratorType } : {}),
  ...(cfg.scaling.nodeLabels !== undefined ? { nodeLabels: cfg.scaling.nodeLabels } : {}),
  ...(cfg.scaling.backend !== undefined ? { backend: cfg.scaling.backend } : {}),
  // Parameter servers are placed with the workers, SERVER_CPUS each.
  ...(cfg.collective.parameterServer ? { servers: cfg.collective.parameterServer.numServers } : {})
})

/** A request for workers joining a running group: its parameter servers run already (placed with the group). */
export const joinersRequest = (request: Omit<PlacementRequest, "numWorkers">): Omit<PlacementRequest, "numWorkers"> => {
  const { servers: _servers, ...workers } = request
  return workers
}

/** The run's GroupArgs, from the Trainer's options, with a fresh secret for the direct links. */
export const groupArgsOf = (cfg: Resolved, elastic: boolean): GroupArgs => ({
  controller: "controller",
  loopModule: cfg.loop.module,
  loopExport: cfg.loop.export,
  ...(datasetModules(cfg.datasets).length > 0 ? { datasetModules: datasetModules(cfg.datasets) } : {}),
  loopConfig: cfg.loopConfig,
  // The direct links' secret: one per run, to the workers over the bus only (not in the run directory).
  collective: { ...cfg.collective, directSecret: randomBytes(32).toString("hex") },
  seed: cfg.seed,
  timeline: cfg.run.timeline === true,
  natsOutageTimeoutMs: cfg.natsOutageTimeoutMs,
  parityEvery: cfg.parityEvery,
  // A fixed-size group too: it runs short-handed while a replacement starts (regroup.ts).
  elastic: { maxWorkers: cfg.maxWorkers, batch: cfg.elasticBatch, ...(elastic ? {} : { fixed: true }) }
})

/** How long a standby worker gets to load its engine, connect and import the loop. */
const STANDBY_PREPARE_MS = 120_000

/** A worker started ahead of a regroup, prepared and waiting to be admitted (WorkerGroup.standby). */
export interface Standby {
  readonly actor: SpawnedActor
  readonly nodeId: string
  /** Its warm-up before it said it was ready, when it did one. */
  readonly warmUp?: WarmUp
}

/** One rank to spawn: where, with what. */
export interface RankSpawn {
  readonly placement: Placement
  readonly nodeId: string
  readonly backend: string
  readonly gpuIndices: ReadonlyArray<number>
  readonly cudaVisibleDevices: string
  readonly resources: Readonly<Record<string, number>>
  readonly join?: WorkerArgs["join"]
}

/** Watching a generation's members: who to tell of a death, and whether it still matters. */
export interface Watch {
  readonly onDown: (rank: number, down: { readonly reason: string; readonly detail: string }) => void
  readonly stillMatters: (rank: number) => boolean
}

/**
 * Placements of a fresh plan (ranks, nodes, local ranks as the plan made them); `max`: the size the
 * group may grow to (an elastic group that starts smaller is marked below its size).
 */
export const placementsOf = (plan: PlacementPlan, attempt: number, max = plan.ranks.length): RankSpawn[] => {
  const nodes = plan.ranks.map((r) => r.nodeId)
  const belowSize = plan.ranks.length < max
  return plan.ranks.map((r) => ({
    placement: {
      attempt,
      rank: r.rank,
      worldSize: plan.ranks.length,
      localRank: r.localRank,
      localWorldSize: r.localWorldSize,
      nodeRank: r.nodeRank,
      nodes,
      group: `g${attempt}`,
      ...(belowSize ? { belowSize } : {})
    },
    nodeId: r.nodeId,
    backend: r.backend,
    gpuIndices: r.gpuIndices,
    cudaVisibleDevices: r.cudaVisibleDevices,
    resources: r.resources
  }))
}

/**
 * Local ranks and node ranks for a group whose rank r runs on nodes[r] (nodes numbered in order of
 * their first rank, ranks on a node in rank order), as a regroup needs them.
 */
export const layoutOf = (nodes: ReadonlyArray<string>): Array<{ localRank: number; localWorldSize: number; nodeRank: number }> => {
  const order: string[] = []
  const count = new Map<string, number>()
  for (const n of nodes) {
    if (!count.has(n)) order.push(n)
    count.set(n, (count.get(n) ?? 0) + 1)
  }
  const seen = new Map<string, number>()
  return nodes.map((n) => {
    const localRank = seen.get(n) ?? 0
    seen.set(n, localRank + 1)
    return { localRank, localWorldSize: count.get(n)!, nodeRank: order.indexOf(n) }
  })
}

/** The environment a worker starts with (core/settings.ts WORKER_ENVIRONMENT). */
export const workerEnv = (
  r: { readonly cudaVisibleDevices: string; readonly resources: Readonly<Record<string, number>>; readonly placement: { readonly rank: number; readonly worldSize: number } },
  verbose: boolean
): Record<string, string> => {
  return {
    CUDA_VISIBLE_DEVICES: r.cudaVisibleDevices,
    GRADWIRE_RANK: String(r.placement.rank),
    GRADWIRE_WORLD_SIZE: String(r.placement.worldSize),
    // A worker sharing its GPU (a fraction of one): tfjs-node-gpu's TensorFlow would otherwise
    // take almost all of the GPU's memory at start, and the next worker on it could allocate none.
    ...(isGpuShare(r.resources.GPU ?? 0) ? { TF_FORCE_GPU_ALLOW_GROWTH: "true" } : {}),
    ...(verbose ? { GRADWIRE_LOG: "debug" } : {})
  }
}

/** A standby's GRADWIRE_START_NICE (core/settings.ts standbyNice), none when it is 0. */
const startNiceEnv = (): Record<string, string> => {
  const nice = standbyNice.read()
  return nice > 0 ? { GRADWIRE_START_NICE: String(nice) } : {}
}

export class WorkerGroup {
  readonly #system: ActorSystem
  /** Every live worker process of the job (any generation not yet killed). */
  #workers: SpawnedActor[] = []
  /** The parameter servers of the running generation, by shard, and the watch of each one's end. */
  #servers: SpawnedActor[] = []
  #serverDowns: Array<Promise<ActorDown>> = []
  /** A spare server ready to take a lost one's place (replicas), and how many replacements and spares were named. */
  #spare: { readonly actor: SpawnedActor; gone: boolean } | undefined
  #replacements = 0
  /** The current generation's members by rank. */
  #members = new Map<number, SpawnedActor>()
  /** Standby workers spawned so far (their actor names count up). */
  #standbys = 0

  /** Silence after which a worker (by its instance) counts as dead, read at every check (the driver derives it from measured steps). */
  readonly #deadAfterMs: (instance: string) => number
  /** runConfig.verbose: workers log at debug level (their transport, topology and deadlines too). */
  readonly #verbose: boolean

  /** A worker beating from its thread: silence after which it is dead, and how long its event loop may be held (collectives/deadlines.ts). */
  readonly #threaded: ThreadedLiveness | undefined

  /** Process starts on each node, at most a few more than its cores at once (start-pacer.ts). */
  readonly #starts: StartPacer

  /** Told of each process started, once it is ready (events.jsonl's process-start). */
  readonly #onStarted: ((s: ProcessStart) => void) | undefined

  /**
   * `startLimit(node)`: how many of the job's processes may be starting on `node` at once (default:
   * no bound); `onStarted`: told of each one as it is ready, with how long it waited for a place.
   */
  constructor(
    system: ActorSystem,
    deadAfterMs: (instance: string) => number = () => WORKER_DEAD_AFTER_MS,
    verbose = false,
    threaded?: ThreadedLiveness,
    startLimit: (node: string) => number = () => Infinity,
    onStarted?: (s: ProcessStart) => void
  ) {
    this.#system = system
    this.#deadAfterMs = deadAfterMs
    this.#verbose = verbose
    this.#threaded = threaded
    this.#starts = new StartPacer(startLimit)
    this.#onStarted = onStarted
  }

  /** `spawn` once the node has a place for one more start (start-pacer.ts); onStarted is told once it is ready. */
  async #paced(node: string, spawn: () => Promise<SpawnedActor>): Promise<SpawnedActor> {
    const asked = performance.now()
    let queuedMs = 0
    const s = await this.#starts.run(node, () => {
      queuedMs = performance.now() - asked
      return spawn()
    })
    try {
      this.#onStarted?.({ name: s.name, node: s.node, pid: s.pid, queuedMs: Math.round(queuedMs), readyMs: Math.round(s.readyMs) })
    } catch {
      // a record only
    }
    return s
  }

  /**
   * How a member is watched: its heartbeat deadline, and for beats from its thread the silence and
   * held-loop ones, `rank`'s event loop held past the heartbeat deadline told to onHeld.
   */
  #liveness(w: SpawnedActor, rank?: number): Omit<WatchOptions, "instance"> {
    const t = this.#threaded
    const deadAfterMs = (): number => this.#deadAfterMs(w.instance)
    return {
      deadAfterMs,
      ...(t
        ? {
            silentAfterMs: t.silentAfterMs,
            heldAfterMs: () => t.heldAfterMs(w.instance),
            ...(t.onHeld && rank !== undefined ? { onHeld: { afterMs: deadAfterMs, call: (heldMs: number) => t.onHeld!(rank, heldMs, t.heldAfterMs(w.instance), w.name) } } : {})
          }
        : {})
    }
  }

  /** The current generation's members, by rank. */
  get members(): ReadonlyMap<number, SpawnedActor> {
    return this.#members
  }

  /** One worker process, spawned with `r`'s placement (a standby's is provisional) and registered to be killed with the job. */
  async #spawnProcess(r: RankSpawn, args: GroupArgs, name: string, standby = false, lowered = true): Promise<SpawnedActor> {
    const p = r.placement
    const workerArgs: WorkerArgs = { ...args, ...p, backend: r.backend, ...(r.cudaVisibleDevices ? { gpus: r.cudaVisibleDevices } : {}), ...(r.join ? { join: r.join } : {}) }
    const w = await this.#paced(r.nodeId, () => spawnActor(this.#system, {
      node: r.nodeId,
      name,
      module: WORKER_MODULE,
      export: "trainWorker",
      args: workerArgs,
      // The agent checks the loop module against its allowed roots before the worker imports it.
      imports: [args.loopModule, ...(args.datasetModules ?? [])],
      gpus: [...r.gpuIndices],
      // A standby starts at a lower priority and takes its own back as it is admitted (core/priority.ts).
      env: { ...workerEnv(r, this.#verbose), ...(standby && lowered ? startNiceEnv() : {}) },
      resources: r.resources,
      logPrefix: `worker rank=${p.rank}`,
      readyTimeoutMs: 60_000
    }))
    this.#workers.push(w)
    return w
  }

  /**
   * Spawns ranks and starts their loops. Resolves with undefined once all run, or with a
   * description of what failed (a spawn, or the `run` request). The new ones join `members`.
   */
  async spawn(ranks: ReadonlyArray<RankSpawn>, args: GroupArgs, watch: Watch): Promise<{ readonly tag: string; readonly message: string } | undefined> {
    const spawned: SpawnedActor[] = []
    try {
      await Promise.all(
        ranks.map(async (r) => {
          const p = r.placement
          const w = await this.#spawnProcess(r, args, `w${p.attempt}-${p.rank}`)
          spawned[p.rank] = w
          this.#members.set(p.rank, w)
        })
      )
    } catch (e) {
      const err = e as { message?: string; _tag?: string }
      return { tag: err._tag ?? "SpawnError", message: err.message ?? String(e) }
    }
    this.watch(
      new Map(ranks.map((r) => [r.placement.rank, spawned[r.placement.rank]!] as const)),
      watch
    )
    try {
      await Promise.all(ranks.map((r) => this.#system.askPromise(spawned[r.placement.rank]!.ref(WorkerProtocol), "run", null, { timeoutMs: 15_000 })))
    } catch (e) {
      return { tag: "StartError", message: `could not start the loops: ${String(e)}` }
    }
    return undefined
  }

  /**
   * Standby workers: processes started ahead of a regroup (while the group runs short-handed, or
   * before an elastic group grows), each loading its engine, opening its connections, importing
   * the loop and warming up (`prepare`) without joining any group. Resolves once every one is prepared, or with
   * what failed (then those that started are killed). Not members, not watched, until admitted.
   * `lowered` false: they start at the workers' priority (refill.ts, after a lowered one timed out).
   */
  async standby(ranks: ReadonlyArray<Omit<RankSpawn, "join">>, args: GroupArgs, lowered = true): Promise<Standby[] | { readonly tag: string; readonly message: string }> {
    const started: SpawnedActor[] = []
    try {
      return await Promise.all(
        ranks.map(async (r) => {
          const w = await this.#spawnProcess(r, args, `w-standby${++this.#standbys}`, true, lowered)
          started.push(w)
          const warmUp = await this.#system.askPromise(w.ref(WorkerProtocol), "prepare", null, { timeoutMs: STANDBY_PREPARE_MS })
          // One that goes down while it waits is no longer held (holds): no regroup admits it.
          void w.down(this.#liveness(w)).then(() => {
            this.#workers = this.#workers.filter((x) => x !== w)
          })
          return { actor: w, nodeId: r.nodeId, ...(warmUp ? { warmUp } : {}) }
        })
      )
    } catch (e) {
      await Promise.all(started.map((w) => this.killOne(w, "a standby worker could not be prepared")))
      const err = e as { message?: string; _tag?: string }
      return { tag: err._tag ?? "SpawnError", message: err.message ?? String(e) }
    }
  }

  /**
   * Lets standby workers into the current generation at their placements (joining the survivors
   * where `join` says): they become members, are watched, and start their loops.
   */
  async admit(entries: ReadonlyArray<{ readonly standby: Standby; readonly placement: Placement; readonly join: JoinPosition }>, watch: Watch): Promise<{ readonly tag: string; readonly message: string } | undefined> {
    const members = new Map(entries.map((e) => [e.placement.rank, e.standby.actor] as const))
    for (const [rank, w] of members) this.#members.set(rank, w)
    this.watch(members, watch)
    try {
      await Promise.all(entries.map((e) => this.#system.askPromise(e.standby.actor.ref(WorkerProtocol), "run", { placement: e.placement, join: e.join }, { timeoutMs: 15_000 })))
    } catch (e) {
      return { tag: "StartError", message: `could not start the standby workers' loops: ${String(e)}` }
    }
    return undefined
  }

  /** Whether a standby worker's process is still registered (not killed, not gone with the job). */
  holds(w: SpawnedActor): boolean {
    return this.#workers.includes(w)
  }

  /**
   * The parameter-server strategy: spawns a generation's servers, server k on the k-th of `nodes`
   * (the placement plan's, cycling), each reserving SERVER_CPUS there as a worker reserves its
   * resources, and watches them: a server that goes down is reported through `onDown` (the
   * generation fails, as with a worker's death). With `replicas` (two servers or more) each keeps a
   * replica of the one before it (its successor is named in its args), and a spare server is
   * started in the background, ready to take a lost one's place (replaceServer). Resolves with
   * their actor names in shard order.
   */
  async spawnServers(attempt: number, count: number, replicas: boolean, nodes: ReadonlyArray<string>, onDown: (index: number, detail: string) => void, stillMatters: () => boolean): Promise<string[]> {
    const names = Array.from({ length: count }, (_, k) => `ps${attempt}-${k}`)
    this.#servers = []
    this.#serverDowns = []
    this.#spare = undefined
    await Promise.all(
      names.map(async (name, k) => this.#watchServer(k, await this.#spawnServer(name, k, count, replicas && count > 1 ? names[(k + 1) % count] : undefined, nodes[k % nodes.length]!), onDown, stillMatters))
    )
    if (replicas && count > 1) this.#startSpare(attempt, count, nodes[count % nodes.length]!, stillMatters)
    return names
  }

  /**
   * A lost server's replacement for shard k of `count`: the spare when one is ready (a new spare
   * is then started in its place), else a new server on the lost one's node while it is alive (else
   * on `fallback`); watched as the others are. It starts empty: its successor initialises it from
   * its replica (regroup.ts). Resolves with its actor name.
   */
  async replaceServer(
    attempt: number,
    k: number,
    count: number,
    successor: string | undefined,
    fallback: string,
    alive: (node: string) => boolean,
    onDown: (index: number, detail: string) => void,
    stillMatters: () => boolean
  ): Promise<string> {
    const lost = this.#servers[k]
    const node = lost && alive(lost.node) ? lost.node : fallback
    // One taken for dead that still runs (missed heartbeats on a loaded machine) is stopped: its shard is served by the new one.
    if (lost && alive(lost.node)) void lost.kill("replaced by a new parameter server").catch(() => {})
    const spare = this.#spare
    this.#spare = undefined
    let s: SpawnedActor
    if (spare && alive(spare.actor.node) && !spare.gone) {
      s = spare.actor
      this.#startSpare(attempt, count, node, stillMatters)
    } else {
      s = await this.#spawnServer(`ps${attempt}-${k}-${++this.#replacements}`, k, count, successor, node, true)
    }
    this.#watchServer(k, s, onDown, stillMatters)
    return s.name
  }

  /** Whether parameter server k is down, or goes down within `ms` (by the watch started with it). */
  async serverDown(k: number, ms: number): Promise<boolean> {
    const down = this.#serverDowns[k]
    return down === undefined || (await withDeadline(down, ms)) !== TIMED_OUT
  }

  /**
   * A spare server, started in the background (its start is what a lost server's replacement would
   * otherwise wait for); it reserves no CPU while it idles. Where it cannot start, none: a
   * replacement is then started when needed.
   */
  #startSpare(attempt: number, count: number, node: string, stillMatters: () => boolean): void {
    const name = `ps${attempt}-spare${++this.#replacements}`
    const mine = (): boolean => stillMatters() && this.#servers[0]?.name.startsWith(`ps${attempt}-`) === true
    void this.#spawnServer(name, -1, count, undefined, node).then(
      (actor) => {
        const spare = { actor, gone: false }
        void actor.down({ deadAfterMs: WORKER_DEAD_AFTER_MS }).then(() => {
          spare.gone = true
          // A spare that dies idle is started again (a spare that cannot start is not retried).
          if (this.#spare === spare && mine()) {
            this.#spare = undefined
            this.#startSpare(attempt, count, node, stillMatters)
          }
        })
        // (A newer generation's servers, or a spare already there, win: this one is stopped.)
        if (mine() && !this.#spare) this.#spare = spare
        else void actor.kill("not needed").catch(() => {})
      },
      () => {}
    )
  }

  async #spawnServer(name: string, k: number, count: number, successor: string | undefined, node: string, joining = false): Promise<SpawnedActor> {
    const s = await this.#paced(node, () => spawnActor(this.#system, {
      node,
      name,
      module: SERVER_MODULE,
      export: "parameterServer",
      args: { index: k, numServers: count, ...(successor !== undefined ? { successor } : {}), ...(joining ? { joining } : {}) },
      // (A spare idles until it takes a lost server's place, whose reservation its death freed: it reserves nothing.)
      resources: { CPU: k < 0 ? 0 : SERVER_CPUS },
      logPrefix: k < 0 ? "spare server" : `server ${k}`,
      readyTimeoutMs: 60_000
    }))
    this.#workers.push(s)
    return s
  }

  /** Server `s` serves shard k from now on: its going down is reported (while it still serves it). */
  #watchServer(k: number, s: SpawnedActor, onDown: (index: number, detail: string) => void, stillMatters: () => boolean): void {
    this.#servers[k] = s
    const watched = s.down({ deadAfterMs: WORKER_DEAD_AFTER_MS })
    this.#serverDowns[k] = watched
    void watched.then((down) => {
      if (stillMatters() && this.#servers[k] === s) onDown(k, `parameter server ${k} (pid ${s.pid} on node ${s.node}) went down: ${down.detail}`)
    })
  }

  /** A fresh generation: forgets the old members (the caller killed them). */
  reset(): void {
    this.#members = new Map()
  }

  /** Survivors under their ranks in a regrouped generation (the caller watches them anew). */
  adopt(members: ReadonlyMap<number, SpawnedActor>): void {
    this.#members = new Map(members)
  }

  /** Reports each member's death to `watch` (by its rank in the current generation). */
  watch(members: ReadonlyMap<number, SpawnedActor>, watch: Watch): void {
    for (const [rank, w] of members) {
      void w.down(this.#liveness(w, rank)).then((down) => {
        if (!watch.stillMatters(rank)) return
        const report = (): void => {
          if (watch.stillMatters(rank)) watch.onDown(rank, { reason: down.reason, detail: `worker process (pid ${w.pid} on node ${w.node}) went down: ${down.detail}` })
        }
        const grace = graceFor(down)
        if (grace === 0) report()
        else setTimeout(report, grace)
      })
    }
  }

  /** Kills one worker (one the regroup left out: alive, but not regroupable). */
  async killOne(w: SpawnedActor, reason: string): Promise<void> {
    await w.kill(reason).catch(() => false)
    this.#workers = this.#workers.filter((x) => x !== w)
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
    this.#members = new Map()
    const deadline = Date.now() + (options.timeoutMs ?? KILL_TIMEOUT_MS)
    await Promise.all(
      [...nodes].map(async (node) => {
        // A node the cluster sees dead (a cut link stalls rather than refuses) gets one short try.
        const gone = options.alive?.(node) === false
        for (;;) {
          const left = gone ? 1_000 : deadline - Date.now()
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
