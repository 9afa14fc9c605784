// The small logger the actor runtime and the node agent write through. A plain interface (not
// Effect's logger) because it is called from NATS callbacks and child-process streams, outside any
// fiber; tests pass their own to capture lines. Level from $GRADWIRE_LOG (core/settings.ts).
import * as settings from "../../core/settings.ts"
import type { LogLevel } from "../../core/settings.ts"

export interface ActorLogger {
  debug(message: string): void
  info(message: string): void
  warn(message: string): void
  error(message: string): void
}

const LEVELS: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 }
type Level = keyof typeof LEVELS

const envLevel = (): number => LEVELS[settings.logLevel.read()]

/** Writes `[gradwire <scope>] message` lines to stderr at or above the $GRADWIRE_LOG level. */
export const stderrLogger = (scope: string): ActorLogger => {
  const min = envLevel()
  const write = (level: Level, message: string): void => {
    if (LEVELS[level] < min) return
    process.stderr.write(`[gradwire ${scope}] ${level === "info" ? "" : `${level}: `}${message}\n`)
  }
  return {
    debug: (m) => write("debug", m),
    info: (m) => write("info", m),
    warn: (m) => write("warn", m),
    error: (m) => write("error", m)
  }
}

export const silentLogger: ActorLogger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} }

/**
 * Logs the first `burst` occurrences, then one summary line per `every` more: a flood of bad
 * messages (a fuzzer, a misconfigured sender) must not turn into a flood of log lines.
 */
export const rateLimited = (log: (message: string) => void, burst = 10, every = 1000): ((message: string) => void) => {
  let count = 0
  return (message) => {
    count++
    if (count <= burst) log(message)
    else if (count % every === 0) log(`${message} (${count} so far; logging 1 in ${every})`)
  }
}
