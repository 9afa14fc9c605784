// The communicator: a group of ranks (world size p, this rank, and for every rank its node and
// NATS server) and the collectives they run together over NATS.
//
// Transport. Every rank subscribes once, in create(), to the subjects that can carry traffic for
// it: data addressed to it (coll.<group>.*.*.<rank>), its node's and its server's fan-out subjects,
// the group's fan-out subject (coll.<group>.*.*.all), and the control subjects (acks, hello,
// probes, abort: coll.<group>.ctl.*.*.<rank> and .all). The control subscriptions sit on a second
// connection when one is given (`controlNc`), so an ack never waits behind megabytes of this
// rank's own outgoing data. One callback demultiplexes everything by the binary frame header into
// the running operations (frames.ts). Each call takes the next sequence number, which every
// subject and frame carries, so successive and concurrent collectives never mix; frames for a
// call this rank has not started yet are held, within a bound.
//
// Start-up. Core NATS drops messages nobody is subscribed to, so create() is a handshake: ranks
// subscribe, then repeat a hello on the group subject until they have heard from every peer
// (proof that the peer is subscribed, also across routed servers) and every peer reported having
// heard from everyone. Only then does any collective publish.
//
// Failure. Every wait has a deadline (timeoutMs without any frame for the operation; with
// `deadlines`, derived from the measured step times once there are enough, deadlines.ts). When it
// passes, the rank probes its peers (ping/pong on the control subject) to name the dead or hung
// ones, fails with CollectiveTimeout, and publishes an abort so every other rank fails at once
// with CollectiveAborted naming the same ranks. Any other local failure (mismatched lengths,
// wrong arguments, close() mid-call, a NATS disconnect) aborts the group the same way. An
// aborted communicator rejects further calls: create a new one (new group name).
import os from "node:os"
import type { Msg, MsgHdrs, NatsConnection, Subscription } from "@nats-io/nats-core"
import {
  BUSY_PEER_WAIT_MS,
  COLLECTIVE_CHUNK_BYTES as DEFAULT_CHUNK_BYTES,
  COLLECTIVE_CREATE_TIMEOUT_MS as DEFAULT_CREATE_TIMEOUT_MS,
  COLLECTIVE_DIRECT_CHUNK_BYTES as DEFAULT_DIRECT_CHUNK_BYTES,
  COLLECTIVE_EARLY_LIMIT_BYTES as DEFAULT_EARLY_LIMIT,
  COLLECTIVE_TIMEOUT_MS as DEFAULT_TIMEOUT_MS,
  COLLECTIVE_WINDOW_BYTES as DEFAULT_WINDOW_BYTES
} from "../core/defaults.ts"
import { installNatsPatches, releaseReceived, takeReceiveBuffer } from "../core/nats-internals/index.ts"
import { nodeGroups } from "../core/collective-cost.ts"
import { HeldClock } from "../core/held-clock.ts"
import { jobSubjects } from "../core/subjects.ts"
import { allGatherBlocks, broadcastChunks, disseminationBarrier, exchangeBlock, shiftBlock } from "./broadcast.ts"
import {
  CollectiveAborted,
  CollectiveArgumentError,
  CollectiveOverflow,
  CollectiveTimeout,
  CommunicatorClosed,
  ConnectionLost,
  GroupMismatch,
  PeerLinkLost,
  blamedRanks
} from "./errors.ts"
import { roundToHalf } from "./float16.ts"
import { DirectEndpoint, type DirectAddress, type TransportChoice } from "./direct.ts"
import { seconds, type Deadline, type MeasuredDeadlines } from "./deadlines.ts"
import { FrameAssembler, HEADER_BLOCK_BYTES, HEADER_BYTES, Kind, Opcode, Variant, controlBody, controlMessage, headerBytesInto, readFrame, splitFrame, variantOf, type Frame } from "./frames.ts"
import { allReduceAlgorithmByCode, allowedAlgorithms, findAllReduceAlgorithm, type AllReduceAlgorithm, type AllReduceCall } from "./algorithms/index.ts"
import type { NodeGroup } from "./algorithms/hierarchical.ts"
import { decodeSourceBits, halfBitsSource, ringReduce, type HalfSource } from "./algorithms/ring.ts"
import { scale, type ReduceOp } from "./kernels.ts"
import { simdSpaceWithSlots } from "./simd.ts"
import { Operation, type OperationHost, type OpSignature } from "./operation.ts"
import type { Reduction } from "./reduction.ts"
import { segmentBounds } from "./segments.ts"

export type { ReduceOp } from "./kernels.ts"
export type { AllReduceAlgorithm } from "./algorithms/index.ts"
export type WireFormat = "f32" | "f16"

export interface CommunicatorOptions {
  /** A connection for this rank. Open it with `noEcho: true` so fan-out publishes are not sent back to their sender. */
  readonly nc: NatsConnection
  /**
   * A second connection, to the same server, for acks and control messages. Strongly recommended:
   * on one connection an ack waits behind the megabytes of data this rank is sending, which roughly
   * halves large-buffer throughput (credits come back a queue later). Default: `nc`.
   */
  readonly controlNc?: NatsConnection
  readonly cluster: string
  readonly job: string
  /** Group name, unique per communicator instance (a restarted group needs a new name). */
  readonly group: string
  readonly rank: number
  readonly worldSize: number
  /** Node id of this rank; ranks with the same id form one node for hierarchical all-reduce. Default: the host name. */
  readonly node?: string
  /** Deadline of every wait: a collective fails when no frame for it arrived for this long. Default 30 s (core/defaults.ts). */
  readonly timeoutMs?: number
  /**
   * Deadlines from measurements (deadlines.ts): the owner notes step times on it, the
   * communicator its calls' times, and a call without its own timeoutMs waits as long as it says
   * (its fixedMs when timeoutMs was set explicitly). Kept across communicators (a regroup keeps
   * the measurements). Absent: every wait has `timeoutMs`.
   */
  readonly deadlines?: MeasuredDeadlines
  /** Deadline of the start-up handshake. Default 60 s. */
  readonly createTimeoutMs?: number
  /**
   * Gives up the start-up handshake once aborted (CommunicatorClosed, with the signal's reason): a
   * group being formed that its owner no longer wants (a member died during the handshake, and the
   * driver regroups again) would otherwise wait for the dead rank until createTimeoutMs.
   */
  readonly signal?: AbortSignal
  /** Largest data payload per message. Default 4 MiB, and never more than the smallest max_payload of the ranks' servers allows (1 MiB on a default nats-server). Larger chunks cost less per byte. */
  readonly chunkBytes?: number
  /**
   * Credits: bytes a rank lets its senders have unacknowledged per call, split over the links that
   * feed it at once (at least one chunk per link). Default 16 MiB, so two calls in flight stay well
   * under nats-server's max_pending (64 MiB), past which it drops a slow receiver.
   */
  readonly windowBytes?: number
  /** Server max_payload; default from the connection. */
  readonly maxPayload?: number
  /** Bound on frames held for collectives this rank has not started yet. Default 512 MiB. */
  readonly earlyLimitBytes?: number
  /**
   * The direct data path (direct.ts): bulk frames peer to peer over TCP or a Unix socket instead
   * of through nats-server. Absent, or transport "nats": everything goes over NATS.
   */
  readonly direct?: DirectOptions
  /**
   * Asked when a wait passed its deadline and peers did not answer the liveness probe, or answered
   * but had not started the call: what the owner knows of them (a worker beating from a thread,
   * actors/runtime/heartbeat.ts, as its driver hears it). A call without an explicit deadline goes
   * on waiting, asking again at each deadline, for silent peers whose event loop one long
   * synchronous computation holds, and for peers behind it that are working (their process uses
   * at least BUSY_CORES of a core: an evaluation on one rank that awaits between its batches), until
   * they join it, stop beating, go idle, or pass their hung limit (held) or busyPeerWaitMs (busy). A silent peer not known so is taken for
   * gone, a peer behind that is idle for hung (waiting on something that never comes), as before.
   * Absent: no peer is waited for past the deadline.
   */
  readonly peerLiveness?: (ranks: ReadonlyArray<number>) => Promise<ReadonlyArray<PeerLiveness>>
  /** How long a call waits for a peer behind it whose process works (ms since the call last moved). Default BUSY_PEER_WAIT_MS, 30 min. */
  readonly busyPeerWaitMs?: number
  /** Told once a call when it first waits on past its deadline for peers peerLiveness says are working (a stall warning, as Horovod's). */
  readonly onWaitOn?: (wait: WaitOn) => void
}

/** A call waiting on past its deadline (CommunicatorOptions.onWaitOn). */
export interface WaitOn {
  readonly op: string
  readonly seq: number
  /** The peers waited for, and what they are doing: their event loop held, or working outside the collectives. */
  readonly ranks: ReadonlyArray<number>
  readonly doing: "held" | "busy"
  readonly waitedMs: number
  /** Still at it after this long (ms since the call last moved for busy peers; held for held ones), they are taken for hung. */
  readonly hungAfterMs: number
}

/** What the owner knows of a peer that did not answer a liveness probe (CommunicatorOptions.peerLiveness). */
export interface PeerLiveness {
  readonly rank: number
  /** How long ago its process last beat (ms). */
  readonly heardAgoMs: number
  /** How long its event loop has gone without a turn, as of that beat and since (ms). */
  readonly heldMs: number
  /** The cores its process used over its latest beats (every thread's CPU time over wall time), if known. */
  readonly cpu?: number
  /** Its event loop held this long, it is taken for hung (ms). */
  readonly hungAfterMs: number
}

/**
 * A peer behind a call whose process uses at least this much of a core is working, not hung
 * (measured: 1.0 evaluating, 0.003 idle in an await). Not a quarter: a busy process on a loaded
 * 2-core machine (two test files with their workers and standbys, seven busy processes) gets about
 * 0.28 of a core, and at 0.25 one was taken for idle and its group aborted in CI.
 */
export const BUSY_CORES = 0.1

/** A peer heard from within this long is alive (beats come every 500 ms). */
const PEER_HEARD_WITHIN_MS = 2_000
/** The most a wait asks the owner about its silent peers before taking them for gone. */
const PEER_LIVENESS_ASK_MS = 2_000

export interface DirectOptions {
  /**
   * "auto" (default): calls of at least `minBytes` go direct where the link is up, smaller ones
   * over NATS (its fan-out and latency serve them well); "direct": every call where the link is up;
   * "nats": none. A peer that cannot be reached or authenticated gets NATS either way.
   */
  readonly transport?: TransportChoice
  /** The job's secret, the same on every rank (at least 16 bytes); peers prove they hold it. */
  readonly secret: Uint8Array
  /** Address to listen on. Default 127.0.0.1 (one machine); on a cluster an address peers reach this host at, or 0.0.0.0 with `advertise`. */
  readonly host?: string
  /** Host name or address peers dial. Default: host (the host name when host is 0.0.0.0). */
  readonly advertise?: string
  /** "auto": calls from this many bytes on go direct. Default 64 KiB (DIRECT_MIN_BYTES). */
  readonly minBytes?: number
  /** TLS 1.2 with the secret as pre-shared key on every link (use it when the bus runs TLS). Default false. */
  readonly tls?: boolean
  /** Ranks of one node connect over a Unix domain socket. Default true. */
  readonly unixSocket?: boolean
  /** Deadline of connecting and authenticating to one peer; past it the peer gets NATS. Default 3 s. */
  readonly connectTimeoutMs?: number
  /**
   * Largest data payload per frame where every rank reads every peer's link (the smallest any rank
   * asks for, at most half of windowBytes, never below the NATS chunk). Default 8 MiB: fewer
   * frames cost less CPU (COLLECTIVE_DIRECT_CHUNK_BYTES). A frame that later has to go through
   * NATS (its link closed) is split into messages that fit max_payload.
   */
  readonly chunkBytes?: number
}

const fmtBytes = (b: number): string => (b >= 1024 * 1024 ? `${b / (1024 * 1024)} MiB` : b >= 1024 ? `${b / 1024} KiB` : `${b} B`)

/**
 * A few lines for explain.txt: the choice, the measured ladder when there is one, and each link's
 * path (fallbacks with why). `pathsTunedBelow`: training's own calls under that size are then timed
 * over both paths and take the faster (AutoGradientReducer, transport "auto" with a direct link
 * between every two ranks), so the start-up rule is said as only the start.
 */
export const describeTransport = (t: TransportInfo, m?: TransportMeasurement, opts: { readonly pathsTunedBelow?: number } = {}): string => {
  const rule =
    t.choice === "nats"
      ? "every call over NATS"
      : t.choice === "direct"
        ? "every call over the direct links"
        : t.minBytes === Number.POSITIVE_INFINITY
          ? "every call over NATS (the direct path measured slower)"
          : t.minBytes === 0
            ? "every call over the direct links (measured faster at every size)"
            : `calls from ${fmtBytes(t.minBytes)} over the direct links, smaller ones over NATS`
  const below = t.choice === "auto" ? opts.pathsTunedBelow : undefined
  const lines = [
    `transport: ${t.choice}${t.tls ? " (TLS-PSK)" : ""} - ${below !== undefined ? `at the start (cold processes), ${rule}; then training's own calls below ${fmtBytes(below)} are timed over both paths and take the faster (the pick names the path: "ring/direct")` : rule}`
  ]
  if (m && m.rows.length > 0) {
    lines.push(`  measured (median all-reduce ms, NATS vs direct): ${m.rows.map((r) => `${fmtBytes(r.bytes)} ${r.natsMs.toFixed(2)} vs ${r.directMs.toFixed(2)}`).join(", ")}`)
  }
  if (t.choice !== "nats") {
    const links = t.links.map((l) => `rank ${l.rank} ${l.via}${l.why ? ` (${l.why})` : ""}`)
    lines.push(`  this rank sends to: ${links.join("; ")}`)
  }
  return lines.join("\n")
}

/**
 * Transport "auto"'s start-up rule for one size of the ladder: the direct links hold it unless they
 * measured more than DIRECT_TIE slower than NATS. A tie goes to them (they spare the broker): on a
 * loaded 2-core machine a 2% difference at 1 MiB (20.52 against 20.05 ms, with the direct links 2x
 * faster at 4 and 64 KiB) had put every call on NATS.
 */
export const DIRECT_TIE = 1.1
export const directHolds = (row: { natsMs: number; directMs: number }): boolean => row.directMs <= row.natsMs * DIRECT_TIE

/** measureTransport's exchanges inside a node (its ranks' own links): this many times the reps of the pairs across nodes. */
export const OWN_NODE_REPS = 3
/** ... and at this many times the largest of the pair sizes as well (2 MiB by default). */
export const OWN_NODE_SIZE = 8

/** "auto" sends calls of at least this many bytes direct. */
export const DIRECT_MIN_BYTES = 64 * 1024

/** measureTransport's figures: per size the median all-reduce ms over each path, and the threshold chosen. */
export interface TransportMeasurement {
  readonly minBytes: number
  /** Transport "auto": per size of the ladder, the median over each path. */
  readonly rows: ReadonlyArray<{ readonly bytes: number; readonly natsMs: number; readonly directMs: number }>
  /** Every timed call over the direct links (this rank's times), for the cost model's fit. */
  readonly direct: ReadonlyArray<{ readonly bytes: number; readonly ms: number }>
  /** The algorithm timed. */
  readonly algorithm: string
  /**
   * A group on several nodes: exchanges between one pair of ranks per pair of nodes, timed over
   * the direct links (pairProbeRounds), for the cost model's fit of each pair of nodes' links
   * (scheduler/cost-model.ts fitDirectPairs). Absent on one node, where every link is alike.
   */
  readonly pairs?: ReadonlyArray<PairTiming>
}

/** One timed exchange over the direct links: ranks `a` and `b` sent each other `bytes` at once, in `ms` (the faster of their two times). */
export interface PairTiming {
  readonly a: number
  readonly b: number
  readonly bytes: number
  readonly ms: number
}

/**
 * Rounds of rank pairs that time every pair of nodes a group's ranks sit on (`nodes[rank]`) once:
 * a node's first two ranks for its own links (where it has two), and each two nodes' first ranks
 * for the link between them. Within a round no node takes part twice, so no two timed flows share
 * a node's network link: first every node's own pair, then the pairs of nodes by the circle
 * method (n - 1 rounds for n nodes, n/2 pairs each). Empty when every rank is on one node.
 */
export const pairProbeRounds = (nodes: ReadonlyArray<string>): Array<Array<readonly [number, number]>> => {
  const groups = nodeGroups(nodes.map((nodeId) => ({ nodeId, server: "" })))
  if (groups.length <= 1) return []
  const rounds: Array<Array<readonly [number, number]>> = []
  const own = groups.filter((g) => g.length >= 2).map((g) => [g[0]!, g[1]!] as const)
  if (own.length > 0) rounds.push(own)
  // circle method over the nodes, a stand-in node (-1) making their number even
  const ids = groups.map((_, i) => i)
  if (ids.length % 2 === 1) ids.push(-1)
  const m = ids.length
  for (let k = 0; k < m - 1; k++) {
    const round: Array<readonly [number, number]> = []
    for (let i = 0; i < m / 2; i++) {
      const x = i === 0 ? ids[m - 1]! : ids[(k + i) % (m - 1)]!
      const y = ids[(k - i + m - 1) % (m - 1)]!
      if (x >= 0 && y >= 0) round.push([Math.min(groups[x]![0]!, groups[y]![0]!), Math.max(groups[x]![0]!, groups[y]![0]!)] as const)
    }
    if (round.length > 0) rounds.push(round)
  }
  return rounds
}

/** How this rank's calls reach each peer, for explain.txt and the benchmark. */
export interface TransportInfo {
  readonly choice: TransportChoice
  /** Where this rank takes direct frames (absent: it offers none). */
  readonly address?: DirectAddress
  readonly minBytes: number
  readonly tls: boolean
  /** Per peer rank, how this rank sends to it: "unix", "tcp", or "nats" (with why, for a fallback). */
  readonly links: ReadonlyArray<{ readonly rank: number; readonly via: "unix" | "tcp" | "nats"; readonly why?: string }>
  /** Bytes this rank sent and received on direct links (frames and their headers). */
  readonly bytesSent: number
  readonly bytesReceived: number
  /** Inbound connections refused for failing authentication. */
  readonly rejected: number
  /** Direct frames whose payload was read straight into the call's buffer (no copy out of a receive buffer). */
  readonly framesInPlace: number
  /** The group formed with a direct link between every two ranks (Communicator.wholeDirect). */
  readonly wholeDirect: boolean
}

export interface PeerInfo {
  readonly rank: number
  readonly node: string
  /** server_id of the NATS server the rank is connected to. */
  readonly server: string
  readonly serverName: string
}

export interface CallOptions {
  /** Overrides the communicator's timeoutMs for this call. */
  readonly timeoutMs?: number
  /**
   * This call's path, overriding the communicator's choice by size: "nats", or "direct" (where the
   * links are up). The same on every rank is not required: each sender decides for its own frames.
   */
  readonly transport?: "nats" | "direct"
}

export interface AllReduceOptions extends CallOptions {
  /** Default "sum". */
  readonly op?: ReduceOp
  /** A registered algorithm's name (collectives/algorithms/); default "ring". */
  readonly algorithm?: AllReduceAlgorithm
  /** This rank's weight for op "weightedMean" (e.g. its sample count): result = sum(w_i x_i) / sum(w_i). */
  readonly weight?: number
  /** "f16": values travel as binary16 (half the bytes), accumulation stays fp32. Default "f32". */
  readonly wire?: WireFormat
  /**
   * Ring: all-gather phase by fan-out (each owner publishes its finished segment once to every
   * rank) instead of relaying it around the ring. Tree: send the result down as one fan-out
   * publish instead of along the tree. Default true for both.
   */
  readonly fanout?: boolean
  /** Hierarchical: group ranks by node id (default) or by the NATS server they are connected to. */
  readonly hierarchy?: "node" | "server"
  /**
   * This rank's values as binary16 bits, one per element of `data` (op "sum" with wire "f16"
   * only; e.g. written by fp16 error feedback in its own pass). The ring reads them directly, with
   * no encode before the first send, and `data` is only written, with the result; the other
   * algorithms decode them into `data` first.
   */
  readonly halfInput?: Uint16Array
  /**
   * This rank's values, made on demand by the ring (op "sum" with wire "f16" only; not with
   * `halfInput`): fp16 error feedback compensates and casts only the segment this rank sends
   * first, and adds its values into the messages it relays (see gradient-reducer.ts). The other
   * algorithms ask it for all the bits at once and decode them into `data` first.
   * @internal
   */
  readonly halfSource?: HalfSource
}

export interface ReduceScatterOptions extends CallOptions {
  readonly op?: ReduceOp
  readonly weight?: number
  readonly wire?: WireFormat
}

export interface BroadcastOptions extends CallOptions {
  /** "fanout" (default): one publish per chunk to every rank; "tree": relayed along a binary tree. */
  readonly algorithm?: "fanout" | "tree"
  readonly wire?: WireFormat
}

export interface AllGatherOptions extends CallOptions {
  /** "fanout" (default): each rank publishes its block once to every rank; "ring": passed along a ring. */
  readonly algorithm?: "fanout" | "ring"
  readonly wire?: WireFormat
  /** Where to gather (length p * n); default a new array. */
  readonly out?: Float32Array
}

const MIN_CHUNK_ELEMS = (64 << 10) / 4
// 2: the variant's algorithm field is a whole byte (frames.ts); 3: frames split over NATS
// (splitFrame) and the direct links' frame size in the hello
const PROTOCOL_VERSION = 3

/** Broadcast and all-gather have their own small sets of algorithms (their opcode tells them apart). */
const broadcastCode = { fanout: 0, tree: 1 } as const
const broadcastName = ["fanout", "tree"]
const gatherCode = { fanout: 0, ring: 1 } as const
const gatherName = ["fanout", "ring"]
const reduceCode: Record<ReduceOp, number> = { sum: 0, mean: 1, max: 2, weightedMean: 3 }
const reduceName = ["sum", "mean", "max", "weightedMean"]
const opName = ["?", "barrier", "broadcast", "allGather", "reduceScatter", "allReduce", "shift"]

/** "allReduce(ring, sum, f32)": what a frame's opcode and variant say, for mismatch errors. */
export const describeOp = (opcode: number, variant: number): string => {
  const name = opName[opcode] ?? `op${opcode}`
  const wire = variant & Variant.half ? "f16" : "f32"
  const code = variant & 0xff
  const reduce = reduceName[(variant & Variant.reduceMask) >> Variant.reduceShift]
  const relay = variant & Variant.relay ? ", no fan-out" : ""
  if (opcode === Opcode.allReduce) return `${name}(${allReduceAlgorithmByCode(code)?.name ?? `algorithm #${code}`}${relay}, ${reduce}, ${wire})`
  if (opcode === Opcode.reduceScatter) return `${name}(${reduce}, ${wire})`
  if (opcode === Opcode.barrier || opcode === Opcode.shift || opcode === Opcode.exchange) return name
  const algo = (opcode === Opcode.broadcast ? broadcastName : gatherName)[code] ?? `#${code}`
  return `${name}(${algo}, ${wire})`
}

/** A subject token for a node id or server id (ids may hold dots or spaces). */
const tokenFor = (id: string): string => {
  if (/^[A-Za-z0-9_-]{1,48}$/.test(id)) return id
  let h = 0x811c9dc5
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 0x01000193)
  return `${id.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 32)}_${(h >>> 0).toString(16)}`
}

/** Fan-out tokens every rank of a node (server) subscribes to; computed the same way by all ranks. */
const nodeTokenFor = (node: string): string => `node_${tokenFor(node)}`
const serverTokenFor = (server: string): string => `srv_${tokenFor(server)}`

interface Hello {
  readonly v: number
  readonly rank: number
  readonly nonce: string
  readonly worldSize: number
  readonly node: string
  readonly server: string
  readonly serverName: string
  /** Where the rank takes direct frames (absent: NATS only). */
  readonly direct?: DirectAddress
  /** In the ready hello: the peers this rank dialled and reads direct frames from, and why not the others. */
  readonly reads?: ReadonlyArray<number>
  readonly readFailures?: Readonly<Record<string, string>>
  readonly maxPayload: number
  readonly chunkBytes: number
  /** With a direct address: the frame size this rank asks for on the direct links. */
  readonly directChunkBytes?: number
  readonly windowBytes: number
  readonly ready: boolean
}

interface AbortBody {
  readonly by: number
  readonly op: string
  readonly failedRanks: ReadonlyArray<number>
  readonly causeTag: string
  readonly reason: string
}

const tagOf = (e: unknown): string =>
  typeof e === "object" && e !== null && "_tag" in e ? String((e as { _tag: unknown })._tag) : e instanceof Error ? e.name : "Error"

const messageOf = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/**
 * A group of one moves nothing: the result is the input, except that a weighted mean over a total
 * weight of 0 is defined as 0 (as for larger groups), and the wire format does not apply.
 */
const soloResult = (data: Float32Array, op: ReduceOp, weight: number): Float32Array => {
  if (op === "weightedMean" && weight === 0) data.fill(0)
  return data
}

const EMPTY = new Uint8Array(0)

const publishControl = (nc: NatsConnection, subject: string, kind: number, src: number, body: unknown): void => {
  const m = controlMessage(kind, src, body)
  nc.publish(subject, m.data, { headers: m.headers })
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

export class Communicator {
  readonly rank: number
  readonly worldSize: number
  readonly group: string
  /** Every rank's node and server, by rank (known after the handshake). */
  readonly peers: ReadonlyArray<PeerInfo>
  /**
   * Elements per data frame at most (fp32 or fp16), agreed by all ranks: in a group whose every
   * rank reads every peer's direct link the direct links' frame (DirectOptions.chunkBytes), else
   * what max_payload and chunkBytes allow.
   */
  readonly chunkElems: number
  /** Largest message body NATS carries here (the smallest max_payload, less the header block); larger frames are split (splitFrame). */
  readonly #natsMaxBody: number
  /** Split frames received over NATS, put together again. */
  readonly #assembler = new FrameAssembler(takeReceiveBuffer, releaseReceived)
  #splitSent = 0
  readonly windowBytes: number
  readonly timeoutMs: number
  readonly #deadlines: MeasuredDeadlines | undefined
  readonly #nc: NatsConnection | undefined
  /** Where acks and control messages go (the control connection, or nc). */
  readonly #cnc: NatsConnection | undefined
  readonly #subjects: ReturnType<typeof jobSubjects>
  readonly #subs: Subscription[]
  readonly #host: OperationHost
  readonly #ops = new Map<number, Operation>()
  /** The deadline each running call without its own timeoutMs got when it started. */
  readonly #opDeadlines = new Map<number, Deadline>()
  readonly #early = new Map<number, Frame[]>()
  readonly #earlyLimit: number
  #earlyBytes = 0
  #nextSeq = 1
  #closed: unknown = undefined
  #watchdog: ReturnType<typeof setInterval> | undefined
  #probe: { nonce: string; answered: Set<number>; behind: Set<number>; seq: number } | undefined
  /** A timed-out call is being judged (#timeOut). */
  #judging = false
  readonly #peerLiveness: CommunicatorOptions["peerLiveness"]
  readonly #onWaitOn: CommunicatorOptions["onWaitOn"]
  readonly #busyPeerWaitMs: number
  /** Calls waiting on past their deadline for peers still working: when their deadline was last re-armed, by seq. */
  readonly #heldWaits = new Map<number, number>()
  /** Calls that waited on held peers and were given one more deadline when every peer answered again (#judge). */
  readonly #resumedWaits = new Set<number>()
  /** The watchdog's lateness (a late run means this rank's own event loop was held). */
  readonly #watchdogClock = new HeldClock(1_000)
  /** Answers late hellos once the group is formed. */
  #hello: Hello | undefined
  readonly #statusIters: Array<{ stop?: () => void }> = []
  /** 0..worldSize-1, handed to every call's algorithm. */
  readonly #ranks: ReadonlyArray<number>
  readonly #direct: DirectEndpoint | undefined
  readonly #transport: TransportChoice
  #directMinBytes: number
  readonly #directTls: boolean
  /** Peers this rank sends to directly: they dialled it and said so (replaced, never mutated, when a link goes). */
  #directPeers: ReadonlySet<number> = new Set()
  /**
   * Chunks a mid-sized segment is split into. Through NATS four, so a step can start while the
   * previous one still arrives at the server and leaves it (store and forward). In a whole-direct
   * group one: a socket streams a frame to the peer as it is written, so smaller chunks only add
   * per-frame costs (events, acks, wake-ups); measured on 2 cores, a 4 MiB ring all-reduce at
   * p = 4 took 14 ms in 1 MiB chunks against 24 ms in 256 KiB ones, 1 MiB at p = 4 5 against 9.5 ms.
   */
  get #segmentChunks(): number {
    return this.#wholeDirect ? 1 : 4
  }
  /** Every rank listens on the direct path and reads every peer's link (from the hellos at creation: the same on every rank). */
  #wholeDirect = false
  /** Why a peer gets NATS: its reason for not dialling this rank. */
  #directWhyNot = new Map<number, string>()
  /** Calls running whose frames go direct: the peers they send to directly, fixed at the call's start. */
  readonly #directSeqs = new Map<number, ReadonlySet<number>>()
  readonly #headerScratch = new Uint8Array(HEADER_BYTES)
  readonly #ackScratch = new Uint8Array(HEADER_BYTES)
  #fanoutRanks: Map<string, number[]> | undefined

  private constructor(
    opts: CommunicatorOptions,
    peers: ReadonlyArray<PeerInfo>,
    chunkElems: number,
    windowBytes: number,
    subjects: ReturnType<typeof jobSubjects>,
    subs: Subscription[],
    natsMaxBody: number,
    direct?: DirectEndpoint
  ) {
    this.#natsMaxBody = natsMaxBody
    this.rank = opts.rank
    this.worldSize = opts.worldSize
    this.group = opts.group
    this.peers = peers
    this.chunkElems = chunkElems
    this.windowBytes = windowBytes
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS
    this.#deadlines = opts.deadlines
    this.#peerLiveness = opts.peerLiveness
    this.#onWaitOn = opts.onWaitOn
    this.#busyPeerWaitMs = opts.busyPeerWaitMs ?? BUSY_PEER_WAIT_MS
    this.#earlyLimit = opts.earlyLimitBytes ?? DEFAULT_EARLY_LIMIT
    this.#nc = opts.worldSize > 1 ? opts.nc : undefined
    this.#cnc = opts.worldSize > 1 ? (opts.controlNc ?? opts.nc) : undefined
    this.#subjects = subjects
    this.#subs = subs
    this.#ranks = Object.freeze(Array.from({ length: opts.worldSize }, (_, r) => r))
    const nc = opts.nc
    const cnc = opts.controlNc ?? nc
    const group = opts.group
    const me = opts.rank
    const full = HEADER_BYTES + chunkElems * 4
    this.#direct = direct
    this.#transport = direct ? (opts.direct?.transport ?? "auto") : "nats"
    this.#directMinBytes = opts.direct?.minBytes ?? DIRECT_MIN_BYTES
    this.#directTls = opts.direct?.tls === true
    const natsTo = (seq: number, dst: number, data: Uint8Array, headers: MsgHdrs): void => this.#publishData(subjects.coll(group, seq, me, dst), data, headers)
    this.#host = {
      group,
      rank: me,
      worldSize: opts.worldSize,
      windowBytes,
      fullFrame: full,
      // A steady ack per full chunk consumed keeps credit flowing before a sender has to ask (ackNow).
      ackEvery: full,
      publishTo: (seq, dst, data, headers, written) => {
        if (this.#directSeqs.get(seq)?.has(dst)) return this.#sendDirect(seq, dst, data, headers, written)
        natsTo(seq, dst, data, headers)
        written?.() // the client copied it
      },
      // An ack goes back on the direct link this rank reads from the sender when it has one (its
      // reverse direction carries nothing else), else on the control connection.
      publishAck: (seq, dst, headers) => {
        if (direct?.reads(dst) && headerBytesInto(headers, this.#ackScratch) && direct.ack(dst, this.#ackScratch)) return
        cnc.publish(subjects.collControl(group, seq, me, dst), EMPTY, { headers })
      },
      publishFanout: (seq, target, data, headers, written) => {
        // A direct call's fan-out is one send per receiver, each on its link (NATS for a peer
        // without one), so all of the call's frames to a peer keep one path and their order.
        const links = this.#directSeqs.get(seq)
        if (links) {
          // `written` once every direct send of the data is written (the count starts at one for this loop)
          let left = 1
          const one = written && ((): void => void (--left === 0 && written()))
          for (const dst of this.#fanoutTargets(target)) {
            if (!links.has(dst)) natsTo(seq, dst, data, headers)
            else if (one === undefined) this.#sendDirect(seq, dst, data, headers)
            else {
              left++
              try {
                this.#sendDirect(seq, dst, data, headers, one)
              } catch (e) {
                one()
                throw e
              }
            }
          }
          one?.()
        } else {
          this.#publishData(target === "all" ? subjects.collFanout(group, seq, me) : subjects.collNodeFanout(group, seq, me, target), data, headers)
          written?.()
        }
      }
    }
  }

  /**
   * Joins the group: subscribes, then handshakes until every rank is subscribed and agrees on the
   * group's size and settings. All ranks must call it with the same group, worldSize and settings.
   */
  static async create(opts: CommunicatorOptions): Promise<Communicator> {
    // the pooled receive and send buffers the collectives give back to (a no-op after openNats did it)
    installNatsPatches()
    const { nc, rank, worldSize, group } = opts
    const cnc = opts.controlNc ?? nc
    if (!Number.isInteger(worldSize) || worldSize < 1 || !Number.isInteger(rank) || rank < 0 || rank >= worldSize) {
      throw new CollectiveArgumentError({ op: "create", reason: `need 0 <= rank < worldSize with integers, got rank ${rank}, worldSize ${worldSize}` })
    }
    const subjects = jobSubjects(opts.cluster, opts.job)
    // The group becomes one subject token; jobSubjects validated cluster and job the same way.
    if (!/^[A-Za-z0-9_-]{1,128}$/.test(group)) {
      throw new CollectiveArgumentError({ op: "create", reason: `group "${group}" must be 1-128 letters, digits, "_" or "-"` })
    }
    const node = opts.node ?? os.hostname()
    const server = nc.info?.server_id ?? "unknown"
    const serverName = nc.info?.server_name ?? server
    const maxPayload = opts.maxPayload ?? nc.info?.max_payload ?? 1 << 20
    const chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_BYTES
    const windowBytes = opts.windowBytes ?? DEFAULT_WINDOW_BYTES
    if (!(chunkBytes >= 64) || !(windowBytes >= 1) || maxPayload < HEADER_BLOCK_BYTES + 64) {
      throw new CollectiveArgumentError({ op: "create", reason: `chunkBytes (${chunkBytes}) must be >= 64, windowBytes (${windowBytes}) >= 1, max_payload (${maxPayload}) >= ${HEADER_BLOCK_BYTES + 64}` })
    }
    const nodeToken = nodeTokenFor(node)
    const serverToken = serverTokenFor(server)
    const self: PeerInfo = { rank, node, server, serverName }
    const directChunkBytes = opts.direct?.chunkBytes ?? DEFAULT_DIRECT_CHUNK_BYTES
    if (!(directChunkBytes >= 64)) throw new CollectiveArgumentError({ op: "create", reason: `direct.chunkBytes (${directChunkBytes}) must be >= 64` })
    if (worldSize === 1) {
      const C = Math.floor(Math.min(chunkBytes, maxPayload - HEADER_BLOCK_BYTES) / 4)
      return new Communicator(opts, [self], C, windowBytes, subjects, [], maxPayload - HEADER_BLOCK_BYTES)
    }

    // The direct path's listener is up before the first hello advertises it.
    const wantDirect = opts.direct !== undefined && (opts.direct.transport ?? "auto") !== "nats"
    const directFrames: Frame[] = []
    let endpoint: DirectEndpoint | undefined
    if (wantDirect) {
      const d = opts.direct as DirectOptions
      endpoint = await DirectEndpoint.listen({
        group,
        rank,
        secret: d.secret,
        host: d.host,
        advertise: d.advertise,
        unixSocket: d.unixSocket,
        tls: d.tls,
        onFrame: (f) => (comm ? comm.#onFrame(f) : directFrames.push(f)),
        // a running call's data frame may be read straight into its place in the call's buffer
        place: (head, bytes) => (comm ? comm.#ops.get(head.seq)?.placement(head, bytes) : undefined),
        onLinkDown: (peer, direction, reason) => {
          if (comm) comm.#linkDown(peer, direction, reason)
        }
      })
    }
    const hellos = new Map<number, Hello>()
    const nonce = Math.random().toString(36).slice(2, 12)
    let failure: unknown = undefined
    let comm: Communicator | undefined
    const pending: Msg[] = []
    // The handshake loop waits for a message, the dials or its next resend, whichever comes first.
    let wake: (() => void) | undefined
    const poke = (): void => {
      const w = wake
      wake = undefined
      w?.()
    }
    const onMsg = (err: Error | null, msg: Msg): void => {
      if (err) return
      if (comm) comm.#onMessage(msg)
      else {
        pending.push(msg)
        poke()
      }
    }
    // Order matters across routed servers: data subscriptions first (and flushed), the control
    // ones last, so a hello received through them means the earlier ones have propagated too.
    const subs = [
      nc.subscribe(subjects.collInbound(group, rank), { callback: onMsg }),
      nc.subscribe(subjects.collNodeInbound(group, nodeToken), { callback: onMsg }),
      nc.subscribe(subjects.collNodeInbound(group, serverToken), { callback: onMsg }),
      nc.subscribe(subjects.collFanoutInbound(group), { callback: onMsg })
    ]
    const unsubscribe = (): void => {
      for (const s of subs) s.unsubscribe()
    }
    // The direct path: once every peer's address is known, dial them all (to read what they send
    // this rank); "ready" waits for the dials, and the ready hello says which links are up.
    let dials: Promise<void> | undefined
    let dialsDone = endpoint === undefined
    const reads: number[] = []
    const readFailures: Record<string, string> = {}
    const startDials = (): void => {
      if (!endpoint || dials) return
      const d = opts.direct as DirectOptions
      const timeout = d.connectTimeoutMs ?? 3_000
      dials = Promise.all(
        [...hellos.values()].map(async (h) => {
          if (!h.direct) readFailures[h.rank] = "it offers no direct address (transport \"nats\" there)"
          else {
            const why = await endpoint.connect(h.rank, h.direct, h.node === node, timeout)
            if (why === undefined) reads.push(h.rank)
            else readFailures[h.rank] = why
          }
        })
      ).then(() => {
        dialsDone = true
        poke()
      })
    }
    const hello = (ready: boolean): Hello => ({
      v: PROTOCOL_VERSION,
      rank,
      nonce,
      worldSize,
      node,
      server,
      serverName,
      ...(endpoint ? { direct: endpoint.address, directChunkBytes } : {}),
      ...(endpoint && ready ? { reads: [...reads].sort((a, b) => a - b), readFailures } : {}),
      maxPayload,
      chunkBytes,
      windowBytes,
      ready
    })
    const mismatch = (reason: string): void => {
      failure ??= new GroupMismatch({ group, rank, reason })
    }
    // Frames other than hellos that arrive during the handshake (a peer that finished first may
    // already be running the first collective): kept and delivered once the communicator exists.
    const early: Msg[] = []
    // Ranks heard for the first time, not yet ready: answered by a hello addressed to each.
    const answer: number[] = []
    const take = (msg: Msg): void => {
      const f = readFrame(msg)
      if (!f || f.src === rank) return
      if (f.kind !== Kind.hello) {
        early.push(msg)
        return
      }
      const h = controlBody(f) as Hello
      if (h.v !== PROTOCOL_VERSION) return mismatch(`rank ${h.rank} speaks collectives protocol ${h.v}, this rank ${PROTOCOL_VERSION}`)
      if (h.worldSize !== worldSize) return mismatch(`rank ${h.rank} was created with worldSize ${h.worldSize}, this rank with ${worldSize}`)
      if (h.rank >= worldSize) return mismatch(`a rank ${h.rank} joined a group of ${worldSize}`)
      const known = hellos.get(h.rank)
      if (known && known.nonce !== h.nonce) {
        return mismatch(`two processes joined as rank ${h.rank} (or a stale communicator used this group name; use a fresh group name per communicator)`)
      }
      // A rank heard for the first time that has not heard everyone may have subscribed after this
      // rank's last hello: it gets one of its own at once, not at this rank's next resend.
      if (!known && !h.ready) answer.push(h.rank)
      hellos.set(h.rank, h)
    }
    // An abort wakes the loop at once (it is checked there).
    opts.signal?.addEventListener("abort", poke, { once: true })
    try {
      await nc.flush()
      subs.push(
        cnc.subscribe(subjects.collControlInbound(group, rank), { callback: onMsg }),
        cnc.subscribe(subjects.collControlFanoutInbound(group), { callback: onMsg })
      )
      await cnc.flush()
      const deadline = Date.now() + (opts.createTimeoutMs ?? DEFAULT_CREATE_TIMEOUT_MS)
      let interval = 20
      let lastSent = -1
      let sentReady = false
      for (;;) {
        while (pending.length > 0) take(pending.shift() as Msg)
        if (failure !== undefined) throw failure
        if (opts.signal?.aborted) {
          const why = opts.signal.reason instanceof Error ? opts.signal.reason.message : String(opts.signal.reason ?? "aborted")
          throw new CommunicatorClosed({ op: "create", group, rank, reason: `given up during the start-up handshake: ${why}` })
        }
        const heardAll = hellos.size === worldSize - 1
        if (heardAll) startDials()
        const meReady = heardAll && dialsDone
        const allReady = meReady && [...hellos.values()].every((h) => h.ready)
        if (allReady) break
        // Repeat the hello: peers that subscribed after our last one would otherwise never hear it.
        // "Ready" goes out as soon as it is true; then with the rest, at the resend interval.
        const now = Date.now()
        if (now - lastSent >= interval || (meReady && !sentReady)) {
          publishControl(cnc, subjects.collControl(group, 0, rank), Kind.hello, rank, hello(meReady))
          lastSent = now
          interval = Math.min(250, interval * 2)
          sentReady = meReady
          answer.length = 0
        }
        for (const r of answer.splice(0)) publishControl(cnc, subjects.collControl(group, 0, rank, r), Kind.hello, rank, hello(meReady))
        if (now > deadline) {
          // Name the ranks never heard from; if every rank answered, the ones not yet ready.
          const silent: number[] = []
          const notReady: number[] = []
          for (let r = 0; r < worldSize; r++) {
            if (r === rank) continue
            if (!hellos.has(r)) silent.push(r)
            else if (!hellos.get(r)?.ready) notReady.push(r)
          }
          throw new CollectiveTimeout({
            op: "create",
            group,
            rank,
            seq: 0,
            waitingFor: silent.length > 0 ? silent : notReady,
            unresponsive: silent,
            timeoutMs: opts.createTimeoutMs ?? DEFAULT_CREATE_TIMEOUT_MS
          })
        }
        // Until a message or the dials wake it, or the next resend is due (the deadline checked then).
        if (pending.length === 0) {
          let timer: ReturnType<typeof setTimeout> | undefined
          await new Promise<void>((resolve) => {
            wake = resolve
            timer = setTimeout(resolve, Math.max(1, Math.min(interval - (Date.now() - lastSent), deadline - Date.now() + 1)))
          })
          wake = undefined
          clearTimeout(timer)
        }
      }
      const peers: PeerInfo[] = []
      for (let r = 0; r < worldSize; r++) {
        const h = r === rank ? hello(true) : (hellos.get(r) as Hello)
        peers.push({ rank: r, node: h.node, server: h.server, serverName: h.serverName })
      }
      // Settings every rank must share: the smallest of each, so every frame fits every server.
      const all = [hello(true), ...hellos.values()]
      const minPayload = Math.min(...all.map((h) => h.maxPayload))
      const C = Math.floor(Math.min(...all.map((h) => Math.min(h.chunkBytes, h.maxPayload - HEADER_BLOCK_BYTES))) / 4)
      const W = Math.min(...all.map((h) => h.windowBytes))
      if (HEADER_BLOCK_BYTES + 4 * C > minPayload) mismatch(`chunk of ${C} elements does not fit max_payload ${minPayload}`)
      if (failure !== undefined) throw failure
      // Every rank listens on the direct path and reads every peer's link: a whole-direct group,
      // which splits segments into fewer chunks (#chunkFor), and larger ones (its frames are the
      // direct links' size, a frame that falls back to NATS split in pieces). Decided from the
      // hellos alone, so the same on every rank.
      const wholeDirect = all.every((h) => h.direct !== undefined && (h.reads?.length ?? 0) === worldSize - 1)
      const D = wholeDirect ? Math.floor(Math.min(W / 2, ...all.map((h) => h.directChunkBytes ?? 0)) / 4) : 0
      comm = new Communicator(opts, peers, Math.max(C, D), W, subjects, subs, minPayload - HEADER_BLOCK_BYTES, endpoint)
      comm.#wholeDirect = wholeDirect
      if (endpoint) {
        // Send direct to the peers that dialled this rank and said so in their ready hello.
        const direct = new Set<number>()
        for (const h of hellos.values()) {
          if (h.reads?.includes(rank) && endpoint.has(h.rank)) direct.add(h.rank)
          else comm.#directWhyNot.set(h.rank, h.readFailures?.[rank] !== undefined ? `rank ${h.rank} could not dial this rank: ${h.readFailures[rank]}` : `rank ${h.rank} did not dial this rank`)
        }
        comm.#directPeers = direct
      }
      comm.#hello = hello(true)
      comm.#watchConnection(nc)
      if (cnc !== nc) comm.#watchConnection(cnc)
      // A late peer may still be waiting for our "ready": one more, now that everyone listens.
      publishControl(cnc, subjects.collControl(group, 0, rank), Kind.hello, rank, comm.#hello)
      for (const m of early) comm.#onMessage(m)
      while (pending.length > 0) comm.#onMessage(pending.shift() as Msg)
      for (const f of directFrames.splice(0)) comm.#onFrame(f)
      return comm
    } catch (e) {
      unsubscribe()
      await endpoint?.close()
      throw e
    } finally {
      opts.signal?.removeEventListener("abort", poke)
    }
  }

  /**
   * A disconnect loses whatever peers sent meanwhile, and zero-copy sends must not sit in the
   * client's buffer across one: any disconnect aborts the group.
   */
  #watchConnection(nc: NatsConnection): void {
    const status = nc.status()
    this.#statusIters.push(status as unknown as { stop?: () => void })
    void (async () => {
      for await (const s of status) {
        if (s.type === "disconnect" || s.type === "reconnect" || s.type === "staleConnection" || s.type === "close") {
          this.#abort(new ConnectionLost({ group: this.group, rank: this.rank, event: s.type }))
        }
      }
    })().catch(() => {})
  }

  // ------------------------------------------------------------------------------------------
  // inbound

  #onMessage(msg: Msg): void {
    const f = readFrame(msg)
    if (!f) return
    if (f.pieces === 0) return this.#onFrame(f)
    const whole = f.kind === Kind.data ? this.#assembler.add(f) : undefined
    if (whole) this.#onFrame(whole)
  }

  /** A data frame through NATS: as one message, or in pieces where it exceeds max_payload (splitFrame). */
  #publishData(subject: string, data: Uint8Array, headers: MsgHdrs): void {
    const nc = this.#nc as NatsConnection
    const pieces = splitFrame(headers, data, this.#natsMaxBody)
    if (!pieces) return nc.publish(subject, data, { headers })
    this.#splitSent++
    for (const p of pieces) nc.publish(subject, p.data, { headers: p.headers })
  }

  #onFrame(f: Frame): void {
    if (f.src === this.rank) return // our own fan-out echoed back
    switch (f.kind) {
      case Kind.data: {
        const op = this.#ops.get(f.seq)
        if (op) op.deliver(f)
        else if (f.seq >= this.#nextSeq && this.#closed === undefined) this.#hold(f)
        // else: a straggler for a call that already finished here; nothing to do.
        return
      }
      case Kind.ack:
        this.#ops.get(f.seq)?.onAck(f)
        return
      case Kind.ping: {
        // The answer says how far this rank got: a peer that has not started the prober's call is
        // the one holding it up (alive, but stalled outside the collectives).
        const body = { ...(controlBody(f) as object), seq: this.#nextSeq - 1 }
        if (this.#cnc) publishControl(this.#cnc, this.#subjects.collControl(this.group, 0, this.rank, f.src), Kind.pong, this.rank, body)
        return
      }
      case Kind.pong: {
        const body = controlBody(f) as { nonce?: string; seq?: number }
        if (this.#probe && body.nonce === this.#probe.nonce) {
          this.#probe.answered.add(f.src)
          if (typeof body.seq === "number" && body.seq < this.#probe.seq) this.#probe.behind.add(f.src)
        }
        return
      }
      case Kind.hello: {
        const h = controlBody(f) as Hello
        if (!h.ready && this.#hello && this.#closed === undefined) {
          if (this.#cnc) publishControl(this.#cnc, this.#subjects.collControl(this.group, 0, this.rank), Kind.hello, this.rank, this.#hello)
        }
        return
      }
      case Kind.abort:
        this.#onAbort(controlBody(f) as AbortBody)
        return
    }
  }

  /** Holds a frame for a call this rank has not started yet. */
  #hold(f: Frame): void {
    this.#earlyBytes += f.wireBytes
    if (this.#earlyBytes > this.#earlyLimit) {
      this.#abort(new CollectiveOverflow({ group: this.group, rank: this.rank, bytes: this.#earlyBytes, limitBytes: this.#earlyLimit }))
      return
    }
    const list = this.#early.get(f.seq)
    if (list) list.push(f)
    else this.#early.set(f.seq, [f])
  }

  // ------------------------------------------------------------------------------------------
  // failure handling

  #onAbort(body: AbortBody): void {
    if (this.#closed !== undefined) return
    const make = (op: string): CollectiveAborted =>
      new CollectiveAborted({
        op,
        group: this.group,
        rank: this.rank,
        by: body.by,
        failedRanks: [...body.failedRanks],
        causeTag: body.causeTag,
        reason: body.reason
      })
    this.#closed = make("collective")
    for (const op of this.#ops.values()) op.fail(make(op.sig.name))
    this.#clearEarly()
  }

  /** Fails every running call with `err` and tells the other ranks (unless they told us). */
  #abort(err: unknown): void {
    if (this.#closed !== undefined) return
    this.#closed = err
    for (const op of this.#ops.values()) op.fail(err)
    this.#clearEarly()
    if (err instanceof CollectiveAborted || !this.#cnc) return
    const body: AbortBody = {
      by: this.rank,
      op: typeof err === "object" && err !== null && "op" in err ? String((err as { op: unknown }).op) : "collective",
      failedRanks: [...blamedRanks(err)],
      causeTag: tagOf(err),
      reason: messageOf(err)
    }
    try {
      publishControl(this.#cnc, this.#subjects.collControl(this.group, 0, this.rank), Kind.abort, this.rank, body)
    } catch {
      // the connection is gone; peers will time out on their own
    }
  }

  #clearEarly(): void {
    this.#early.clear()
    this.#earlyBytes = 0
  }

  #ensureWatchdog(): void {
    if (this.#watchdog) return
    const every = Math.max(20, Math.min(1_000, Math.floor(this.#deadline().ms / 8)))
    this.#watchdogClock.reset(Date.now(), every)
    this.#watchdog = setInterval(() => this.#checkDeadlines(), every)
    this.#watchdog.unref()
  }

  #checkDeadlines(): void {
    if (this.#ops.size === 0) {
      clearInterval(this.#watchdog)
      this.#watchdog = undefined
      return
    }
    if (this.#judging) return
    const now = Date.now()
    // This rank's own event loop was held (the check ran late): frames may be waiting unread, so
    // the silence is not the peers'. Let them in before judging.
    if (this.#watchdogClock.held(now) > 0) return
    for (const op of this.#ops.values()) {
      const limit = this.#deadlineOf(op)
      const since = Math.max(op.lastProgress, this.#heldWaits.get(op.seq) ?? 0)
      if (op.failure === undefined && op.waiting && now - since > limit.ms) {
        void this.#timeOut(op, limit)
        return
      }
    }
  }

  /** The deadline of a call starting now without its own timeoutMs. */
  #deadline(): Deadline {
    return this.#deadlines?.current() ?? { ms: this.timeoutMs, measured: false, why: `timeoutMs ${seconds(this.timeoutMs)}` }
  }

  /** A running call's deadline: its own timeoutMs, else the one fixed when it started. */
  #deadlineOf(op: Operation): Deadline {
    if (op.timeoutMs !== undefined) return { ms: op.timeoutMs, measured: false, why: `the call's timeoutMs ${seconds(op.timeoutMs)}` }
    return this.#opDeadlines.get(op.seq) ?? this.#deadline()
  }

  /** The deadline passed: find out which peers are gone, then fail and abort the group (or wait on for peers still working). */
  async #timeOut(op: Operation, deadline: Deadline, onlyIfGone?: number): Promise<void> {
    // one judgement at a time: the watchdog waits for this one (its probe, its question to the owner)
    if (this.#judging) return
    this.#judging = true
    try {
      await this.#judge(op, deadline, onlyIfGone)
    } finally {
      this.#judging = false
    }
  }

  async #judge(op: Operation, deadline: Deadline, onlyIfGone?: number): Promise<void> {
    const timeoutMs = deadline.ms
    const waitingFor = op.waitingFor()
    const progress = op.lastProgress
    const probe = { nonce: Math.random().toString(36).slice(2, 12), answered: new Set<number>(), behind: new Set<number>(), seq: op.seq }
    this.#probe = probe
    const probeMs = Math.max(200, Math.min(2_000, Math.floor(timeoutMs / 4)))
    try {
      if (this.#cnc) publishControl(this.#cnc, this.#subjects.collControl(this.group, 0, this.rank), Kind.ping, this.rank, { nonce: probe.nonce })
      const until = Date.now() + probeMs
      while (Date.now() < until && probe.answered.size < this.worldSize - 1 && op.failure === undefined) await sleep(20)
    } finally {
      this.#probe = undefined
    }
    if (op.failure !== undefined) return // an abort from a peer came first
    if (onlyIfGone !== undefined) {
      // A direct link closed: the peer is gone if it did not answer; if it did, the deadline decides.
      if (!probe.answered.has(onlyIfGone)) this.#abort(new PeerLinkLost({ op: op.sig.name, group: this.group, rank: this.rank, peer: onlyIfGone }))
      return
    }
    // Frames came while the probe ran, or the call finished: it is moving after all.
    if (!this.#ops.has(op.seq) || op.lastProgress !== progress) return
    const unresponsive: number[] = []
    for (let r = 0; r < this.worldSize; r++) if (r !== this.rank && !probe.answered.has(r)) unresponsive.push(r)
    const behind = [...probe.behind].sort((a, b) => a - b)
    // Silent peers that still beat, their event loop held by one long computation (an evaluation on
    // one rank, a step of a big model), or peers behind this call that are working outside the
    // collectives: alive, so wait on, as DDP would, and ask again at the next deadline. An explicit
    // deadline is kept as given.
    const explicit = op.timeoutMs !== undefined || this.#deadlines?.fixedMs !== undefined || this.#deadlines === undefined
    const asked = unresponsive.length > 0 ? unresponsive : behind
    const waitedMs = Date.now() - op.lastProgress
    const still = asked.length > 0 && this.#peerLiveness && !explicit ? await this.#stillWorking(asked, unresponsive.length > 0, probeMs, waitedMs) : undefined
    const hungAfterMs = still !== undefined && "hungAfterMs" in still ? still.hungAfterMs : undefined
    if (hungAfterMs !== undefined) {
      if (op.failure !== undefined || !this.#ops.has(op.seq)) return
      if (!this.#heldWaits.has(op.seq)) {
        try {
          this.#onWaitOn?.({ op: op.sig.name, seq: op.seq, ranks: asked, doing: unresponsive.length > 0 ? "held" : "busy", waitedMs, hungAfterMs })
        } catch {
          // a warning only
        }
      }
      this.#heldWaits.set(op.seq, Date.now())
      return
    }
    if (op.failure !== undefined || !this.#ops.has(op.seq)) return
    // A call that waited on held peers finds every peer answering now: the held one just went on,
    // and its frames are on their way through the ranks between it and this one (a ring's next
    // rank waits on it, this one on that rank). One more deadline, from now: if nothing moves by
    // then, it is judged as any other. Before, a probe answered right after the held rank resumed
    // aborted the group, blaming the rank in between (seen in CI under load).
    if (asked.length === 0 && this.#heldWaits.has(op.seq) && !this.#resumedWaits.has(op.seq)) {
      this.#resumedWaits.add(op.seq)
      this.#heldWaits.set(op.seq, Date.now())
      return
    }
    this.#abort(
      new CollectiveTimeout({
        op: op.sig.name,
        group: this.group,
        rank: this.rank,
        seq: op.seq,
        waitingFor,
        unresponsive,
        behind,
        timeoutMs,
        silentMs: Date.now() - op.lastProgress,
        deadline: deadline.why,
        ...(still !== undefined && "why" in still ? { notWaitedOn: still.why } : {})
      })
    )
  }

  /**
   * Whether every one of `ranks` is known alive and at work: `silent` ones (no answer to the
   * probe) with their event loop held since before the probe (by their latest beat, which says it
   * held longer than the silence since) and not yet for their hung limit,
   * the others (behind the call) using at least BUSY_CORES while this call waited `waitedMs`, less
   * than busyPeerWaitMs. No answer in time: no. Yes: the least of their limits.
   */
  async #stillWorking(ranks: ReadonlyArray<number>, silent: boolean, probeMs: number, waitedMs: number): Promise<{ readonly hungAfterMs: number } | { readonly why: string }> {
    let timer: ReturnType<typeof setTimeout> | undefined
    try {
      const known = await Promise.race([
        this.#peerLiveness!(ranks),
        new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), PEER_LIVENESS_ASK_MS)))
      ])
      if (known === undefined) return { why: `the owner did not say within ${seconds(PEER_LIVENESS_ASK_MS)} whether they still work` }
      let hungAfterMs = Infinity
      for (const r of ranks) {
        const k = known.find((x) => x.rank === r)
        if (k === undefined) return { why: `the owner knows nothing of rank ${r}'s process` }
        if (k.heardAgoMs > PEER_HEARD_WITHIN_MS) return { why: `rank ${r}'s process was last heard ${seconds(k.heardAgoMs)} ago` }
        if (silent) {
          // held since before the probe, by its latest beat, and held longer at that beat than it
          // has been silent since (a process stopped or cut off after a free turn of its loop is not held)
          const atBeat = k.heldMs - k.heardAgoMs
          if (atBeat < Math.max(probeMs - k.heardAgoMs, k.heardAgoMs)) return { why: `rank ${r}'s event loop was not held (its beats say ${seconds(Math.max(0, atBeat))})` }
          if (k.heldMs >= k.hungAfterMs) return { why: `rank ${r}'s event loop was held ${seconds(k.heldMs)}, past its hung limit ${seconds(k.hungAfterMs)}` }
        } else {
          if (k.cpu === undefined) return { why: `rank ${r}'s CPU use was not known yet` }
          if (k.cpu < BUSY_CORES) return { why: `rank ${r}'s process used ${k.cpu.toFixed(2)} of a core (a peer at work uses at least ${BUSY_CORES})` }
          if (waitedMs >= this.#busyPeerWaitMs) return { why: `they worked past the ${seconds(this.#busyPeerWaitMs)} a busy peer is waited for` }
        }
        hungAfterMs = Math.min(hungAfterMs, silent ? k.hungAfterMs : this.#busyPeerWaitMs)
      }
      return { hungAfterMs }
    } catch (e) {
      return { why: `asking the owner failed: ${messageOf(e)}` }
    } finally {
      clearTimeout(timer)
    }
  }

  // ------------------------------------------------------------------------------------------
  // running one call

  async #run<T>(sig: OpSignature, call: CallOptions, body: (op: Operation) => Promise<T>): Promise<T> {
    const timeoutMs = call.timeoutMs
    if (this.#closed instanceof CollectiveAborted) {
      // A peer aborted the group before this rank got to the call: say so, with the peer's cause,
      // rather than a bare "closed" (the same outcome as if the abort had come a moment later).
      const a = this.#closed
      throw new CollectiveAborted({ op: sig.name, group: this.group, rank: this.rank, by: a.by, failedRanks: [...a.failedRanks], causeTag: a.causeTag, reason: a.reason })
    }
    if (this.#closed !== undefined) {
      // the culprit of what closed it travels on (a later call is often the one a loop reports)
      const blamed = blamedRanks(this.#closed)
      const closed = this.#closed
      const causeTag = closed instanceof CommunicatorClosed ? closed.causeTag : closed instanceof CollectiveAborted ? closed.causeTag : tagOf(closed)
      throw new CommunicatorClosed({
        op: sig.name,
        group: this.group,
        rank: this.rank,
        reason: messageOf(closed),
        ...(blamed.length > 0 ? { failedRanks: [...blamed] } : {}),
        ...(causeTag !== undefined ? { causeTag } : {})
      })
    }
    const seq = this.#nextSeq++
    const op = new Operation(this.#host, seq, sig, describeOp)
    op.timeoutMs = timeoutMs
    if (timeoutMs === undefined) this.#opDeadlines.set(seq, this.#deadline())
    const started = performance.now()
    this.#ops.set(seq, op)
    const direct =
      this.#directPeers.size > 0 &&
      (call.transport !== undefined ? call.transport === "direct" : this.#transport === "direct" || sig.length * (sig.half ? 2 : 4) >= this.#directMinBytes)
    if (direct) this.#directSeqs.set(seq, this.#directPeers)
    this.#ensureWatchdog()
    let running: Promise<T>
    try {
      running = body(op)
    } catch (e) {
      running = Promise.reject(e)
    }
    // Frames that arrived before this rank got here: the algorithm's handler is installed now.
    const early = this.#early.get(seq)
    if (early) {
      this.#early.delete(seq)
      for (const f of early) {
        this.#earlyBytes -= f.wireBytes
        op.deliver(f)
      }
    }
    try {
      const result = await running
      // bodies handed to the direct links are written before the caller may touch its buffer again,
      // and every frame it sent there is in the kernel before this rank goes on (Operation.flushing)
      await op.written()
      await op.flushed()
      this.#deadlines?.noteCollective(performance.now() - started)
      return result
    } catch (e) {
      const err = op.failure ?? e
      op.fail(err)
      this.#abort(err)
      throw err
    } finally {
      this.#ops.delete(seq)
      this.#opDeadlines.delete(seq)
      this.#heldWaits.delete(seq)
      this.#resumedWaits.delete(seq)
      this.#directSeqs.delete(seq)
      if (this.#assembler.open > 0) this.#assembler.drop(seq)
    }
  }

  // ------------------------------------------------------------------------------------------
  // the direct path

  #sendDirect(seq: number, dst: number, data: Uint8Array, headers: MsgHdrs, written?: () => void): void {
    const d = this.#direct as DirectEndpoint
    if (!d.has(dst)) {
      const op = this.#ops.get(seq)
      throw new PeerLinkLost({ op: op?.sig.name ?? "collective", group: this.group, rank: this.rank, peer: dst })
    }
    headerBytesInto(headers, this.#headerScratch)
    d.send(dst, this.#headerScratch, data, written, this.#ops.get(seq)?.flushing(dst))
  }

  /** The ranks a fan-out subject reaches (every rank but this one, or one node's or server's). */
  #fanoutTargets(target: string): number[] {
    if (!this.#fanoutRanks) {
      const m = new Map<string, number[]>()
      const add = (k: string, r: number): void => {
        const l = m.get(k)
        if (l) l.push(r)
        else m.set(k, [r])
      }
      for (const p of this.peers) {
        if (p.rank === this.rank) continue
        add("all", p.rank)
        add(nodeTokenFor(p.node), p.rank)
        add(serverTokenFor(p.server), p.rank)
      }
      this.#fanoutRanks = m
    }
    return this.#fanoutRanks.get(target) ?? []
  }

  /**
   * A direct link to or from a peer closed while this communicator is open. A call waiting on that
   * peer learns at once whether it is gone (the deadline's probe, now): a killed peer is named
   * without waiting out timeoutMs. A call that still has frames to send it fails on the send.
   */
  #linkDown(peer: number, direction: "in" | "out", reason: string): void {
    if (direction === "out" && this.#directPeers.has(peer)) {
      const next = new Set(this.#directPeers)
      next.delete(peer)
      this.#directPeers = next
      this.#directWhyNot.set(peer, `the direct link closed (${reason}); NATS since`)
    }
    if (this.#closed !== undefined || this.#probe) return
    for (const op of this.#ops.values()) {
      if (op.failure === undefined && op.waiting && op.waitingFor().includes(peer)) {
        void this.#timeOut(op, this.#deadlineOf(op), peer)
        return
      }
    }
  }

  /**
   * Times all-reduces over the direct links, for the cost model's fit of them (the timings come
   * back as `direct`: `algorithm`, ring by default, at every size of the ladder and at `fitSizes`,
   * extra sizes timed over the direct links only).
   * With transport "auto" it also times the ladder over NATS (interleaved, median of `reps`) and
   * sends calls direct from the smallest size on which the direct path held (directHolds: at most
   * DIRECT_TIE slower) at that size and every larger one (never, if it lost at the largest). Every rank must call it at
   * the same point (the calls are collectives); each keeps its own threshold, since each sender
   * chooses the path of its own frames. On several nodes it then times exchanges at `pairSizes`
   * (default 4 KiB and 256 KiB) between each pair of nodes (`pairs`), for the fit of each pair's
   * links; a node's own pair OWN_NODE_REPS times as often, and at OWN_NODE_SIZE times the largest
   * too. Returns the figures; nothing is timed without direct links.
   */
  async measureTransport(
    opts: { sizes?: ReadonlyArray<number>; fitSizes?: ReadonlyArray<number>; pairSizes?: ReadonlyArray<number>; reps?: number; algorithm?: AllReduceAlgorithm } = {}
  ): Promise<TransportMeasurement> {
    const sizes = opts.sizes ?? [4 * 1024, 64 * 1024, 1024 * 1024]
    const fitSizes = opts.fitSizes ?? []
    const reps = opts.reps ?? 3
    const algorithm = opts.algorithm ?? "ring"
    const rows: Array<{ bytes: number; natsMs: number; directMs: number }> = []
    const direct: Array<{ bytes: number; ms: number }> = []
    if (this.#directPeers.size === 0 || this.#transport === "nats") return { minBytes: this.#directMinBytes, rows, direct, algorithm }
    const auto = this.#transport === "auto"
    const med = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
    for (const bytes of [...sizes, ...fitSizes.filter((b) => !sizes.includes(b))]) {
      const buf = new Float32Array(Math.max(1, bytes >> 2))
      const paths = auto && sizes.includes(bytes) ? (["nats", "direct"] as const) : (["direct"] as const)
      const t: Record<"nats" | "direct", number[]> = { nats: [], direct: [] }
      for (let i = 0; i <= reps; i++) {
        for (const transport of i % 2 === 0 ? paths : [...paths].reverse()) {
          buf.fill(1)
          const t0 = performance.now()
          await this.allReduce(buf, { algorithm, transport })
          if (i > 0) t[transport].push(performance.now() - t0) // the first round warms both paths up
        }
      }
      for (const ms of t.direct) direct.push({ bytes, ms })
      if (paths.length === 2) rows.push({ bytes, natsMs: med(t.nats), directMs: med(t.direct) })
    }
    const pairs = await this.#timePairs(opts.pairSizes ?? [4 * 1024, 256 * 1024], reps)
    if (!auto) return { minBytes: this.#directMinBytes, rows, direct, algorithm, ...(pairs ? { pairs } : {}) }
    let minBytes = Number.POSITIVE_INFINITY
    for (let i = rows.length - 1; i >= 0 && directHolds(rows[i]!); i--) minBytes = i === 0 ? 0 : rows[i]!.bytes
    this.#directMinBytes = minBytes
    return { minBytes, rows, direct, algorithm, ...(pairs ? { pairs } : {}) }
  }

  /**
   * On several nodes, the exchanges of pairProbeRounds over the direct links at each size, `reps`
   * times after a warm-up, each rank timing its own; one all-gather then gives every rank each
   * pair's times. Undefined on one node, or where a rank lacks a direct link to a peer (what those
   * exchanges timed would be NATS).
   */
  async #timePairs(sizes: ReadonlyArray<number>, reps: number): Promise<PairTiming[] | undefined> {
    const nodes = this.peers.map((p) => p.node)
    const rounds = pairProbeRounds(nodes)
    // The same decision on every rank: wholeDirect is agreed from the hellos.
    if (rounds.length === 0 || !this.#wholeDirect) return undefined
    const plan: Array<{ round: ReadonlyArray<readonly [number, number]>; bytes: number }> = []
    for (const round of rounds) {
      // A node's own links (a Unix socket) move 256 KiB in about a millisecond, which one time
      // slice lost to another process multiplies several times over (a loaded 2-core machine
      // timed 1.6, 8.2 and 12.9 ms, and the fit priced the node's links at 4x the slow link across
      // instead of 35x). Their round is cheap, so it is timed OWN_NODE_REPS times as often and at
      // OWN_NODE_SIZE times the largest size too, where the link's own time shows through the noise.
      const own = round.every(([a, b]) => nodes[a] === nodes[b])
      const roundSizes = own ? [...sizes, OWN_NODE_SIZE * Math.max(...sizes)] : sizes
      for (const bytes of roundSizes) for (let i = 0; i < (own ? OWN_NODE_REPS * reps : reps); i++) plan.push({ round, bytes })
    }
    const mine = new Float32Array(plan.length)
    for (let k = 0; k < plan.length; k++) {
      const { round, bytes } = plan[k]!
      const pair = round.find(([a, b]) => a === this.rank || b === this.rank)
      const partner = pair === undefined ? -1 : pair[0] === this.rank ? pair[1] : pair[0]
      const data = new Float32Array(Math.max(1, bytes >> 2)).fill(this.rank + 1)
      const out = new Float32Array(data.length)
      if (k === 0 || plan[k - 1]!.round !== round || plan[k - 1]!.bytes !== bytes) await this.#exchange(data, out, partner) // a warm-up per round and size
      const t0 = performance.now()
      await this.#exchange(data, out, partner)
      mine[k] = performance.now() - t0
      if (partner >= 0 && (out[0] !== partner + 1 || out[out.length - 1] !== partner + 1)) {
        throw new Error(`rank ${this.rank}: the timed exchange with rank ${partner} brought back ${out[0]}, not ${partner + 1}`)
      }
    }
    const all = await this.allGather(mine)
    return plan.flatMap(({ round, bytes }, k) => round.map(([a, b]) => ({ a, b, bytes, ms: Math.min(all[a * plan.length + k]!, all[b * plan.length + k]!) })))
  }

  /**
   * Every rank calls it together: this rank and `partner` send each other `data` at once (over the
   * direct links), the partner's landing in `out`; a rank with partner -1 only takes its turn.
   */
  async #exchange(data: Float32Array, out: Float32Array, partner: number): Promise<void> {
    await this.#run({ name: "exchange", opcode: Opcode.exchange, variant: 0, length: data.length, half: false }, { transport: "direct" }, async (op) => {
      if (partner >= 0) await exchangeBlock(op, data, out, partner, this.#chunkFor(data.length, 1))
    })
  }

  /**
   * Whether every rank of the group listens on the direct path and reads every peer's link: decided
   * at creation from the hellos alone, so the same on every rank (a link that closes later sends
   * over NATS from then on, without changing this).
   */
  get wholeDirect(): boolean {
    return this.#wholeDirect
  }

  /** How this rank's calls reach each peer. */
  get transport(): TransportInfo {
    const links = this.peers
      .filter((p) => p.rank !== this.rank)
      .map((p) => {
        const via = this.#directPeers.has(p.rank) ? this.#direct?.via(p.rank) : undefined
        if (via) return { rank: p.rank, via }
        const why = this.#directWhyNot.get(p.rank)
        return why ? { rank: p.rank, via: "nats" as const, why } : { rank: p.rank, via: "nats" as const }
      })
    return { choice: this.#transport, ...(this.#direct ? { address: this.#direct.address } : {}), minBytes: this.#directMinBytes, tls: this.#direct !== undefined && this.#directTls, links, bytesSent: this.#direct?.bytesSent ?? 0, bytesReceived: this.#direct?.bytesReceived ?? 0, rejected: this.#direct?.rejected ?? 0, framesInPlace: this.#direct?.framesInPlace ?? 0, wholeDirect: this.wholeDirect }
  }

  /**
   * Elements per chunk for a call moving `n` elements in `parts` segments: the agreed maximum for
   * large buffers, smaller for mid-sized ones so each segment still streams in about
   * #segmentChunks chunks, and never below 64 KiB, where per-message costs take over. The same on
   * every rank: it depends only on n, p and settings agreed at creation.
   */
  #chunkFor(n: number, parts: number): number {
    const floor = Math.min(this.chunkElems, MIN_CHUNK_ELEMS)
    return Math.max(floor, Math.min(this.chunkElems, Math.ceil(n / (this.#segmentChunks * parts))))
  }

  /** Rejects a bad argument the same way on this rank as a failure would: the group is aborted. */
  #argError(op: string, reason: string): never {
    const err = new CollectiveArgumentError({ op, reason })
    if (this.#closed === undefined) {
      // Consume the sequence number the peers are using for this call, then tell them.
      this.#nextSeq++
      this.#abort(err)
    }
    throw err
  }

  #wire(op: string, wire: WireFormat | undefined): boolean {
    if (wire === undefined || wire === "f32") return false
    if (wire === "f16") return true
    return this.#argError(op, `wire must be "f32" or "f16", got ${String(wire)}`)
  }

  #reduceOp(name: string, op: ReduceOp | undefined, weight: number | undefined): { op: ReduceOp; weight: number } {
    const r = op ?? "sum"
    if (!(r in reduceCode)) this.#argError(name, `op must be sum, mean, max or weightedMean, got ${String(op)}`)
    if (r !== "weightedMean") return { op: r, weight: 0 }
    const w = weight ?? 1
    if (!Number.isFinite(w) || w < 0) this.#argError(name, `weight must be a finite number >= 0, got ${w}`)
    return { op: r, weight: w }
  }

  #checkBuffer(op: string, data: unknown): asserts data is Float32Array {
    if (!(data instanceof Float32Array)) this.#argError(op, "expects a Float32Array")
  }

  // ------------------------------------------------------------------------------------------
  // collectives

  /** Resolves on every rank once all ranks have called it. */
  async barrier(opts: CallOptions = {}): Promise<void> {
    if (this.worldSize === 1) return
    await this.#run({ name: "barrier", opcode: Opcode.barrier, variant: 0, length: 0, half: false }, opts, (op) =>
      disseminationBarrier(op, this.worldSize)
    )
  }

  /** Copies `root`'s `data` into `data` on every rank (in place); returns `data`. */
  async broadcast(data: Float32Array, root: number, opts: BroadcastOptions = {}): Promise<Float32Array> {
    this.#checkBuffer("broadcast", data)
    if (!Number.isInteger(root) || root < 0 || root >= this.worldSize) this.#argError("broadcast", `root must be a rank in 0..${this.worldSize - 1}, got ${root}`)
    const algorithm = opts.algorithm ?? "fanout"
    if (algorithm !== "fanout" && algorithm !== "tree") this.#argError("broadcast", `algorithm must be "fanout" or "tree", got ${String(algorithm)}`)
    const half = this.#wire("broadcast", opts.wire)
    if (this.worldSize === 1) return data
    const variant = variantOf(broadcastCode[algorithm], 0, half)
    return this.#run({ name: "broadcast", opcode: Opcode.broadcast, variant, length: data.length, half }, opts, async (op) => {
      // The root keeps exactly what the others decode.
      if (half && this.rank === root) roundToHalf(data)
      await broadcastChunks(op, data, root, this.worldSize, this.#chunkFor(data.length, 1), half, algorithm === "fanout")
      return data
    })
  }

  /** Every rank's `data` (same length n on all), concatenated in rank order: p * n elements. */
  async allGather(data: Float32Array, opts: AllGatherOptions = {}): Promise<Float32Array> {
    this.#checkBuffer("allGather", data)
    const p = this.worldSize
    const n = data.length
    const out = opts.out ?? new Float32Array(p * n)
    if (out.length !== p * n) this.#argError("allGather", `out must hold worldSize * data.length = ${p * n} elements, has ${out.length}`)
    const algorithm = opts.algorithm ?? "fanout"
    if (algorithm !== "fanout" && algorithm !== "ring") this.#argError("allGather", `algorithm must be "fanout" or "ring", got ${String(algorithm)}`)
    const half = this.#wire("allGather", opts.wire)
    out.set(data, this.rank * n)
    if (p === 1) return out
    if (half) roundToHalf(out.subarray(this.rank * n, (this.rank + 1) * n))
    const variant = variantOf(gatherCode[algorithm], 0, half)
    // The length on the wire is the total, so a rank with a different block size is caught.
    return this.#run({ name: "allGather", opcode: Opcode.allGather, variant, length: p * n, half }, opts, async (op) => {
      await allGatherBlocks(op, out, n, p, this.#chunkFor(n, 1), half, algorithm === "fanout")
      return out
    })
  }

  /**
   * Every rank's `data` (same length n on all) to the next rank (rank + 1 mod p; rank + `by` with
   * `by`, the same on every rank); returns the previous rank's (rank - by mod p), in `out` when
   * given (n elements), bit for bit (f32 on the wire). With by = 1 one step of the ring all-gather:
   * n elements sent and received per rank. With p = 1, this rank's own data.
   */
  async shift(data: Float32Array, opts: CallOptions & { readonly out?: Float32Array; readonly by?: number } = {}): Promise<Float32Array> {
    this.#checkBuffer("shift", data)
    const n = data.length
    const out = opts.out ?? new Float32Array(n)
    const by = opts.by ?? 1
    if (out.length !== n) this.#argError("shift", `out must hold data.length = ${n} elements, has ${out.length}`)
    if (out === data) this.#argError("shift", "out must not be data itself (it is sent while the previous rank's arrives)")
    if (this.worldSize > 1 && (!Number.isInteger(by) || by < 1 || by >= this.worldSize)) this.#argError("shift", `by must be an integer in [1, ${this.worldSize - 1}], got ${String(by)}`)
    if (this.worldSize === 1) {
      out.set(data)
      return out
    }
    return this.#run({ name: "shift", opcode: Opcode.shift, variant: 0, length: n, half: false }, opts, async (op) => {
      await shiftBlock(op, data, out, this.worldSize, this.#chunkFor(n, 1), by)
      return out
    })
  }

  /**
   * Reduces `data` over all ranks and leaves this rank's segment of the result (segmentBounds(n, p,
   * rank)) in place; returns that segment as a view. The rest of `data` holds partial sums.
   */
  async reduceScatter(data: Float32Array, opts: ReduceScatterOptions = {}): Promise<Float32Array> {
    this.#checkBuffer("reduceScatter", data)
    const { op: rop, weight } = this.#reduceOp("reduceScatter", opts.op, opts.weight)
    const half = this.#wire("reduceScatter", opts.wire)
    const [s, e] = segmentBounds(data.length, this.worldSize, this.rank)
    if (this.worldSize === 1) return soloResult(data, rop, weight).subarray(s, e)
    const variant = variantOf(0, reduceCode[rop], half)
    return this.#run({ name: "reduceScatter", opcode: Opcode.reduceScatter, variant, length: data.length, half }, opts, async (op) => {
      if (rop === "weightedMean") scale(data, 0, data.length, weight)
      const reduce: Reduction = { op: rop, count: this.worldSize, weight, half }
      await ringReduce(op, data, { members: this.#ranks, index: this.rank, chunkElems: this.#chunkFor(data.length, this.worldSize), stepBase: 0, reduce, scatterOnly: true })
      return data.subarray(s, e)
    })
  }

  /**
   * A zeroed array of `n` floats for allReduce whose sums run in place: it lives in WebAssembly
   * memory (collectives/simd.ts) beside slots that the direct path reads the ring's received
   * reduce-scatter frames into, so neither operand of a sum is copied through the kernels' scratch
   * blocks (a 64 MiB ring all-reduce at p = 4 and 8 on 2 cores: 4-10 ms of CPU a call less). Make
   * it once and reuse it, as one keeps a tensor. An ordinary Float32Array where WebAssembly SIMD is
   * off or `n` is too large; allReduce takes any Float32Array.
   */
  allocate(n: number): Float32Array {
    if (!Number.isSafeInteger(n) || n < 0) this.#argError("allocate", `expects a count of floats (a whole number >= 0), got ${n}`)
    // what a link's window holds in flight, as many again held to be passed on, and two spare
    const slots = Math.min(256, Math.ceil((2 * this.windowBytes) / (this.chunkElems * 4)) + 2)
    return simdSpaceWithSlots([n], this.chunkElems * 4, slots)?.[0] ?? new Float32Array(n)
  }

  /**
   * Reduces `data` over all ranks, in place; returns `data`. Every rank ends with bitwise the same
   * values. With p = 1 it returns at once, with no traffic.
   */
  async allReduce(data: Float32Array, opts: AllReduceOptions = {}): Promise<Float32Array> {
    this.#checkBuffer("allReduce", data)
    const { op: rop, weight } = this.#reduceOp("allReduce", opts.op, opts.weight)
    const name = opts.algorithm ?? "ring"
    const algorithm = typeof name === "string" ? findAllReduceAlgorithm(name) : undefined
    if (algorithm === undefined) return this.#argError("allReduce", `algorithm must be ${allowedAlgorithms()}, got ${String(name)}`)
    const hierarchy = opts.hierarchy ?? "node"
    if (hierarchy !== "node" && hierarchy !== "server") this.#argError("allReduce", `hierarchy must be "node" or "server", got ${String(hierarchy)}`)
    const half = this.#wire("allReduce", opts.wire)
    const halfInput = opts.halfInput
    if (halfInput !== undefined) {
      if (!(halfInput instanceof Uint16Array)) this.#argError("allReduce", "halfInput must be a Uint16Array of binary16 bits")
      if (halfInput.length !== data.length) this.#argError("allReduce", `halfInput has ${halfInput.length} values for ${data.length} elements of data; pass one binary16 value per element`)
      if (!half || rop !== "sum") this.#argError("allReduce", `halfInput needs op "sum" and wire "f16", got op "${rop}" and wire "${opts.wire ?? "f32"}"`)
    }
    let halfSource = opts.halfSource
    if (halfSource !== undefined) {
      if (typeof halfSource?.bits !== "function" || typeof halfSource.addInto !== "function" || typeof halfSource.load !== "function") {
        this.#argError("allReduce", "halfSource must have bits, addInto and load methods (see HalfSource)")
      }
      if (halfInput !== undefined) this.#argError("allReduce", "pass halfInput or halfSource, not both")
      if (!half || rop !== "sum") this.#argError("allReduce", `halfSource needs op "sum" and wire "f16", got op "${rop}" and wire "${opts.wire ?? "f32"}"`)
    }
    // binary16 input bits are the simplest source
    if (halfInput !== undefined) halfSource = halfBitsSource(halfInput, data)
    // only an algorithm that says so takes its values on demand; the others start from them in `data`
    if (halfSource !== undefined && (this.worldSize === 1 || algorithm.takesHalfSource !== true)) {
      decodeSourceBits(halfSource, data)
      halfSource = undefined
    }
    if (this.worldSize === 1) return soloResult(data, rop, weight)
    const fanout = opts.fanout !== false
    const variant = variantOf(algorithm.code, reduceCode[rop], half, !fanout && algorithm.usesFanout === true)
    return this.#run({ name: "allReduce", opcode: Opcode.allReduce, variant, length: data.length, half }, opts, async (op) => {
      if (rop === "weightedMean") scale(data, 0, data.length, weight)
      const call: AllReduceCall = {
        op,
        data,
        rank: this.rank,
        worldSize: this.worldSize,
        ranks: this.#ranks,
        chunkElems: this.#chunkFor(data.length, this.worldSize),
        reduce: { op: rop, count: this.worldSize, weight, half },
        fanout,
        halfSource,
        nodeGroups: () => this.nodeGroups(hierarchy)
      }
      await algorithm.run(call)
      return data
    })
  }

  /** Ranks grouped by node id (or NATS server), each group ascending, groups ordered by their first rank. */
  nodeGroups(hierarchy: "node" | "server" = "node"): NodeGroup[] {
    const byKey = new Map<string, number[]>()
    for (const peer of this.peers) {
      const key = hierarchy === "node" ? peer.node : peer.server
      const list = byKey.get(key)
      if (list) list.push(peer.rank)
      else byKey.set(key, [peer.rank])
    }
    return [...byKey.entries()]
      .map(([key, ranks]) => ({ ranks, fanoutToken: hierarchy === "node" ? nodeTokenFor(key) : serverTokenFor(key) }))
      .sort((a, b) => a.ranks[0] - b.ranks[0])
  }

  /** Frames this rank sent through NATS in pieces (over max_payload: splitFrame), and split frames it put together again. */
  get splitFrames(): { readonly sent: number; readonly assembled: number } {
    return { sent: this.#splitSent, assembled: this.#assembler.assembled }
  }

  /** True once the group is aborted or closed. */
  get closed(): boolean {
    return this.#closed !== undefined
  }

  /**
   * Leaves the group: unsubscribes. Calls still running fail with CommunicatorClosed, and the
   * other ranks are told (their running calls fail fast instead of timing out).
   */
  async close(): Promise<void> {
    if (this.#closed === undefined && this.#ops.size > 0) {
      this.#abort(new CommunicatorClosed({ op: "close", group: this.group, rank: this.rank, reason: "close() was called while collectives were running" }))
    }
    this.#closed ??= new CommunicatorClosed({ op: "close", group: this.group, rank: this.rank, reason: "closed" })
    if (this.#watchdog) clearInterval(this.#watchdog)
    this.#watchdog = undefined
    for (const it of this.#statusIters) it.stop?.()
    this.#statusIters.length = 0
    for (const s of this.#subs) s.unsubscribe()
    this.#subs.length = 0
    this.#clearEarly()
    this.#assembler.clear()
    if (this.#nc && !this.#nc.isClosed()) await this.#nc.flush().catch(() => {})
    if (this.#cnc && this.#cnc !== this.#nc && !this.#cnc.isClosed()) await this.#cnc.flush().catch(() => {})
    await this.#direct?.close()
  }
}
