// gradwire CLI: parses flags and hands off to the actors and scheduler. Thin on purpose: the
// agent lifecycle lives in actors/node/daemon.ts, the status query and table in actors/node/cluster-status.ts.
import { parseArgs, type ParseArgsConfig } from "node:util"
import { queryCluster, formatClusterTable } from "../actors/node/cluster-status.ts"
import { openConnection } from "../core/connection-spec.ts"
import { defaultStateDir, describeStarted, explainConnectError, runAgent, startInBackground, stopAgent, type StartOptions } from "../actors/node/daemon.ts"
import { readState } from "../actors/node/agent-state.ts"
import { ALL_BACKENDS, type BackendName } from "../actors/node/node-probe.ts"
import { validToken } from "../core/subjects.ts"
import * as settings from "../core/settings.ts"

const usage = `usage: gradwire <command> [options]

commands:
  start --head                 start a NATS server (or join one with --address) and run a node agent
  start --address nats://...   run a node agent that joins an existing cluster
  status [--json]              nodes, resources (used/total), tfjs backends and liveness
  stop                         stop the local agent (and the NATS server the head started)

start options:
  --head                       this is the head node: starts NATS unless --address is given
  --address URL[,URL...]       NATS server(s) to join (env GRADWIRE_ADDRESS)
  --port N                     head's NATS port (default 4222)
  --host ADDR                  head's NATS listen address (default 127.0.0.1; 0.0.0.0 lets other machines join)
  --max-payload BYTES          head's NATS max_payload (default 1 MiB; larger messages are chunked anyway)
  --cluster NAME               gradwire cluster name (default "default"); jobs and nodes live under it
  --node-id ID                 node id (default <hostname>-<random>)
  --labels k=v,k=v             user labels for placement (e.g. zone=a,tier=spot)
  --num-cpus N / --num-gpus N  override the detected CPU cores / GPUs
  --resources name=n,...       custom resources (e.g. licence=2)
  --backends a,b               skip the tfjs backend probe and advertise these (${ALL_BACKENDS.join(", ")})
  --user U --password P        NATS user/password (the head's server requires them when given)
  --token T                    NATS token (same)
  --creds FILE                 NATS credentials file (JWT + NKey) to connect with
  --block                      run in the foreground (default: in the background, logging to the state dir)
  --state-dir DIR              where the agent's pid/state and log go (env GRADWIRE_STATE_DIR, default ~/.gradwire)

status options: --address URL, --cluster NAME, --json, --user/--password/--token/--creds, --state-dir DIR
stop options:   --state-dir DIR, --timeout SECONDS (default 20, then SIGKILL)

The background agent writes <state dir>/agent.json; "gradwire stop" uses it to stop the agent, which
kills its actor processes and, on a head that started it, the NATS server.`

class UsageError extends Error {}

const options = {
  head: { type: "boolean" },
  address: { type: "string" },
  port: { type: "string" },
  host: { type: "string" },
  "max-payload": { type: "string" },
  cluster: { type: "string" },
  "node-id": { type: "string" },
  labels: { type: "string" },
  "num-cpus": { type: "string" },
  "num-gpus": { type: "string" },
  resources: { type: "string" },
  backends: { type: "string" },
  user: { type: "string" },
  password: { type: "string" },
  token: { type: "string" },
  creds: { type: "string" },
  block: { type: "boolean" },
  "state-dir": { type: "string" },
  "owner-timeout-ms": { type: "string" },
  json: { type: "boolean" },
  timeout: { type: "string" },
  help: { type: "boolean", short: "h" }
} satisfies ParseArgsConfig["options"]

type Flags = ReturnType<typeof parse>["values"]

const parse = (args: string[]) => parseArgs({ args, options, allowPositionals: true, strict: true })

const number = (flag: string, raw: string | undefined, min = 0): number | undefined => {
  if (raw === undefined) return undefined
  const n = Number(raw)
  if (!Number.isFinite(n) || n < min) throw new UsageError(`--${flag} must be a number >= ${min}, got "${raw}"`)
  return n
}

const keyValues = (flag: string, raw: string | undefined): Record<string, string> => {
  const out: Record<string, string> = {}
  if (!raw) return out
  for (const part of raw.split(",").filter(Boolean)) {
    const eq = part.indexOf("=")
    if (eq <= 0) throw new UsageError(`--${flag} wants key=value pairs separated by commas, got "${part}"`)
    out[part.slice(0, eq).trim()] = part.slice(eq + 1).trim()
  }
  return out
}

const clusterName = (flags: Flags): string => {
  const name = flags.cluster ?? settings.clusterName.read() ?? "default"
  if (!validToken(name)) throw new UsageError(`--cluster "${name}" is not a valid name: use letters, digits, "_" or "-"`)
  return name
}

const stateDir = (flags: Flags): string => flags["state-dir"] ?? defaultStateDir()

const startOptions = (flags: Flags): StartOptions => {
  const address = flags.address ?? settings.clusterAddress.read()
  if (!flags.head && !address) throw new UsageError("start needs --head (this is the head node) or --address nats://host:port (join a cluster)")
  if (flags.token !== undefined && flags.user !== undefined) throw new UsageError("give either --token or --user/--password, not both")
  if (flags.password !== undefined && flags.user === undefined) throw new UsageError("--password needs --user")
  if (address) for (const a of address.split(",")) if (!/^(nats|tls|ws|wss):\/\/[^\s]+$/.test(a) && !/^[^\s:/]+:\d+$/.test(a)) {
    throw new UsageError(`--address "${a}" is not a NATS URL: use nats://host:port`)
  }
  if (flags["node-id"] !== undefined && !validToken(flags["node-id"])) throw new UsageError(`--node-id "${flags["node-id"]}" is not valid: use letters, digits, "_" or "-"`)
  const custom: Record<string, number> = {}
  for (const [k, v] of Object.entries(keyValues("resources", flags.resources))) custom[k] = number(`resources ${k}`, v) as number
  let backends: BackendName[] | undefined
  if (flags.backends !== undefined) {
    backends = flags.backends.split(",").filter(Boolean) as BackendName[]
    const bad = backends.filter((b) => !ALL_BACKENDS.includes(b))
    if (bad.length) throw new UsageError(`--backends: unknown backend(s) ${bad.join(", ")}; known: ${ALL_BACKENDS.join(", ")}`)
  }
  const port = number("port", flags.port, 0)
  return {
    head: flags.head ?? false,
    ...(address !== undefined ? { address } : {}),
    ...(port !== undefined ? { port } : {}),
    ...(flags.host !== undefined ? { host: flags.host } : {}),
    ...(flags["max-payload"] !== undefined ? { maxPayload: number("max-payload", flags["max-payload"], 1024) } : {}),
    ...(flags.user !== undefined ? { user: flags.user, password: flags.password ?? "" } : {}),
    ...(flags.token !== undefined ? { token: flags.token } : {}),
    ...(flags.creds !== undefined ? { creds: flags.creds } : {}),
    cluster: clusterName(flags),
    ...(flags["node-id"] !== undefined ? { nodeId: flags["node-id"] } : {}),
    labels: keyValues("labels", flags.labels),
    ...(flags["num-cpus"] !== undefined ? { numCpus: number("num-cpus", flags["num-cpus"], 0) } : {}),
    ...(flags["num-gpus"] !== undefined ? { numGpus: number("num-gpus", flags["num-gpus"], 0) } : {}),
    custom,
    ...(backends ? { backends } : {}),
    ...(flags["owner-timeout-ms"] !== undefined ? { ownerTimeoutMs: number("owner-timeout-ms", flags["owner-timeout-ms"], 0) } : {}),
    stateDir: stateDir(flags)
  }
}

const start = async (flags: Flags, rawArgs: string[]): Promise<number> => {
  const o = startOptions(flags)
  if (!flags.block) {
    // Re-run this CLI in the background with the same flags plus --block.
    const entry = [...process.execArgv, process.argv[1]]
    const state = await startInBackground(entry, ["start", ...rawArgs.filter((a) => a !== "start")], o.stateDir)
    console.log(describeStarted(state, o))
    return 0
  }
  const running = await runAgent(o)
  console.log(describeStarted(running.state, o))
  return await new Promise<number>((resolve) => {
    let exiting = false
    const finish = (reason: string, code: number): void => {
      if (exiting) return
      exiting = true
      console.log(`gradwire agent stopping: ${reason}`)
      // Never hang on the way out.
      setTimeout(() => process.exit(code), 15_000).unref()
      void running.shutdown(reason).then(() => resolve(code))
    }
    process.on("SIGINT", () => finish("interrupted (SIGINT)", 0))
    process.on("SIGTERM", () => finish("asked to stop (SIGTERM)", 0))
    void running.agent.stopped.then(() => finish("shutdown requested", 0))
  })
}

const status = async (flags: Flags): Promise<number> => {
  const cluster = clusterName(flags)
  const local = readState(stateDir(flags))
  const address = flags.address ?? settings.clusterAddress.read() ?? (local && local.cluster === cluster ? local.address : undefined) ?? "nats://127.0.0.1:4222"
  const creds = {
    ...(flags.user !== undefined ? { user: flags.user, password: flags.password ?? "" } : {}),
    ...(flags.token !== undefined ? { token: flags.token } : {}),
    ...(flags.creds !== undefined ? { creds: flags.creds } : {})
  }
  const conn = await openConnection({ servers: address.split(","), ...creds }, "gradwire status", { timeoutMs: 3_000 }).catch((e: unknown) => {
    const err = explainConnectError(address, e, Object.keys(creds).length > 0)
    throw new Error(
      `${err.message}${flags.address ? "" : `\n(no --address given: used ${local ? `the local agent's ${address}` : address}; is a head running? start one with "gradwire start --head")`}`
    )
  })
  try {
    const report = await queryCluster(conn.nc, cluster, address)
    console.log(flags.json ? JSON.stringify(report, null, 2) : formatClusterTable(report))
    return 0
  } finally {
    await conn.close().catch(() => {})
  }
}

const stop = async (flags: Flags): Promise<number> => {
  const seconds = number("timeout", flags.timeout, 1) ?? 20
  console.log(await stopAgent(stateDir(flags), seconds * 1_000))
  return 0
}

const main = async (): Promise<number> => {
  const argv = process.argv.slice(2)
  const [command, ...rest] = argv
  if (!command || command === "--help" || command === "-h" || command === "help") {
    console.log(usage)
    return 0
  }
  let flags: Flags
  try {
    const parsed = parse(rest)
    if (parsed.positionals.length) throw new UsageError(`unexpected argument "${parsed.positionals[0]}"`)
    flags = parsed.values
  } catch (e) {
    throw e instanceof UsageError ? e : new UsageError((e as Error).message)
  }
  if (flags.help) {
    console.log(usage)
    return 0
  }
  switch (command) {
    case "start":
      return start(flags, rest)
    case "status":
      return status(flags)
    case "stop":
      return stop(flags)
    default:
      throw new UsageError(`unknown command "${command}"`)
  }
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    if (e instanceof UsageError) {
      console.error(`gradwire: ${e.message}\nrun "gradwire --help" for usage`)
      process.exit(2)
    }
    console.error(`gradwire: ${e instanceof Error ? e.message : String(e)}`)
    process.exit(1)
  }
)
