// The cluster a fit() runs on: an embedded one (a nats-server and a local node agent started here
// and stopped when the run ends) or a cluster started with `gradwire start`, joined by address.
// The embedded server admits only a user nkey made for the run: its config lists the public key,
// the seed stays in this process (driver and agent connections) and reaches the workers the way any
// cluster's credentials do (the agent's connection spec, on their stdin). Other local users, and
// any process without the seed, cannot join. The seed is also in a 0600 file in the server's 0700
// temp dir (removed with it), for `gradwire jobs/logs --nkey FILE` while the run lasts.
import * as settings from "../../../core/settings.ts"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { nkeys, type NatsConnection } from "@nats-io/nats-core"

import { EMBEDDED_MAX_PAYLOAD_BYTES } from "../../../core/defaults.ts"
import { launchNatsServer, type NatsServerProcess } from "../../../core/nats-server.ts"
import { superviseNatsServer, type NatsSupervision, type NatsSupervisionEvents } from "../../../core/nats-supervisor.ts"
import { resolvable } from "../../../core/engine.ts"
import { webgpuSoftware } from "../../../core/settings.ts"
import type { WebGpuAdapterInfo } from "../../../core/webgpu.ts"
import { describeConnection, openConnection, type ConnectionSpec, type OpenedConnection } from "../../../core/connection-spec.ts"
import { ClusterView, openClusterView } from "../../../scheduler/cluster-view.ts"
import { launchAgent, type NodeAgent } from "../../node/agent.ts"
import { probeGpus, probeWebGpu, type BackendName } from "../../node/node-probe.ts"
import { silentLogger, stderrLogger } from "../../runtime/log.ts"

/** The cluster a fit() runs on: embedded (started and stopped here) or joined. */
export interface ClusterHandle {
  readonly nc: NatsConnection
  readonly clusterName: string
  readonly connection: ConnectionSpec
  readonly view: ClusterView
  readonly embedded: boolean
  /** The servers, for messages (never with credentials). */
  readonly where: string
  /**
   * How another process reaches the cluster, as the dashboard and job listings show it (never
   * with a secret): the servers, and on the embedded cluster the nkey seed file to pass to --nkey.
   */
  readonly address: string
  /** What to check when the bus stays away (NatsUnavailable's hint). */
  readonly outageHint: string
  /** The supervision of the embedded nats-server (restarts it when it dies). */
  readonly supervision?: NatsSupervision
  close(): Promise<void>
}

/**
 * The embedded node's backends, from what is installed, without the agent's probe (it costs
 * seconds). webgpu alone is tried (in a child), and only for a GPU job on a machine with GPUs, or
 * with GRADWIRE_WEBGPU_SOFTWARE=1 (a software adapter then stands in for the GPU): an installed
 * webgpu package says nothing about an adapter.
 */
const localBackends = async (useGpu: boolean): Promise<{ backends: BackendName[]; webgpu?: WebGpuAdapterInfo }> => {
  const out: BackendName[] = []
  let webgpu: WebGpuAdapterInfo | undefined
  if (resolvable("@tensorflow/tfjs-node-gpu")) out.push("tensorflow-gpu")
  if (useGpu && ((await probeGpus()).length > 0 || webgpuSoftware.read())) {
    const probe = await probeWebGpu()
    if (probe.ok) {
      out.push("webgpu")
      webgpu = probe.adapter
    }
  }
  if (resolvable("@tensorflow/tfjs-node")) out.push("tensorflow")
  out.push("wasm", "cpu")
  return { backends: out, ...(webgpu ? { webgpu } : {}) }
}

/** The file in the embedded nats-server's temp dir that holds the run's nkey seed (mode 0600). */
export const EMBEDDED_SEED_FILE = "client.nk"

/** What the run says when the embedded node, sized to the job, runs more CPU workers than the machine has cores; undefined when it does not. */
export const sharedCoresLine = (cpuWorkers: number, cores: number): string | undefined =>
  cpuWorkers > cores
    ? `gradwire: ${cpuWorkers} workers on this machine's ${cores} cores (the embedded cluster is sized to the job): they share the cores, and a step waits for every rank: more workers than cores rarely train faster`
    : undefined

/**
 * The embedded cluster sizes its one node to the job, the way `ray.init(num_cpus=...)` would: a
 * 2-core laptop can still run 4 CPU workers (they share the cores). GPUs are never invented (a software WebGPU adapter stands in only with GRADWIRE_WEBGPU_SOFTWARE=1).
 */
export const startEmbeddedCluster = async (options: {
  readonly verbose: boolean
  readonly output: (line: string) => void
  readonly cpusNeeded: number
  /** The job wants GPU workers (webgpu is probed for only then). */
  readonly useGpu?: boolean
  /** GPUs the job's workers take: how many a software WebGPU adapter counts as here. */
  readonly gpusNeeded?: number
  readonly jetstreamStoreDir?: string
  /** Exits and restarts of the embedded nats-server, which is supervised for the run's length. */
  readonly serverEvents?: NatsSupervisionEvents
}): Promise<ClusterHandle> => {
  const { verbose, output, cpusNeeded, jetstreamStoreDir } = options
  // A fresh credential per run (nkeys draws the key from the system's CSPRNG).
  const user = nkeys.createUser()
  const seed = new TextDecoder().decode(user.getSeed())
  const server: NatsServerProcess = await launchNatsServer({
    maxPayload: EMBEDDED_MAX_PAYLOAD_BYTES,
    auth: { nkey: user.getPublicKey() },
    ...(jetstreamStoreDir !== undefined ? { jetstreamStoreDir } : {})
  })
  const seedFile = path.join(server.dir, EMBEDDED_SEED_FILE)
  let agent: NodeAgent | undefined
  let opened: OpenedConnection | undefined
  // Restarted on the same port and store dir when it dies; the driver and the agent reconnect.
  const supervision = superviseNatsServer(server, options.serverEvents ?? {})
  try {
    // Long-lived connections reconnect for as long as it takes; the driver's outage deadline
    // (failureConfig.natsOutageTimeoutMs) decides when to give up.
    const connection: ConnectionSpec = { servers: [server.url], nkeySeed: seed }
    fs.writeFileSync(seedFile, `${seed}\n`, { mode: 0o600 })
    opened = await openConnection(connection, "gradwire driver", { maxReconnectAttempts: -1 })
    const agentConn = await openConnection(connection, "gradwire local agent", { maxReconnectAttempts: -1 })
    agent = await launchAgent({
      nc: agentConn.nc,
      connection,
      cluster: "local",
      nodeId: "local",
      head: true,
      ...(await localBackends(options.useGpu === true)),
      softwareGpuCount: Math.ceil(options.gpusNeeded ?? 1),
      log: verbose ? stderrLogger("agent") : silentLogger,
      ownerTimeoutMs: 5_000,
      numCpus: Math.max(os.availableParallelism(), Math.ceil(cpusNeeded)),
      warmHosts: settings.warmHosts.read(),
      output
    })
    // Its one agent answers at once: no quarter second waiting for others.
    const view = await openClusterView({ nc: opened.nc, cluster: "local", expectNodes: 1 })
    await view.waitFor((nodes) => nodes.some((n) => n.state === "alive"), 10_000)
    const o = opened
    const a = agent
    return {
      nc: o.nc,
      clusterName: "local",
      connection,
      view,
      embedded: true,
      where: `the embedded nats-server (${server.url})`,
      address: `${server.url} (--nkey ${seedFile})`,
      outageHint:
        `the embedded nats-server could not be restarted (its log: ${server.dir}/server.log); ` +
        "check free disk space and memory, and that nothing else took its port",
      supervision,
      close: async () => {
        supervision.stop()
        view.close()
        await a.stop("run finished").catch(() => {})
        await agentConn.close().catch(() => {})
        await o.close().catch(() => {})
        await server.stop()
      }
    }
  } catch (e) {
    supervision.stop()
    await agent?.stop().catch(() => {})
    await opened?.close().catch(() => {})
    await server.stop()
    throw e
  }
}

export const joinCluster = async (c: { readonly clusterName: string; readonly connection: ConnectionSpec }): Promise<ClusterHandle> => {
  const { connection, clusterName } = c
  const opened = await openConnection(connection, "gradwire driver", { maxReconnectAttempts: -1 })
  const view = await openClusterView({ nc: opened.nc, cluster: clusterName })
  await view.refresh().catch(() => {})
  return {
    nc: opened.nc,
    clusterName,
    connection,
    view,
    embedded: false,
    where: describeConnection(connection),
    address: describeConnection(connection),
    outageHint:
      "check that nats-server is running there (on the head: `gradwire status`, or the head agent's log), " +
      "that this machine can reach it, and the credentials",
    close: async () => {
      view.close()
      await opened.close()
    }
  }
}

