// Prometheus' text exposition format (version 0.0.4, what Prometheus scrapes from Ray, NATS's
// exporter and most others): per metric family a "# HELP" and a "# TYPE" line, then one sample per
// line, `name{label="value",...} value`. Label values escape backslash, double quote and newline;
// help text escapes backslash and newline; values are Go-style floats (NaN, +Inf, -Inf).

export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

export type Labels = Readonly<Record<string, string | number | boolean>>

export interface Sample {
  readonly labels: Labels
  readonly value: number
}

export interface MetricFamily {
  readonly name: string
  readonly help: string
  readonly type: "gauge" | "counter"
  readonly samples: ReadonlyArray<Sample>
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/

const escapeLabel = (v: string): string => v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"')
const escapeHelp = (v: string): string => v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")

export const formatValue = (v: number): string => (Number.isNaN(v) ? "NaN" : v === Infinity ? "+Inf" : v === -Infinity ? "-Inf" : String(v))

/** The exposition text of these families; families without samples are left out, a bad name throws. */
export const renderExposition = (families: ReadonlyArray<MetricFamily>): string => {
  const out: string[] = []
  for (const f of families) {
    if (!NAME.test(f.name)) throw new Error(`invalid metric name "${f.name}"`)
    if (f.samples.length === 0) continue
    out.push(`# HELP ${f.name} ${escapeHelp(f.help)}`, `# TYPE ${f.name} ${f.type}`)
    for (const s of f.samples) {
      const labels = Object.entries(s.labels).map(([k, v]) => {
        if (!LABEL.test(k) || k.startsWith("__")) throw new Error(`invalid label name "${k}" of ${f.name}`)
        return `${k}="${escapeLabel(String(v))}"`
      })
      out.push(`${f.name}${labels.length ? `{${labels.join(",")}}` : ""} ${formatValue(s.value)}`)
    }
  }
  return out.length ? `${out.join("\n")}\n` : ""
}
