// The cluster view: the live set of nodes and their resources, built from the advertisements node
// agents heartbeat (and answer on request, so a new view fills in at once instead of after a beat).
// A node silent for `deadAfterMs` (default 2.5 s; agents beat every 500 ms) is marked dead within
// that plus one sweep (100 ms), and the owners of the actors it ran are told: a node-lost notice
// on each affected job's events subject, which their watchers and supervisors act on, plus a local
// event. A node whose agent says it is leaving is marked "left" instead (its agent reports its own
// processes' exits). Several views may run (each driver, the head); their notices are idempotent.
import type { NatsConnection, Subscription } from "@nats-io/nats-core"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Scope from "effect/Scope"
import { NODE_DEAD_AFTER_MS } from "../core/defaults.ts"
import { HeldClock } from "../core/held-clock.ts"
import { clusterSubjects, jobSubjects, validToken } from "../core/subjects.ts"
import { decodeMessage, encodeMessage } from "../core/wire.ts"
import { LinkState } from "./link-state.ts"
import { decodeAdvertisement, toNodeResources, type NodeAdvertisement, type NodeLostEvent, type NodeProcess } from "./node-info.ts"
import type { NodeResources } from "./resources.ts"

export type NodeState = "alive" | "dead" | "left"

export interface NodeStatus {
  readonly ad: NodeAdvertisement
  readonly state: NodeState
  /** When the last advertisement arrived (ms since epoch, this host's clock). */
  readonly lastSeenAt: number
  /** When the node entered its current state. */
  readonly since: number
}

export type ClusterEvent =
  | { readonly type: "node-joined"; readonly node: NodeStatus }
  | { readonly type: "node-dead"; readonly node: NodeStatus; readonly lost: ReadonlyArray<NodeProcess> }
  | { readonly type: "node-left"; readonly node: NodeStatus }
  | { readonly type: "node-back"; readonly node: NodeStatus }

export interface ClusterViewOptions {
  readonly nc: NatsConnection
  readonly cluster: string
  /** Silence after which a node is dead. Default 2500 ms. */
  readonly deadAfterMs?: number
  /** How often silence is checked. Default 100 ms. */
  readonly sweepMs?: number
  /** Publish node-lost notices to the jobs of a dead node's actors. Default true. */
  readonly notifyOwners?: boolean
  /** Dead and departed nodes are dropped from the view after this long. Default 10 min. */
  readonly forgetAfterMs?: number
  /**
   * How many agents answer the first refresh, where the caller knows (the embedded cluster: its
   * one agent): the refresh ends at that many answers instead of waiting a quarter of a second
   * after the last one for more. Unset: answers are awaited until they stop.
   */
  readonly expectNodes?: number
}

export const DEFAULT_NODE_DEAD_AFTER_MS = NODE_DEAD_AFTER_MS

/** Orders advertisements of one node id: a restarted agent's win over its previous life's. */
const newer = (a: NodeAdvertisement, b: NodeAdvertisement): boolean =>
  a.startedAt !== b.startedAt ? a.startedAt > b.startedAt : a.seq > b.seq

export class ClusterView {
  readonly cluster: string
  readonly deadAfterMs: number
  readonly #nc: NatsConnection
  readonly #nodes = new Map<string, NodeStatus>()
  readonly #listeners = new Set<(event: ClusterEvent) => void>()
  readonly #changeWaiters = new Set<() => void>()
  readonly #sub: Subscription
  readonly #timer: ReturnType<typeof setInterval>
  readonly #notifyOwners: boolean
  readonly #forgetAfterMs: number
  readonly #link: LinkState
  /** This process's own holds (core/held-clock.ts), so they do not count as the nodes' silence. */
  readonly #clock: HeldClock
  /** Per node, where its silence is counted from after a hold of ours (when later than its last advertisement). */
  readonly #silentFrom = new Map<string, number>()
  #closed = false

  constructor(options: ClusterViewOptions) {
    this.cluster = options.cluster
    this.#nc = options.nc
    this.deadAfterMs = options.deadAfterMs ?? DEFAULT_NODE_DEAD_AFTER_MS
    this.#notifyOwners = options.notifyOwners ?? true
    this.#forgetAfterMs = options.forgetAfterMs ?? 600_000
    const subjects = clusterSubjects(options.cluster)
    this.#sub = options.nc.subscribe(subjects.nodeHeartbeats, { callback: (_err, msg) => this.#onData(msg.data) })
    const sweepMs = options.sweepMs ?? 100
    this.#clock = new HeldClock(sweepMs)
    this.#timer = setInterval(() => this.#sweep(), sweepMs)
    this.#timer.unref()
    this.#link = new LinkState(options.nc)
    // Back from our own outage: give every live node a fresh deadline instead of declaring it dead.
    this.#link.onResume(() => {
      const now = Date.now()
      for (const [id, node] of this.#nodes) if (node.state === "alive") this.#nodes.set(id, { ...node, lastSeenAt: now })
    })
  }

  /** Every node known, dead and departed ones included, head first then by id. */
  nodes(): NodeStatus[] {
    return [...this.#nodes.values()].sort(
      (a, b) => Number(b.ad.head) - Number(a.ad.head) || (a.ad.nodeId < b.ad.nodeId ? -1 : a.ad.nodeId > b.ad.nodeId ? 1 : 0)
    )
  }

  alive(): NodeStatus[] {
    return this.nodes().filter((n) => n.state === "alive")
  }

  get(nodeId: string): NodeStatus | undefined {
    return this.#nodes.get(nodeId)
  }

  /** The live nodes as the placement code wants them. */
  resources(): NodeResources[] {
    return this.alive().map((n) => toNodeResources(n.ad))
  }

  /**
   * Takes a node for dead now, without waiting for its heartbeats to stop (a process of it said its
   * agent is gone), as the sweep would: a node-dead event, and the owners of its processes told. A
   * node that is heard again comes back as after any death.
   */
  markDead(nodeId: string): void {
    const node = this.#nodes.get(nodeId)
    if (!node || node.state !== "alive") return
    const now = Date.now()
    const dead: NodeStatus = { ...node, state: "dead", since: now }
    this.#nodes.set(nodeId, dead)
    if (this.#notifyOwners) this.#tellOwners(nodeId, node.ad.processes, now)
    this.#emit({ type: "node-dead", node: dead, lost: node.ad.processes })
    this.#changed()
  }

  onEvent(listener: (event: ClusterEvent) => void): () => void {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }

  /**
   * Resolves with the nodes once `predicate` holds (checked now and on every change); rejects
   * with an Error describing what is known when `timeoutMs` passes first.
   */
  waitFor(predicate: (nodes: NodeStatus[]) => boolean, timeoutMs: number): Promise<NodeStatus[]> {
    return new Promise((resolve, reject) => {
      const check = (): boolean => {
        const nodes = this.nodes()
        if (!predicate(nodes)) return false
        cleanup()
        resolve(nodes)
        return true
      }
      const timer = setTimeout(() => {
        cleanup()
        const known = this.nodes().map((n) => `${n.ad.nodeId}:${n.state}`).join(", ") || "none"
        reject(new Error(`cluster view: condition not met within ${timeoutMs} ms (nodes: ${known})`))
      }, timeoutMs)
      const waiter = (): void => void check()
      const cleanup = (): void => {
        clearTimeout(timer)
        this.#changeWaiters.delete(waiter)
      }
      if (check()) return
      this.#changeWaiters.add(waiter)
    })
  }

  /**
   * Resolves at the view's next change (a node heard for the first time, or changing state, or an
   * advertisement updated), or after `timeoutMs`: what a loop that waits for room awaits between
   * tries (waitFor with a predicate that holds now resolves at once, without a turn of the event
   * loop, so the messages that would change the view never arrive).
   */
  nextChange(timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer)
        this.#changeWaiters.delete(done)
        resolve()
      }
      const timer = setTimeout(done, timeoutMs)
      this.#changeWaiters.add(done)
    })
  }

  /**
   * Asks every agent for its advertisement now; resolves after replies stop coming, or at
   * `expectNodes` replies when the caller knows how many agents there are (bounded by `timeoutMs`).
   */
  async refresh(timeoutMs = 1_500, expectNodes?: number): Promise<void> {
    const subjects = clusterSubjects(this.cluster)
    try {
      const replies = await this.#nc.requestMany(
        subjects.nodeQuery,
        new Uint8Array(0),
        expectNodes !== undefined && expectNodes > 0
          ? { maxWait: timeoutMs, strategy: "count", maxMessages: expectNodes }
          : { maxWait: timeoutMs, strategy: "stall", stall: 250 }
      )
      for await (const msg of replies) {
        if (msg.data.length > 0) this.#onData(msg.data)
      }
    } catch {
      // no agents answered (no responders) or the connection is closing: the view stays as is
    }
  }

  close(): void {
    if (this.#closed) return
    this.#closed = true
    clearInterval(this.#timer)
    this.#link.close()
    try {
      this.#sub.unsubscribe()
    } catch {
      // connection closed
    }
  }

  #emit(event: ClusterEvent): void {
    for (const l of this.#listeners) {
      try {
        l(event)
      } catch {
        // a listener's problem is not the view's
      }
    }
  }

  #changed(): void {
    for (const w of [...this.#changeWaiters]) w()
  }

  #onData(data: Uint8Array): void {
    let value: unknown
    try {
      value = decodeMessage(data)
    } catch {
      return
    }
    const decoded = decodeAdvertisement(value)
    if (Exit.isFailure(decoded)) return
    const ad = decoded.value
    if (ad.cluster !== this.cluster || !validToken(ad.nodeId)) return
    const now = Date.now()
    const before = this.#nodes.get(ad.nodeId)
    if (before && !newer(ad, before.ad)) return
    const state: NodeState = ad.leaving ? "left" : "alive"
    const node: NodeStatus = { ad, state, lastSeenAt: now, since: before && before.state === state ? before.since : now }
    this.#nodes.set(ad.nodeId, node)
    if (!before) {
      if (state === "alive") this.#emit({ type: "node-joined", node })
    } else if (before.state !== state) {
      if (state === "left") this.#emit({ type: "node-left", node })
      else this.#emit({ type: before.state === "dead" ? "node-back" : "node-joined", node })
    }
    this.#changed()
  }

  #sweep(): void {
    const now = Date.now()
    const held = this.#clock.held(now)
    if (!this.#link.up) return
    if (held > 0) {
      // Our own process was held: each live node's silence goes on from where it stood before.
      for (const [id, node] of this.#nodes) {
        if (node.state === "alive") this.#silentFrom.set(id, now - Math.max(0, now - held - this.#silenceBase(id, node)))
      }
      return
    }
    let changed = false
    for (const [id, node] of this.#nodes) {
      if (node.state === "alive" && now - this.#silenceBase(id, node) > this.deadAfterMs) {
        this.markDead(id)
      } else if (node.state !== "alive" && now - node.since > this.#forgetAfterMs) {
        this.#nodes.delete(id)
        this.#silentFrom.delete(id)
        changed = true
      }
    }
    if (changed) this.#changed()
  }

  /** Where a node's silence is counted from: its last advertisement, or later after a hold of ours. */
  #silenceBase(id: string, node: NodeStatus): number {
    return Math.max(node.lastSeenAt, this.#silentFrom.get(id) ?? 0)
  }

  #tellOwners(nodeId: string, lost: ReadonlyArray<NodeProcess>, now: number): void {
    if (this.#nc.isClosed()) return
    for (const p of lost) {
      if (!validToken(p.job)) continue
      const event: NodeLostEvent = { type: "node-lost", node: nodeId, name: p.name, instance: p.instance, owner: p.owner, at: now }
      try {
        this.#nc.publish(jobSubjects(this.cluster, p.job).events, encodeMessage(event))
      } catch {
        // closing
      }
    }
  }
}

/** A cluster view that lives as long as the enclosing scope. Fills in from a query first. */
export const makeClusterView = (options: ClusterViewOptions): Effect.Effect<ClusterView, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const view = new ClusterView(options)
      await view.refresh()
      return view
    }),
    (view) => Effect.sync(() => view.close())
  )

/** `makeClusterView` for Promise code: close it with `view.close()`. */
export const openClusterView = async (options: ClusterViewOptions): Promise<ClusterView> => {
  const view = new ClusterView(options)
  await view.refresh(undefined, options.expectNodes)
  return view
}
