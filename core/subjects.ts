// The one place that builds NATS subjects. Everything a job sends lives under
// gw.<cluster>.<job>. so two jobs (or two clusters) on one NATS never see each other's traffic.
import { ConfigError } from "./errors.ts"

const TOKEN = /^[A-Za-z0-9_-]+$/

/** Checks that a value can be one token of a subject (no dots, spaces or wildcards). */
export const validToken = (value: string): boolean => value.length > 0 && value.length <= 128 && TOKEN.test(value)

export const assertToken = (field: string, value: string): void => {
  if (!validToken(value)) {
    throw new ConfigError({
      field,
      reason: `"${value}" is not a valid name: use 1-128 letters, digits, "_" or "-" (no dots, spaces or wildcards)`
    })
  }
}

/** Subjects of the cluster as a whole (node agents, cluster events), under gw.<cluster>. */
export const clusterSubjects = (cluster: string) => {
  assertToken("cluster", cluster)
  const root = `gw.${cluster}`
  return {
    root,
    /** Every subject of the cluster, jobs included. */
    all: `${root}.>`,
    /** Node advertisements and heartbeats. */
    nodeHeartbeat: (nodeId: string) => `${root}.node.${nodeId}.hb`,
    nodeHeartbeats: `${root}.node.*.hb`,
    /** Requests to a node agent (spawn, kill, status). */
    nodeControl: (nodeId: string) => `${root}.node.${nodeId}.ctl`,
    nodeEvents: `${root}.events`,
    /** Every agent answers here with its advertisement (`gradwire status`, cluster views). */
    nodeQuery: `${root}.nodes.query`,
    /** The head agent's cluster view answers here with every node it knows, dead ones included. */
    viewQuery: `${root}.view.query`,
    /** A job's state, published by its driver about once a second and on every change (dashboards, `gradwire jobs`). */
    jobState: (job: string) => `${root}.jobs.${job}.state`,
    jobStates: `${root}.jobs.*.state`,
    /** A job's live curves (per-rank step progress, report rounds), batched by its driver. */
    jobTelemetry: (job: string) => `${root}.jobs.${job}.tm`,
    jobTelemetries: `${root}.jobs.*.tm`,
    /** Requests to a job's driver: its history (curves, reports) or its workers' log tails. */
    jobQuery: (job: string) => `${root}.jobs.${job}.query`,
    /** Every running driver answers here with its job's state. */
    jobsQuery: `${root}.jobs.query`,
    /** Worker output of every job of the cluster (each job's log.<actor> subjects). */
    allJobLogs: `${root}.*.log.*`,
    /** The JetStream key-value bucket that keeps the latest state of recent jobs, one key per job. */
    jobsBucket: `gw-jobs-${cluster}`,
    job: (job: string) => jobSubjects(cluster, job)
  }
}

/** Subjects of one job, all under gw.<cluster>.<job>. */
export const jobSubjects = (cluster: string, job: string) => {
  assertToken("cluster", cluster)
  assertToken("job", job)
  const root = `gw.${cluster}.${job}`
  return {
    root,
    all: `${root}.>`,
    /** An actor's mailbox. */
    actor: (name: string) => `${root}.actor.${name}`,
    /** Liveness beats of the job's actor processes. */
    heartbeat: (actor: string) => `${root}.hb.${actor}`,
    heartbeats: `${root}.hb.*`,
    /** Asks an actor process's beat thread for its main thread's JavaScript stack (a request; the reply is JSON: actors/runtime/beat-thread.ts). */
    stack: (actor: string) => `${root}.stack.${actor}`,
    /** Job-level events (exits, deaths). */
    events: `${root}.events`,
    /** Collective traffic: coll.<group>.<seq>.<src>.<dst>. */
    coll: (group: string, seq: number, src: number, dst: number) => `${root}.coll.${group}.${seq}.${src}.${dst}`,
    collGroup: (group: string) => `${root}.coll.${group}.>`,
    /** One publish that every rank of the group receives (broadcast, tree fan-out): coll.<group>.<seq>.<src>.all. */
    collFanout: (group: string, seq: number, src: number) => `${root}.coll.${group}.${seq}.${src}.all`,
    /** One publish that the ranks of one node receive: coll.<group>.<seq>.<src>.n-<node>. */
    collNodeFanout: (group: string, seq: number, src: number, node: string) => `${root}.coll.${group}.${seq}.${src}.n-${node}`,
    /**
     * Acks and group control (hello, liveness probes, abort): coll.<group>.ctl.<seq>.<src>.<dst|all>.
     * One token longer than data subjects, so data wildcards never match it (it may use its own connection).
     */
    collControl: (group: string, seq: number, src: number, dst?: number) => `${root}.coll.${group}.ctl.${seq}.${src}.${dst ?? "all"}`,
    /** What one rank subscribes to: data addressed to it, to the whole group, and to its node; control to it or to all. */
    collInbound: (group: string, rank: number) => `${root}.coll.${group}.*.*.${rank}`,
    collFanoutInbound: (group: string) => `${root}.coll.${group}.*.*.all`,
    collNodeInbound: (group: string, node: string) => `${root}.coll.${group}.*.*.n-${node}`,
    collControlInbound: (group: string, rank: number) => `${root}.coll.${group}.ctl.*.*.${rank}`,
    collControlFanoutInbound: (group: string) => `${root}.coll.${group}.ctl.*.*.all`,
    /** Topology probes of a group (ping-pong echoes and probe commands) addressed to one rank. */
    probe: (group: string, rank: number) => `${root}.probe.${group}.${rank}`,
    /** Replies to chunked requests and other ad-hoc inboxes of the job. */
    inbox: (id: string) => `${root}.inbox.${id}`,
    /** Where the reply to ask number `seq` of client `client` goes (one wildcard sub per client). */
    reply: (client: string, seq: number) => `${root}.inbox.${client}.${seq}`,
    replies: (client: string) => `${root}.inbox.${client}.*`,
    /** stdout/stderr lines of the job's actor processes, forwarded by node agents. */
    log: (actor: string) => `${root}.log.${actor}`,
    logs: `${root}.log.*`
  }
}

export type JobSubjects = ReturnType<typeof jobSubjects>
export type ClusterSubjects = ReturnType<typeof clusterSubjects>
