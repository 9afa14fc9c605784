// Picks, from the cost model, the all-reduce algorithm for each gradient bucket and whether (and
// how) to compress, and explains the decision in words and JSON so a user can see why. Pure.
//
// Per bucket: the algorithm with the lowest predicted time (ties: the first in the order given, the
// all-reduce registry's: ring, tree, hierarchical, then any registered later).
// Compression 'auto' (escalating, because every compressor costs accuracy or compute):
//   1. predicted communication per step (sum over buckets of the best algorithm) <= measured compute
//      time of a step -> no compression: the network is not the bottleneck;
//   2. else the mild compressor (the first of the list: the registry's fp16) if its predicted
//      communication + codec time is within `farAboveFactor` x compute;
//   3. else the cheapest of the aggressive ones (the rest: powersgd, topk) if it beats the mild one.
// A compressor is only ever chosen when its predicted total beats sending uncompressed.
// Compressed sizes: wire = bytes / ratio; all-reduce-compatible compressors (fp16, PowerSGD's P and
// Q) run `rounds` all-reduces of wire/rounds each (the algorithm re-picked for that size); sparse
// ones (top-k) need an all-gather of each rank's wire bytes.
import {
  nodeGroups,
  predictAll,
  predictAllGather,
  type AlgorithmCost,
  type CostModel,
  type FittedCostModel,
  type Prediction,
  type Topology
} from "./cost-model.ts"
import { formatBytes } from "./resources.ts"

export interface AlgorithmChoice {
  readonly bytes: number
  readonly algorithm: string
  readonly ms: number
  /** Every algorithm's prediction, in the order the algorithms were given. */
  readonly predictions: readonly Prediction[]
  readonly reason: string
}

const fmtMs = (ms: number): string => (ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(3))

/**
 * The cheapest of `algorithms` (the all-reduce registry's entries, in its preference order) for
 * one all-reduce of `bytes`; with `candidates`, the cheapest of those names (every algorithm is
 * still predicted, for the explanation).
 */
export const chooseAlgorithm = (
  bytes: number,
  topo: Topology,
  model: CostModel,
  algorithms: readonly AlgorithmCost[],
  candidates?: readonly string[]
): AlgorithmChoice => {
  const predictions = predictAll(bytes, topo, model, algorithms)
  const allowed = candidates === undefined ? predictions : predictions.filter((p) => candidates.includes(p.algorithm))
  const pool = allowed.length > 0 ? allowed : predictions
  let best = pool[0]!
  for (const p of pool) if (p.ms < best.ms) best = p
  const others = pool.filter((p) => p !== best)
  let reason: string
  if (topo.length <= 1) reason = "a single rank: no communication"
  else if (others.length === 0) reason = `${best.algorithm} is the only candidate`
  else {
    const runner = others.reduce((a, b) => (b.ms < a.ms ? b : a))
    const factor = best.ms > 0 ? runner.ms / best.ms : 1
    reason =
      factor <= 1.0000001
        ? `${best.algorithm} ties with ${runner.algorithm} (${fmtMs(best.ms)} ms) and comes first in the preference order`
        : `${best.algorithm} is ${factor.toFixed(2)}x faster than the next best, ${runner.algorithm} (${fmtMs(best.ms)} vs ${fmtMs(runner.ms)} ms); bound by ${best.bottleneck}`
  }
  return { bytes, algorithm: best.algorithm, ms: best.ms, predictions, reason }
}

export interface CompressorProfile {
  readonly name: string
  /** Uncompressed bytes / bytes on the wire. */
  readonly ratio: number
  /** 'allreduce': compressed values can be summed in flight; 'allgather': they cannot (top-k, sign). */
  readonly collective: "allreduce" | "allgather"
  /** All-reduces per bucket (PowerSGD reduces P, then Q: 2). Default 1. */
  readonly rounds?: number
  /** Measured compress + decompress time per uncompressed byte (ms/byte); 0 when not measured. */
  readonly codecMsPerByte?: number
}

export type CompressionMode = "auto" | "none" | string

export interface CommunicationRequest {
  /** Bytes of each gradient bucket, in send order. */
  readonly bucketBytes: readonly number[]
  readonly topology: Topology
  readonly model: CostModel | FittedCostModel
  /** Measured forward + backward time of one step, ms (undefined before warm-up has measured it). */
  readonly computeMs?: number
  /** Default 'auto'. A compressor name forces it. */
  readonly compression?: CompressionMode
  /**
   * The compressors 'auto' may escalate through, the first being the mild one (the codec
   * registry's candidates, collectives/compression/: the scheduler does not import them).
   */
  readonly compressors: readonly CompressorProfile[]
  /** "Far above compute": escalate past the mild compressor when it leaves more than this x compute. Default 2. */
  readonly farAboveFactor?: number
  /** The all-reduce algorithms to predict (the registry's entries, collectives/algorithms/). */
  readonly algorithms: readonly AlgorithmCost[]
  /** Names among `algorithms` that may be chosen; default all. */
  readonly candidates?: readonly string[]
}

export interface CompressionCandidate {
  readonly name: string
  readonly ratio: number
  readonly commMs: number
  readonly codecMs: number
  /** false when the profile had no codecMsPerByte: codec time counted as 0. */
  readonly codecMeasured: boolean
  readonly totalMs: number
  /** Algorithm (or 'allgather') per bucket at the compressed size. */
  readonly perBucket: readonly string[]
}

export interface CommunicationPlan {
  readonly ranks: number
  readonly nodes: number
  readonly servers: number
  readonly computeMs: number | undefined
  /** Per bucket: the uncompressed choice, with every algorithm's prediction. */
  readonly buckets: readonly AlgorithmChoice[]
  readonly uncompressedMs: number
  readonly compression: {
    readonly mode: CompressionMode
    readonly chosen: string
    readonly candidates: readonly CompressionCandidate[]
    readonly reason: string
    /** A short word for the printed line: a codec asked for that saves little of a measured step. */
    readonly note?: string
  }
  /** What runs: per bucket the algorithm ('allgather' for sparse compressors) at the chosen compression. */
  readonly schedule: readonly { readonly bytes: number; readonly wireBytes: number; readonly algorithm: string }[]
  readonly predictedCommMs: number
  /** Link classes the model borrowed from another class (not measured). */
  readonly assumedLinks: Readonly<Record<string, string>>
}

const evaluateCompressor = (c: CompressorProfile, req: CommunicationRequest): CompressionCandidate => {
  let commMs = 0
  let codecMs = 0
  const perBucket: string[] = []
  const rounds = Math.max(1, Math.floor(c.rounds ?? 1))
  for (const bytes of req.bucketBytes) {
    const wire = bytes / c.ratio
    codecMs += bytes * (c.codecMsPerByte ?? 0)
    if (c.collective === "allgather") {
      commMs += predictAllGather(wire, req.topology, req.model)
      perBucket.push("allgather")
    } else {
      const choice = chooseAlgorithm(wire / rounds, req.topology, req.model, req.algorithms, req.candidates)
      commMs += choice.ms * rounds
      perBucket.push(choice.algorithm)
    }
  }
  return { name: c.name, ratio: c.ratio, commMs, codecMs, codecMeasured: c.codecMsPerByte !== undefined, totalMs: commMs + codecMs, perBucket }
}

/** A codec asked for that saves less than this fraction of a measured step is said to save little. */
const ASKED_SAVES_LITTLE = 0.1

/** Chooses the algorithm per bucket and the compression; see the module comment for the rules. */
export const planCommunication = (req: CommunicationRequest): CommunicationPlan => {
  const buckets = req.bucketBytes.map((b) => chooseAlgorithm(b, req.topology, req.model, req.algorithms, req.candidates))
  const uncompressedMs = buckets.reduce((s, b) => s + b.ms, 0)
  const compressors = req.compressors
  const candidates = compressors.map((c) => evaluateCompressor(c, req))
  const mode = req.compression ?? "auto"
  const computeMs = req.computeMs !== undefined && Number.isFinite(req.computeMs) && req.computeMs >= 0 ? req.computeMs : undefined
  const far = req.farAboveFactor ?? 2
  let chosen = "none"
  let reason: string
  let note: string | undefined
  if (req.topology.length <= 1) reason = "a single rank sends nothing"
  else if (mode === "none") reason = "compression is off (compression: 'none')"
  else if (mode !== "auto") {
    const forced = candidates.find((c) => c.name === mode)
    if (forced) {
      chosen = forced.name
      reason = `compression '${mode}' was asked for (predicted ${fmtMs(forced.totalMs)} ms vs ${fmtMs(uncompressedMs)} ms uncompressed)`
      // Measured compute: what it saves of a step (compute + uncompressed communication, as if
      // nothing overlapped). Little, and the bytes it saves are not what holds the step back.
      const saved = computeMs !== undefined ? (uncompressedMs - forced.totalMs) / (computeMs + uncompressedMs) : undefined
      if (saved !== undefined && saved < ASKED_SAVES_LITTLE) {
        const pct = `${Math.max(0, saved * 100).toFixed(saved > 0 && saved < 0.01 ? 1 : 0)}%`
        note = `saves ~${pct} of a step here`
        reason +=
          `; with compute at ${fmtMs(computeMs!)} ms a step it saves about ${pct} of one: the network is not what holds the step back, ` +
          `and compression trades accuracy for bytes (most over few steps, before error feedback makes it up)` +
          (uncompressedMs <= computeMs! ? "; 'auto' would send uncompressed here" : "")
      }
    } else {
      // It runs all the same (the reducer makes the codec asked for); only its price is unknown.
      chosen = mode
      reason = `compression '${mode}' was asked for, but the cost model has no price for it (priced: ${compressors.map((c) => c.name).join(", ")}): the times below are uncompressed`
    }
  } else if (computeMs === undefined) {
    reason = "no measured compute time yet (warm-up), so no evidence the network is the bottleneck; sending uncompressed"
  } else if (uncompressedMs <= computeMs) {
    reason = `predicted communication ${fmtMs(uncompressedMs)} ms <= compute ${fmtMs(computeMs)} ms per step: the network is not the bottleneck`
  } else if (candidates.length === 0) {
    reason = "no compressors available"
  } else {
    const over = `predicted communication ${fmtMs(uncompressedMs)} ms > compute ${fmtMs(computeMs)} ms per step`
    const mild = candidates[0]!
    const aggressive = candidates.slice(1)
    const bestAggressive = aggressive.reduce<CompressionCandidate | undefined>((a, b) => (a === undefined || b.totalMs < a.totalMs ? b : a), undefined)
    if (mild.totalMs <= far * computeMs && mild.totalMs < uncompressedMs) {
      chosen = mild.name
      reason = `${over}; ${mild.name} brings it to ${fmtMs(mild.totalMs)} ms, within ${far}x compute, so nothing more aggressive is needed`
    } else if (bestAggressive !== undefined && bestAggressive.totalMs < Math.min(mild.totalMs, uncompressedMs)) {
      chosen = bestAggressive.name
      reason =
        `${over}; ${mild.name} would still leave ${fmtMs(mild.totalMs)} ms (> ${far}x compute), ` +
        `${bestAggressive.name} is the cheapest at ${fmtMs(bestAggressive.totalMs)} ms`
    } else if (mild.totalMs < uncompressedMs) {
      chosen = mild.name
      reason = `${over}; ${mild.name} (${fmtMs(mild.totalMs)} ms) is the cheapest compressor`
    } else {
      reason = `${over}, but no compressor is predicted to beat sending uncompressed (codec time included)`
    }
  }
  const winner = compressors.find((c) => c.name === chosen)
  const cand = candidates.find((c) => c.name === chosen)
  const schedule = buckets.map((b, i) => ({
    bytes: b.bytes,
    wireBytes: winner ? b.bytes / winner.ratio : b.bytes,
    algorithm: cand ? cand.perBucket[i]! : b.algorithm
  }))
  const assumed = (req.model as Partial<FittedCostModel>).assumed ?? {}
  return {
    ranks: req.topology.length,
    nodes: nodeGroups(req.topology).length,
    servers: new Set(req.topology.map((r) => r.server)).size,
    computeMs,
    buckets,
    uncompressedMs,
    compression: { mode, chosen, candidates, reason, ...(note !== undefined ? { note } : {}) },
    schedule,
    predictedCommMs: cand ? cand.totalMs : uncompressedMs,
    assumedLinks: { ...assumed }
  }
}

export interface Explanation {
  readonly text: string
  /** Plain data (JSON.stringify-able): every candidate's predicted time and the reasons. */
  readonly json: {
    readonly ranks: number
    readonly nodes: number
    readonly servers: number
    readonly computeMs: number | null
    readonly buckets: readonly {
      readonly bytes: number
      readonly chosen: string
      readonly predictedMs: Readonly<Record<string, number>>
      readonly bottleneck: Readonly<Record<string, string>>
      readonly reason: string
    }[]
    readonly uncompressedMs: number
    readonly compression: {
      readonly mode: string
      readonly chosen: string
      readonly candidates: readonly CompressionCandidate[]
      readonly reason: string
    }
    readonly schedule: CommunicationPlan["schedule"]
    readonly predictedCommMs: number
    readonly assumedLinks: Readonly<Record<string, string>>
    /** With algorithm 'auto', once the tuner has decided: per size, each candidate's measured ms (in `candidates`' order) and the pick. */
    readonly tuned?: readonly { readonly bytes: number; readonly candidates: readonly string[]; readonly ms: readonly number[]; readonly picked: string; readonly modelPick: string }[]
    /** The tuner's picks were measured once the group's processes were warm (from its call 200 on). */
    readonly confirmed?: boolean
    /** Times the tuner measured again after its calls moved, and why the last time. */
    readonly retuned?: { readonly times: number; readonly why: string | undefined }
  }
}

/** The plan as a readable multi-line text (for the log) and as JSON (for tools and tests). */
export const explain = (plan: CommunicationPlan): Explanation => {
  const json: Explanation["json"] = {
    ranks: plan.ranks,
    nodes: plan.nodes,
    servers: plan.servers,
    computeMs: plan.computeMs ?? null,
    buckets: plan.buckets.map((b) => ({
      bytes: b.bytes,
      chosen: b.algorithm,
      predictedMs: Object.fromEntries(b.predictions.map((p) => [p.algorithm, p.ms])),
      bottleneck: Object.fromEntries(b.predictions.map((p) => [p.algorithm, p.bottleneck])),
      reason: b.reason
    })),
    uncompressedMs: plan.uncompressedMs,
    compression: plan.compression,
    schedule: plan.schedule,
    predictedCommMs: plan.predictedCommMs,
    assumedLinks: plan.assumedLinks
  }
  const lines: string[] = []
  lines.push(
    `all-reduce plan: ${plan.ranks} rank(s) on ${plan.nodes} node(s), ${plan.servers} NATS server(s); ` +
      `${plan.buckets.length} bucket(s), ${formatBytes(plan.buckets.reduce((s, b) => s + b.bytes, 0))} per step`
  )
  const assumed = Object.entries(plan.assumedLinks)
  if (assumed.length > 0) lines.push(`  note: not measured, borrowed: ${assumed.map(([c, from]) => `${c} <- ${from}`).join(", ")}`)
  plan.buckets.forEach((b, i) => {
    const cands = b.predictions.map((p) => `${p.algorithm} ${fmtMs(p.ms)}${p.algorithm === b.algorithm ? "*" : ""}`).join(", ")
    lines.push(`  bucket ${i} (${formatBytes(b.bytes)}): ${b.algorithm} [${cands} ms] - ${b.reason}`)
  })
  lines.push(
    `  communication per step: ${fmtMs(plan.uncompressedMs)} ms uncompressed; compute ${plan.computeMs === undefined ? "not measured" : `${fmtMs(plan.computeMs)} ms`}`
  )
  for (const c of plan.compression.candidates) {
    lines.push(
      `  ${c.name === plan.compression.chosen ? "*" : " "} ${c.name} (${c.ratio}x): ${fmtMs(c.totalMs)} ms (comm ${fmtMs(c.commMs)} + codec ${c.codecMeasured ? fmtMs(c.codecMs) : "not measured"}) via ${[
        ...new Set(c.perBucket)
      ].join("/")}`
    )
  }
  lines.push(`  compression: ${plan.compression.chosen} - ${plan.compression.reason}`)
  lines.push(`  predicted communication per step: ${fmtMs(plan.predictedCommMs)} ms`)
  return { text: lines.join("\n"), json }
}
