// Topology observation: when a group starts, find out what it actually got (which node and which
// NATS server each rank is on, as the communicator's handshake learned) and measure the links
// between ranks with a few ping-pongs, then fit the alpha-beta cost model per link class. The I/O
// (who sends what where) is behind TopologyProbeIO so this module stays pure scheduler logic;
// actors/train/worker/topology-probe.ts implements it over NATS.
//
// Agreement. Only rank 0 measures and fits; it broadcasts the fitted model (JSON, one float per
// byte, so no float bit pattern can be altered in transit) and every rank, rank 0 included, uses
// the decoded copy. Every rank therefore holds the same numbers and picks the same algorithm for
// every bucket: a mismatch would make ranks run different collectives and deadlock.
//
// Probes. One representative pair per link class present (the lowest ranks with that class,
// preferring pairs that include rank 0), and on several nodes one per pair of nodes besides, pairs
// one after another so they do not share a server; each class is fitted from its pairs' samples,
// and each pair of nodes from its own (a flow is priced on its nodes' pair where there is one).
// Per pair and size: one warm-up round trip, then `reps` timed ones; one-way time = RTT / 2. Two
// sizes far apart (1 KiB pins alpha, 256 KiB pins beta). Up to `rounds` rounds over the pairs,
// spread in time, pool their samples (the fit takes the lower quartile per size, so a burst of load
// during one round does not make a link look slow). A time budget bounds the whole thing:
// classes not reached in time borrow a measured neighbour (fitCostModel's fallback), and with no
// sample at all the loopback defaults are used, flagged as such.
import * as Result from "effect/Result"
import {
  defaultCostModel,
  fitCostModel,
  fitDirectLinks,
  fitDirectPairs,
  fitNodePairs,
  linkClassOf,
  linkClasses,
  nodeGroups,
  nodePairKey,
  type AlgorithmCost,
  type AlphaBeta,
  type CostModel,
  type DirectPairTiming,
  type DirectTiming,
  type FittedCostModel,
  type LinkClass,
  type ProbeSample,
  type RankPairTiming,
  type Topology
} from "./cost-model.ts"
import { formatBytes } from "./resources.ts"

export interface ProbePair {
  readonly from: number
  readonly to: number
  readonly linkClass: LinkClass
}

/**
 * One pair per link class present (the lowest ranks with that class, preferring pairs that include
 * rank 0), then, on several nodes, one per pair of nodes no pair before stands for (each node's
 * lowest ranks; a node with itself where it has two): deterministic, the same on every rank.
 */
export const probePairs = (topo: Topology): ProbePair[] => {
  const out: ProbePair[] = []
  for (const c of linkClasses) {
    let found: ProbePair | undefined
    for (let j = 1; j < topo.length && !found; j++) if (linkClassOf(topo[0]!, topo[j]!) === c) found = { from: 0, to: j, linkClass: c }
    for (let i = 1; i < topo.length && !found; i++) {
      for (let j = i + 1; j < topo.length && !found; j++) if (linkClassOf(topo[i]!, topo[j]!) === c) found = { from: i, to: j, linkClass: c }
    }
    if (found) out.push(found)
  }
  const groups = nodeGroups(topo)
  if (groups.length <= 1) return out
  const nodeOf = (r: number): string => topo[r]!.nodeId
  const covered = new Set(out.map((p) => nodePairKey(nodeOf(p.from), nodeOf(p.to))))
  for (let i = 0; i < groups.length; i++) {
    for (let j = i; j < groups.length; j++) {
      const [a, b] = [groups[i]!, groups[j]!]
      // groups come in order of their lowest rank: a[0] < b[0] across nodes
      const pair = i === j ? (a.length >= 2 ? ([a[0]!, a[1]!] as const) : undefined) : ([a[0]!, b[0]!] as const)
      if (pair === undefined || covered.has(nodePairKey(nodeOf(a[0]!), nodeOf(b[0]!)))) continue
      out.push({ from: pair[0], to: pair[1], linkClass: linkClassOf(topo[pair[0]]!, topo[pair[1]]!) })
    }
  }
  return out
}

export interface TopologyProbeIO {
  readonly rank: number
  readonly worldSize: number
  /** Where each rank is (node id and NATS server id), by rank; the same on every rank. */
  readonly topology: Topology
  /**
   * Called on rank 0 only: rank `from` sends `bytes` to `to`, which echoes them, `reps` times;
   * resolves the round-trip times in ms (the IO routes the command to `from`).
   */
  pingPong(from: number, to: number, bytes: number, reps: number): Promise<number[]>
  /** Every rank calls it; resolves rank 0's buffer everywhere. */
  broadcast(buf: Float32Array): Promise<Float32Array>
  /** The communicator's chunk in bytes, which the fitted model pipelines with (default: the cost model's). */
  readonly chunkBytes?: number
}

export interface ProbeOptions {
  /** Message sizes (bytes). Default 1 KiB and 256 KiB. */
  readonly sizes?: readonly number[]
  /** Timed round trips per size and pair (after one warm-up). Default 5. */
  readonly reps?: number
  /**
   * Rounds over the pairs, each pair's samples pooled (default 3). A burst of load on the machine
   * rarely covers every round, and the fit keeps the faster samples. Rounds after the first probe a
   * pair only when its last round fits in what is left of the budget.
   */
  readonly rounds?: number
  /** Stop probing new pairs once this much time has passed. Default 1500 ms. */
  readonly budgetMs?: number
  /**
   * Timed all-reduces over the group's direct links (Communicator.measureTransport on rank 0):
   * rank 0 fits the model's direct links from them (fitDirectLinks), so calls from `minBytes` on
   * are priced on the links they take.
   */
  readonly direct?: {
    readonly algorithm: AlgorithmCost
    readonly timings: readonly DirectTiming[]
    readonly minBytes: number
    /** A group on several nodes: timed exchanges between each pair of nodes (Communicator.measureTransport's `pairs`), fitted per pair (fitDirectPairs). */
    readonly pairs?: readonly DirectPairTiming[]
  }
}

export interface ObservedTopology {
  readonly topology: Topology
  readonly model: FittedCostModel
  readonly pairs: readonly ProbePair[]
  /** One-way samples per link class (rank 0's measurements, shared with everyone). */
  readonly samples: Readonly<Partial<Record<LinkClass, readonly ProbeSample[]>>>
  /** Wall time of the observation on rank 0, ms. */
  readonly probeMs: number
  /** Set when the model is not measured (one rank, probes failed or timed out). */
  readonly note?: string
}

/** The placeholder model dressed as a fitted one (nothing measured). */
const unmeasured = (chunkBytes?: number): FittedCostModel => {
  const d: CostModel = defaultCostModel()
  return { ...d, ...(chunkBytes !== undefined ? { chunkBytes } : {}), fits: {}, assumed: {} }
}

/** JSON in a Float32Array, one float per byte: floats 0..255 survive any copy bit for bit. */
export const encodeJson = (value: unknown, capacity?: number): Float32Array => {
  const bytes = new TextEncoder().encode(JSON.stringify(value))
  const out = new Float32Array(Math.max(capacity ?? 0, bytes.length + 4))
  // Length prefix in the first four floats (base 256).
  out[0] = bytes.length & 255
  out[1] = (bytes.length >>> 8) & 255
  out[2] = (bytes.length >>> 16) & 255
  out[3] = (bytes.length >>> 24) & 255
  for (let i = 0; i < bytes.length; i++) out[4 + i] = bytes[i]!
  return out
}

export const decodeJson = (buf: Float32Array): unknown => {
  const n = buf[0]! + buf[1]! * 256 + buf[2]! * 65536 + buf[3]! * 16777216
  const bytes = new Uint8Array(n)
  for (let i = 0; i < n; i++) bytes[i] = buf[4 + i]!
  return JSON.parse(new TextDecoder().decode(bytes))
}

/**
 * Capacity of the broadcast (bytes of JSON): every rank must pass the same length. Room for the
 * fits of every pair of a few dozen nodes; a model that does not fit goes without its samples,
 * then without its pairs of nodes (observeTopology).
 */
const WIRE_FLOATS = 64 * 1024

/** The model without its pairs of nodes' fits, NATS's and the direct links' (priced by link class instead). */
const withoutPairs = (model: FittedCostModel): FittedCostModel => {
  const { pairs: _nats, direct, ...rest } = model
  if (direct === undefined) return rest
  const { pairs: _direct, ...links } = direct
  return { ...rest, direct: links }
}

/** Rank 0 probes and fits; every rank gets the same model. All ranks must call it together. */
export const observeTopology = async (io: TopologyProbeIO, options: ProbeOptions = {}): Promise<ObservedTopology> => {
  const topo = io.topology
  const pairs = probePairs(topo)
  if (io.worldSize <= 1) return { topology: topo, model: unmeasured(), pairs, samples: {}, probeMs: 0, note: "a single rank: nothing to measure" }
  let payload: Float32Array
  if (io.rank === 0) {
    const started = performance.now()
    const sizes = options.sizes ?? [1024, 256 * 1024]
    const reps = Math.max(1, options.reps ?? 5)
    const budget = options.budgetMs ?? 1500
    const rounds = Math.max(1, options.rounds ?? 3)
    const samples: Partial<Record<LinkClass, ProbeSample[]>> = {}
    // the same samples by pair of ranks, for each pair of nodes' own fit on several nodes
    const byPair: RankPairTiming[] = []
    const problems: string[] = []
    const lastMs = new Map<ProbePair, number>()
    for (let round = 0; round < rounds; round++) {
      for (const pair of pairs) {
        const elapsed = performance.now() - started
        if (round === 0) {
          if (elapsed > budget) {
            problems.push(`${pair.linkClass} not probed: the ${budget} ms budget ran out`)
            continue
          }
        } else if (!lastMs.has(pair) || elapsed + lastMs.get(pair)! > budget) continue // a repeat only when it fits the budget
        const got: ProbeSample[] = []
        const t0 = performance.now()
        try {
          for (const bytes of sizes) {
            const rtts = await io.pingPong(pair.from, pair.to, bytes, reps + 1)
            for (const ms of rtts.slice(1)) got.push({ bytes, ms: ms / 2 })
          }
          samples[pair.linkClass] = [...(samples[pair.linkClass] ?? []), ...got]
          for (const g of got) byPair.push({ a: pair.from, b: pair.to, ...g })
          lastMs.set(pair, performance.now() - t0)
        } catch (e) {
          lastMs.delete(pair)
          // a failed repeat leaves the class fitted from the rounds before it; say so
          const kept = round > 0 && (samples[pair.linkClass]?.length ?? 0) > 0
          problems.push(
            `${pair.linkClass} probe ${pair.from}->${pair.to} failed${kept ? ` in round ${round + 1} (fitted from the earlier rounds)` : ""}: ${String(e)}`
          )
        }
      }
    }
    const fitted = fitCostModel(samples, io.chunkBytes !== undefined ? { chunkBytes: io.chunkBytes } : {})
    let model = Result.isSuccess(fitted) ? fitted.success : unmeasured(io.chunkBytes)
    if (Result.isFailure(fitted)) problems.push(`fit failed (${fitted.failure.message}); using the loopback defaults`)
    else if (nodeGroups(topo).length > 1) {
      // a pair of nodes its samples cannot fit is left to its class's fit
      const { pairs } = fitNodePairs(topo, byPair, (f) => ({ alphaMs: f.alphaMs, betaMsPerByte: f.betaMsPerByte }))
      if (Object.keys(pairs).length > 0) model = { ...model, pairs }
    }
    if (options.direct !== undefined && options.direct.timings.length > 0) {
      const d = options.direct
      const pairs = d.pairs !== undefined && d.pairs.length > 0 ? fitDirectPairs(topo, d.pairs) : undefined
      if (pairs !== undefined && Result.isFailure(pairs)) problems.push(`direct links' pairs of nodes not fitted (${pairs.failure.reason}); one alpha and beta for every link`)
      const pairLinks = pairs !== undefined && Result.isSuccess(pairs) ? pairs.success : undefined
      const direct = fitDirectLinks(d.algorithm, d.timings, topo, { chunkBytes: model.chunkBytes ?? io.chunkBytes, minBytes: d.minBytes, ...(pairLinks ? { pairs: pairLinks } : {}) })
      if (Result.isSuccess(direct)) {
        model = { ...model, direct: direct.success }
        if (pairLinks !== undefined && direct.success.pairs === undefined) problems.push("direct links: not every pair of nodes was timed; one alpha and beta for every link")
      } else problems.push(`direct links not fitted (${direct.failure.message}); their calls priced as NATS`)
    }
    const probeMs = performance.now() - started
    const note = (...more: string[]) => ([...problems, ...more].length > 0 ? { note: [...problems, ...more].join("; ") } : {})
    payload = encodeJson({ model, samples, probeMs, ...note() }, WIRE_FLOATS)
    if (payload.length > WIRE_FLOATS) payload = encodeJson({ model, samples: {}, probeMs, ...note("samples not shared (too large)") }, WIRE_FLOATS)
    if (payload.length > WIRE_FLOATS) {
      const why = "samples and the pairs of nodes' fits not shared (too many nodes): links priced by class"
      payload = encodeJson({ model: withoutPairs(model), samples: {}, probeMs, ...note(why) }, WIRE_FLOATS)
    }
  } else payload = new Float32Array(WIRE_FLOATS)
  const shared = decodeJson(await io.broadcast(payload)) as { model: FittedCostModel; samples: ObservedTopology["samples"]; probeMs: number; note?: string }
  return {
    topology: topo,
    model: shared.model,
    pairs,
    samples: shared.samples,
    probeMs: shared.probeMs,
    ...(shared.note !== undefined ? { note: shared.note } : {})
  }
}

/** A link's alpha (us) and bandwidth (MB/s). */
const describeLink = (l: AlphaBeta): string => `${(l.alphaMs * 1000).toFixed(0)}us ${l.betaMsPerByte > 0 ? (1 / l.betaMsPerByte / 1000).toFixed(0) : "inf"}MB/s`

/** Each pair of nodes once ("a <-> b 40us 950MB/s"), in the order of the nodes' names. */
const describePairs = (pairs: NonNullable<CostModel["pairs"]>): string => {
  const out: string[] = []
  for (const a of Object.keys(pairs).sort()) {
    for (const b of Object.keys(pairs[a]!).sort()) if (a <= b) out.push(`${a} <-> ${b} ${describeLink(pairs[a]![b]!)}`)
  }
  return out.join(", ")
}

/** One line for logs: the fitted alpha (us) and bandwidth (MB/s) per class. */
export const describeObservation = (o: ObservedTopology): string => {
  const nodes = new Set(o.topology.map((t) => t.nodeId)).size
  const servers = new Set(o.topology.map((t) => t.server)).size
  const links = linkClasses
    .map((c) => {
      const from = o.model.assumed[c]
      return `${c} ${describeLink(o.model.links[c])}${from ? ` (from ${from})` : o.model.fits[c] ? "" : " (default)"}`
    })
    .join(", ")
  const d = o.model.direct
  const fit = d === undefined ? "" : `${d.source ?? "fitted"}${d.rmsRelativeError !== undefined ? `, rms error ${(d.rmsRelativeError * 100).toFixed(0)}%` : ""}`
  const direct =
    d === undefined
      ? ""
      : d.pairs !== undefined
        ? `; direct links ${describePairs(d.pairs)} (${fit}) for calls from ${formatBytes(d.minBytes)}`
        : `; direct links ${describeLink(d.links["same-node"])} (${fit}) for calls from ${formatBytes(d.minBytes)}`
  const pairs = o.model.pairs !== undefined ? `; through NATS by pair of nodes ${describePairs(o.model.pairs)}` : ""
  return `topology: ${o.topology.length} ranks, ${nodes} node(s), ${servers} server(s); probed in ${o.probeMs.toFixed(0)} ms; ${links}${pairs}${direct}${o.note ? `; ${o.note}` : ""}`
}
