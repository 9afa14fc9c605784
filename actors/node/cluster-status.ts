// `gradwire status`: asks the cluster who is there and prints nodes, resources (total and used),
// backends and liveness as a table, or as JSON for scripts. The head's cluster view answers with
// every node it knows (dead ones included); without a head view, every agent answers for itself.
// Below the table: the WebGPU adapters nodes found, restarts of a head's supervised nats-server
// and the NATS outages agents had.
// When NATS itself cannot be reached, describeLocalAgent says what the local agent's state file
// knows (is it running, its server's restarts, the outage it is in).
import type { NatsConnection } from "@nats-io/nats-core"
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import { clusterSubjects } from "../../core/subjects.ts"
import { decodeMessage } from "../../core/wire.ts"
import type { NodeState } from "../../scheduler/cluster-view.ts"
import {
  decodeAdvertisement,
  NodeAdvertisementSchema,
  type NatsOutages,
  type NodeAdvertisement,
  type SupervisedServer,
  type WebGpuAdapter
} from "../../scheduler/node-info.ts"
import { pidAlive, type AgentState } from "./agent-state.ts"
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
  /** The agent's NATS outages (absent from older agents' advertisements). */
  readonly natsOutages?: NatsOutages
  /** The nats-server this node's agent supervises (a head that started one). */
  readonly natsServer?: SupervisedServer
  /** The WebGPU adapter the node's probe found. */
  readonly webgpu?: WebGpuAdapter
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

/** A node as `gradwire status` reports it (GPUs in use: those held whole plus the fractions shared). */
export const report = (ad: NodeAdvertisement, state: NodeState, lastSeenAt: number): NodeReport => {
  const total: Record<string, number> = { CPU: ad.cpus, GPU: ad.gpus.length, memory: ad.memoryBytes, ...ad.custom }
  const used: Record<string, number> = { CPU: ad.used.cpus, GPU: ad.used.gpuIndices.length + Object.values(ad.used.gpuShares ?? {}).reduce((a, b) => a + b, 0), memory: ad.used.memoryBytes, ...ad.used.custom }
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
    agentPid: ad.pid,
    ...(ad.natsOutages !== undefined ? { natsOutages: ad.natsOutages } : {}),
    ...(ad.natsServer !== undefined ? { natsServer: ad.natsServer } : {}),
    ...(ad.webgpu !== undefined ? { webgpu: ad.webgpu } : {})
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

const fmtTime = (ms: number): string => new Date(ms).toISOString()

const fmtSeconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`

const times = (n: number): string => `${n} time${n === 1 ? "" : "s"}`

/** One line per node whose probe found a WebGPU adapter: what it is and its buffer limits. */
export const adapterLines = (nodes: ReadonlyArray<NodeReport>): string[] =>
  nodes.flatMap((n) => {
    const a = n.webgpu
    if (!a) return []
    const what = [a.vendor, a.architecture, a.device].filter(Boolean).join(" ")
    return [
      `webgpu adapter of ${n.nodeId}: ${a.description || what || "unnamed"}${a.description && what ? ` (${what})` : ""}, ` +
        `max buffer ${formatBytes(a.maxBufferSize)}, max storage binding ${formatBytes(a.maxStorageBufferBindingSize)}` +
        (a.software ? ", software rasterizer (not a GPU)" : "")
    ]
  })

/** The lines under the table: supervised servers that restarted, agents that lost NATS. */
export const incidentLines = (nodes: ReadonlyArray<NodeReport>): string[] => {
  const out: string[] = []
  for (const n of nodes) {
    const srv = n.natsServer
    if (srv && srv.restarts > 0) {
      out.push(`nats-server of ${n.nodeId} (pid ${srv.pid}) restarted ${times(srv.restarts)}, last at ${fmtTime(srv.lastRestartAt)}`)
    }
  }
  for (const n of nodes) {
    const o = n.natsOutages
    if (o && o.count > 0) {
      out.push(`${n.nodeId} lost NATS ${times(o.count)}${o.lastAt > 0 ? `, the last at ${fmtTime(o.lastAt)} for ${fmtSeconds(o.lastMs)}` : ""}`)
    }
  }
  return out
}

/**
 * What the local agent's state file says, for when NATS cannot be reached: whether the agent is
 * running, the server it supervises, and the outage it is in or had last.
 */
export const describeLocalAgent = (state: AgentState, stateFile: string, now = Date.now()): string => {
  const running = pidAlive(state.pid)
  const lines = [
    running
      ? `the local agent (node ${state.nodeId}, cluster "${state.cluster}", pid ${state.pid}) is running (${stateFile})`
      : `the local agent recorded in ${stateFile} (node ${state.nodeId}, pid ${state.pid}) is not running: start it again ("gradwire start")`
  ]
  const srv = state.natsServer
  if (srv) {
    const restarts = srv.restarts ?? 0
    lines.push(
      `  its NATS server ${srv.url}: pid ${srv.pid} ${pidAlive(srv.pid) ? "running" : "not running"}` +
        (restarts > 0 ? `; restarted ${times(restarts)}, last at ${fmtTime(srv.lastRestartAt ?? 0)}` : "") +
        ((srv.lastExitAt ?? 0) > (srv.lastRestartAt ?? 0) ? `; exited at ${fmtTime(srv.lastExitAt!)}, restarting` : "")
    )
  }
  const nats = state.nats
  if (running && nats) {
    if (!nats.up && nats.downSince !== undefined) {
      lines.push(`  it lost NATS at ${nats.server} ${fmtSeconds(now - nats.downSince)} ago (${fmtTime(nats.downSince)}) and keeps retrying`)
    } else {
      lines.push(`  its connection to NATS (${nats.server}) was up when last recorded (${fmtTime(nats.updatedAt)})`)
    }
    if (nats.lastOutageAt !== undefined) {
      lines.push(`  NATS outages so far: ${nats.outages}; the last ended one began ${fmtTime(nats.lastOutageAt)} and lasted ${fmtSeconds(nats.lastOutageMs ?? 0)}`)
    }
  }
  return lines.join("\n")
}

/** The table `gradwire status` prints. */
export const formatClusterTable = (r: ClusterReport): string => {
  if (r.nodes.length === 0) {
    return `cluster "${r.cluster}" at ${r.address}: no nodes. Start an agent with "gradwire start --head" (or "gradwire start --address ${r.address}").`
  }
  const header = ["NODE", "STATE", "HOST", "CPU", "MEMORY", "GPU", "BACKENDS", "NATS SERVER", "ACTORS", "LABELS", "SEEN"]
  // A dead or departed node's last advertisement says what it held then, not now: its processes
  // are gone with it (or being stopped), so neither its use nor its actors are shown.
  const rows = r.nodes.map((n) => {
    const live = n.state === "alive"
    const used = (text: string): string => (live ? text : "-")
    return [
      `${n.nodeId}${n.head ? " (head)" : ""}`,
      n.state,
      n.hostname,
      `${used(fmtAmount("CPU", n.resources.used.CPU ?? 0))}/${fmtAmount("CPU", n.resources.total.CPU ?? 0)}`,
      `${used(formatBytes(n.resources.used.memory ?? 0))}/${formatBytes(n.resources.total.memory ?? 0)}`,
      `${used(fmtAmount("GPU", n.resources.used.GPU ?? 0))}/${n.resources.total.GPU ?? 0}${n.gpus.length ? ` ${[...new Set(n.gpus.map((g) => g.name))].join(",")}` : ""}`,
      n.backendsProbed ? n.backends.join(",") || "none" : "probing…",
      n.nats.serverName || n.nats.serverId.slice(0, 8),
      used(String(n.processes.length)),
      Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(",") || "-",
      fmtAgo(n.lastSeenMsAgo)
    ]
  })
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)))
  const line = (cells: string[]): string => cells.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd()
  const keys = [...new Set([...Object.keys(r.totals.total), ...Object.keys(r.totals.used)])]
  const totals = keys.map((k) => `${k} ${fmtAmount(k, r.totals.used[k] ?? 0)}/${fmtAmount(k, r.totals.total[k] ?? 0)}`).join(", ")
  const alive = r.nodes.filter((n) => n.state === "alive").length
  const incidents = incidentLines(r.nodes)
  return [
    `cluster "${r.cluster}" at ${r.address}: ${alive} alive node(s) of ${r.nodes.length} known`,
    "",
    line(header),
    ...rows.map(line),
    "",
    `resources (used/total, alive nodes): ${totals}`,
    ...adapterLines(r.nodes),
    ...incidents
  ].join("\n")
}
