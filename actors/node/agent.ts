// The node agent: one per machine. It advertises the node (hardware, tfjs backends, NATS server,
// labels, resources total and used, the actor processes it runs) by heartbeating it every 500 ms
// and answering queries; it spawns actor processes on request (actors/node/host.ts with the spawn's
// module export, args and the environment variables env-policy.ts allows, such as
// CUDA_VISIBLE_DEVICES), forwards their output line by line with a prefix, reports their exits on
// the job's events subject, and kills them when their job ends, their owner (driver) stops
// heartbeating, or the agent stops. The head agent also runs a cluster view, so `gradwire status`
// can show dead nodes too. It never gives up on NATS: an outage is logged at once, every 10 s while
// it lasts and when it ends, and advertised (count, last length) once the bus is back.
// The agent's control interface is an actor (AgentProtocol) at gw.<cluster>.node.<id>.ctl.
import * as fs from "node:fs"
import { getPriority, hostname } from "node:os"
import * as path from "node:path"
import { nuid, type NatsConnection, type Subscription } from "@nats-io/nats-core"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { clusterSubjects, jobSubjects, validToken } from "../../core/subjects.ts"
import { encodeMessage } from "../../core/wire.ts"
import { HeldClock } from "../../core/held-clock.ts"
import { ClusterView } from "../../scheduler/cluster-view.ts"
import { usageOfProcesses } from "../../scheduler/resources.ts"
import { LinkState } from "../../scheduler/link-state.ts"
import type { NodeAdvertisement, NodeProcess, SupervisedServer } from "../../scheduler/node-info.ts"
import { watchBus, type BusMonitor } from "../../core/bus-monitor.ts"
import { defineActor, launchActor, type ActorHandle } from "../runtime/actor.ts"
import { ActorProcess } from "./actor-process.ts"
import { AgentProtocol, agentsInThisProcess, type SpawnRequest } from "./agent-protocol.ts"
import { normalizeConnection, redactUrl, type ConnectionSpec } from "../../core/connection-spec.ts"
import { AgentError, EnvNotAllowed, ModuleNotAllowed, SpawnError } from "./errors.ts"
import { SPAWN_ENV_ALLOWED, refusedSpawnEnv } from "./env-policy.ts"
import { modulePolicy, refuseActorModule, refuseImport, type ModulePolicy } from "./module-policy.ts"
import { publishJobEvent, readJobEvent } from "../runtime/events.ts"
import { DEFAULT_HEARTBEAT_MS } from "../runtime/heartbeat.ts"
import { settleWithin } from "../runtime/deadline.ts"
import { encodeHostSpec } from "./host-spec.ts"
import { stderrLogger, type ActorLogger } from "../runtime/log.ts"
import { probeBackends, probeHardware, softwareGpus, type BackendName, type GpuInfo, type NodeHardware } from "./node-probe.ts"
import type { WebGpuAdapterInfo } from "../../core/webgpu.ts"
import { ActorSystem } from "../runtime/system.ts"
import { processState } from "./agent-state.ts"
import { mayRaiseTo } from "../../core/priority.ts"
import { standbyNice } from "../../core/settings.ts"

export const AGENT_VERSION = "0.1.0"

/** While NATS is away, the agent says so this often (it never gives up: it only logs). */
export const OUTAGE_NOTICE_EVERY_MS = 10_000

/** What the agent knows about its own NATS connection (the state file keeps it for `gradwire status`). */
export interface AgentNatsStatus {
  readonly up: boolean
  /** The server it is connected to, or was when the connection was lost (never with credentials). */
  readonly server: string
  /** When the outage in progress began (ms since the epoch). */
  readonly downSince?: number
  /** Outages since the agent started, the one in progress included. */
  readonly outages: number
  /** When the last ended outage began, and how long it lasted. */
  readonly lastOutageAt?: number
  readonly lastOutageMs?: number
}
/** The job whose subjects the agent's own request/reply traffic uses. Reserved. */
export const AGENT_JOB = "_gw"

export interface AgentOptions {
  readonly nc: NatsConnection
  /** How spawned processes connect (the same servers and credentials as the agent; given on their stdin). */
  readonly connection: ConnectionSpec
  /**
   * Folders whose modules spawned processes may run, besides gradwire's own actors (see
   * module-policy.ts). Default none: only gradwire's actors, and the train loops jobs declare.
   */
  readonly allowModuleRoots?: ReadonlyArray<string>
  readonly maxPayload?: number
  readonly cluster: string
  /** Default "<hostname>-<random>". */
  readonly nodeId?: string
  readonly head?: boolean
  readonly labels?: Readonly<Record<string, string>>
  readonly numCpus?: number
  readonly numGpus?: number
  /** Custom resources (name -> amount). */
  readonly custom?: Readonly<Record<string, number>>
  /** Skip the probe and advertise these backends. */
  readonly backends?: ReadonlyArray<BackendName>
  /** With `backends`: the WebGPU adapter found (a software one becomes the node's GPUs, see softwareGpus). */
  readonly webgpu?: WebGpuAdapterInfo
  /** How many GPUs a software adapter counts as (default 1; the embedded cluster sizes it to the job). */
  readonly softwareGpuCount?: number
  /** Where the backend probe result is cached. */
  readonly stateDir?: string
  readonly heartbeatMs?: number
  /** Kill a job's processes when their owner has not heartbeat for this long. Default 5 s. */
  readonly ownerTimeoutMs?: number
  /** SIGTERM to SIGKILL. Default 3 s. */
  readonly killGraceMs?: number
  readonly log?: ActorLogger
  /** Where forwarded process output goes (default stdout). */
  readonly output?: (line: string) => void
  /** The nats-server this agent's owner started and supervises (a head's), for the advertisement. */
  readonly supervisedServer?: () => SupervisedServer | undefined
  /** Called when the connection to NATS is lost or back (the daemon keeps it in the state file). */
  readonly onNatsStatus?: (status: AgentNatsStatus) => void
  /**
   * Actor processes kept started ahead of requests, with gradwire's worker modules and tfjs loaded
   * (host.ts): a spawn takes one instead of starting cold, which is most of a replacement worker's
   * start. One starts after 3 s without a spawn, or at once beside a standby worker's spawn (while
   * its group runs short-handed, on the lost worker's CPU, rather than as it joins); where no
   * core is spare (the node's CPUs beyond what its processes reserve) only once a standby worker
   * was asked of this agent (a job here lost a worker), and at a lower CPU priority (GRADWIRE_STANDBY_NICE, where it can be raised
   * back), so that its load takes only what the running processes leave idle; it runs at its own
   * once a spawn takes it (a standby worker's: once it joins its group). Without a way back it
   * does not start there. Default 1; 0 starts every process cold.
   */
  readonly warmHosts?: number
  /**
   * A process stopped (SIGSTOP, SIGTSTP: state T) this long is killed (SIGKILL): it holds its whole
   * group up until a collective deadline (10 s at least) would fence it. Default 250 ms (checked
   * every 100 ms: a stopped worker holds its group about 0.35 s before its death is reported, 0.6 s
   * at 500 ms, 1.5 s at the first 1 s; a job-control stop by a person is never that short); 0 never.
   * Linux (/proc) only; a debugger's tracing stop (state t) is left alone.
   */
  readonly stoppedKillMs?: number
}

/** How long a process may be stopped (state T) before its agent kills it, by default. */
const STOPPED_KILL_MS = 250

/** How often an agent looks for stopped processes. */
const STOPPED_CHECK_MS = 100
/** How often the owners' heartbeats are checked (and warm hosts topped up). */
const OWNER_CHECK_MS = 250

/**
 * A warm process starts only after this long without a spawn (not beside the actors starting), and
 * on a fully used node only lowered: loading tfjs takes a core for seconds, which running workers
 * there would lose.
 */
const WARM_FILL_QUIET_MS = 3_000
/** After a warm process died while it waited, the next one waits this much longer. */
const WARM_CRASH_BACKOFF_MS = 30_000

interface Running {
  readonly proc: ActorProcess
  readonly info: NodeProcess
  readonly ownerTimeoutMs: number
  /** Since when the process has been seen stopped (state T), if it is. */
  stoppedSince?: number
}

interface Tracked {
  readonly sub: Subscription
  count: number
  lastSeen: number
}

const sanitize = (s: string): string => s.replace(/[^A-Za-z0-9_-]/g, "-").slice(0, 40) || "node"

/** Applies --num-gpus: fewer than detected keeps the first n; more declares placeholders. */
const limitGpus = (gpus: ReadonlyArray<GpuInfo>, n: number | undefined): GpuInfo[] => {
  if (n === undefined) return [...gpus]
  const out = gpus.slice(0, n)
  for (let i = out.length; i < n; i++) out.push({ index: i, name: "declared (--num-gpus)", memoryMiB: 0 })
  return out
}

export class NodeAgent {
  readonly nodeId: string
  readonly cluster: string
  readonly head: boolean
  readonly startedAt = Date.now()
  readonly #options: AgentOptions
  readonly #modules: ModulePolicy
  readonly #nc: NatsConnection
  readonly #log: ActorLogger
  readonly #output: (line: string) => void
  readonly #system: ActorSystem
  readonly #processes = new Map<string, Running>()
  /** Warm processes waiting for a spawn (options.warmHosts), until taken or dead. */
  readonly #warm: ActorProcess[] = []
  /** When the last spawn (the agent's start, a warm process's start) was: warm processes wait for quiet (WARM_FILL_QUIET_MS). */
  #lastSpawnAt = Date.now()
  /**
   * Whether a standby worker (a replacement, a spare) was asked of this agent: from then on it keeps
   * a warm process on a fully used node too, lowered (#fillWarm). Before it, a fully used node's
   * jobs are spared the CPU that loading one takes (short jobs paid 10-15% for it).
   */
  #standbySeen = false
  /** A standby worker was just spawned: the pool fills again at once, not after WARM_FILL_QUIET_MS (#fillWarm). */
  #fillBesideStandby = false
  readonly #owners = new Map<string, Tracked>()
  readonly #jobs = new Map<string, Tracked>()
  readonly #heartbeatMs: number
  #hardware: NodeHardware = { hostname: "", cpus: 0, memoryBytes: 0, gpus: [] }
  #gpus: GpuInfo[] = []
  #backends: ReadonlyArray<string> = []
  #backendsProbed = false
  #backendErrors: Record<string, string> = {}
  #webgpu: WebGpuAdapterInfo | undefined
  #seq = 0
  #leaving = false
  #control: Pick<ActorHandle, "stop"> | undefined
  #subs: Subscription[] = []
  #timers: Array<ReturnType<typeof setInterval>> = []
  readonly #ownerClock = new HeldClock(OWNER_CHECK_MS)
  #view: ClusterView | undefined
  #link: LinkState | undefined
  #bus: BusMonitor | undefined
  #outageNotice: ReturnType<typeof setInterval> | undefined
  #lastOutage: { readonly at: number; readonly ms: number } | undefined
  #stopping: Promise<void> | undefined
  readonly #stopped: Promise<void>
  #resolveStopped!: () => void

  /** @internal use launchAgent / launchAgentEffect */
  constructor(options: AgentOptions) {
    this.#options = options
    this.#modules = modulePolicy(options.allowModuleRoots ?? [])
    this.#nc = options.nc
    this.cluster = options.cluster
    this.head = options.head ?? false
    this.#heartbeatMs = options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS
    this.nodeId = options.nodeId ?? `${sanitize(hostname())}-${nuid.next().slice(-6).toLowerCase()}`
    if (!validToken(this.nodeId)) throw new AgentError({ reason: `invalid node id "${this.nodeId}": use letters, digits, "_" or "-"` })
    this.#log = options.log ?? stderrLogger(`agent ${this.nodeId}`)
    this.#output = options.output ?? ((line) => process.stdout.write(`${line}\n`))
    this.#system = new ActorSystem({
      nc: options.nc,
      cluster: options.cluster,
      job: AGENT_JOB,
      identity: `agent-${this.nodeId}`.slice(0, 128),
      heartbeat: false,
      node: this.nodeId,
      log: this.#log,
      ...(options.maxPayload !== undefined ? { maxPayload: options.maxPayload } : {})
    })
    this.#stopped = new Promise((resolve) => (this.#resolveStopped = resolve))
  }

  /** Resolves once the agent has stopped (by `stop()` or a shutdown request). */
  get stopped(): Promise<void> {
    return this.#stopped
  }

  /** @internal */
  async start(): Promise<void> {
    const hw = await probeHardware()
    this.#hardware = hw
    this.#gpus = limitGpus(hw.gpus, this.#options.numGpus)
    if (this.#options.backends) {
      this.#backends = [...this.#options.backends]
      this.#webgpu = this.#options.webgpu
      this.#gpus = limitGpus(softwareGpus(hw.gpus, this.#backends, this.#webgpu, this.#options.softwareGpuCount), this.#options.numGpus)
      this.#backendsProbed = true
    } else {
      // In the background: the agent serves at once and advertises the backends when known.
      void probeBackends({ gpus: hw.gpus, ...(this.#options.stateDir ? { cacheFile: path.join(this.#options.stateDir, "backends.json") } : {}) }).then(
        (r) => {
          this.#backends = r.backends
          this.#backendErrors = { ...r.errors }
          this.#webgpu = r.webgpu
          this.#gpus = limitGpus(softwareGpus(hw.gpus, r.backends, r.webgpu, this.#options.softwareGpuCount), this.#options.numGpus)
          this.#backendsProbed = true
          this.#advertise()
        }
      )
    }
    const subjects = clusterSubjects(this.cluster)
    this.#control = await launchActor(this.#system, this.#definition(), {
      name: `agent-${this.nodeId}`.slice(0, 128),
      subject: subjects.nodeControl(this.nodeId),
      heartbeat: false,
      log: this.#log
    }).catch((e: unknown) => {
      this.#system.close()
      throw new AgentError({
        reason: /already serves/.test(String((e as Error).message))
          ? `another agent with node id "${this.nodeId}" is running in cluster "${this.cluster}"; pick another --node-id`
          : `cannot start the agent's control actor: ${(e as Error).message}`
      })
    })
    // Known as this process's own once it serves (a start that failed, say to another agent of this
    // node id elsewhere, must not make that one's silence read as this process being busy).
    agentsInThisProcess.add(`${this.cluster}/${this.nodeId}`)
    this.#subs.push(
      this.#nc.subscribe(subjects.nodeQuery, {
        callback: (_e, msg) => {
          if (msg.reply) msg.respond(encodeMessage(this.advertisement()))
        }
      })
    )
    if (this.head) {
      this.#view = new ClusterView({ nc: this.#nc, cluster: this.cluster })
      this.#subs.push(
        this.#nc.subscribe(subjects.viewQuery, {
          callback: (_e, msg) => {
            if (!msg.reply || !this.#view) return
            msg.respond(encodeMessage(this.#view.nodes().map((n) => ({ ad: n.ad, state: n.state, lastSeenAt: n.lastSeenAt }))))
          }
        })
      )
    }
    this.#link = new LinkState(this.#nc)
    // While we were cut off we heard no owner: give every owner a fresh deadline.
    this.#link.onResume(() => {
      const now = Date.now()
      for (const t of this.#owners.values()) t.lastSeen = now
      this.#advertise()
    })
    this.#watchNats()
    this.#timers.push(setInterval(() => this.#advertise(), this.#heartbeatMs))
    this.#ownerClock.reset()
    this.#timers.push(
      setInterval(() => {
        this.#checkOwners(this.#ownerClock.held())
        this.#fillWarm()
      }, OWNER_CHECK_MS),
      // One /proc read per process: cheap enough to look for stopped ones more often.
      setInterval(() => this.#checkStopped(), STOPPED_CHECK_MS)
    )
    this.#advertise()
    await settleWithin(this.#nc.flush(), 5_000)
  }

  /**
   * Starts a warm process when fewer than options.warmHosts wait and nothing was spawned for
   * WARM_FILL_QUIET_MS: at its own priority while a core is spare (the node's CPUs beyond what its
   * processes reserve), else, once a standby was asked of this agent, lowered where that can be
   * undone (core/priority.ts), else not.
   */
  #fillWarm(): void {
    const want = this.#options.warmHosts ?? 1
    // A dead one leaves #warm through its exit handler (with the back-off), a taken one through #takeWarm.
    // Beside a standby worker's start the pool fills at once: the lost worker's CPU is free while its
    // group runs short-handed, and where the node's processes share a CPU quota (a cgroup, a
    // container's limit) a warm process loading tfjs once the standby has joined takes the quota
    // its group's worker leaves while it waits in collectives, and it is throttled at its next step
    // (SCHED_IDLE does not stop that: the quota is spent all the same).
    const besideStandby = this.#fillBesideStandby
    this.#fillBesideStandby = false
    if (this.#leaving || this.#warm.length >= want || (!besideStandby && Date.now() - this.#lastSpawnAt < WARM_FILL_QUIET_MS)) return
    const cores = Math.min(this.#options.numCpus ?? this.#hardware.cpus, this.#hardware.cpus || Infinity)
    let reserved = 0
    for (const r of this.#processes.values()) reserved += r.info.resources.CPU ?? 0
    const lowered = reserved + 1 > cores ? standbyNice.read() : 0
    if (reserved + 1 > cores && !(this.#standbySeen && lowered > 0 && mayRaiseTo(getPriority()))) return
    const env: NodeJS.ProcessEnv = { ...process.env, GRADWIRE_CLUSTER: this.cluster, GRADWIRE_NODE_ID: this.nodeId }
    delete env.GRADWIRE_ADDRESS
    delete env.GRADWIRE_JOB
    delete env.GRADWIRE_ACTOR
    delete env.GRADWIRE_START_NICE
    if (lowered > 0) env.GRADWIRE_START_NICE = String(lowered)
    const proc = new ActorProcess({ cwd: process.cwd(), env, onLine: (stream, line) => this.#log.debug(`(warm pid=${proc.pid}) ${stream}: ${line}`) })
    this.#lastSpawnAt = Date.now()
    if (proc.pid < 0) return
    this.#log.info(`warm process ${proc.pid} started${lowered > 0 ? ` (lowered, nice ${lowered})` : ""}${besideStandby ? " beside a standby worker's start" : ""}`)
    this.#warm.push(proc)
    void proc.exited.then((exit) => {
      const i = this.#warm.indexOf(proc)
      if (i < 0) return
      this.#warm.splice(i, 1)
      if (this.#leaving) return
      // Died while waiting: say why, and start no other for a while (a crash loop would spin).
      this.#lastSpawnAt = Date.now() + WARM_CRASH_BACKOFF_MS
      this.#log.warn(`warm process ${proc.pid} exited while waiting (${exit.signal ?? `code ${exit.code}`}): ${proc.stderrTail().split("\n").at(-1) ?? ""}`)
    })
  }

  /** A warm process for a spawn, taken from the pool (the pool fills again later), or undefined. */
  #takeWarm(): ActorProcess | undefined {
    this.#lastSpawnAt = Date.now()
    const i = this.#warm.findIndex((w) => w.idle)
    if (i < 0) return undefined
    const [proc] = this.#warm.splice(i, 1)
    return proc
  }

  advertisement(): NodeAdvertisement {
    const info = this.#nc.info
    const supervised = this.#options.supervisedServer?.()
    const processes: NodeProcess[] = [...this.#processes.values()].map((r) => r.info)
    const used = usageOfProcesses(processes)
    return {
      v: 1,
      cluster: this.cluster,
      nodeId: this.nodeId,
      hostname: this.#hardware.hostname,
      pid: process.pid,
      head: this.head,
      startedAt: this.startedAt,
      sentAt: Date.now(),
      seq: ++this.#seq,
      heartbeatMs: this.#heartbeatMs,
      cpus: this.#options.numCpus ?? this.#hardware.cpus,
      memoryBytes: this.#hardware.memoryBytes,
      gpus: this.#gpus,
      backends: this.#backends,
      backendsProbed: this.#backendsProbed,
      backendErrors: this.#backendErrors,
      nats: {
        serverId: info?.server_id ?? "",
        serverName: info?.server_name ?? "",
        url: this.#nc.isClosed() ? "" : this.#nc.getServer(),
        cluster: info?.cluster ?? ""
      },
      labels: { ...this.#options.labels },
      custom: { ...this.#options.custom },
      used: { ...used, gpuIndices: [...used.gpuIndices], custom: { ...used.custom } },
      processes,
      leaving: this.#leaving,
      version: AGENT_VERSION,
      natsOutages: { count: this.#bus?.outages ?? 0, lastAt: this.#lastOutage?.at ?? 0, lastMs: this.#lastOutage?.ms ?? 0 },
      ...(supervised !== undefined ? { natsServer: supervised } : {}),
      ...(this.#webgpu !== undefined ? { webgpu: this.#webgpu } : {})
    }
  }

  /** The agent's NATS connection: up or lost since when, and its outages so far. */
  natsStatus(): AgentNatsStatus {
    const outage = this.#bus?.outage
    return {
      up: outage === undefined,
      server: redactUrl(outage?.server ?? (this.#nc.isClosed() ? "" : this.#nc.getServer())),
      ...(outage !== undefined ? { downSince: outage.since } : {}),
      outages: this.#bus?.outages ?? 0,
      ...(this.#lastOutage !== undefined ? { lastOutageAt: this.#lastOutage.at, lastOutageMs: this.#lastOutage.ms } : {})
    }
  }

  // An agent never gives up on NATS (its connection reconnects forever): it says at once that the
  // bus is gone, again every OUTAGE_NOTICE_EVERY_MS while it lasts, and when it is back, so an
  // operator reading the log (or `gradwire status`) sees the outage.
  #watchNats(): void {
    const stamp = (ms: number): string => new Date(ms).toISOString()
    this.#bus = watchBus(this.#nc, {
      timeoutMs: 0,
      onDown: (o) => {
        const server = redactUrl(o.server)
        this.#log.warn(`lost NATS at ${server} (${stamp(o.since)}); retrying`)
        if (this.#outageNotice) clearInterval(this.#outageNotice)
        this.#outageNotice = setInterval(() => {
          this.#log.warn(`still no NATS at ${server} after ${Math.round((Date.now() - o.since) / 1000)} s (since ${stamp(o.since)}); retrying`)
        }, OUTAGE_NOTICE_EVERY_MS)
        this.#options.onNatsStatus?.(this.natsStatus())
      },
      onUp: (o) => {
        if (this.#outageNotice) clearInterval(this.#outageNotice)
        this.#outageNotice = undefined
        this.#lastOutage = { at: o.since, ms: o.ms }
        this.#log.info(`NATS back after ${(o.ms / 1000).toFixed(1)} s (${redactUrl(this.#nc.getServer())}; lost at ${stamp(o.since)})`)
        this.#options.onNatsStatus?.(this.natsStatus())
        this.#advertise()
      }
    })
  }

  /** The processes running now. */
  processes(): NodeProcess[] {
    return [...this.#processes.values()].map((r) => r.info)
  }

  /** The head's cluster view (undefined on other nodes). */
  get view(): ClusterView | undefined {
    return this.#view
  }

  /** Kills every process (SIGTERM, then SIGKILL), says goodbye, and releases everything. */
  stop(reason = "agent stopping"): Promise<void> {
    this.#stopping ??= (async () => {
      this.#leaving = true
      agentsInThisProcess.delete(`${this.cluster}/${this.nodeId}`)
      this.#advertise()
      const grace = this.#options.killGraceMs ?? 3_000
      const warm = this.#warm.splice(0)
      await settleWithin(Promise.all([...[...this.#processes.values()].map((r) => r.proc), ...warm].map((p) => p.kill(reason, grace))), grace + 5_000)
      // Let the exit notices out before the subscriptions go.
      await new Promise((resolve) => setImmediate(resolve))
      for (const t of this.#timers) clearInterval(t)
      if (this.#outageNotice) clearInterval(this.#outageNotice)
      this.#bus?.stop()
      this.#view?.close()
      this.#link?.close()
      for (const sub of [...this.#subs, ...[...this.#owners.values()].map((t) => t.sub), ...[...this.#jobs.values()].map((t) => t.sub)]) {
        try {
          sub.unsubscribe()
        } catch {
          // closed
        }
      }
      this.#advertise()
      await this.#control?.stop({ drain: false, reason, timeoutMs: 2_000 })
      this.#system.close()
      if (!this.#nc.isClosed()) await settleWithin(this.#nc.flush(), 2_000)
      this.#resolveStopped()
    })()
    return this.#stopping
  }

  // -- control actor --------------------------------------------------------------------------

  #definition() {
    return defineActor(AgentProtocol, () => ({
      spawn: (request) => this.#spawn(request),
      kill: async ({ job, name, reason }) => {
        const r = this.#processes.get(`${job}/${name}`)
        if (!r) return { killed: false }
        await r.proc.kill(reason || "asked to", this.#options.killGraceMs ?? 3_000)
        return { killed: true }
      },
      killJob: async ({ job, reason }) => ({ killed: await this.#killJob(job, reason || "asked to") }),
      list: () => this.processes(),
      info: () => this.advertisement(),
      shutdown: ({ reason }) => {
        setImmediate(() => void this.stop(reason || "shutdown requested"))
        return null
      }
    }))
  }

  #spawn(request: SpawnRequest): { pid: number; node: string; instance: string } {
    const fail = (reason: string): never => {
      throw new SpawnError({ node: this.nodeId, actor: request.name, reason })
    }
    if (this.#leaving) fail("the agent is stopping")
    if (request.env.GRADWIRE_START_NICE !== undefined) this.#standbySeen = true
    for (const [field, value] of [
      ["job", request.job],
      ["name", request.name],
      ["owner", request.owner],
      ["instance", request.instance]
    ] as const) {
      if (!validToken(value)) fail(`invalid ${field} "${value}": use 1-128 letters, digits, "_" or "-"`)
    }
    // Any client of the bus can ask: the request's env is held to the allow-list (env-policy.ts),
    // so it cannot smuggle in NODE_OPTIONS, LD_PRELOAD and the like. Nothing starts otherwise.
    const offList = refusedSpawnEnv(request.env)
    if (offList.length > 0) {
      this.#log.warn(`refused to spawn ${request.job}/${request.name}: environment variable(s) ${offList.join(", ")} are not on the allow-list`)
      throw new EnvNotAllowed({ node: this.nodeId, actor: request.name, variables: offList, allowed: [...SPAWN_ENV_ALLOWED] })
    }
    const key = `${request.job}/${request.name}`
    const existing = this.#processes.get(key)
    if (existing) fail(`an actor process named "${request.name}" of job "${request.job}" already runs here (pid ${existing.proc.pid})`)
    const cwd = request.cwd ?? process.cwd()
    if (!fs.existsSync(cwd)) fail(`working directory ${cwd} does not exist on node ${this.nodeId}`)
    // What this process gets on top of the agent's own environment.
    const added: Record<string, string> = {
      ...request.env,
      GRADWIRE_CLUSTER: this.cluster,
      GRADWIRE_JOB: request.job,
      GRADWIRE_ACTOR: request.name,
      GRADWIRE_NODE_ID: this.nodeId
    }
    if (request.env.CUDA_VISIBLE_DEVICES === undefined && request.gpus.length > 0) added.CUDA_VISIBLE_DEVICES = request.gpus.join(",")
    const env: NodeJS.ProcessEnv = { ...process.env, ...added }
    // Only what the agent's owner allowed runs here (module-policy.ts).
    const refused = refuseActorModule(this.#modules, request.module, cwd)
    if (refused !== undefined) throw new ModuleNotAllowed({ node: this.nodeId, module: request.module, reason: refused })
    const imports = request.imports ?? []
    for (const m of imports) {
      const why = refuseImport(this.#modules, m)
      if (why !== undefined) throw new ModuleNotAllowed({ node: this.nodeId, module: m, reason: why })
    }
    // The address a user gave may hold credentials; the process gets them on stdin, not in its env.
    delete env.GRADWIRE_ADDRESS
    // A warm process (started with the agent's environment) takes what this request adds to it.
    const warm = this.#takeWarm()
    if (request.env.GRADWIRE_START_NICE !== undefined) this.#fillBesideStandby = true
    const spec = encodeHostSpec({
      ...(warm ? { env: added, cwd } : {}),
      connection: normalizeConnection(this.#options.connection),
      imports: [...imports],
      cluster: this.cluster,
      job: request.job,
      name: request.name,
      instance: request.instance,
      node: this.nodeId,
      module: request.module,
      export: request.export || "default",
      args: request.args,
      heartbeatMs: request.heartbeatMs ?? DEFAULT_HEARTBEAT_MS
    })
    const subjects = jobSubjects(this.cluster, request.job)
    const label = request.logPrefix || request.name
    let prefix = `(${label})`
    const onLine = (stream: "stdout" | "stderr", line: string): void => {
      this.#output(`${prefix} ${line}`)
      if (!this.#nc.isClosed()) {
        try {
          this.#nc.publish(subjects.log(request.name), encodeMessage({ stream, line, name: request.name, pid: proc.pid, node: this.nodeId }))
        } catch {
          // closing
        }
      }
    }
    let proc: ActorProcess
    if (warm) {
      proc = warm
      warm.assign(spec, onLine, Number(request.env.GRADWIRE_START_NICE ?? "0") > 0)
    } else {
      proc = new ActorProcess({ cwd, env, spec, onLine })
    }
    if (proc.pid < 0) fail("the process could not be started (see the agent's log)")
    prefix = `(${label} pid=${proc.pid} node=${this.nodeId})`
    // A process started lowered that other work at the normal priority starves is raised from
    // here, its own limit starving with it: a standby, and a lowered warm process a spawn took
    // (raised by assign, it can lower itself again if its host had not yet run when it was taken).
    proc.raiseWhenStarved((why) => this.#log.warn(`${prefix} raised from its lowered start: ${why}`))
    const info: NodeProcess = {
      job: request.job,
      name: request.name,
      instance: request.instance,
      pid: proc.pid,
      owner: request.owner,
      resources: { ...request.resources },
      gpus: [...request.gpus],
      startedAt: Date.now()
    }
    this.#processes.set(key, { proc, info, ownerTimeoutMs: request.ownerTimeoutMs ?? this.#options.ownerTimeoutMs ?? 5_000 })
    this.#track(this.#owners, `${request.job}|${request.owner}`, subjects.heartbeat(request.owner))
    this.#track(this.#jobs, request.job, subjects.events, (data) => {
      const event = readJobEvent(data)
      if (event?.type === "job-end") void this.#killJob(request.job, `job ended (by ${event.by})`)
    })
    void proc.exited.then((exit) => {
      this.#processes.delete(key)
      this.#untrack(this.#owners, `${request.job}|${request.owner}`)
      this.#untrack(this.#jobs, request.job)
      publishJobEvent(this.#nc, subjects.events, {
        type: "exit",
        name: request.name,
        instance: request.instance,
        node: this.nodeId,
        pid: proc.pid,
        code: exit.code,
        signal: exit.signal,
        ...(proc.killedBy ? { killedBy: proc.killedBy } : {}),
        stderrTail: proc.stderrTail(),
        at: Date.now()
      })
      const how = exit.signal ? `killed by ${exit.signal}` : `exited with code ${exit.code}`
      this.#log.info(`${prefix} ${how}${proc.killedBy ? ` (${proc.killedBy})` : ""}`)
      this.#advertise()
    })
    this.#log.info(`${prefix} started${warm ? " (warm)" : ""}: ${request.module}#${request.export || "default"} for job ${request.job}`)
    this.#advertise()
    return { pid: proc.pid, node: this.nodeId, instance: request.instance }
  }

  async #killJob(job: string, reason: string): Promise<number> {
    const victims = [...this.#processes.values()].filter((r) => r.info.job === job)
    await Promise.all(victims.map((r) => r.proc.kill(reason, this.#options.killGraceMs ?? 3_000)))
    return victims.length
  }

  // Reference-counted subscriptions: one per job (events) and per job+owner (heartbeats).
  #track(map: Map<string, Tracked>, key: string, subject: string, onData?: (data: Uint8Array) => void): void {
    const t = map.get(key)
    if (t) {
      t.count++
      t.lastSeen = Math.max(t.lastSeen, Date.now())
      return
    }
    const tracked: Tracked = {
      count: 1,
      lastSeen: Date.now(),
      sub: this.#nc.subscribe(subject, {
        callback: (_e, msg) => {
          tracked.lastSeen = Date.now()
          onData?.(msg.data)
        }
      })
    }
    map.set(key, tracked)
  }

  #untrack(map: Map<string, Tracked>, key: string): void {
    const t = map.get(key)
    if (!t || --t.count > 0) return
    map.delete(key)
    try {
      t.sub.unsubscribe()
    } catch {
      // closed
    }
  }

  /** `held`: how long this process was itself held before this check (core/held-clock.ts). */
  #checkOwners(held: number): void {
    const now = Date.now()
    if (held > 0) {
      // Our own process was held (the embedded cluster's agent shares the driver's): the owners'
      // silence goes on from where it stood before, instead of counting the hold against them.
      for (const t of this.#owners.values()) t.lastSeen = now - Math.max(0, now - held - t.lastSeen)
      return
    }
    if (this.#leaving || this.#nc.isClosed() || this.#link?.up === false) return
    for (const r of this.#processes.values()) {
      if (r.ownerTimeoutMs <= 0 || !r.proc.running || r.proc.killedBy) continue
      const owner = this.#owners.get(`${r.info.job}|${r.info.owner}`)
      if (owner && now - owner.lastSeen > r.ownerTimeoutMs) {
        const reason = `owner "${r.info.owner}" stopped heartbeating ${now - owner.lastSeen} ms ago (driver gone)`
        this.#log.warn(`killing ${r.info.job}/${r.info.name} (pid ${r.proc.pid}): ${reason}`)
        void r.proc.kill(reason, this.#options.killGraceMs ?? 3_000)
      }
    }
  }

  /** Kills a process that has been stopped (state T) for options.stoppedKillMs. */
  #checkStopped(): void {
    const limit = this.#options.stoppedKillMs ?? STOPPED_KILL_MS
    if (limit <= 0 || this.#leaving) return
    const now = Date.now()
    for (const r of this.#processes.values()) {
      if (!r.proc.running || r.proc.killedBy) continue
      if (processState(r.proc.pid) !== "T") {
        r.stoppedSince = undefined
        continue
      }
      r.stoppedSince ??= now
      if (now - r.stoppedSince < limit) continue
      const reason = `stopped (SIGSTOP) for ${((now - r.stoppedSince) / 1000).toFixed(1)} s: a stopped process holds its group up`
      this.#log.warn(`killing ${r.info.job}/${r.info.name} (pid ${r.proc.pid}): ${reason}`)
      // SIGKILL at once: a SIGTERM would need a SIGCONT first (its handler runs only in a running
      // process), which would let the hung rank run on for its shutdown, and its clean exit code
      // would be given the driver's grace for orderly exits (0.3 s) on top.
      void r.proc.killNow(reason)
    }
  }

  #advertise(): void {
    // Not before the control actor serves: a driver may place a worker here on the first
    // advertisement it hears (the backends probe, cached, resolves before the actor has started).
    if (this.#nc.isClosed() || this.#control === undefined) return
    try {
      this.#nc.publish(clusterSubjects(this.cluster).nodeHeartbeat(this.nodeId), encodeMessage(this.advertisement()))
    } catch {
      // reconnecting or closing: the next beat goes out
    }
  }
}

/** Starts a node agent; stop it with `agent.stop()`. Rejects with AgentError. */
export const launchAgent = async (options: AgentOptions): Promise<NodeAgent> => {
  const agent = new NodeAgent(options)
  await agent.start()
  return agent
}

/** A node agent living as long as the enclosing scope. */
export const launchAgentEffect = (options: AgentOptions): Effect.Effect<NodeAgent, AgentError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => launchAgent(options),
      catch: (e) => (e instanceof AgentError ? e : new AgentError({ reason: e instanceof Error ? e.message : String(e) }))
    }),
    (agent) => Effect.promise(() => agent.stop())
  )
