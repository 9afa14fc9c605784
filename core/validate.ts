// Turns Schema decoding failures into ConfigError: the field path, what was wrong, what was
// given. Every user-facing config goes through here before anything starts.
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as SchemaIssue from "effect/SchemaIssue"
import { ConfigError } from "./errors.ts"

const formatter = SchemaIssue.makeFormatterStandardSchemaV1()

const show = (value: unknown): string => {
  if (typeof value === "function") return "a function"
  try {
    const s = JSON.stringify(value)
    if (s === undefined) return String(value)
    return s.length > 80 ? `${s.slice(0, 77)}...` : s
  } catch {
    return String(value)
  }
}

const valueAt = (root: unknown, path: ReadonlyArray<PropertyKey>): unknown => {
  let cur: unknown = root
  for (const key of path) {
    if (cur === null || typeof cur !== "object") return undefined
    cur = (cur as Record<PropertyKey, unknown>)[key]
  }
  return cur
}

/**
 * Decodes `input` with `schema`, or throws a ConfigError naming the first bad field (dotted path
 * under `root`), the expected values and what was given; further problems are listed after it.
 * Unknown keys are errors, so a misspelt option never gets silently ignored.
 */
export const decodeConfig = <S extends Schema.ConstraintDecoder<unknown>>(
  schema: S,
  input: unknown,
  root: string
): S["Type"] => {
  const result = Schema.decodeUnknownResult(schema)(input, { errors: "all", onExcessProperty: "error" })
  if (Result.isSuccess(result)) return result.success
  const issues = formatter(result.failure.issue).issues
  const describe = (issue: (typeof issues)[number]) => {
    const path = (issue.path ?? []).map((p) => (typeof p === "object" && p !== null && "key" in p ? p.key : p)) as PropertyKey[]
    const field = [root, ...path.map(String)].filter((s) => s.length > 0).join(".")
    const given = valueAt(input, path)
    const msg = issue.message === "Expected no excess property"
      ? `unknown option (check the spelling; see docs/api.md for the options of "${[root, ...path.slice(0, -1).map(String)].filter(Boolean).join(".")}")`
      : `${issue.message}, got ${show(given)}`
    return { field, msg }
  }
  const [first, ...rest] = issues.map(describe)
  throw new ConfigError({
    field: first?.field ?? root,
    reason: (first?.msg ?? "invalid value") + rest.map((r) => `; also "${r.field}": ${r.msg}`).join("")
  })
}
