// The training-strategy registry: every strategy is declared once, as one entry (strategy.ts), and
// config validation (core/config.ts checks only the shape of collectiveConfig.strategy; the name is
// checked here when the Trainer resolves its options), error texts, strategy "auto"'s candidates,
// the worker's choice of what runs the steps, benches and test lists read their lists from here.
//
// The built-in strategies are registered by ./index.ts; another one is one module that defines an
// entry (defineStrategy) and one registerStrategy call, made in the driver and in every worker
// (the train loop's module imports it) before the job starts.
import * as Schema from "effect/Schema"
import { ConfigError } from "../../../../core/errors.ts"
import type { BenchVariant, StrategyEntry } from "./strategy.ts"

/** A registration that cannot be accepted (the message says what to change). */
export class StrategyRegistrationError extends Schema.TaggedError<StrategyRegistrationError>()("StrategyRegistrationError", {
  name: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot register training strategy "${this.name}": ${this.reason}`
  }
}

const NAME = /^[a-z][a-z0-9-]{0,31}$/

const byName = new Map<string, StrategyEntry>()
let list: ReadonlyArray<StrategyEntry> = []

/**
 * Adds a strategy. Refuses a bad or taken name, or an entry without its recovery answer.
 * Registering the same entry object again is a no-op (a module imported twice).
 */
export const registerStrategy = (entry: StrategyEntry): void => {
  const name = String(entry?.name)
  const fail = (reason: string): never => {
    throw new StrategyRegistrationError({ name, reason })
  }
  if (byName.get(name) === entry) return
  if (!NAME.test(name)) fail('a name is 1-32 lower-case letters, digits or "-", starting with a letter')
  if (byName.has(name)) fail("the name is taken; pick another")
  if (typeof entry.hint !== "string" || entry.hint.length === 0) fail("an entry needs a one-line hint")
  if (typeof entry.peersCannot !== "function") fail("an entry needs peersCannot(input): which recoveries it supports")
  if (entry.selectable !== false && typeof entry.create !== "function") fail("a strategy collectiveConfig.strategy selects needs create(host), its worker side")
  byName.set(name, entry)
  list = Object.freeze([...list, entry])
}

/** Every registered strategy, in registration order (the built-ins first). */
export const strategies = (): ReadonlyArray<StrategyEntry> => list

/** The names collectiveConfig.strategy takes. */
export const strategyNames = (): ReadonlyArray<string> => list.filter((e) => e.selectable !== false).map((e) => e.name)

/** The names as error messages list them: "allreduce", "parameter-server", ... */
export const allowedStrategies = (): string => strategyNames().map((n) => JSON.stringify(n)).join(", ")

/** The entry of a registered name, or undefined. */
export const findStrategy = (name: string): StrategyEntry | undefined => byName.get(name)

/** The entry collectiveConfig.strategy names; a ConfigError (naming `field`, listing the names) when none does. */
export const resolveStrategy = (name: string, field = "collectiveConfig.strategy"): StrategyEntry => {
  const entry = byName.get(name)
  if (!entry || entry.selectable === false) {
    const why = entry ? `"${name}" is chosen by ${entry.hint}, not by collectiveConfig.strategy` : `unknown strategy ${JSON.stringify(name)}`
    throw new ConfigError({ field, reason: `${why}; one of ${allowedStrategies()}` })
  }
  return entry
}

/**
 * The configurations `npm run bench -- strategy` compares: every registered strategy's bench
 * variants in registration order (the all-reduce's first: the baseline), an opt-in one only when
 * `flags` has its flag.
 */
export const benchVariants = (flags: ReadonlyArray<string>): ReadonlyArray<BenchVariant> =>
  list.flatMap((e) => e.benchVariants ?? []).filter((v) => v.optIn === undefined || flags.includes(v.optIn))

/** Whether a job with this strategy runs parameter servers. */
export const usesParameterServers = (name: string): boolean => byName.get(name)?.servers === true
