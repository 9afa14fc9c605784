// Recovery from surviving peers (after a lost worker or node, or a NATS outage) and growth in place:
// the survivors park at their next group operation, the furthest one's state is handed to the
// others, replacements are placed where there is room and replay the loop from the checkpoint to
// join them. The controller decides whether this is tried (controller.ts: recoveryFor); FitRun
// (fit-run.ts) carries it out through here, and restarts from the checkpoint when it returns none.
import * as R from "effect/Result"
import { PLACEMENT_TIMEOUT_MS, WORKER_DEAD_AFTER_MS } from "../../../core/defaults.ts"
import type { PlacementPlan, PlacementRequest } from "../../../scheduler/placement.ts"
import type { ActorSystem } from "../../runtime/system.ts"
import { ServerProtocol, WorkerProtocol, measurementsServe, type CheckpointPayload, type PeerState, type Position } from "../common/train-protocol.ts"
import { SERVER_DOWN, type Controller, type Generation, type GroupFailure } from "./controller.ts"
import { planLargest } from "./elastic.ts"
import { joinersRequest, layoutOf, type GroupArgs, type RankSpawn, type Standby, type WorkerGroup } from "./worker-group.ts"
import type { ClusterHandle } from "./cluster.ts"
import type { Resolved } from "./options.ts"
import type { Incident } from "../common/observe/report-html.ts"
import type { ProgressPrinter } from "../common/observe/progress.ts"
import { firstLine } from "../../../core/errors.ts"
import { mergePeerShards } from "../common/optim/zero.ts"
import { isStageShard, mergeStageHandovers, pickStageFiles } from "../common/stage-handover.ts"

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

/** How long each parameter server gets to take a regrouped generation (it answers at once: every worker is parked). */
const SERVER_REGROUP_TIMEOUT_MS = 5_000

/** How long a server that did not take the regrouped generation gets to be seen down (its agent's exit notice) before the regroup gives up on it. */
const SERVER_DOWN_WAIT_MS = 2_000

/** Rounds of servers made again while one regroup asks them (each round a server that died meanwhile). */
const MAX_SERVER_ROUNDS = 2

/** How long the survivors of a failure get to stop at a group operation and say where they are. */
const PAUSE_TIMEOUT_MS = 20_000

/**
 * Asks of a regroup are sent again every this many ms until their deadline: right after the bus
 * came back a worker may not have renewed its subscriptions yet, and a request sent then is lost
 * without a "no responders" answer. The workers answer a repeated pause or resume once.
 */
const REGROUP_RETRY_MS = 1_000

/**
 * A grow's pause waits for a hand-written loop's next report() call (GroupSession.reportBoundary),
 * at most this long for the first rank to park; the others then get PAUSE_TIMEOUT_MS more.
 */
const GROW_PAUSE_TIMEOUT_MS = 30 * 60_000

/** `ask` again until it is answered or the time `deadline()` gives has passed: its answer, or undefined. */
const askAgain = async <A>(ask: () => Promise<A>, deadline: () => number): Promise<A | undefined> => {
  for (;;) {
    try {
      return await ask()
    } catch {
      if (Date.now() >= deadline()) return undefined
      await sleep(100)
    }
  }
}

/**
 * The checkpoint of a lineage (path -> report() calls made before it) that a rank joining
 * survivors who made `reports` report() calls resumes from: the latest made at or before that
 * report (a newer one is past the survivors' position), with its count; undefined when there is none.
 */
export const latestAtOrBefore = (lineage: ReadonlyMap<string, number>, reports: number): { path: string; reports: number } | undefined => {
  let best: { path: string; reports: number } | undefined
  for (const [path, n] of lineage) if (n <= reports && (best === undefined || n >= best.reports)) best = { path, reports: n }
  return best
}

/** What a regroup (recovery from peers, growth in place) works with. */
export interface RegroupContext {
  readonly cfg: Resolved
  readonly cluster: ClusterHandle
  readonly system: ActorSystem
  readonly group: WorkerGroup
  readonly controller: Controller<CheckpointPayload>
  readonly request: Omit<PlacementRequest, "numWorkers">
  /** The failure that ended the last generation; none for a resize. */
  readonly failure?: GroupFailure
  /** The size to grow back to: the controller's decision (numWorkers; elastic: max, or the resize's size). */
  readonly target: number
  readonly what: string
  readonly budget: string
  readonly counted: boolean
  readonly saving: () => Promise<unknown>
  readonly incident: (kind: Incident["kind"], text: string, event: Record<string, unknown>) => void
  readonly progress: ProgressPrinter
  readonly groupArgs: GroupArgs
  readonly peerStates: Map<number, PeerState>
  readonly onSize: (attempt: number, size: number) => void
  readonly latest: () => string | undefined
  readonly setResume: (path: string | undefined) => void
  /** Why the survivors could not be regrouped (the restart from the checkpoint says it). */
  readonly fellBack: (why: string) => void
  /**
   * Workers started ahead and prepared (refill.ts: a short group's replacements, spares): how many
   * are ready, and taking up to `n` of them; they join this regroup first, which owns them from then on.
   */
  readonly standbyReady: number
  readonly takeStandby: (n: number) => Standby[]
  /** The regrouped generation formed: it may run below its size while standby workers refill it (at a step, or in a hand-written loop at a report() call). */
  readonly formed: (g: Generation<CheckpointPayload>, joinsAtReport: boolean) => void
  /**
   * A lost parameter server's shard k made again (fit-run.ts): a new server started, initialised
   * from the replica its successor keeps, for `numWorkers` workers of group `group`, and its
   * predecessor replicating to it. The servers' names from then on, in shard order.
   */
  readonly replaceServer: (k: number, numWorkers: number, group: number) => Promise<string[]>
  /** Parameter servers lost and not made again yet (a server lost while an earlier failure was being regrouped too). */
  readonly serversDown: () => ReadonlyArray<number>
  /** Whether parameter server k is down, or goes down within `ms` (a server that failed to answer may be one whose exit notice is on its way). */
  readonly serverDown: (k: number, ms: number) => Promise<boolean>
}

/**
 * Whether new workers can join a grow at the furthest survivor's position `furthest`: not where it
 * is between two dp.fit() calls of a loop that uses dp.fit() (any survivor's `fitLoop`), since a
 * joiner replays dp.fit() and takes its place only at a step inside it. The ranks of an
 * asynchronous strategy are not in lockstep: one can park in its epoch's last step while another,
 * already past it, parks where its evaluation's group operation broke.
 */
export const joinsAt = (furthest: Position, survivors: ReadonlyArray<Position>): boolean => furthest.inFit || !survivors.some((p) => p.fitLoop === true)

/**
 * Where the furthest survivor was, as events.jsonl logs it: a streamed epoch's plan (its intervals)
 * stays out, and so do dp.fit()'s epoch fields outside dp.fit() (a hand-written loop is placed by
 * its report() calls and steps since the last; the fields' zeros read as epoch 0).
 */
const loggedPosition = (pos: Position): Record<string, unknown> => {
  const { stream: _stream, ...rest } = pos
  if (pos.inFit) return rest
  const { epoch: _e, stepInEpoch: _s, stepsPerEpoch: _n, ...outside } = rest
  return outside
}

/**
 * Recovery from surviving peers after a lost worker or node, and growth in place: pauses every
 * other worker at its next group operation, regroups those that park (the survivors) with the
 * standby workers that are ready, and hands the furthest survivor's state to the others. After a
 * failure the survivors do not wait for replacements to start: they go on short-handed (down to
 * the controller's floor) and fit-run.ts refills the group with standby workers once they are
 * prepared. Only below the floor are replacements spawned here and waited for. Returns the new,
 * running generation, or undefined when the survivors cannot be regrouped (then the caller
 * restarts the group from the checkpoint).
 */
export const regroupSurvivors = async (x: RegroupContext): Promise<Generation<CheckpointPayload> | undefined> => {
  const attempt = x.controller.attempt
  const giveUp = (why: string): undefined => {
    x.progress.warn(`gradwire: cannot regroup the survivors (${why}); restarting from the checkpoint instead`)
    x.fellBack(why)
    return undefined
  }
  // Growing: only if the new workers are ready or have room now (nothing is paused for a grow that cannot be).
  if (!x.failure && x.standbyReady === 0) {
    const planned = planLargest(joinersRequest(x.request), { min: 1, max: Math.max(1, x.target - x.group.members.size) }, x.cluster.view.resources())
    if (!R.isSuccess(planned)) return giveUp(`no room for new workers: ${firstLine(planned.failure.message)}`)
  }
  // 1. Every other worker stops at its next group operation; those that park survive. Workers on
  // a node the cluster sees dead are lost with it: not asked (a cut link stalls an ask until its
  // timeout), and killed in the background in case the node comes back.
  const alive = (node: string): boolean => x.cluster.view.get(node)?.state === "alive"
  for (const [rank, w] of x.group.members) {
    if (rank !== x.failure?.rank && !alive(w.node)) void x.group.killOne(w, "its node was lost")
  }
  // A grow: a hand-written loop below its size parks at its next report() call (the new ranks join
  // at that boundary), so the first answer may take up to an epoch; the rest follow at once.
  const grow = x.failure === undefined
  const asked = Date.now()
  let firstAnswer: number | undefined
  const pauseDeadline = (): number => (firstAnswer !== undefined ? firstAnswer + PAUSE_TIMEOUT_MS : asked + (grow ? GROW_PAUSE_TIMEOUT_MS : PAUSE_TIMEOUT_MS))
  const replies = await Promise.all(
    [...x.group.members]
      .filter(([rank, w]) => rank !== x.failure?.rank && alive(w.node))
      .map(async ([rank, w]) => {
        // A member that dies (or is fenced) while asked is no survivor: not waited for.
        let gone: string | undefined
        const down = w.down({ deadAfterMs: WORKER_DEAD_AFTER_MS }).then((d) => {
          gone = `seen down while asked to pause: ${d.reason}, ${d.detail} (${Date.now() - d.at} ms ago, instance ${d.instance} of ${w.instance})`
          return undefined
        })
        const reply = await Promise.race([
          askAgain(
            () => x.system.askPromise(w.ref(WorkerProtocol), "pause", { attempt, ...(grow ? { atReport: true } : {}) }, { timeoutMs: REGROUP_RETRY_MS }),
            () => (gone !== undefined ? 0 : pauseDeadline())
          ),
          down
        ])
        if (reply) firstAnswer ??= Date.now()
        // Why a member is no survivor: its answer's reason, or how it was lost.
        const why = reply === undefined ? (gone ?? "no answer to the pause by its deadline") : reply.state === "parked" ? undefined : reply.reason
        return { rank, w, reply, why }
      })
  )
  const survivors = replies.filter((r) => r.reply?.state === "parked").sort((a, b) => a.rank - b.rank)
  if (survivors.length === 0) {
    const why = replies.map((r) => r.reply?.reason).find((w) => w) ?? "no worker survived"
    return giveUp(why)
  }
  // The members left out (stopped) and why: in the regroup's event, for a group that comes back smaller than expected.
  const leftOut = replies.filter((r) => !survivors.includes(r)).map((r) => ({ rank: r.rank, reason: r.why ?? "not parked" }))
  for (const r of replies) if (!survivors.includes(r)) await x.group.killOne(r.w, `left out of the regrouped generation: ${r.why ?? "not parked"}`)
  // ZeRO stage 1: every survivor's optimizer shard and its replica of its predecessor's make the
  // whole optimizer state again, unless neighbouring ranks were lost together.
  const zeroShards = survivors.some((r) => r.reply!.shards !== undefined) ? mergePeerShards(survivors.map((r) => r.reply!.shards)) : undefined
  if (zeroShards && "reason" in zeroShards) return giveUp(zeroShards.reason)
  // A pipelined model: each stage's shard from its replica furthest on, unless a stage was lost with every rank that held it.
  const stages = survivors.some((r) => r.reply!.stage !== undefined) ? mergeStageHandovers(survivors.map((r) => r.reply!.stage)) : undefined
  if (stages && "reason" in stages) return giveUp(stages.reason)
  // The failed rank may still run (hung, or its loop threw): it is not part of the new group.
  const failed = x.failure ? x.group.members.get(x.failure.rank) : undefined
  if (failed) {
    const killing = x.group.killOne(failed, "it failed")
    if (alive(failed.node)) await killing
  }
  // 2. The survivor that got furthest: the others and the joiners continue from its state.
  const source = survivors.reduce((a, b) => (b.reply!.position.ops > a.reply!.position.ops ? b : a))
  const s = survivors.length
  const pos: Position = source.reply!.position
  // A loader was made by its factory for its rank's place and has no plan to cut again: any
  // regroup goes through the checkpoint (`dataPinned`). dp.fit() plans a file dataset's streamed
  // epoch again for the new group (fit-loop.ts), and between epochs the next one is planned for
  // whatever group reads it. Outside dp.fit(), in the middle of an epoch, a file dataset's
  // survivors finish it on the plan they opened and ranks join only at a report() between epochs
  // (`joinLater`). Strategy auto on the parameter servers, or moving between strategies, has
  // state a regroup does not carry (`strategyPinned`).
  const first = (f: (p: Position) => string | undefined): string | undefined => survivors.map((r) => f(r.reply!.position)).find((w) => w !== undefined)
  const pinned = first((p) => p.dataPinned ?? p.strategyPinned)
  if (pinned) return giveUp(pinned)
  const joinLater = pos.inFit ? undefined : first((p) => p.joinLater)
  if (joinLater && (!x.failure || x.controller.floor > s)) return giveUp(joinLater)
  // The survivors regroup alone now where no joiner can take its place (joinsAt); the ready
  // workers stay on standby for the next grow, which comes at once.
  const notHere = !x.failure && !joinsAt(pos, survivors.map((r) => r.reply!.position))
  // A group that cannot go on short-handed nor renumber its ranks (a pipelined model's grid): the
  // survivors keep their ranks and replacements take the lost ones, the group at its size again.
  const whole = first((p) => p.wholeGroup)
  if (whole !== undefined) {
    if (!x.failure) return giveUp(`${whole}: it does not grow in place`)
    const size = Math.max(...x.group.members.keys()) + 1
    if (size !== x.target) return giveUp(`${whole}: the group's size would change from ${size} to ${x.target}`)
  }
  // 3. Joiners: the standby workers that are ready; new ones spawned now only to reach the floor
  // (an elastic group's min), or for a grow that has none ready. The rest come later (fit-run.ts
  // refills a short group), so the survivors go on at once.
  const ready = joinLater || notHere ? [] : x.takeStandby(Math.max(0, x.target - s))
  // The survivors go on short-handed. dp.fit() keeps the global batch and its epochs' steps
  // whatever the group's size, so a joiner replays them as the survivors ran them and joins at a
  // step. A hand-written loop sizes its epochs by ctx.worldSize: each survivor finishes the epoch
  // on the rows it had (the lost rank's rest of it goes untrained), the next ones are cut for the
  // smaller group, and replacements join at a report() boundary (GroupSession.reportBoundary).
  const kMax = x.target - s - ready.length
  const kMin = whole !== undefined ? kMax : Math.max(0, x.controller.floor - s - ready.length)
  let joinPlan: PlacementPlan | undefined
  if (!joinLater && !notHere && kMax > 0 && (kMin > 0 || (!x.failure && ready.length === 0))) {
    // New workers replay the loop from the checkpoint and join where the survivors are: in
    // dp.fit() at their epoch and step, in a hand-written loop after as many report() calls and
    // steps since (group-session.ts).
    const deadline = Date.now() + (kMin > 0 ? (x.cfg.scaling.placementTimeoutMs ?? PLACEMENT_TIMEOUT_MS) : 1_000)
    for (;;) {
      const planned = planLargest(joinersRequest(x.request), { min: Math.max(1, kMin), max: kMax }, x.cluster.view.resources())
      if (R.isSuccess(planned)) {
        joinPlan = planned.success
        break
      }
      if (Date.now() >= deadline) {
        if (kMin > 0 || !x.failure) return giveUp(`no room for new workers: ${firstLine(planned.failure.message)}`)
        break
      }
      await x.cluster.view.nextChange(500)
    }
  }
  const joiners = ready.length + (joinPlan?.ranks.length ?? 0)
  const worldSize = s + joiners
  // New ranks: survivors in their order, then the joiners; or (a whole group) the survivors' own
  // ranks, the joiners taking the lost ones.
  const holes = whole !== undefined ? Array.from({ length: worldSize }, (_, r) => r).filter((r) => !survivors.some((v) => v.rank === r)) : []
  const survivorRank = (i: number): number => (whole !== undefined ? survivors[i]!.rank : i)
  const joinerRank = (j: number): number => (whole !== undefined ? holes[j]! : s + j)
  const nodes = new Array<string>(worldSize)
  survivors.forEach((r, i) => (nodes[survivorRank(i)] = r.w.node))
  ;[...ready.map((w) => w.nodeId), ...(joinPlan?.ranks.map((r) => r.nodeId) ?? [])].forEach((n, j) => (nodes[joinerRank(j)] = n))
  const layout = layoutOf(nodes)
  // What the furthest survivor's group measured of its links, when it covers every node of the new
  // group or most of them (measurementsServe): every member reuses it instead of measuring again
  // (worker-run.ts build).
  const measured = source.reply!.measured
  const reuse = measurementsServe(measured, nodes) ? { measured } : {}
  // Survivors keep their order under new ranks; a streamed epoch's plan is cut again from their old ones.
  const survivorRanks = survivors.map((r) => r.rank)
  // (A loop in dp.fit() grows at a step: only a hand-written loop's generation needs the mark.)
  const belowSize = worldSize < x.target && !pos.inFit
  const placementOf = (rank: number) => ({
    attempt,
    rank,
    worldSize,
    ...layout[rank]!,
    nodes,
    group: `g${attempt}`,
    ...reuse,
    survivorRanks,
    ...(belowSize ? { belowSize } : {}),
    // The parameter servers' names now: a lost one's replacement (this regroup's or an earlier
    // one's) for every member, a standby started before it was made included.
    ...(servers.length > 0 ? { servers } : {})
  })
  // 4. The furthest survivor's state, which every member loads. A pipelined model's stages: each
  // from the snapshot of its replica furthest on (the source's among them), one copy of each.
  const snapshotOf = (r: (typeof survivors)[number]) => x.system.askPromise(r.w.ref(WorkerProtocol), "snapshot", null, { timeoutMs: 60_000 }).catch(() => undefined)
  const holders = stages ? [...new Set(Object.values(stages.from))].filter((i) => survivors[i] !== source) : []
  const [snapshot, ...held] = await Promise.all([snapshotOf(source), ...holders.map((i) => snapshotOf(survivors[i]!))])
  if (!snapshot) return giveUp(`rank ${source.rank} could not hand over its state`)
  const lacking = holders.findIndex((_, k) => held[k] === undefined)
  if (lacking >= 0) return giveUp(`rank ${survivors[holders[lacking]!]!.rank} could not hand over its stage`)
  // survivor index -> its snapshot's files (the source's and every holder's)
  const snapshots = new Map(holders.map((i, k) => [i, held[k]!.files]))
  let stageFiles: Record<string, Uint8Array> | undefined
  if (stages) {
    const picked = pickStageFiles(stages, (i) => snapshots.get(i) ?? snapshot.files)
    if ("missing" in picked) return giveUp(`rank ${survivors[picked.survivor]!.rank}'s state lacks ${picked.missing}, which it said it held`)
    stageFiles = picked.files
  }
  const merged = zeroShards?.files ?? stageFiles
  const state = merged ? { ...snapshot, files: { ...snapshot.files, ...merged } } : snapshot
  // A lost parameter server: a new one, made from the replica the next server keeps of its shard
  // (every worker is parked; the push each had in flight goes again to the new group's servers).
  // Servers lost while an earlier failure was regrouped are made again here too.
  const lostServers = [...new Set([...(x.failure?.tag === SERVER_DOWN && x.failure.server !== undefined ? [x.failure.server] : []), ...x.serversDown()])]
  let servers = x.groupArgs.servers ?? []
  const replace = async (k: number): Promise<string | undefined> => {
    const replaced = await x.replaceServer(k, worldSize, attempt).catch((e: unknown) => firstLine(e instanceof Error ? e.message : String(e)))
    if (typeof replaced === "string") return `parameter server ${k} could not be made again from its replica: ${replaced}`
    servers = replaced
    return undefined
  }
  for (const k of lostServers) {
    const why = await replace(k)
    if (why !== undefined) return giveUp(why)
  }
  // Parameter servers keep the parameters and optimizer state: they serve the new group from
  // here on (its size; the survivors renumbered; pushes of the old group dropped). Every worker
  // is parked, so no push of the new group can come first. The workers push their step in flight
  // again (sync): a server that applied it already drops it (it keeps the last step applied). A
  // server that does not take it because it died meanwhile is made again, and all are asked again.
  for (let round = 0; servers.length > 0; round++) {
    const asked = await Promise.allSettled(
      servers.map((name) => x.system.askPromise(x.system.ref(ServerProtocol, name), "regroup", { numWorkers: worldSize, group: attempt }, { timeoutMs: SERVER_REGROUP_TIMEOUT_MS }))
    )
    const failed = asked.flatMap((a, k) => (a.status === "rejected" ? [{ k, why: firstLine(a.reason instanceof Error ? a.reason.message : String(a.reason)) }] : []))
    if (failed.length === 0) break
    const dead = await Promise.all(failed.map((f) => x.serverDown(f.k, SERVER_DOWN_WAIT_MS)))
    const alive = failed.find((_, i) => !dead[i])
    if (alive || round >= MAX_SERVER_ROUNDS) return giveUp(`a parameter server did not take the new group: ${(alive ?? failed[0]!).why}`)
    for (const f of failed) {
      const why = await replace(f.k)
      if (why !== undefined) return giveUp(why)
      lostServers.push(f.k)
    }
  }
  const lostServer = lostServers[0]
  x.peerStates.set(attempt, state)
  // 5. The regrouped generation: survivors keep their processes under new ranks, joiners start.
  // Rounds only the lost ranks had yet to report complete as it forms, and may leave a checkpoint.
  // A survivor one step behind the furthest makes its last reports only once regrouped: a joiner's
  // checkpoint request waits for those, and is given the latest checkpoint of the lineage at or
  // before the survivors' position with its report count, from which the joiner counts (fit-run.ts
  // #joinCheckpoint, latestAtOrBefore).
  const generation = x.controller.regroup({ worldSize, survivors: survivors.map((r, i) => ({ from: r.rank, to: survivorRank(i) })), survivorsOnlyBelow: pos.reports })
  await x.saving()
  const from = x.latest()
  x.setResume(from)
  x.onSize(attempt, worldSize)
  x.formed(generation, !pos.inFit)
  x.progress.start(attempt, worldSize)
  const where = pos.inFit
    ? `epoch ${pos.epoch} step ${Math.min(pos.stepInEpoch, pos.stepsPerEpoch)}/${pos.stepsPerEpoch}`
    : `${pos.reports} report() calls and ${pos.stepsSinceReport} steps since the last`
  x.incident(
    x.failure ? "restart" : "resize",
    (x.failure
      ? `${x.what}; ${lostServers.map((k) => `parameter server ${k} made again from its replica on server ${(k + 1) % servers.length}; `).join("")}regrouping ${s} surviving worker(s)${joiners ? ` with ${joiners} new one(s)` : ""} at the furthest survivor's position (${where}): at most the step in flight is lost` +
        `${worldSize < x.target ? `; they go on short-handed while ${x.target - worldSize} replacement(s) start${pos.inFit ? "" : " (joining at a report() call; the lost rank's rows of this epoch go untrained)"}` : ""}` +
        `${x.budget}`
      : notHere
        ? `${x.what}: the ${s} running workers regroup alone (they are between two dp.fit() calls, where a new worker cannot take its place); the ready ones join at the next grow`
        : `${x.what}: ${joiners} new worker(s) join the ${s} running ones at ${where}`) +
      leftOut.map((l) => `; rank ${l.rank} left out (${l.reason})`).join(""),
    {
      type: x.failure ? "restart" : "grow",
      attempt,
      kind: x.failure?.kind ?? "resize",
      counted: x.counted,
      recovery: "peers",
      survivors: s,
      joiners,
      ...(leftOut.length > 0 ? { leftOut } : {}),
      source: source.rank,
      // the state held for the members (a pipelined model's each load their stage's files of it), and where each stage's shard came from
      stateBytes: Object.values(state.files).reduce((n, f) => n + f.byteLength, 0),
      ...(stages ? { stagesFrom: Object.fromEntries(Object.entries(stages.from).filter(([f]) => isStageShard(f)).map(([f, i]) => [f, survivors[i]!.rank])) } : {}),
      ...(lostServer !== undefined ? { server: lostServer, replacement: servers[lostServer] } : {}),
      ...(lostServers.length > 1 ? { servers: lostServers } : {}),
      position: loggedPosition(pos),
    }
  )
  const watch = {
    onDown: (rank: number, down: { readonly reason: string; readonly detail: string }) => x.controller.workerDown(attempt, rank, down),
    stillMatters: (rank: number) => !generation.settled && !generation.finished.has(rank)
  }
  const members = new Map(survivors.map((r, i) => [survivorRank(i), r.w] as const))
  x.group.adopt(members)
  x.group.watch(members, watch)
  const resumed = Promise.all(
    survivors.map(async (r, i) => {
      const until = Date.now() + 15_000
      const ok = await askAgain(() => x.system.askPromise(r.w.ref(WorkerProtocol), "resume", { placement: placementOf(survivorRank(i)), source: pos }, { timeoutMs: REGROUP_RETRY_MS }), () => until)
      if (ok === undefined) throw new Error(`rank ${r.rank} did not answer`)
    })
  ).catch((e: unknown) => {
    x.controller.fail(generation, { kind: "recovery", rank: -1, tag: "RegroupError", message: `a survivor did not take its new place: ${String(e)}` })
  })
  if (ready.length > 0) {
    const admitted = ready.map((standby, j) => ({ standby, placement: placementOf(joinerRank(j)), join: { to: pos } }))
    const failed = await x.group.admit(admitted, watch)
    if (failed) x.controller.fail(generation, { kind: "recovery", rank: -1, ...failed })
  }
  if (joinPlan) {
    const spawns: RankSpawn[] = joinPlan.ranks.map((r, j) => ({
      placement: placementOf(joinerRank(ready.length + j)),
      nodeId: r.nodeId,
      backend: r.backend,
      gpuIndices: r.gpuIndices,
      cudaVisibleDevices: r.cudaVisibleDevices,
      resources: r.resources,
      join: { to: pos }
    }))
    const failed = await x.group.spawn(spawns, servers.length > 0 ? { ...x.groupArgs, servers } : x.groupArgs, watch)
    if (failed) x.controller.fail(generation, { kind: "recovery", rank: -1, ...failed })
  }
  await resumed
  return generation
}
