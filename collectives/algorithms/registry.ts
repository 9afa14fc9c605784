// The all-reduce algorithm registry: every algorithm is declared once, as one entry that carries
// its name, its code on the wire, how the communicator runs it, the stages the cost model prices,
// and a line of help. The communicator dispatches through the entry (a property lookup), the
// scheduler's cost model receives the entries (it may not import the collectives), and config
// validation, error messages, explain output, benchmarks and tests read their lists from here.
//
// The built-in algorithms are registered by ./index.ts; another one is one module that defines an
// entry (defineAllReduceAlgorithm) and one registerAllReduceAlgorithm call, made before any
// communicator that uses it runs a call, in every process of the group.
import * as Schema from "effect/Schema"
import type { AlgorithmCost } from "../../core/collective-cost.ts"
import { ConfigError } from "../../core/errors.ts"
import type { Operation } from "../operation.ts"
import type { Reduction } from "../reduction.ts"

/**
 * This rank's values in an fp16 sum, made as the ring needs each range [off, off+n) of them. Each
 * element is asked for exactly once per call: by `bits` (the segment this rank sends first), by
 * `addInto` (a relay's or the owner's addition) or by `load` (the fallback).
 */
export interface HalfSource {
  /** The binary16 bits of the values in [off, off+n), as bytes; they stay as they are until sent. */
  bits(off: number, n: number): Uint8Array
  /**
   * h[i] = binary16 bits of f32(value of h[i] + value off+i): added into a received message. With
   * `final` (the segment's owner) also buf[off+i] = value of the new h[i].
   */
  addInto(h: Uint16Array, off: number, n: number, final: boolean): void
  /** buf[off..off+n) = the values in fp32. */
  load(off: number, n: number): void
}

/** One node of a hierarchical all-reduce: its ranks and its fan-out subject. */
export interface NodeGroup {
  /** Ranks on the node, ascending; the first is the leader. */
  readonly ranks: ReadonlyArray<number>
  /** Fan-out subject token of the node (every member subscribes to it). */
  readonly fanoutToken: string | undefined
}

/** One all-reduce call on this rank, as the communicator hands it to an algorithm. */
export interface AllReduceCall {
  readonly op: Operation
  /** Reduced in place; on return every rank holds the same bits. */
  readonly data: Float32Array
  readonly rank: number
  readonly worldSize: number
  /** The ranks 0..worldSize-1, shared by every call: do not modify. */
  readonly ranks: ReadonlyArray<number>
  /** Elements per data frame for this call. */
  readonly chunkElems: number
  readonly reduce: Reduction
  /** The caller's `fanout` option (default true). */
  readonly fanout: boolean
  /** fp16 sums only, and only for an algorithm with `takesHalfSource`: this rank's values on demand. */
  readonly halfSource: HalfSource | undefined
  /** The group's ranks by node (or NATS server, the caller's `hierarchy`), each group ascending, ordered by first rank. */
  nodeGroups(): ReadonlyArray<NodeGroup>
}

/** An all-reduce algorithm: what it is called, how it travels, how it runs and what it costs. */
export interface AllReduceAlgorithmEntry<N extends string = string> extends AlgorithmCost {
  /** The name users write (collectiveConfig.algorithm, AllReduceOptions.algorithm): lower case, digits and "-". */
  readonly name: N
  /** Its code in every data frame's header (0-255, unique): ranks running different algorithms fail with OpMismatch. */
  readonly code: number
  /** One line: what it does and when it wins (error messages, the docs, explain output). */
  readonly hint: string
  /** It reads the `fanout` option, so a call without fan-out is told apart on the wire. */
  readonly usesFanout?: boolean
  /**
   * It takes an fp16 sum's values on demand (`halfSource`, see ring.ts). Without it the
   * communicator decodes a source's bits into `data` before the call.
   */
  readonly takesHalfSource?: boolean
  /** Runs one call on this rank; resolves when this rank holds the result. */
  run(call: AllReduceCall): Promise<void>
}

/** A registration that cannot be accepted (the message says what to change). */
export class AlgorithmRegistrationError extends Schema.TaggedError<AlgorithmRegistrationError>()("AlgorithmRegistrationError", {
  name: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot register all-reduce algorithm "${this.name}": ${this.reason}`
  }
}

const NAME = /^[a-z][a-z0-9-]{0,31}$/

const byName = new Map<string, AllReduceAlgorithmEntry>()
const byCode: Array<AllReduceAlgorithmEntry | undefined> = new Array(256).fill(undefined)
let list: ReadonlyArray<AllReduceAlgorithmEntry> = []

/** Types an entry (keeping its literal name) without registering it. */
export const defineAllReduceAlgorithm = <const N extends string>(entry: AllReduceAlgorithmEntry<N>): AllReduceAlgorithmEntry<N> => entry

/**
 * Adds an algorithm. Refuses a bad or taken name or code, or an entry without run or stages.
 * Registering the same entry object again is a no-op (a module imported twice).
 */
export const registerAllReduceAlgorithm = (entry: AllReduceAlgorithmEntry): void => {
  const name = String(entry?.name)
  const fail = (reason: string): never => {
    throw new AlgorithmRegistrationError({ name, reason })
  }
  if (byName.get(name) === entry) return
  if (!NAME.test(name) || name === "auto") fail('a name is 1-32 lower-case letters, digits or "-", starting with a letter, and not "auto"')
  if (byName.has(name)) fail("the name is taken; pick another")
  if (!Number.isInteger(entry.code) || entry.code < 0 || entry.code > 255) fail(`code ${entry.code} is not an integer in 0..255`)
  const holder = byCode[entry.code]
  if (holder) fail(`code ${entry.code} belongs to "${holder.name}"; free codes: ${freeCodes()}`)
  if (typeof entry.run !== "function" || typeof entry.stages !== "function") fail("an entry needs run(call) and stages(input)")
  if (typeof entry.hint !== "string" || entry.hint.length === 0) fail("an entry needs a one-line hint")
  byName.set(name, entry)
  byCode[entry.code] = entry
  list = Object.freeze([...list, entry])
}

const freeCodes = (): string => {
  const free = byCode.flatMap((e, code) => (e ? [] : [code]))
  return free.length > 8 ? `${free.slice(0, 8).join(", ")}, ...` : free.join(", ")
}

/** Every registered algorithm, in registration order (the cost model's preference order on ties). */
export const allReduceAlgorithms = (): ReadonlyArray<AllReduceAlgorithmEntry> => list

export const allReduceAlgorithmNames = (): string[] => list.map((a) => a.name)

export const findAllReduceAlgorithm = (name: string): AllReduceAlgorithmEntry | undefined => byName.get(name)

/** The algorithm a frame's code names, if any. */
export const allReduceAlgorithmByCode = (code: number): AllReduceAlgorithmEntry | undefined => byCode[code]

/** `"ring", "tree" or "hierarchical"`: the registered names, for messages. */
export const allowedAlgorithms = (): string => {
  const names = list.map((a) => `"${a.name}"`)
  return names.length <= 1 ? names.join("") : `${names.slice(0, -1).join(", ")} or ${names.at(-1)}`
}

/** The registered algorithms, one per line with its hint (docs, explain, `--help`). */
export const describeAlgorithms = (): string => list.map((a) => `${a.name}: ${a.hint}`).join("\n")

/**
 * Validates collectiveConfig.algorithm: "auto" (the default when absent) or a registered name.
 * Throws ConfigError naming the field and the allowed values.
 */
export const parseAlgorithmChoice = (value: unknown, field = "algorithm"): string => {
  if (value === undefined || value === "auto") return "auto"
  if (typeof value === "string" && byName.has(value)) return value
  const shown = typeof value === "string" ? `"${value}"` : String(value)
  throw new ConfigError({ field, reason: `must be "auto" or a registered all-reduce algorithm (${allowedAlgorithms()}), got ${shown}` })
}
