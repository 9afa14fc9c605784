// Alpha-beta cost model of gradwire's collectives over NATS: fitted from probe measurements, it
// predicts how long each all-reduce algorithm (ring, tree, hierarchical, ...) takes for a message
// size and a topology, so algorithm-choice.ts can pick the cheapest per bucket. Pure arithmetic,
// no I/O.
//
// Links. A message of b bytes between two ranks costs  t = alpha_c + b * beta_c,  where the link
// class c is 'same-node' (same host, same NATS server), 'same-server' (different hosts, same NATS
// server) or 'cross-server' (the route between two NATS servers). alpha, beta are fitted per class
// by weighted least squares over (bytes, one-way ms) samples: the lower quartile per size first
// (robust to outliers, and load on the machine only ever adds time, so the faster samples are the
// link's), weights 1/t^2 (relative error, so 16-byte probes pin alpha and 64 MiB probes pin beta
// instead of the largest size dominating), both clamped to >= 0.
//
// NATS is a hub. Every byte goes client -> nats-server -> client, so flows that run at the same time
// share their servers. Each server s relays B_s bytes/ms (delivered bytes; default: one flow's rate
// 1/beta_same-server, i.e. a single-core server, which is what a 2-core box shows) and spends a_s ms
// on every message it delivers (default: one message's alpha_same-server, by the same argument: a
// server serialises what a lone flow sees as its per-message cost). A flow loads every server it
// touches: the destination's server with one message of its bytes per delivered copy, plus the
// source's server with one message when the bytes cross a route. An algorithm is a sequence of
// stages; in a stage a set of flows {src -> dsts, bytes} runs concurrently (a multi-destination flow
// is one publish that the server fans out), and
//
//   stage = max( max_flow alpha_c
//                + max_rank max(sum_sent bytes*beta_c, sum_received bytes*beta_c),  (a client's
//                                                    socket, full duplex; one publish per flow)
//                max_server (msgs_s * a_s + bytes_s / B_s) )                       (the shared hub)
//
// A lone flow costs alpha + b*beta either way; concurrent messages overlap on the links but queue
// at the hub, so a stage of p messages costs about p*a on one server, not one alpha.
//
// Algorithms. Each all-reduce algorithm declares its stages next to its implementation
// (collectives/algorithms/: ring, tree, hierarchical, ...; the vocabulary is core/collective-cost.ts)
// and the caller hands the entries in, since the scheduler does not import the collectives. A
// fan-out stage is one publish that the server copies to every other member: the sender pays the
// bytes once, the hub p-1 deliveries, each receiver one copy, and the stage one alpha (not p-1
// relay hops). For example the ring (p ranks, n bytes): p-1 relay stages of n/p, then one fan-out
// all-gather stage, so without the hub term T = p*alpha + 2(p-1)/p*n*beta; on one server every
// stage moves n bytes through the hub, so T -> 2(p-1) * n / B. The tree: h + k stages for k chunks
// (latency grows with log2 p, so it wins small messages; its k alphas lose large ones).
// p = 1 costs 0 (no traffic).
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import { COST_MODEL_CHUNK_BYTES } from "../core/defaults.ts"
import type { AlgorithmCost, Flow, RankLocation, Topology } from "../core/collective-cost.ts"
import { formatBytes } from "./resources.ts"

export { nodeGroups, type AlgorithmCost, type Flow, type RankLocation, type Topology } from "../core/collective-cost.ts"

export type LinkClass = "same-node" | "same-server" | "cross-server"
export const linkClasses: readonly LinkClass[] = ["same-node", "same-server", "cross-server"]

export interface AlphaBeta {
  /** Fixed cost of one message, ms (one way). */
  readonly alphaMs: number
  /** Cost per byte, ms/byte (1 / bandwidth). */
  readonly betaMsPerByte: number
}

export interface CostModel {
  readonly links: Readonly<Record<LinkClass, AlphaBeta>>
  /**
   * Each pair of nodes' links through NATS (`pairs[a][b]`, both orders, a node with itself for
   * its ranks' links), where the probe reached them on a group of several nodes: a flow is priced
   * on its nodes' pair, and on `links` by class where the pair is missing.
   */
  readonly pairs?: NodePairLinks
  /** Throughput of each NATS server in delivered bytes/ms, by server id. */
  readonly serverBytesPerMs?: Readonly<Record<string, number>>
  /** For servers not listed above; default 1 / links['same-server'].betaMsPerByte. */
  readonly defaultServerBytesPerMs?: number
  /** Time each NATS server spends per delivered message, ms, by server id. */
  readonly serverMsPerMessage?: Readonly<Record<string, number>>
  /** For servers not listed above (0 allowed: no per-message hub cost); default links['same-server'].alphaMs. */
  readonly defaultServerMsPerMessage?: number
  /** Chunk of tree / hierarchical streams: the communicator's (chunkElems * 4); default DEFAULT_CHUNK_BYTES. */
  readonly chunkBytes?: number
  /** How hierarchical groups ranks: per node (default) or per NATS server, as the collective is configured. */
  readonly hierarchicalGroups?: "node" | "server"
  /**
   * The direct data path (collectives/direct.ts), when the group has one: calls of at least
   * `minBytes` are priced on these links instead of NATS's.
   */
  readonly direct?: DirectLinks
}

/**
 * The direct data path as the model prices it. Frames go from a rank's socket straight to the
 * peer's (a Unix socket on one node, TCP across), so a stage has no hub term: it costs its largest
 * alpha plus the busiest rank's sent or received bytes times beta (or the busiest node's to and
 * from other nodes, which its ranks share), and a fan-out is one send per receiver (the sender
 * pays its bytes once per destination). Fitted from the group's own timed calls over those
 * links (fitDirectLinks): on one node every link alike, on several each pair of nodes in
 * proportion to exchanges timed between them (fitDirectPairs).
 */
export interface DirectLinks {
  readonly links: Readonly<Record<LinkClass, AlphaBeta>>
  /**
   * Each pair of nodes' links (`pairs[a][b]`, both orders, a node with itself for its ranks'
   * links to each other), where the group spans several nodes and timed exchanges between them
   * (fitDirectPairs): a stage prices a flow on its nodes' pair, and on `links` by class where the
   * pair is missing.
   */
  readonly pairs?: NodePairLinks
  /** Calls of at least this many bytes go direct (the communicator's threshold; 0: every call). */
  readonly minBytes: number
  /** What the links were fitted from, for explanations ("ring over the direct links at 3 sizes"). */
  readonly source?: string
  /** Root-mean-square relative error of the fit over its timings. */
  readonly rmsRelativeError?: number
}

/** One probe measurement: a message of `bytes` took `ms` one way (halve a round trip). */
export interface ProbeSample {
  readonly bytes: number
  readonly ms: number
}

export interface PhasePrediction {
  readonly name: string
  readonly stages: number
  readonly ms: number
}

export interface Prediction {
  readonly algorithm: string
  readonly bytes: number
  readonly ranks: number
  readonly ms: number
  /** The data path the call is priced on (the direct links from the model's `direct.minBytes` on). */
  readonly path?: "nats" | "direct"
  readonly phases: readonly PhasePrediction[]
  /** What dominates: "latency", "link" or "server <id>". */
  readonly bottleneck: string
}

export class CostModelFitError extends Schema.TaggedError<CostModelFitError>()("CostModelFitError", {
  linkClass: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return (
      `cannot fit the ${this.linkClass} link: ${this.reason}. Probe at least two message sizes far apart ` +
      `(e.g. 16 B and 1 MiB), each a few times, with finite positive timings.`
    )
  }
}

/** The chunk assumed when the model is not told the communicator's (core/defaults.ts). */
export const DEFAULT_CHUNK_BYTES = COST_MODEL_CHUNK_BYTES

/**
 * Loopback figures measured on a 2-core development machine (nats-server request-reply of 16 B:
 * 0.32 ms median round trip, as `npm run bench -- actors` measures raw NATS; one publisher to one
 * subscriber with 1 MiB messages: 0.55 GB/s, nats-server taking a whole core, as `npm run bench --
 * codec` measures raw NATS); cross-server guessed at 1.5x. A placeholder until a probe has run.
 */
export const defaultCostModel = (): CostModel => ({
  links: {
    "same-node": { alphaMs: 0.16, betaMsPerByte: 1 / 550_000 },
    "same-server": { alphaMs: 0.16, betaMsPerByte: 1 / 550_000 },
    "cross-server": { alphaMs: 0.25, betaMsPerByte: 1.5 / 550_000 }
  },
  chunkBytes: DEFAULT_CHUNK_BYTES
})

export const median = (xs: readonly number[]): number => {
  if (xs.length === 0) return Number.NaN
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2
}

/** The lower quartile (linear interpolation between order statistics). */
export const lowerQuartile = (xs: readonly number[]): number => {
  if (xs.length === 0) return Number.NaN
  const s = [...xs].sort((a, b) => a - b)
  const at = (s.length - 1) * 0.25
  const lo = Math.floor(at)
  return s[lo]! + (at - lo) * (s[Math.min(lo + 1, s.length - 1)]! - s[lo]!)
}

export interface FittedLink extends AlphaBeta {
  readonly sizes: number
  readonly samples: number
  /** Root-mean-square relative error of the fit over the per-size lower quartiles. */
  readonly rmsRelativeError: number
}

/** Fits alpha and beta for one link class; see the module comment for the method. */
export const fitAlphaBeta = (samples: readonly ProbeSample[], linkClass: string = "link"): Result.Result<FittedLink, CostModelFitError> => {
  const good = samples.filter((s) => Number.isFinite(s.bytes) && s.bytes >= 0 && Number.isFinite(s.ms) && s.ms > 0)
  const bySize = lowerQuartileBySize(good)
  if (bySize.length < 2) {
    return Result.fail(
      new CostModelFitError({
        linkClass,
        reason: `${good.length} usable sample(s) over ${bySize.length} distinct size(s) (${samples.length - good.length} dropped as non-finite or <= 0 ms)`
      })
    )
  }
  const pts = bySize.map(([x, y]) => ({ a: 1, b: x, y }))
  const { alpha, beta, rms } = fitTwoTerms(pts)
  return Result.succeed({ alphaMs: alpha, betaMsPerByte: beta, sizes: pts.length, samples: good.length, rmsRelativeError: rms })
}

/** Per distinct size, the lower quartile of its times (load only ever adds time). */
const lowerQuartileBySize = (samples: ReadonlyArray<{ readonly bytes: number; readonly ms: number }>): Array<[number, number]> => {
  const bySize = new Map<number, number[]>()
  for (const s of samples) {
    const xs = bySize.get(s.bytes)
    if (xs) xs.push(s.ms)
    else bySize.set(s.bytes, [s.ms])
  }
  return [...bySize].map(([bytes, ms]) => [bytes, lowerQuartile(ms)])
}

/**
 * Least squares of y = alpha a + beta b, weighted 1/y^2 (relative error), both clamped to >= 0
 * (noise that makes one negative: refit with the other alone). Returns the root-mean-square
 * relative error too.
 */
const fitTwoTerms = (pts: ReadonlyArray<{ readonly a: number; readonly b: number; readonly y: number }>): { alpha: number; beta: number; rms: number } => {
  let saa = 0, sab = 0, sbb = 0, say = 0, sby = 0
  for (const { a, b, y } of pts) {
    const w = 1 / (y * y)
    saa += w * a * a
    sab += w * a * b
    sbb += w * b * b
    say += w * a * y
    sby += w * b * y
  }
  const det = saa * sbb - sab * sab
  let alpha = det !== 0 ? (say * sbb - sab * sby) / det : Number.NaN
  let beta = det !== 0 ? (saa * sby - sab * say) / det : Number.NaN
  if (!(alpha >= 0)) {
    // Noise made the intercept negative: refit through the origin.
    alpha = 0
    beta = sbb > 0 ? sby / sbb : 0
  }
  if (!(beta >= 0)) {
    beta = 0
    alpha = saa > 0 ? say / saa : 0
  }
  const rel = pts.map(({ a, b, y }) => (alpha * a + beta * b - y) / y)
  return { alpha, beta, rms: Math.sqrt(rel.reduce((s, r) => s + r * r, 0) / rel.length) }
}

/**
 * Aggregate throughput of a server from concurrent-flow probes: (bytes delivered in total, ms the
 * whole round took). The median of the rates, so one slow round does not drag it down.
 */
export const estimateServerBandwidth = (rounds: readonly ProbeSample[]): number | undefined => {
  const rates = rounds.filter((r) => r.ms > 0 && r.bytes > 0 && Number.isFinite(r.ms)).map((r) => r.bytes / r.ms)
  return rates.length === 0 ? undefined : median(rates)
}

export interface FittedCostModel extends CostModel {
  readonly fits: Readonly<Partial<Record<LinkClass, FittedLink>>>
  /** Classes with no samples, borrowed from a measured neighbour class (say so in explain output). */
  readonly assumed: Readonly<Partial<Record<LinkClass, LinkClass>>>
}

/**
 * Fits every class that has samples; a class without samples (a topology that has no such link)
 * borrows the nearest measured one: same-node <-> same-server, then cross-server.
 */
export const fitCostModel = (
  samples: Readonly<Partial<Record<LinkClass, readonly ProbeSample[]>>>,
  options: {
    readonly serverBytesPerMs?: Readonly<Record<string, number>>
    readonly defaultServerBytesPerMs?: number
    readonly serverMsPerMessage?: Readonly<Record<string, number>>
    readonly defaultServerMsPerMessage?: number
    readonly chunkBytes?: number
  } = {}
): Result.Result<FittedCostModel, CostModelFitError> => {
  const fits: Partial<Record<LinkClass, FittedLink>> = {}
  for (const c of linkClasses) {
    const s = samples[c]
    if (s === undefined || s.length === 0) continue
    const f = fitAlphaBeta(s, c)
    if (Result.isFailure(f)) return Result.fail(f.failure)
    fits[c] = f.success
  }
  const fallback: Record<LinkClass, readonly LinkClass[]> = {
    "same-node": ["same-server", "cross-server"],
    "same-server": ["same-node", "cross-server"],
    "cross-server": ["same-server", "same-node"]
  }
  const links = {} as Record<LinkClass, AlphaBeta>
  const assumed: Partial<Record<LinkClass, LinkClass>> = {}
  for (const c of linkClasses) {
    const own = fits[c]
    if (own) {
      links[c] = { alphaMs: own.alphaMs, betaMsPerByte: own.betaMsPerByte }
      continue
    }
    const from = fallback[c].find((d) => fits[d] !== undefined)
    if (from === undefined) return Result.fail(new CostModelFitError({ linkClass: "any", reason: "no link class has samples" }))
    links[c] = { alphaMs: fits[from]!.alphaMs, betaMsPerByte: fits[from]!.betaMsPerByte }
    assumed[c] = from
  }
  return Result.succeed({
    links,
    fits,
    assumed,
    ...(options.serverBytesPerMs ? { serverBytesPerMs: options.serverBytesPerMs } : {}),
    ...(options.defaultServerBytesPerMs ? { defaultServerBytesPerMs: options.defaultServerBytesPerMs } : {}),
    ...(options.serverMsPerMessage ? { serverMsPerMessage: options.serverMsPerMessage } : {}),
    ...(options.defaultServerMsPerMessage !== undefined ? { defaultServerMsPerMessage: options.defaultServerMsPerMessage } : {}),
    chunkBytes: options.chunkBytes ?? DEFAULT_CHUNK_BYTES
  })
}

export const linkClassOf = (a: RankLocation, b: RankLocation): LinkClass =>
  a.server !== b.server ? "cross-server" : a.nodeId === b.nodeId ? "same-node" : "same-server"

export interface StageCost {
  readonly ms: number
  readonly latencyMs: number
  readonly linkMs: number
  readonly serverMs: number
  readonly busiestServer: string
}

const serverRate = (model: CostModel, server: string): number => {
  const own = model.serverBytesPerMs?.[server]
  if (own !== undefined && own > 0) return own
  if (model.defaultServerBytesPerMs !== undefined && model.defaultServerBytesPerMs > 0) return model.defaultServerBytesPerMs
  const beta = model.links["same-server"].betaMsPerByte
  return beta > 0 ? 1 / beta : Number.POSITIVE_INFINITY
}

const serverMsPerMessage = (model: CostModel, server: string): number => {
  const own = model.serverMsPerMessage?.[server]
  if (own !== undefined && own >= 0) return own
  if (model.defaultServerMsPerMessage !== undefined && model.defaultServerMsPerMessage >= 0) return model.defaultServerMsPerMessage
  return model.links["same-server"].alphaMs
}

/**
 * A stage over the direct links: no hub; the largest alpha plus the busiest rank's sent or received
 * bytes times beta, a multi-destination flow being one send per receiver, or the busiest node's
 * bytes to or from other nodes where that is more: a node's ranks share its network link (two
 * ranks of a node each sending to the other node take twice as long as one).
 */
const directStageCost = (flows: readonly Flow[], topo: Topology, direct: DirectLinks): StageCost => {
  const { links, pairs } = direct
  let latency = 0
  const tx = new Map<number, number>()
  const rx = new Map<number, number>()
  const nodeTx = new Map<string, number>()
  const nodeRx = new Map<string, number>()
  const bump = <K>(m: Map<K, number>, k: K, v: number) => m.set(k, (m.get(k) ?? 0) + v)
  for (const f of flows) {
    const src = topo[f.src]!
    for (const d of f.dsts) {
      const dst = topo[d]!
      const link = pairs?.[src.nodeId]?.[dst.nodeId] ?? links[linkClassOf(src, dst)]
      latency = Math.max(latency, link.alphaMs)
      bump(tx, f.src, f.bytes * link.betaMsPerByte)
      bump(rx, d, f.bytes * link.betaMsPerByte)
      if (src.nodeId !== dst.nodeId) {
        bump(nodeTx, src.nodeId, f.bytes * link.betaMsPerByte)
        bump(nodeRx, dst.nodeId, f.bytes * link.betaMsPerByte)
      }
    }
  }
  let linkMs = 0
  for (const m of [tx, rx, nodeTx, nodeRx]) for (const v of m.values()) linkMs = Math.max(linkMs, v)
  return { ms: latency + linkMs, latencyMs: latency, linkMs, serverMs: 0, busiestServer: "" }
}

/** Cost of one stage (the formula in the module comment); over the model's direct links with path "direct". */
export const stageCost = (flows: readonly Flow[], topo: Topology, model: CostModel, path: "nats" | "direct" = "nats"): StageCost => {
  if (path === "direct" && model.direct !== undefined) return directStageCost(flows, topo, model.direct)
  let latency = 0
  // Sending and receiving are separate directions of a full-duplex socket: a ring rank does both
  // in every stage at full speed, a tree parent receiving two children's chunks does not.
  const tx = new Map<number, number>()
  const rx = new Map<number, number>()
  const load = new Map<string, number>()
  const msgs = new Map<string, number>()
  const bump = <K>(m: Map<K, number>, k: K, v: number) => m.set(k, (m.get(k) ?? 0) + v)
  for (const f of flows) {
    if (f.dsts.length === 0) continue
    const src = topo[f.src]!
    let sendBeta = 0
    let crosses = false
    for (const d of f.dsts) {
      const dst = topo[d]!
      const link = model.pairs?.[src.nodeId]?.[dst.nodeId] ?? model.links[linkClassOf(src, dst)]
      latency = Math.max(latency, link.alphaMs)
      sendBeta = Math.max(sendBeta, link.betaMsPerByte)
      bump(rx, d, f.bytes * link.betaMsPerByte)
      bump(load, dst.server, f.bytes)
      bump(msgs, dst.server, 1)
      if (dst.server !== src.server) crosses = true
    }
    bump(tx, f.src, f.bytes * sendBeta)
    if (crosses) {
      bump(load, src.server, f.bytes)
      bump(msgs, src.server, 1)
    }
  }
  let linkMs = 0
  for (const v of tx.values()) linkMs = Math.max(linkMs, v)
  for (const v of rx.values()) linkMs = Math.max(linkMs, v)
  let serverMs = 0
  let busiest = ""
  for (const [s, bytes] of load) {
    const t = (msgs.get(s) ?? 0) * serverMsPerMessage(model, s) + bytes / serverRate(model, s)
    if (t > serverMs) {
      serverMs = t
      busiest = s
    }
  }
  return { ms: Math.max(latency + linkMs, serverMs), latencyMs: latency, linkMs, serverMs, busiestServer: busiest }
}

interface PhaseAcc {
  name: string
  stages: number
  ms: number
  latencyMs: number
  linkMs: number
  serverMs: number
  servers: Map<string, number>
}

const newPhase = (name: string): PhaseAcc => ({ name, stages: 0, ms: 0, latencyMs: 0, linkMs: 0, serverMs: 0, servers: new Map() })

const addStage = (ph: PhaseAcc, c: StageCost, times: number): void => {
  if (times <= 0) return
  ph.stages += times
  ph.ms += c.ms * times
  // Attribute the stage to whichever bound it: the hub, or a message's latency plus its link time.
  if (c.serverMs > c.latencyMs + c.linkMs) {
    ph.serverMs += c.serverMs * times
    ph.servers.set(c.busiestServer, (ph.servers.get(c.busiestServer) ?? 0) + c.serverMs * times)
  } else {
    ph.latencyMs += c.latencyMs * times
    ph.linkMs += c.linkMs * times
  }
}

const finish = (algorithm: string, bytes: number, p: number, phases: PhaseAcc[], path: "nats" | "direct" = "nats"): Prediction => {
  const ms = phases.reduce((s, ph) => s + ph.ms, 0)
  const lat = phases.reduce((s, ph) => s + ph.latencyMs, 0)
  const link = phases.reduce((s, ph) => s + ph.linkMs, 0)
  const servers = new Map<string, number>()
  for (const ph of phases) for (const [s, t] of ph.servers) servers.set(s, (servers.get(s) ?? 0) + t)
  let top = ""
  let topMs = 0
  for (const [s, t] of servers) if (t > topMs) [top, topMs] = [s, t]
  const bottleneck = ms === 0 ? "none" : lat >= link && lat >= topMs ? "latency" : link >= topMs ? "link" : `server ${top}`
  return {
    algorithm,
    bytes,
    ranks: p,
    ms,
    path,
    phases: phases.filter((ph) => ph.stages > 0).map((ph) => ({ name: ph.name, stages: ph.stages, ms: ph.ms })),
    bottleneck
  }
}

/** Chunk of the algorithms' pipelined streams (the model's, default 1 MiB). */
const chunkBytesOf = (model: CostModel): number =>
  model.chunkBytes !== undefined && model.chunkBytes > 0 ? model.chunkBytes : DEFAULT_CHUNK_BYTES

/** Predicted time of one all-reduce of `bytes` over `topo` (rank i at topo[i]) by `algorithm`. */
export const predictAllReduce = (algorithm: AlgorithmCost, bytes: number, topo: Topology, model: CostModel): Prediction => {
  const p = topo.length
  const path = pathOf(bytes, model)
  if (p <= 1 || bytes <= 0) return finish(algorithm.name, bytes, p, [], path)
  const input = { bytes, topology: topo, chunkBytes: chunkBytesOf(model), hierarchy: model.hierarchicalGroups ?? "node", fanout: true }
  const phases = algorithm.stages(input).map((declared) => {
    const ph = newPhase(declared.name)
    for (const stage of declared.stages) addStage(ph, stageCost(stage.flows, topo, model, path), stage.times)
    return ph
  })
  return finish(algorithm.name, bytes, p, phases, path)
}

/** The path a call of `bytes` takes: direct from the model's `direct.minBytes` on, else NATS. */
export const pathOf = (bytes: number, model: CostModel): "nats" | "direct" =>
  model.direct !== undefined && bytes >= model.direct.minBytes ? "direct" : "nats"

/** One timed call over the direct links: the all-reduce of `bytes` took `ms` (the slowest rank's time, or one rank's). */
export interface DirectTiming {
  readonly bytes: number
  readonly ms: number
}

/**
 * Fits the direct links' alpha and beta from timed all-reduces of one algorithm over them: the
 * algorithm's declared stages give, per size, how many alphas (a) and how many bytes' worth of
 * beta (b) lie on its critical path when every link class has the same alpha and beta, so each
 * timing is  ms = alpha * a + beta * b; solved by least squares weighted 1/ms^2 over the per-size
 * lower quartiles (as fitAlphaBeta does), both clamped to >= 0. The same alpha and beta for every
 * class: the timed calls cross all of them and are bounded by the slowest, which is what a
 * collective over those links pays. Needs at least two sizes.
 *
 * With `pairs` (each pair of nodes' links, fitDirectPairs: a group on several nodes), the links
 * keep the pairs' proportions instead: a and b are the critical path's alphas and bytes priced on
 * each pair's own alpha and beta, and the fit finds the two factors that scale every pair's alpha
 * and beta to what the timed calls took (a collective pays for its lockstep and its arithmetic,
 * which an exchange between two ranks does not). A hierarchical all-reduce then sees that its
 * ranks on one node talk faster than across nodes, which one alpha and beta for every link hid.
 */
export const fitDirectLinks = (
  algorithm: AlgorithmCost,
  timings: readonly DirectTiming[],
  topo: Topology,
  opts: { readonly chunkBytes?: number; readonly minBytes?: number; readonly hierarchicalGroups?: "node" | "server"; readonly pairs?: NodePairLinks } = {}
): Result.Result<DirectLinks, CostModelFitError> => {
  const pairs = opts.pairs !== undefined && coversTopology(opts.pairs, topo) ? opts.pairs : undefined
  const unit = (alphaMs: number, betaMsPerByte: number): CostModel => {
    const l = { alphaMs, betaMsPerByte }
    const links = { "same-node": l, "same-server": l, "cross-server": l }
    return {
      links,
      chunkBytes: opts.chunkBytes ?? DEFAULT_CHUNK_BYTES,
      ...(opts.hierarchicalGroups ? { hierarchicalGroups: opts.hierarchicalGroups } : {}),
      direct: { links, minBytes: 0, ...(pairs ? { pairs: scalePairs(pairs, alphaMs, betaMsPerByte) } : {}) }
    }
  }
  const bySize = lowerQuartileBySize(timings.filter((t) => Number.isFinite(t.ms) && t.ms > 0 && Number.isFinite(t.bytes) && t.bytes > 0))
  if (topo.length < 2 || bySize.length < 2) {
    return Result.fail(new CostModelFitError({ linkClass: "direct", reason: `${bySize.length} distinct size(s) timed over ${topo.length} rank(s)` }))
  }
  const pts = bySize.map(([bytes, y]) => ({
    a: predictAllReduce(algorithm, bytes, topo, unit(1, 0)).ms,
    b: predictAllReduce(algorithm, bytes, topo, unit(0, 1)).ms,
    y
  }))
  const { alpha, beta, rms } = fitTwoTerms(pts)
  if (pairs !== undefined) {
    const scaled = scalePairs(pairs, alpha, beta)
    return Result.succeed({
      links: classLinksOf(scaled, topo),
      pairs: scaled,
      minBytes: opts.minBytes ?? 0,
      source: `${algorithm.name} over the direct links at ${pts.length} sizes, each pair of nodes in proportion to its timed exchanges`,
      rmsRelativeError: rms
    })
  }
  const l = { alphaMs: alpha, betaMsPerByte: beta }
  return Result.succeed({
    links: { "same-node": l, "same-server": l, "cross-server": l },
    minBytes: opts.minBytes ?? 0,
    source: `${algorithm.name} over the direct links at ${pts.length} sizes`,
    rmsRelativeError: rms
  })
}

/** Whether `pairs` prices every two ranks' link of `topo` (a gap would fall back to one class's link, unscaled). */
const coversTopology = (pairs: NodePairLinks, topo: Topology): boolean => {
  for (let i = 0; i < topo.length; i++) {
    for (let j = i + 1; j < topo.length; j++) if (pairs[topo[i]!.nodeId]?.[topo[j]!.nodeId] === undefined) return false
  }
  return true
}

/** Every pair's alpha times `ka` and beta times `kb` (plain AlphaBeta: the fits' details dropped). */
const scalePairs = (pairs: NodePairLinks, ka: number, kb: number): NodePairLinks => {
  const out: Record<string, Record<string, AlphaBeta>> = {}
  for (const [a, row] of Object.entries(pairs)) {
    out[a] = {}
    for (const [b, l] of Object.entries(row)) out[a][b] = { alphaMs: l.alphaMs * ka, betaMsPerByte: l.betaMsPerByte * kb }
  }
  return out
}

/** Per class, its slowest pair's link (what a call crossing that class waits for); a class absent from `topo` takes the slowest of all. */
const classLinksOf = (pairs: NodePairLinks, topo: Topology): Record<LinkClass, AlphaBeta> => {
  const worst = new Map<LinkClass, AlphaBeta>()
  let slowest: AlphaBeta = { alphaMs: 0, betaMsPerByte: 0 }
  const slower = (x: AlphaBeta, y: AlphaBeta): AlphaBeta => ({ alphaMs: Math.max(x.alphaMs, y.alphaMs), betaMsPerByte: Math.max(x.betaMsPerByte, y.betaMsPerByte) })
  for (let i = 0; i < topo.length; i++) {
    for (let j = i + 1; j < topo.length; j++) {
      const l = pairs[topo[i]!.nodeId]![topo[j]!.nodeId]!
      const c = linkClassOf(topo[i]!, topo[j]!)
      worst.set(c, slower(worst.get(c) ?? l, l))
      slowest = slower(slowest, l)
    }
  }
  return { "same-node": worst.get("same-node") ?? slowest, "same-server": worst.get("same-server") ?? slowest, "cross-server": worst.get("cross-server") ?? slowest }
}

/** One timing between ranks `a` and `b`: `bytes` took `ms` (a NATS probe's one way, a direct exchange). */
export interface RankPairTiming {
  readonly a: number
  readonly b: number
  readonly bytes: number
  readonly ms: number
}

/** One timed exchange between ranks `a` and `b` over the direct links (Communicator.measureTransport's `pairs`). */
export type DirectPairTiming = RankPairTiming

/** Each pair of nodes' links, `[a][b]` and `[b][a]` alike (DirectLinks.pairs). */
export type NodePairLinks<L extends AlphaBeta = AlphaBeta> = Readonly<Record<string, Readonly<Record<string, L>>>>

/** A pair of nodes, either order. */
export const nodePairKey = (a: string, b: string): string => JSON.stringify(a <= b ? [a, b] : [b, a])

/**
 * Each pair of nodes fitted from the timings between their ranks (per size the lower quartile,
 * then alpha and beta as fitAlphaBeta fits a probed link), `link` making the fit the link kept;
 * a pair whose fit fails is left out, its reason in `problems`.
 */
export const fitNodePairs = <L extends AlphaBeta>(
  topo: Topology,
  timings: readonly RankPairTiming[],
  link: (fit: FittedLink, samples: readonly ProbeSample[]) => L
): { readonly pairs: NodePairLinks<L>; readonly timedPairs: number; readonly problems: readonly string[] } => {
  const byPair = new Map<string, { a: string; b: string; samples: ProbeSample[] }>()
  for (const t of timings) {
    const na = topo[t.a]?.nodeId
    const nb = topo[t.b]?.nodeId
    if (na === undefined || nb === undefined || t.a === t.b) continue
    const key = nodePairKey(na, nb)
    const entry = byPair.get(key) ?? byPair.set(key, { a: na <= nb ? na : nb, b: na <= nb ? nb : na, samples: [] }).get(key)!
    entry.samples.push({ bytes: t.bytes, ms: t.ms })
  }
  const pairs: Record<string, Record<string, L>> = {}
  const problems: string[] = []
  for (const { a, b, samples } of byPair.values()) {
    const fit = fitAlphaBeta(samples, `${a} <-> ${b}`)
    if (Result.isFailure(fit)) {
      problems.push(fit.failure.reason)
      continue
    }
    const l = link(fit.success, samples)
    ;(pairs[a] ??= {})[b] = l
    ;(pairs[b] ??= {})[a] = l
  }
  return { pairs, timedPairs: byPair.size, problems }
}

/**
 * Each pair of nodes' direct links from timed exchanges between one rank of each (a node with
 * itself: two of its ranks), by fitNodePairs (a link too fast for the sizes timed to show its
 * bandwidth: bounded by what they do show, resolvedOrBound). Pairs of nodes no exchange reached
 * are left out (the class links price them). Fails when no pair has two sizes.
 */
export const fitDirectPairs = (topo: Topology, timings: readonly DirectPairTiming[]): Result.Result<NodePairLinks<FittedLink>, CostModelFitError> => {
  const { pairs, timedPairs, problems } = fitNodePairs(topo, timings, resolvedOrBound)
  if (Object.keys(pairs).length === 0) {
    return Result.fail(new CostModelFitError({ linkClass: "direct pairs", reason: timedPairs === 0 ? "no exchange between two ranks was timed" : problems.join("; ") }))
  }
  return Result.succeed(pairs)
}

/**
 * A pair's fit where its exchanges told its bandwidth apart from its latency: the largest size's
 * time (lower quartile) at least 1.5x the smallest's and beta above zero. A link too fast for the
 * sizes timed (a Unix socket, loopback) is not: it gets what its exchanges do show, the smallest
 * size's time as alpha and at most the largest size's bytes per its time as bandwidth, instead
 * of a noise-made beta of zero (a free link) or a bandwidth no link has.
 */
const resolvedOrBound = (fit: FittedLink, samples: readonly ProbeSample[]): FittedLink => {
  const bySize = lowerQuartileBySize(samples).sort((x, y) => x[0] - y[0])
  const [small, large] = [bySize[0]!, bySize[bySize.length - 1]!]
  if (fit.betaMsPerByte > 0 && large[1] >= 1.5 * small[1]) return fit
  return { ...fit, alphaMs: small[1], betaMsPerByte: large[1] / large[0] }
}

/** Every algorithm's prediction, in the order given (the registry's: its preference order). */
export const predictAll = (bytes: number, topo: Topology, model: CostModel, algorithms: readonly AlgorithmCost[]): readonly Prediction[] =>
  algorithms.map((a) => predictAllReduce(a, bytes, topo, model))

/**
 * All-gather of `bytesPerRank` from every rank (sparse compressors such as top-k cannot be summed
 * in flight): one NATS publish per rank fanned out to the others, a single stage.
 */
export const predictAllGather = (bytesPerRank: number, topo: Topology, model: CostModel): number => {
  const p = topo.length
  if (p <= 1 || bytesPerRank <= 0) return 0
  const flows = topo.map((_, r) => ({ src: r, dsts: topo.map((__, d) => d).filter((d) => d !== r), bytes: bytesPerRank }))
  return stageCost(flows, topo, model, pathOf(p * bytesPerRank, model)).ms
}

/** Topology of a placement plan (ranks carry nodeId and natsServer). */
export const topologyOf = (ranks: readonly { readonly nodeId: string; readonly natsServer: string }[]): Topology =>
  ranks.map((r) => ({ nodeId: r.nodeId, server: r.natsServer }))

export const describePrediction = (p: Prediction): string =>
  `${p.algorithm} ${formatBytes(p.bytes)} p=${p.ranks}: ${p.ms.toFixed(3)} ms (${p.phases
    .map((ph) => `${ph.name} ${ph.stages}x = ${ph.ms.toFixed(3)} ms`)
    .join("; ")}; bound by ${p.bottleneck})`
