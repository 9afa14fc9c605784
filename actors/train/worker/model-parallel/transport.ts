// The model-parallel links over NATS: every link and group is a communicator of its own
// (collectives/communicator.ts) over the ranks it joins, on this worker's collective connections.
// A one-way channel between neighbouring stages is a group of two, sender first, whose messages
// are broadcasts from the sender: each has its own sequence number, so the activations of a link
// and, on a second group, its gradients each arrive in order, while both directions are in flight
// at once (1F1B interleaves them differently on the two sides). What the collectives give every
// call comes with it: chunking to the server's max_payload, credit-based flow control (a stage
// that runs ahead cannot flood its neighbour), a deadline on every wait with a liveness probe that
// names a dead or hung peer, and an abort that fails the peer at once when this side fails.
import type { Communicator } from "../../../../collectives/communicator.ts"
import * as Schema from "effect/Schema"
import { rankAt, replicaGroup, tensorGroup, type GridPlace } from "./grid.ts"
import { soloGroup, type Channel, type StageLinks, type SumGroup } from "./links.ts"

/** Makes a communicator over `members` (world ranks, this one among them), named `name` within the job's generation. */
export type SubgroupFactory = (name: string, members: ReadonlyArray<number>) => Promise<Communicator>

const tagOf = (e: unknown): string => (typeof e === "object" && e !== null && "_tag" in e ? String((e as { _tag: unknown })._tag) : e instanceof Error ? e.name : "Error")
const messageOf = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/** A message between pipeline stages, or a reduction of a model-parallel group, failed. */
export class ModelParallelLinkError extends Schema.TaggedError<ModelParallelLinkError>()("ModelParallelLinkError", {
  /** This rank. */
  rank: Schema.Number,
  /** What it was doing: "receiving gradients from stage 1 (rank 2)", "all-reducing stage 0's gradients over its replicas"... */
  doing: Schema.String,
  /** The world ranks of the group it was doing it in. */
  peers: Schema.Array(Schema.Number),
  /** The world ranks most likely at fault (dead, hung or stalled), if known. */
  failedRanks: Schema.Array(Schema.Number),
  causeTag: Schema.String,
  /** What happened, with world ranks. */
  reason: Schema.String
}) {
  override get message(): string {
    return (
      `rank ${this.rank} failed ${this.doing}: ${this.reason} (${this.causeTag}). A dead or hung stage stops its whole pipeline; ` +
      "within failureConfig.maxFailures the trainer regroups the survivors (a lost stage made again from another replica) or restarts the group from the latest checkpoint"
    )
  }
}

interface TimeoutLike {
  readonly timeoutMs: number
  readonly waitingFor: ReadonlyArray<number>
  readonly unresponsive: ReadonlyArray<number>
  readonly behind?: ReadonlyArray<number>
}

/** The collectives' error in world ranks (a sub-group numbers its members 0..n-1). */
const explain = (e: unknown, members: ReadonlyArray<number>): { reason: string; failed: number[] } => {
  const world = (rs: ReadonlyArray<number> | undefined): number[] => (rs ?? []).map((r) => members[r] ?? r)
  const tag = tagOf(e)
  if (tag === "CollectiveTimeout") {
    const t = e as TimeoutLike
    const dead = world(t.unresponsive)
    const behind = world(t.behind)
    const waited = world(t.waitingFor)
    const who =
      dead.length > 0
        ? `rank(s) ${dead.join(", ")} did not answer a liveness probe: dead, stopped or hung`
        : behind.length > 0
          ? `rank(s) ${behind.join(", ")} answered a liveness probe but had not started this transfer: stalled in a slow or stuck step (raise collectiveConfig.timeoutMs if stages legitimately take longer)`
          : `rank(s) ${waited.join(", ")} are alive but sent nothing`
    return { reason: `nothing arrived for ${t.timeoutMs} ms; ${who}`, failed: dead.length > 0 ? dead : behind.length > 0 ? behind : waited }
  }
  if (tag === "CollectiveAborted") {
    const a = e as { by: number; failedRanks: ReadonlyArray<number>; causeTag: string; reason: string }
    return { reason: `rank ${members[a.by] ?? a.by} gave up first (${a.causeTag}: ${a.reason.split("\n")[0]})`, failed: world(a.failedRanks) }
  }
  return { reason: messageOf(e), failed: [] }
}

const wrap = async (rank: number, doing: string, members: ReadonlyArray<number>, run: () => Promise<unknown>): Promise<void> => {
  try {
    await run()
  } catch (e) {
    const { reason, failed } = explain(e, members)
    throw new ModelParallelLinkError({ rank, doing, peers: [...members], failedRanks: failed, causeTag: tagOf(e), reason })
  }
}

const group = (comm: Communicator, members: ReadonlyArray<number>, rank: number, what: string): SumGroup => ({
  size: members.length,
  index: members.indexOf(rank),
  sum: (buf) => wrap(rank, `summing ${what}`, members, () => comm.allReduce(buf, { op: "sum" })),
  weightedMean: (buf, weight) => wrap(rank, `all-reducing ${what}`, members, () => comm.allReduce(buf, { op: "weightedMean", weight })),
  broadcast: (buf, root) => wrap(rank, `broadcasting ${what} from world rank ${members[root]}`, members, () => comm.broadcast(buf, root))
})

/** A group over the world communicator (epoch metrics, profiling). */
export const worldGroup = (comm: Communicator): SumGroup => group(comm, Array.from({ length: comm.worldSize }, (_, r) => r), comm.rank, "over every rank")

const channel = (comm: Communicator, members: ReadonlyArray<number>, rank: number, doing: string): Channel => ({
  send: (buf) => wrap(rank, `sending ${doing}`, members, () => comm.broadcast(buf, 0)),
  recv: (into) => wrap(rank, `receiving ${doing}`, members, () => comm.broadcast(into, 0))
})

/**
 * This rank's links in the grid: channels to its neighbour stages (one group per direction) and
 * its replica and tensor groups, created at once (each creation waits for its members: in any
 * order one at a time, two ranks could wait on each other).
 */
export const natsLinks = async (place: GridPlace, world: Communicator, subgroup: SubgroupFactory): Promise<StageLinks> => {
  const me = place.rank
  const make = (name: string, members: ReadonlyArray<number>): Promise<Communicator> => subgroup(name, members)
  const tag = (replica: number, stage: number) => `${replica}-${stage}-${place.tpRank}`
  const prev = place.stage > 0 ? rankAt(place, place.replica, place.stage - 1, place.tpRank) : -1
  const next = place.stage < place.stages - 1 ? rankAt(place, place.replica, place.stage + 1, place.tpRank) : -1
  const replicas = replicaGroup(place)
  const tensor = tensorGroup(place)
  const settled = await Promise.allSettled([
      prev >= 0 ? make(`ppf-${tag(place.replica, place.stage)}`, [prev, me]) : undefined,
      prev >= 0 ? make(`ppb-${tag(place.replica, place.stage)}`, [me, prev]) : undefined,
      next >= 0 ? make(`ppf-${tag(place.replica, place.stage + 1)}`, [me, next]) : undefined,
      next >= 0 ? make(`ppb-${tag(place.replica, place.stage + 1)}`, [next, me]) : undefined,
      replicas.length > 1 ? make(`ppdp-${place.stage}-${place.tpRank}`, replicas) : undefined,
      tensor.length > 1 ? make(`pptp-${place.replica}-${place.stage}`, tensor) : undefined
  ])
  const made = settled.flatMap((r) => (r.status === "fulfilled" && r.value ? [r.value] : []))
  const failed = settled.find((r) => r.status === "rejected")
  if (failed) {
    // a failed creation must not leave the others' subscriptions behind
    await Promise.allSettled(made.map((c) => c.close()))
    throw (failed as PromiseRejectedResult).reason
  }
  const [fIn, bOut, fOut, bIn, rep, ten] = settled.map((r) => (r as PromiseFulfilledResult<Communicator | undefined>).value)
  const s = place.stage
  return {
    ...(fIn ? { fromPrev: channel(fIn, [prev, me], me, `activations from stage ${s - 1} (rank ${prev})`) } : {}),
    ...(bOut ? { toPrev: channel(bOut, [me, prev], me, `gradients to stage ${s - 1} (rank ${prev})`) } : {}),
    ...(fOut ? { toNext: channel(fOut, [me, next], me, `activations to stage ${s + 1} (rank ${next})`) } : {}),
    ...(bIn ? { fromNext: channel(bIn, [next, me], me, `gradients from stage ${s + 1} (rank ${next})`) } : {}),
    replicas: rep ? group(rep, replicas, me, `stage ${s}'s gradients over its replicas`) : soloGroup,
    tensor: ten ? group(ten, tensor, me, `stage ${s}'s tensor-parallel partial sums`) : soloGroup,
    world: worldGroup(world),
    close: async () => {
      await Promise.all(made.map((c) => c.close().catch(() => {})))
    }
  }
}
