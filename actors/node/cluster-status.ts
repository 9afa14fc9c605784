// `gradwire status`: asks the cluster who is there and prints nodes, resources (total and used),
// backends and liveness as a table, or as JSON for scripts. The head's cluster view answers with
// every node it knows (dead ones included); without a head view, every agent answers for itself.
import type { NatsConnection } from "@nats-io/nats-core"
import { Exit, Schema } from "effect"
import { clusterSubjects } from "../../core/subjects.ts"
import { decodeMessage } from "../../core/wire.ts"
import type { NodeState } from "../../scheduler/cluster-view.ts"
import { decodeAdvertisement, NodeAdvertisementSchema, type NodeAdvertisement } from "../../scheduler/node-info.ts"
import { formatBytes } from "../../scheduler/resources.ts"

export interface NodeReport {
  readonly nodeId: string
  readonly state: NodeState
  readonly head: boolean
  readonly hostname: string
  readonly lastSeenMsAgo: number
  readonly resources: { readonly total: Record<string, number>; readonly used: Record<string, number> }
  readonly gpus: NodeAdvertisement["gpus"]
  readonly backends: ReadonlyArray<string>
  readonly backendsProbed: boolean
  readonly nats: NodeAdvertisement["nats"]
  readonly labels: Readonly<Record<string, string>>
  readonly processes: NodeAdvertisement["processes"]
  readonly agentPid: number
}

export interface ClusterReport {
  readonly cluster: string
  readonly address: string
  /** "head-view" when the head's cluster view answered, else "agents". */
  readonly source: "head-view" | "agents"
  readonly nodes: ReadonlyArray<NodeReport>
  readonly totals: { readonly total: Record<string, number>; readonly used: Record<string, number> }
}

const ViewEntry = Schema.Struct({ ad: NodeAdvertisementSchema, state: Schema.Literals(["alive", "dead", "left"]), lastSeenAt: Schema.Number })
const decodeView = Schema.decodeUnknownExit(Schema.Array(ViewEntry))

const report = (ad: NodeAdvertisement, state: NodeState, lastSeenAt: number): NodeReport => {
  const total: Record<string, number> = { CPU: ad.cpus, GPU: ad.gpus.length, memory: ad.memoryBytes, ...ad.custom }
  const used: Record<string, number> = { CPU: ad.used.cpus, GPU: ad.used.gpuIndices.length, memory: ad.used.memoryBytes, ...ad.used.custom }
  return {
    nodeId: ad.nodeId,
    state,
    head: ad.head,
    hostname: ad.hostname,
    lastSeenMsAgo: Math.max(0, Date.now() - lastSeenAt),
    resources: { total, used },
    gpus: ad.gpus,
    backends: ad.backends,
    backendsProbed: ad.backendsProbed,
    nats: ad.nats,
    labels: ad.labels,
    processes: ad.processes,
    agentPid: ad.pid
  }
}

const sum = (nodes: ReadonlyArray<NodeReport>, pick: (n: NodeReport) => Record<string, number>): Record<string, number> => {
  const out: Record<string, number> = {}
  for (const n of nodes) if (n.state === "alive") for (const [k, v] of Object.entries(pick(n))) out[k] = (out[k] ?? 0) + v
  return out
}

/** Collects the cluster's nodes (at most ~`timeoutMs`). */
export const queryCluster = async (nc: NatsConnection, cluster: string, address: string, timeoutMs = 1_500): Promise<ClusterReport> => {
  const subjects = clusterSubjects(cluster)
  let nodes: NodeReport[] | undefined
  let source: ClusterReport["source"] = "head-view"
  try {
    const msg = await nc.request(subjects.viewQuery, new Uint8Array(0), { timeout: Math.min(1_000, timeoutMs) })
    const view = decodeView(decodeMessage(msg.data))
    if (Exit.isSuccess(view)) nodes = view.value.map((e) => report(e.ad, e.state, e.lastSeenAt))
  } catch {
    // no head view (no head, or an older agent): ask the agents themselves
  }
  if (!nodes) {
    source = "agents"
    nodes = []
    try {
      const replies = await nc.requestMany(subjects.nodeQuery, new Uint8Array(0), { maxWait: timeoutMs, strategy: "stall", stall: 300 })
      for await (const msg of replies) {
        if (msg.data.length === 0) continue
        try {
          const ad = decodeAdvertisement(decodeMessage(msg.data))
          if (Exit.isSuccess(ad)) nodes.push(report(ad.value, ad.value.leaving ? "left" : "alive", Date.now()))
        } catch {
          // not an advertisement
        }
      }
    } catch {
      // no responders: no agents
    }
  }
  nodes.sort((a, b) => Number(b.head) - Number(a.head) || (a.nodeId < b.nodeId ? -1 : 1))
  return { cluster, address, source, nodes, totals: { total: sum(nodes, (n) => n.resources.total), used: sum(nodes, (n) => n.resources.used) } }
}

const fmtAmount = (key: string, v: number): string => (key === "memory" ? formatBytes(v) : String(Number(v.toFixed(2))))

const fmtAgo = (ms: number): string => (ms < 1_000 ? "now" : ms < 120_000 ? `${Math.round(ms / 1000)}s ago` : `${Math.round(ms / 60_000)}m ago`)

/** The table `gradwire status` prints. */
export const formatClusterTable = (r: ClusterReport): string => {
  if (r.nodes.length === 0) {
    return `cluster "${r.cluster}" at ${r.address}: no nodes. Start an agent with "gradwire start --head" (or "gradwire start --address ${r.address}").`
  }
  const header = ["NODE", "STATE", "HOST", "CPU", "MEMORY", "GPU", "BACKENDS", "NATS SERVER", "ACTORS", "LABELS", "SEEN"]
  const rows = r.nodes.map((n) => [
    `${n.nodeId}${n.head ? " (head)" : ""}`,
    n.state,
    n.hostname,
    `${fmtAmount("CPU", n.resources.used.CPU ?? 0)}/${fmtAmount("CPU", n.resources.total.CPU ?? 0)}`,
    `${formatBytes(n.resources.used.memory ?? 0)}/${formatBytes(n.resources.total.memory ?? 0)}`,
    `${n.resources.used.GPU ?? 0}/${n.resources.total.GPU ?? 0}${n.gpus.length ? ` ${[...new Set(n.gpus.map((g) => g.name))].join(",")}` : ""}`,
    n.backendsProbed ? n.backends.join(",") || "none" : "probing…",
    n.nats.serverName || n.nats.serverId.slice(0, 8),
    String(n.processes.length),
    Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(",") || "-",
    fmtAgo(n.lastSeenMsAgo)
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)))
  const line = (cells: string[]): string => cells.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd()
  const keys = [...new Set([...Object.keys(r.totals.total), ...Object.keys(r.totals.used)])]
  const totals = keys.map((k) => `${k} ${fmtAmount(k, r.totals.used[k] ?? 0)}/${fmtAmount(k, r.totals.total[k] ?? 0)}`).join(", ")
  const alive = r.nodes.filter((n) => n.state === "alive").length
  return [
    `cluster "${r.cluster}" at ${r.address}: ${alive} alive node(s) of ${r.nodes.length} known`,
    "",
    line(header),
    ...rows.map(line),
    "",
    `resources (used/total, alive nodes): ${totals}`
  ].join("\n")
}
