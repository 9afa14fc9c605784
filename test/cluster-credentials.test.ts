// Clusters that require credentials, end to end with the real CLI, agents and worker processes:
// an nkey-only server, a server in operator mode (JWT) joined with a creds file, and a password
// given in the URL (`nats://user:pass@host`) to the agents (foreground and background) and the
// Trainer. Each trains a small digits job, and the secret appears in none of the places it must
// not: the run directory, the agents' output and log, the state file, the process listings (command
// line and environment) of the agents and workers, and the errors of a wrong password. The embedded
// cluster makes an nkey of its own per run: its server refuses a connection without it while a fit
// trains on it, and the seed is in none of those places either.
import { randomUUID } from "node:crypto"
import * as fs from "node:fs"
import * as path from "node:path"
import { nkeyAuthenticator } from "@nats-io/nats-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset, type TrainerCallbacks } from "../index.ts"
import { NatsConnectError } from "../core/errors.ts"
import { openConnection, publicNkey } from "../core/connection-spec.ts"
import { EMBEDDED_SEED_FILE } from "../actors/train/driver/cluster.ts"
import { openClusterView, type ClusterView } from "../scheduler/cluster-view.ts"
import { ROOT, TestRig, pidAlive } from "./support/actors-processes.ts"
import { nkeyServerConfig, nkeyUser, operatorSetup } from "./support/nats-auth.ts"
import { livePids, procLine, procStatFields } from "../core/proc.ts"

const rig = new TestRig()
const LOOP = path.join(ROOT, "examples", "digits", "train.ts") + "#trainLoop"
let train: ArrayDataset
let test: ArrayDataset
let storage: string

beforeAll(async () => {
  storage = rig.tempDir("gw-creds-runs-")
  ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
})
afterAll(() => rig.cleanup())

/** Files under `dir` (recursively) whose bytes contain `secret`. */
const filesHolding = (dir: string, secret: string): string[] =>
  fs.readdirSync(dir, { recursive: true, withFileTypes: true }).flatMap((e) => {
    if (!e.isFile()) return []
    const file = path.join(e.parentPath, e.name)
    return fs.readFileSync(file).includes(Buffer.from(secret)) ? [file] : []
  })

/** What `ps` and /proc show of a process: its command line and environment. */
const listing = (pid: number): string => `${procLine(pid, "cmdline")}\n${procLine(pid, "environ")}`

/**
 * A callback that, at the first report (the job's workers are running), records the process
 * listings of every process the cluster's agents run.
 */
const listWorkers = (view: ClusterView, into: Map<number, string>): TrainerCallbacks => ({
  onReport: ({ index }) => {
    if (index !== 0) return
    for (const n of view.nodes()) for (const p of n.ad.processes) into.set(p.pid, listing(p.pid))
  }
})

const job = (name: string, cluster: Record<string, unknown>, callbacks: TrainerCallbacks[], extra: Record<string, unknown> = {}) =>
  new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { epochs: 2 },
    scalingConfig: { numWorkers: 2, ...extra },
    runConfig: { name, storagePath: storage, progress: false, callbacks },
    datasets: { train, test },
    cluster: cluster as never
  }).fit()

const configOf = (runDir: string): { cluster: Record<string, unknown> } => JSON.parse(fs.readFileSync(path.join(runDir, "config.json"), "utf8"))

describe("clusters that require credentials", () => {
  it("nkey only: agent (--nkey FILE), workers and driver connect with the seed, which stays out of every file and listing", async () => {
    const user = nkeyUser()
    const server = await rig.server({ jetstream: false, extraConfig: nkeyServerConfig(user.publicKey) })
    const seedFile = path.join(rig.tempDir(), "user.nk")
    fs.writeFileSync(seedFile, `${user.seed}\n`, { mode: 0o600 })
    const agent = await rig.agent("nk-1", ["--address", server.url, "--nkey", seedFile], { cluster: "nk", allowFixtures: false })
    const view = await openClusterView({ nc: await rig.connect(server.url, { authenticator: nkeyAuthenticator(new TextEncoder().encode(user.seed)) }), cluster: "nk" })
    rig.onCleanup(() => view.close())
    const listings = new Map<number, string>()
    const r = await job("nkey", { address: server.url, clusterName: "nk", nkeySeed: user.seed }, [listWorkers(view, listings)])
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
    expect(configOf(r.path).cluster).toEqual({ clusterName: "nk", servers: [server.url], nkey: user.publicKey })
    expect(filesHolding(r.path, user.seed)).toEqual([])
    expect(listings.size).toBe(2)
    for (const [pid, text] of [...listings, [agent.pid, listing(agent.pid)] as const]) {
      expect(text, `process ${pid}`).toContain("GRADWIRE_") // the listing was read
      expect(text, `process ${pid}`).not.toContain(user.seed)
    }
    expect(agent.lines.join("\n")).not.toContain(user.seed)
  })

  it("creds only: a server in operator mode, an agent with --creds, and a Trainer with credsFile", async () => {
    const op = operatorSetup()
    const server = await rig.server({ jetstream: false, extraConfig: op.serverConfig })
    const credsFile = path.join(rig.tempDir(), "user.creds")
    fs.writeFileSync(credsFile, op.creds, { mode: 0o600 })
    const agent = await rig.agent("jwt-1", ["--address", server.url, "--creds", credsFile], { cluster: "jwt", allowFixtures: false })
    const r = await job("creds", { address: server.url, clusterName: "jwt", credsFile }, [])
    expect(r.metricsHistory).toHaveLength(2)
    expect(configOf(r.path).cluster).toEqual({ clusterName: "jwt", servers: [server.url], credsFile })
    expect(filesHolding(r.path, op.userSeed)).toEqual([])
    expect(agent.lines.join("\n")).not.toContain(op.userSeed)
    // Without the creds file nothing gets in.
    const none = await new Trainer({ trainLoopPerWorker: LOOP, scalingConfig: { numWorkers: 1 }, runConfig: { storagePath: storage, progress: false }, cluster: { address: server.url } }).fit().catch((e: unknown) => e)
    expect(none).toBeInstanceOf(NatsConnectError)
    expect((none as Error).message).toContain("requires credentials")
  })

  it("user:pass in the URL: agents (foreground and background) and the Trainer take it from the URL; it is shown nowhere", async () => {
    const secret = `pw-${randomUUID()}`
    const server = await rig.server({ jetstream: false, auth: { user: "gw", password: secret } })
    const port = new URL(server.url).port
    const address = `nats://gw:${secret}@127.0.0.1:${port}`
    const foreground = await rig.agent("url-a", ["--address", address], { cluster: "url", allowFixtures: false })
    // The background agent (the default): started by the CLI, which hands it the password on stdin.
    const dirB = rig.tempDir("gw-agent-")
    const started = await rig.cli(["start", "--address", address, "--node-id", "url-b", "--cluster", "url", "--backends", "cpu", "--state-dir", dirB])
    const stateB = JSON.parse(fs.readFileSync(path.join(dirB, "agent.json"), "utf8")) as { pid: number; address: string }
    rig.onCleanup(async () => {
      await rig.cli(["stop", "--state-dir", dirB])
      if (pidAlive(stateB.pid)) process.kill(stateB.pid, "SIGKILL")
    })
    expect(started.code, started.stderr).toBe(0)
    expect(started.stdout).toContain(`connected to NATS at nats://127.0.0.1:${port}`)
    expect(stateB.address).toBe(`nats://127.0.0.1:${port}`)

    const view = await openClusterView({ nc: await rig.connect(server.url, { user: "gw", pass: secret }), cluster: "url" })
    rig.onCleanup(() => view.close())
    await view.waitFor((nodes) => nodes.filter((n) => n.state === "alive").length === 2, 10_000)
    const listings = new Map<number, string>()
    const r = await job("url", { address, clusterName: "url" }, [listWorkers(view, listings)], { placementStrategy: "STRICT_SPREAD" })
    expect(r.metricsHistory).toHaveLength(2)
    expect(configOf(r.path).cluster).toEqual({ clusterName: "url", servers: [`nats://127.0.0.1:${port}`], user: "gw", password: "***" })
    expect(filesHolding(r.path, secret)).toEqual([])
    expect(filesHolding(dirB, secret)).toEqual([]) // agent.json and agent.log
    // One worker on each agent, and neither they nor the agents show the password.
    expect(listings.size).toBe(2)
    for (const [pid, text] of listings) {
      expect(text, `worker ${pid}`).toContain("GRADWIRE_JOB=") // the listing was read
      expect(text, `worker ${pid}`).not.toContain(secret)
    }
    for (const pid of [foreground.pid, stateB.pid]) {
      expect(listing(pid), `agent ${pid}`).toMatch(/gradwire(\.js)? start/)
      expect(listing(pid), `agent ${pid}`).not.toContain(secret)
    }
    expect(foreground.lines.join("\n")).not.toContain(secret)

    // A wrong password: refused with advice, and never echoed.
    const wrong = `nats://gw:wr0ng-${secret}@127.0.0.1:${port}`
    const agentErr = await rig.cli(["start", "--block", "--address", wrong, "--state-dir", rig.tempDir(), "--backends", "cpu"])
    expect(agentErr.code).toBe(1)
    expect(agentErr.stderr).toContain("refused the credentials given (user \"gw\" with a password)")
    const statusErr = await rig.cli(["status", "--address", wrong, "--cluster", "url"])
    expect(statusErr.code).toBe(1)
    const fitErr = await job("wrong", { address: wrong, clusterName: "url" }, []).catch((e: unknown) => e)
    expect(fitErr).toBeInstanceOf(NatsConnectError)
    expect((fitErr as Error).message).toContain("rejected the credentials")
    for (const text of [agentErr.stderr, agentErr.stdout, statusErr.stderr, (fitErr as Error).message]) expect(text).not.toContain(secret)
  })
})

/** The embedded nats-server this process runs now: its guardian's and its own pid, config and temp dir. */
const embeddedServer = (): { guardian: number; server: number; conf: string; dir: string } => {
  const pids = livePids()
  const childrenOf = (ppid: number): number[] => pids.filter((p) => Number(procStatFields(p)?.[1]) === ppid)
  for (const pid of childrenOf(process.pid)) {
    let args: string[]
    try {
      args = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")
    } catch {
      continue
    }
    // /bin/sh -c SCRIPT gradwire-nats-guardian BIN CONF DIR TICKS (core/nats-server.ts)
    const at = args.indexOf("gradwire-nats-guardian")
    if (at < 0 || !fs.existsSync(path.join(args[at + 3], EMBEDDED_SEED_FILE))) continue
    const server = childrenOf(pid)[0]
    if (server === undefined) continue
    return { guardian: pid, server, conf: args[at + 2], dir: args[at + 3] }
  }
  throw new Error("no embedded nats-server runs under this process")
}

describe("the embedded cluster", () => {
  it("admits only the run's own nkey: a connection without it is refused while a fit trains on it; the seed is shown nowhere", { timeout: 120_000 }, async () => {
    const stopFile = path.join(rig.tempDir(), "stop")
    const seen: { seed?: string; dir?: string; checked?: boolean } = {}
    let probe: Promise<void> | undefined
    // At the first report (workers running), from outside the run: what the server accepts.
    const check = async (): Promise<void> => {
      try {
        const found = embeddedServer()
        seen.dir = found.dir
        const seedFile = path.join(found.dir, EMBEDDED_SEED_FILE)
        const seed = fs.readFileSync(seedFile, "utf8").trim()
        seen.seed = seed
        // The config lists only the public key; it and the seed file are the user's alone.
        const conf = fs.readFileSync(found.conf, "utf8")
        expect(conf).toContain(`nkey: "${publicNkey(seed)}"`)
        expect(conf).not.toContain(seed)
        expect(fs.statSync(found.conf).mode & 0o777).toBe(0o600)
        expect(fs.statSync(seedFile).mode & 0o777).toBe(0o600)
        expect(fs.statSync(found.dir).mode & 0o777).toBe(0o700)
        const url = `nats://${/listen: "([^"]+)"/.exec(conf)![1]}`
        // Without credentials, or with another nkey: refused.
        const refused = (spec: Parameters<typeof openConnection>[0]) =>
          openConnection(spec, "outsider", { timeoutMs: 3_000, maxReconnectAttempts: 0 }).then(
            async (c) => {
              await c.close()
              return undefined
            },
            (e: unknown) => e as NatsConnectError
          )
        const anonymous = await refused({ servers: [url] })
        expect(anonymous).toBeInstanceOf(NatsConnectError)
        expect(anonymous!.message).toContain("the server requires credentials")
        const other = await refused({ servers: [url], nkeySeed: nkeyUser().seed })
        expect(other).toBeInstanceOf(NatsConnectError)
        expect(other!.message).toContain("rejected the credentials")
        // With the run's seed file (what the dashboard's address names): the CLI gets in.
        const status = await rig.cli(["status", "--json", "--address", url, "--nkey", seedFile, "--cluster", "local"])
        expect(status.code, status.stderr).toBe(0)
        const workers = (JSON.parse(status.stdout) as { nodes: Array<{ processes: Array<{ pid: number }> }> }).nodes.flatMap((n) => n.processes)
        expect(workers).toHaveLength(2)
        // Neither the server, its guardian nor the workers show the seed in their listings.
        for (const pid of [found.guardian, found.server, ...workers.map((w) => w.pid)]) {
          const text = listing(pid)
          expect(text.length, `process ${pid}`).toBeGreaterThan(0)
          expect(text, `process ${pid}`).not.toContain(seed)
        }
        seen.checked = true
      } finally {
        fs.writeFileSync(stopFile, "")
      }
    }
    const r = await new Trainer({
      trainLoopPerWorker: { module: new URL("./support/dashboard-loop.ts", import.meta.url).href, export: "dashboardLoop" },
      trainLoopConfig: { stopFile, maxEpochs: 30, minEpochMs: 200 },
      scalingConfig: { numWorkers: 2 },
      runConfig: {
        name: "embedded-nkey",
        storagePath: storage,
        progress: false,
        callbacks: [{ onReport: ({ index }) => void (index === 0 && (probe = check())) }]
      },
      datasets: { train }
    }).fit()
    await probe
    expect(seen.checked).toBe(true)
    expect(r.metricsHistory.length).toBeGreaterThanOrEqual(1)
    expect(configOf(r.path).cluster).toBe("embedded")
    expect(filesHolding(r.path, seen.seed!)).toEqual([])
    // The server's temp dir, seed file included, went with it.
    expect(fs.existsSync(seen.dir!)).toBe(false)
  })
})
