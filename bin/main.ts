// gradwire CLI: parses flags and hands off to the actors and scheduler. Thin on purpose: the
// agent lifecycle lives in actors/node/daemon.ts, the status query and table in actors/node/cluster-status.ts.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { pathToFileURL } from "node:url"
import { parseArgs, type ParseArgsConfig } from "node:util"
import { describeLocalAgent, queryCluster, formatClusterTable } from "../actors/node/cluster-status.ts"
import { checkAuth, connectionFromAddress, describeConnection, hasCredentials, openConnection, type ConnectionAuth, type ConnectionSpec } from "../core/connection-spec.ts"
import { ConfigError } from "../core/errors.ts"
import { defaultStateDir, describeStarted, explainConnectError, refusedCredentials, runAgent, startInBackground, stopAgent, type StartOptions } from "../actors/node/daemon.ts"
import { readState, runningAgents, stateFile } from "../actors/node/agent-state.ts"
import { ALL_BACKENDS, type BackendName } from "../actors/node/node-probe.ts"
import { jobSubjects, validToken } from "../core/subjects.ts"
import { mainThreadStack } from "../actors/runtime/heartbeat.ts"
import * as settings from "../core/settings.ts"
import { listUploaded, putFiles } from "../core/data/object-data.ts"
import type { FileFormat } from "../core/data/file-spec.ts"
import { DEFAULT_DASHBOARD_PORT, startDashboard } from "../actors/train/dashboard/server.ts"
import { ENDED_STATES, type LogLine } from "../actors/train/common/job-telemetry.ts"
import { fetchJobLogs, findJob, followJobLogs, formatJobsTable, formatLogLine, listJobs } from "../actors/train/dashboard/jobs-client.ts"

const usage = `usage: gradwire <command> [options]

commands:
  start --head                 start a NATS server (or join one with --address) and run a node agent
  start --address nats://...   run a node agent that joins an existing cluster
  status [--json]              nodes, resources (used/total), tfjs backends and liveness
  stop                         stop the local agent (and the NATS server the head started)
  data put <files...> nats-obj://BUCKET/PREFIX
                               upload dataset files (CSV, JSON Lines, .gwshard) to the cluster's JetStream object
                               store, for machines with no shared filesystem: fromFiles("nats-obj://BUCKET/PREFIX")
  data ls nats-obj://BUCKET[/PREFIX]   the dataset files uploaded there: rows, bytes, parts
  dashboard [--port 8265] [--host 127.0.0.1]
                               a live web dashboard of the cluster and its jobs, with Prometheus metrics at /metrics
  jobs [--json]                running and recent jobs: state, attempt, workers, restarts, progress
  logs JOB [--rank R] [--follow] [--tail N] [--json]
                               the job's worker output (JOB: its id or name), streamed from the nodes that run it
  stack JOB [--rank R] [--json]
                               where each worker's main thread is now: its JavaScript stack, taken by the worker's
                               beat thread (a hung or slow rank, inside a long computation too)
  train FILE#EXPORT --workers N [--address URL]
                               run a train loop on N workers (an embedded cluster without --address), no driver to write
  demo                         train the digits example on 4 workers of an embedded cluster, with the dashboard
  --version, -V                print gradwire's version
  --help, -h                   this text

start options:
  --head                       this is the head node: starts NATS unless --address is given
  --address URL[,URL...]       NATS server(s) to join (env GRADWIRE_ADDRESS): nats://host:4222, tls://host:4222,
                               nats://user:pass@host:4222 or nats://token@host:4222 (credentials as in the NATS CLI)
  --port N                     head's NATS port (default 4222)
  --host ADDR                  head's NATS listen address (default 127.0.0.1; 0.0.0.0 lets other machines join,
                               and then needs credentials or --insecure)
  --max-payload BYTES          head's NATS max_payload (default 1 MiB; larger messages are chunked anyway)
  --cluster NAME               gradwire cluster name (default "default"); jobs and nodes live under it
  --node-id ID                 node id (default <hostname>-<random>)
  --labels k=v,k=v             user labels for placement (e.g. zone=a,tier=spot)
  --num-cpus N / --num-gpus N  override the detected CPU cores / GPUs
  --resources name=n,...       custom resources (e.g. licence=2)
  --backends a,b               skip the tfjs backend probe and advertise these (${ALL_BACKENDS.join(", ")})
  --allow-module-root DIR      let jobs run actor and train-loop modules under DIR (repeatable; default: only
                               gradwire's own actors, plus the train loop each job declares)
  --insecure                   let a head's NATS server listen beyond loopback without credentials
  --owner-timeout-ms MS        kill a job's processes when its driver has been silent this long (default 5000)
  --warm-hosts N               actor processes kept started with tfjs loaded, so a replacement worker
                               starts warm (default GRADWIRE_WARM_HOSTS, else 1; 0: every process starts cold)
  --block                      run in the foreground (default: in the background, logging to the state dir)
  --state-dir DIR              where the agent's pid/state and log go (env GRADWIRE_STATE_DIR, default ~/.gradwire)
  credentials (start and status; a head that starts its server requires them from every client):
  --user U --password P        NATS user/password
  --token T                    NATS token
  --nkey FILE                  file holding a user nkey seed (SU...)
  --creds FILE                 NATS credentials file (user JWT + nkey seed, from nsc)
  --tlsca FILE --tlscert FILE --tlskey FILE   TLS CA / client certificate and key (TLS is then required)

status options: --address URL, --cluster NAME, --json, credentials, --state-dir DIR
stop options:   --state-dir DIR, --timeout SECONDS (default 20, then SIGKILL)
data options:   --address URL (default: as status), credentials, --part-mib N (size of the uploaded parts, default 4),
                --format csv|jsonl|shards (default: by each file's extension)
dashboard options: --address URL, --cluster NAME, credentials, --state-dir DIR, --port N (default 8265, 0: any free
                one), --host ADDR (default 127.0.0.1). A token is required (printed; GRADWIRE_DASHBOARD_TOKEN sets it)
                when the cluster has credentials or --host is not loopback.
jobs options:   --address URL, --cluster NAME, --json, credentials, --state-dir DIR
logs options:   --rank R (one rank), --follow (-f: stream until the job ends), --tail N (lines of the tail, default 200),
                --json (one object per line), --address URL, --cluster NAME, credentials, --state-dir DIR
train options:  --workers N (default 1), --config JSON (the loop's config; @FILE reads it from a file), --name NAME,
                --storage-path DIR, --max-failures N, --resume-from CHECKPOINT (a checkpoint directory or
                nats-obj:// path, or a run directory: its latest checkpoint), --gpu, --timeline, --dashboard [--port N --host ADDR],
                --dataset NAME=FILES or NAME='{"files": FILES, ...fromFiles options}' (repeatable: each
                worker streams its rows; .gz files too), --address URL,
                --cluster NAME, credentials
demo options:   --workers N (default 4), --epochs N (default 20), --port N (dashboard, default 8265; 0: any free one),
                --host ADDR, --storage-path DIR, --name NAME

The background agent writes <state dir>/agent.json; "gradwire stop" uses it to stop the agent, which
kills its actor processes and, on a head that started it, the NATS server. Credentials reach the
background agent and the processes it spawns on their stdin, never in their arguments or environment.`

/**
 * One command's part of the usage: its lines under "commands:" and its options' block, then where
 * the rest is (gradwire train --help, as git and npm show a command's own help).
 */
const commandUsage = (command: string): string => {
  const parts = usage.split("\n\n")
  const at = parts.findIndex((p) => p.startsWith("commands:"))
  const commands = parts[at] ?? ""
  const rest = parts.slice(at + 1).join("\n\n")
  const own: string[] = []
  let taking = false
  for (const line of commands.split("\n").slice(1)) {
    if (/^  \S/.test(line)) taking = line.trimStart().split(/\s/)[0] === command
    if (taking) own.push(line)
  }
  const blocks: string[] = []
  let block: string[] | undefined
  for (const line of rest.split("\n")) {
    if (/^\S/.test(line)) {
      if (block) blocks.push(block.join("\n").trimEnd())
      block = line.startsWith(`${command} options:`) ? [line] : undefined
    } else if (block) block.push(line)
  }
  if (block) blocks.push(block.join("\n").trimEnd())
  return [`usage: gradwire ${command} [options]`, "", ...own, ...(blocks.length > 0 ? ["", ...blocks] : []), "", 'every command and option: gradwire --help'].join("\n")
}

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
  "warm-hosts": { type: "string" },
  "num-gpus": { type: "string" },
  resources: { type: "string" },
  backends: { type: "string" },
  user: { type: "string" },
  password: { type: "string" },
  token: { type: "string" },
  nkey: { type: "string" },
  creds: { type: "string" },
  tlsca: { type: "string" },
  tlscert: { type: "string" },
  tlskey: { type: "string" },
  insecure: { type: "boolean" },
  "allow-module-root": { type: "string", multiple: true },
  block: { type: "boolean" },
  "state-dir": { type: "string" },
  "owner-timeout-ms": { type: "string" },
  // Internal: the background agent reads its credentials from stdin (see start).
  "auth-stdin": { type: "boolean" },
  json: { type: "boolean" },
  timeout: { type: "string" },
  "part-mib": { type: "string" },
  format: { type: "string" },
  rank: { type: "string" },
  follow: { type: "boolean", short: "f" },
  tail: { type: "string" },
  workers: { type: "string" },
  epochs: { type: "string" },
  config: { type: "string" },
  name: { type: "string" },
  "storage-path": { type: "string" },
  "max-failures": { type: "string" },
  "resume-from": { type: "string" },
  dashboard: { type: "boolean" },
  gpu: { type: "boolean" },
  timeline: { type: "boolean" },
  dataset: { type: "string", multiple: true },
  help: { type: "boolean", short: "h" }
} satisfies ParseArgsConfig["options"]

type OptionName = keyof typeof options

const CREDENTIALS: ReadonlyArray<OptionName> = ["user", "password", "token", "nkey", "creds", "tlsca", "tlscert", "tlskey"]

/** The options each command takes; any other is an error naming the command and listing these. */
const COMMAND_OPTIONS: Readonly<Record<string, ReadonlyArray<OptionName>>> = {
  start: [
    "head", "address", "port", "host", "max-payload", "cluster", "node-id", "labels", "num-cpus", "num-gpus", "resources", "backends",
    ...CREDENTIALS, "insecure", "allow-module-root", "block", "state-dir", "owner-timeout-ms", "warm-hosts", "auth-stdin", "help"
  ],
  status: ["address", "cluster", "json", ...CREDENTIALS, "state-dir", "help"],
  stop: ["state-dir", "timeout", "help"],
  data: ["address", ...CREDENTIALS, "state-dir", "part-mib", "format", "help"],
  dashboard: ["address", "cluster", ...CREDENTIALS, "state-dir", "port", "host", "help"],
  jobs: ["address", "cluster", "json", ...CREDENTIALS, "state-dir", "help"],
  logs: ["address", "cluster", "json", ...CREDENTIALS, "state-dir", "rank", "follow", "tail", "help"],
  stack: ["address", "cluster", "json", ...CREDENTIALS, "state-dir", "rank", "help"],
  train: [
    "address", "cluster", ...CREDENTIALS, "state-dir", "workers", "config", "name", "storage-path", "max-failures", "resume-from", "dashboard", "port", "host",
    "gpu", "timeline", "dataset", "help"
  ],
  demo: ["workers", "epochs", "storage-path", "name", "port", "host", "help"]
}

/** Commands that take arguments besides options. */
const WITH_ARGUMENTS: ReadonlySet<string> = new Set(["data", "logs", "stack", "train"])

const HIDDEN: ReadonlySet<OptionName> = new Set(["auth-stdin"])

const VALUE_NAMES: Partial<Record<OptionName, string>> = {
  address: "URL", port: "N", host: "ADDR", "max-payload": "BYTES", cluster: "NAME", "node-id": "ID", labels: "k=v,...",
  "num-cpus": "N", "num-gpus": "N", resources: "name=n,...", backends: "a,b", user: "U", password: "P", token: "T", nkey: "FILE",
  creds: "FILE", tlsca: "FILE", tlscert: "FILE", tlskey: "FILE", "allow-module-root": "DIR", "state-dir": "DIR",
  "owner-timeout-ms": "MS", "warm-hosts": "N", timeout: "SECONDS", "part-mib": "N", format: "csv|jsonl|shards", rank: "R", tail: "N", workers: "N",
  epochs: "N", config: "JSON", name: "NAME", "storage-path": "DIR", "max-failures": "N", "resume-from": "CHECKPOINT", dataset: "NAME=FILES"
}

const describeOption = (name: OptionName): string => `--${name}${options[name].type === "string" ? ` ${VALUE_NAMES[name] ?? "VALUE"}` : ""}`

type Flags = ReturnType<typeof parseAll>["values"]

const parseAll = (args: string[]) => parseArgs({ args, options, allowPositionals: true, strict: true, tokens: true })

/**
 * `--max-failures -1` as `--max-failures=-1`: node's parser takes a value that starts with a dash
 * for an option, and "-1 for no limit" is what the docs say to give.
 */
const joinNegativeNumbers = (args: string[]): string[] => {
  const out: string[] = []
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!
    const name = /^--([\w-]+)$/.exec(a)?.[1]
    const next = args[i + 1]
    if (name !== undefined && (options as Record<string, { type: string } | undefined>)[name]?.type === "string" && next !== undefined && /^-\d+(\.\d+)?$/.test(next)) {
      out.push(`${a}=${next}`)
      i++
    } else out.push(a)
  }
  return out
}

/**
 * Parses `args` for `command`: an option another command takes, or none takes, is an error that
 * names the command and lists the options it does take.
 */
const parseCommand = (command: string, given: string[]): { values: Flags; tokens: ReturnType<typeof parseAll>["tokens"]; positionals: string[] } => {
  const args = joinNegativeNumbers(given)
  const allowed = COMMAND_OPTIONS[command]
  if (allowed === undefined) throw new UsageError(`unknown command "${command}"; commands: ${Object.keys(COMMAND_OPTIONS).join(", ")}`)
  const takes = `gradwire ${command} takes: ${allowed.filter((o) => !HIDDEN.has(o)).map(describeOption).join(", ")}`
  // Names first (a lenient pass), so an option of another command is reported as such.
  for (const t of parseArgs({ args, options, allowPositionals: true, strict: false, tokens: true }).tokens) {
    if (t.kind !== "option" || (allowed as ReadonlyArray<string>).includes(t.name)) continue
    const owners = Object.entries(COMMAND_OPTIONS).filter(([, o]) => (o as ReadonlyArray<string>).includes(t.name)).map(([c]) => `gradwire ${c}`)
    throw new UsageError(`gradwire ${command} does not take ${t.rawName}${owners.length ? ` (an option of ${owners.join(" and ")})` : ""}; ${takes}`)
  }
  let parsed: ReturnType<typeof parseAll>
  try {
    parsed = parseAll(args)
  } catch (e) {
    throw new UsageError(`gradwire ${command}: ${(e as Error).message}`)
  }
  // Only data (a subcommand, files and a location), logs (a job) and train (a loop) take arguments.
  if (parsed.positionals.length && !WITH_ARGUMENTS.has(command)) throw new UsageError(`gradwire ${command}: unexpected argument "${parsed.positionals[0]}"; ${takes}`)
  return { values: parsed.values, tokens: parsed.tokens, positionals: parsed.positionals }
}

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

/** The credentials given by flags (--nkey names a file holding the seed, as in the NATS CLI). */
const authFromFlags = (flags: Flags): ConnectionAuth => {
  if (flags.password !== undefined && flags.user === undefined) throw new UsageError("--password needs --user")
  let nkeySeed: string | undefined
  if (flags.nkey !== undefined) {
    try {
      nkeySeed = fs.readFileSync(flags.nkey, "utf8").trim()
    } catch (e) {
      throw new UsageError(`--nkey ${flags.nkey}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); give the file holding the user nkey seed (SU...)`)
    }
  }
  const tls = {
    ...(flags.tlsca !== undefined ? { caFile: flags.tlsca } : {}),
    ...(flags.tlscert !== undefined ? { certFile: flags.tlscert } : {}),
    ...(flags.tlskey !== undefined ? { keyFile: flags.tlskey } : {})
  }
  return {
    ...(flags.user !== undefined ? { user: flags.user, password: flags.password ?? "" } : {}),
    ...(flags.token !== undefined ? { token: flags.token } : {}),
    ...(nkeySeed !== undefined ? { nkeySeed } : {}),
    ...(flags.creds !== undefined ? { credsFile: flags.creds } : {}),
    ...(Object.keys(tls).length > 0 ? { tls } : {})
  }
}

/** Parses --address with the credential flags; a ConfigError becomes a usage error (it never shows a secret). */
const connection = (address: string | undefined, auth: ConnectionAuth): { servers?: ReadonlyArray<string>; auth: ConnectionAuth } => {
  try {
    if (address === undefined) {
      checkAuth({ servers: [], ...auth }, "credentials")
      return { auth }
    }
    const { servers, ...merged } = connectionFromAddress(address, auth, "--address")
    return { servers, auth: merged }
  } catch (e) {
    if (e instanceof ConfigError) throw new UsageError(e.field === "credentials" ? e.reason : `${e.field} ${e.reason}`)
    throw e
  }
}

const startOptions = (flags: Flags, stdinAuth: ConnectionAuth | undefined): StartOptions => {
  const address = flags.address ?? settings.clusterAddress.read()
  if (!flags.head && !address) throw new UsageError("start needs --head (this is the head node) or --address nats://host:port (join a cluster)")
  const conn = connection(address, stdinAuth ?? authFromFlags(flags))
  if (flags["node-id"] !== undefined && !validToken(flags["node-id"])) throw new UsageError(`--node-id "${flags["node-id"]}" is not valid: use letters, digits, "_" or "-"`)
  const custom: Record<string, number> = {}
  for (const [k, v] of Object.entries(keyValues("resources", flags.resources))) custom[k] = number(`resources ${k}`, v) as number
  let backends: BackendName[] | undefined
  if (flags.backends !== undefined) {
    backends = flags.backends.split(",").filter(Boolean) as BackendName[]
    const bad = backends.filter((b) => !ALL_BACKENDS.includes(b))
    if (bad.length) throw new UsageError(`--backends: unknown backend(s) ${bad.join(", ")}; known: ${ALL_BACKENDS.join(", ")}`)
  }
  const roots = (flags["allow-module-root"] ?? []).map((r) => path.resolve(r))
  for (const r of roots) if (!fs.statSync(r, { throwIfNoEntry: false })?.isDirectory()) throw new UsageError(`--allow-module-root ${r}: not a directory`)
  const port = number("port", flags.port, 0)
  return {
    head: flags.head ?? false,
    ...(conn.servers !== undefined ? { servers: conn.servers } : {}),
    auth: conn.auth,
    ...(port !== undefined ? { port } : {}),
    ...(flags.host !== undefined ? { host: flags.host } : {}),
    ...(flags["max-payload"] !== undefined ? { maxPayload: number("max-payload", flags["max-payload"], 1024) } : {}),
    ...(flags.insecure === true ? { insecure: true } : {}),
    ...(roots.length > 0 ? { allowModuleRoots: roots } : {}),
    cluster: clusterName(flags),
    ...(flags["node-id"] !== undefined ? { nodeId: flags["node-id"] } : {}),
    labels: keyValues("labels", flags.labels),
    ...(flags["num-cpus"] !== undefined ? { numCpus: number("num-cpus", flags["num-cpus"], 0) } : {}),
    ...(flags["num-gpus"] !== undefined ? { numGpus: number("num-gpus", flags["num-gpus"], 0) } : {}),
    custom,
    ...(backends ? { backends } : {}),
    ...(flags["owner-timeout-ms"] !== undefined ? { ownerTimeoutMs: number("owner-timeout-ms", flags["owner-timeout-ms"], 0) } : {}),
    warmHosts: flags["warm-hosts"] !== undefined ? (number("warm-hosts", flags["warm-hosts"], 0) as number) : settings.warmHosts.read(),
    stateDir: stateDir(flags)
  }
}

/**
 * The command line without credentials: the options given, minus the credential flags and
 * --address, plus the address without its user info. What the background agent is started with,
 * and what a foreground agent shows in process listings.
 */
const publicArgs = (tokens: ReturnType<typeof parseAll>["tokens"], o: StartOptions): string[] => {
  const out: string[] = []
  for (const t of tokens) {
    if (t.kind !== "option" || t.name === "address" || t.name === "auth-stdin" || (CREDENTIALS as ReadonlyArray<string>).includes(t.name)) continue
    out.push(`--${t.name}`)
    if (t.value !== undefined) out.push(t.value)
  }
  if (o.servers !== undefined) out.push("--address", o.servers.join(","))
  return out
}

/** One line from stdin (the background agent's credentials), within `ms`. */
const readStdinLine = (ms: number): Promise<string> =>
  new Promise((resolve, reject) => {
    let buffered = ""
    const timer = setTimeout(() => reject(new UsageError(`--auth-stdin: no credentials on stdin within ${ms} ms`)), ms)
    process.stdin.setEncoding("utf8")
    const done = (line: string): void => {
      clearTimeout(timer)
      process.stdin.pause()
      process.stdin.removeAllListeners("data")
      resolve(line)
    }
    process.stdin.on("data", (chunk: string) => {
      buffered += chunk
      const nl = buffered.indexOf("\n")
      if (nl >= 0) done(buffered.slice(0, nl))
    })
    process.stdin.on("end", () => done(buffered))
  })

const start = async (flags: Flags, tokens: ReturnType<typeof parseAll>["tokens"]): Promise<number> => {
  const stdinAuth = flags["auth-stdin"] ? (JSON.parse(await readStdinLine(10_000)) as ConnectionAuth) : undefined
  const o = startOptions(flags, stdinAuth)
  const shown = ["start", ...publicArgs(tokens, o)]
  if (!flags.block) {
    // Re-run this CLI in the background with the same options plus --block; its credentials go to
    // its stdin, so neither its command line nor its log shows them.
    const entry = [...process.execArgv, process.argv[1]]
    const withAuth = Object.keys(o.auth).length > 0
    const state = await startInBackground(entry, withAuth ? [...shown, "--auth-stdin"] : shown, o.stateDir, undefined, withAuth ? JSON.stringify(o.auth) : undefined)
    console.log(describeStarted(state, o))
    return 0
  }
  // A foreground agent lives as long as its command line: take the credentials out of what
  // process listings show (on Linux this rewrites /proc/<pid>/cmdline).
  if (tokens.some((t) => t.kind === "option" && (CREDENTIALS as ReadonlyArray<string>).includes(t.name)) || /:\/\/[^,\s]*@/.test(flags.address ?? "")) {
    process.title = ["gradwire", ...shown].join(" ")
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
  const conn = connection(address, authFromFlags(flags))
  const spec = { servers: conn.servers ?? [], ...conn.auth }
  const shown = spec.servers.join(",")
  const opened = await openConnection(spec, "gradwire status", { timeoutMs: 3_000 }).catch((e: unknown) => {
    const err = explainConnectError(spec, e)
    const elsewhere = flags.address || local ? [] : runningAgents()
    const message =
      `${err.message}${flags.address || refusedCredentials(e) ? "" : `\n(no --address given: used ${local ? `the local agent's ${shown}` : shown}; is a head running? start one with "gradwire start --head")`}` +
      (elsewhere.length > 0 ? `\nagents running on this machine with another state dir: ${elsewhere.map((a) => `pid ${a.pid} (gradwire status --state-dir ${a.stateDir})`).join(", ")}` : "")
    // NATS is out of reach: what the local agent's state file knows is all there is to show.
    if (flags.json) console.log(JSON.stringify({ reachable: false, error: message, localAgent: local ?? null }, null, 2))
    throw new Error(local ? `${message}\n${describeLocalAgent(local, stateFile(stateDir(flags)))}` : message)
  })
  try {
    const report = await queryCluster(opened.nc, cluster, shown)
    console.log(flags.json ? JSON.stringify(report, null, 2) : formatClusterTable(report))
    return 0
  } finally {
    await opened.close().catch(() => {})
  }
}

/** The NATS connection of a command that talks to the cluster (status, data): --address, else the local agent's, else loopback. */
const clusterAddressOf = (flags: Flags): { address: string; local: ReturnType<typeof readState> } => {
  const local = readState(stateDir(flags))
  return { address: flags.address ?? settings.clusterAddress.read() ?? local?.address ?? "nats://127.0.0.1:4222", local }
}

const mib = (bytes: number): string => `${(bytes / 1024 / 1024).toFixed(bytes < 10 * 1024 * 1024 ? 2 : 1)} MiB`

const data = async (flags: Flags, args: string[]): Promise<number> => {
  const [sub, ...rest] = args
  const how = "gradwire data put <files...> nats-obj://BUCKET/PREFIX, or gradwire data ls nats-obj://BUCKET[/PREFIX]"
  if (sub !== "put" && sub !== "ls") throw new UsageError(`gradwire data: ${sub === undefined ? "name what to do" : `unknown action "${sub}"`}: ${how}`)
  const target = rest.at(-1)
  if (target === undefined || !target.startsWith("nats-obj://")) throw new UsageError(`gradwire data ${sub}: the last argument is the location, nats-obj://BUCKET/PREFIX: ${how}`)
  const files = rest.slice(0, -1)
  if (sub === "put" && files.length === 0) throw new UsageError(`gradwire data put: name the files to upload before ${target}`)
  if (sub === "ls" && files.length > 0) throw new UsageError(`gradwire data ls takes one location, got ${rest.length} arguments`)
  const format = flags.format
  if (format !== undefined && !["csv", "jsonl", "shards"].includes(format)) throw new UsageError(`--format must be csv, jsonl or shards, got "${format}"`)
  const partMib = number("part-mib", flags["part-mib"], 0.001)
  const { address } = clusterAddressOf(flags)
  const conn = connection(address, authFromFlags(flags))
  const spec = { servers: conn.servers ?? [], ...conn.auth }
  const opened = await openConnection(spec, `gradwire data ${sub}`, { timeoutMs: 5_000 }).catch((e: unknown) => {
    throw new Error(`${explainConnectError(spec, e).message}${flags.address ? "" : `\n(no --address given: used ${spec.servers.join(",")})`}`)
  })
  try {
    if (sub === "put") {
      const started = performance.now()
      let total = 0
      await putFiles(opened.nc, files, target, {
        ...(partMib !== undefined ? { partBytes: Math.round(partMib * 1024 * 1024) } : {}),
        ...(format !== undefined ? { format: format as FileFormat } : {}),
        onFile: (f) => {
          total += f.bytes
          console.log(`${f.file} -> ${target.replace(/^(nats-obj:\/\/[^/]+).*$/, "$1")}/${f.object}: ${f.rows} rows${f.headerLine ? " (and a header line)" : ""}, ${mib(f.bytes)}, ${f.parts} part${f.parts === 1 ? "" : "s"}`)
        }
      })
      const s = (performance.now() - started) / 1000
      console.log(`uploaded ${files.length} file${files.length === 1 ? "" : "s"}, ${mib(total)} in ${s.toFixed(1)} s; train from them with fromFiles("${target}")`)
    } else {
      const listed = await listUploaded(opened.nc, target)
      if (listed.length === 0) console.log(`no dataset files at ${target}`)
      for (const f of listed) console.log(`${f.object}\t${f.format}\t${f.rows} rows${f.headerLine ? " + header" : ""}\t${mib(f.bytes)}\t${f.parts} parts`)
    }
    return 0
  } finally {
    await opened.close().catch(() => {})
  }
}

/** Opens the cluster's NATS for a command that reads it (dashboard, jobs, logs): --address, else as status. */
const openCluster = async (flags: Flags, name: string, reconnect = false) => {
  const { address } = clusterAddressOf(flags)
  const conn = connection(address, authFromFlags(flags))
  const spec: ConnectionSpec = { servers: conn.servers ?? [], ...conn.auth }
  const opened = await openConnection(spec, name, { timeoutMs: 5_000, ...(reconnect ? { maxReconnectAttempts: -1 } : {}) }).catch((e: unknown) => {
    throw new Error(`${explainConnectError(spec, e).message}${flags.address ? "" : `\n(no --address given: used ${spec.servers.join(",")})`}`)
  })
  return { spec, nc: opened.nc, shown: describeConnection(spec), close: () => opened.close().catch(() => {}) }
}

const untilSignal = (): Promise<NodeJS.Signals> =>
  new Promise((resolve) => {
    process.once("SIGINT", () => resolve("SIGINT"))
    process.once("SIGTERM", () => resolve("SIGTERM"))
  })

const dashboardCommand = async (flags: Flags): Promise<number> => {
  const cluster = clusterName(flags)
  const port = number("port", flags.port, 0) ?? DEFAULT_DASHBOARD_PORT
  const c = await openCluster(flags, "gradwire dashboard", true)
  try {
    const d = await startDashboard({
      nc: c.nc,
      cluster,
      address: c.shown,
      port,
      requireToken: hasCredentials(c.spec),
      ...(flags.host !== undefined ? { host: flags.host } : {})
    })
    console.log(`gradwire dashboard of cluster "${cluster}" (${c.shown}): ${d.url}`)
    console.log(`Prometheus metrics: ${d.baseUrl}/metrics${d.token !== undefined ? `, with the header "Authorization: Bearer ${d.token}"` : ""}`)
    console.log("Ctrl-C stops it.")
    await untilSignal()
    await d.close()
    return 0
  } finally {
    await c.close()
  }
}

const jobs = async (flags: Flags): Promise<number> => {
  const cluster = clusterName(flags)
  const c = await openCluster(flags, "gradwire jobs")
  try {
    const list = await listJobs(c.nc, cluster)
    console.log(flags.json ? JSON.stringify(list, null, 2) : formatJobsTable(cluster, c.shown, list))
    return 0
  } finally {
    await c.close()
  }
}

const logs = async (flags: Flags, args: string[]): Promise<number> => {
  const [query, ...more] = args
  if (query === undefined || more.length > 0) throw new UsageError(`gradwire logs takes one job (its id or name; "gradwire jobs" lists them), got ${args.length} arguments`)
  const rank = number("rank", flags.rank, 0)
  const tail = number("tail", flags.tail, 0) ?? 200
  const cluster = clusterName(flags)
  const print = (l: LogLine): void => console.log(flags.json ? JSON.stringify(l) : formatLogLine(l))
  const c = await openCluster(flags, "gradwire logs")
  try {
    const job = findJob(await listJobs(c.nc, cluster), query)
    if (!job) throw new Error(`no job "${query}" in cluster "${cluster}" at ${c.shown}: "gradwire jobs" lists the running and recent ones`)
    const ended = ENDED_STATES.has(job.state) || job.lost
    // Subscribe first, so no line falls between the tail and the stream.
    const early: LogLine[] = []
    let streaming = false
    const follow = flags.follow && !ended ? followJobLogs(c.nc, cluster, job.job, (l) => (streaming ? print(l) : early.push(l)), { ...(rank !== undefined ? { rank } : {}) }) : undefined
    const lines = job.live ? await fetchJobLogs(c.nc, cluster, job.job, { ...(rank !== undefined ? { rank } : {}), lines: tail }) : undefined
    let printed = 0
    const out = (text: string): void => {
      console.log(text)
      printed++
    }
    if (lines) for (const l of lines) out(flags.json ? JSON.stringify(l) : formatLogLine(l))
    else {
      // The driver is gone: its run directory has every line, if it is on this machine.
      const dir = path.join(job.runDir, "logs")
      if (!fs.existsSync(dir)) {
        follow?.stop()
        throw new Error(`job ${job.job} ${job.lost ? "lost its driver" : `is ${job.state}`} and no driver answers; its workers' output is in ${dir} on ${job.driver.host}`)
      }
      for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".log") && (rank === undefined || f === `worker_rank=${rank}.log`)).sort()) {
        const text = fs.readFileSync(path.join(dir, f), "utf8").split("\n").filter(Boolean).slice(-tail)
        for (const line of text) out(flags.json ? JSON.stringify({ file: f, line }) : line)
      }
    }
    // (on stderr: --json's output stays one object per line)
    if (printed === 0 && !flags.json) {
      console.error(`gradwire: job ${job.job}'s ${rank !== undefined ? `rank ${rank} has` : "workers have"} written no output ${follow ? "yet; following" : "(their console.log and stderr lines show here)"}`)
    }
    if (!follow) return 0
    const seen = new Set((lines ?? []).map((l) => `${l.actor}\u0000${l.pid}\u0000${l.line}`))
    for (const l of early) if (!seen.has(`${l.actor}\u0000${l.pid}\u0000${l.line}`)) print(l)
    streaming = true
    const stopped = untilSignal().then(() => follow.stop())
    const end = await follow.ended
    void stopped
    if (end && !flags.json) console.error(`gradwire: job ${job.job} ${end.state}${end.error ? `: ${end.error.split("\n")[0]}` : ""}`)
    return 0
  } finally {
    await c.close()
  }
}

/** How long `gradwire stack` waits for each worker's answer. */
const STACK_WAIT_MS = 5_000

const stack = async (flags: Flags, args: string[]): Promise<number> => {
  const [query, ...more] = args
  if (query === undefined || more.length > 0) throw new UsageError(`gradwire stack takes one job (its id or name; "gradwire jobs" lists them), got ${args.length} arguments`)
  const rank = number("rank", flags.rank, 0)
  const cluster = clusterName(flags)
  const c = await openCluster(flags, "gradwire stack")
  try {
    const job = findJob(await listJobs(c.nc, cluster), query)
    if (!job) throw new Error(`no job "${query}" in cluster "${cluster}" at ${c.shown}: "gradwire jobs" lists the running and recent ones`)
    if (!job.live || ENDED_STATES.has(job.state)) throw new Error(`job ${job.job} is ${job.lost ? "lost (no driver answers)" : job.state}: only a running job's workers have a stack to show`)
    const ranks = job.ranks.filter((r) => r.actor !== undefined && (rank === undefined || r.rank === rank))
    if (ranks.length === 0) throw new Error(`job ${job.job} has ${rank === undefined ? "no worker its driver knows yet" : `no rank ${rank} (ranks 0-${job.worldSize - 1})`}`)
    const subjects = jobSubjects(cluster, job.job)
    const stacks = await Promise.all(ranks.map(async (r) => ({ r, got: await mainThreadStack(c.nc, subjects.stack(r.actor!), STACK_WAIT_MS) })))
    if (flags.json) {
      const out = stacks.map(({ r, got }) => ({ rank: r.rank, actor: r.actor, pid: r.pid, node: r.node, ...(got ?? { error: `no answer within ${STACK_WAIT_MS} ms` }) }))
      console.log(JSON.stringify(out, null, 2))
    } else {
      for (const { r, got } of stacks) {
        console.log(`rank ${r.rank} (${r.actor}, pid ${r.pid ?? "?"}, node ${r.node ?? "?"}):`)
        if (got?.frames && got.frames.length > 0) for (const f of got.frames) console.log(`    at ${f}`)
        // (a training worker's loop turns between its steps' computations and collectives, as a hung
        // one's does on an await: where its loop is tells them apart, a second look whether it moves)
        else if (got?.idle) console.log(`    not held: its event loop ran within 0.3 s (between computations, or waiting on I/O, a timer or a promise), no stack to take${got.where !== undefined ? `; its loop is ${got.where}` : ""}`)
        else
          console.log(
            `    ${got === undefined ? `no answer within ${STACK_WAIT_MS / 1000} s (its process stopped or cut off, or it beats from its event loop)` : `no stack: ${got.error ?? "no frames"}`}`
          )
      }
    }
    return stacks.every(({ got }) => got?.frames !== undefined || got?.idle === true) ? 0 : 1
  } finally {
    await c.close()
  }
}

/** --config JSON, or @FILE holding it. */
const loopConfig = (raw: string | undefined): unknown => {
  if (raw === undefined) return {}
  const text = raw.startsWith("@") ? fs.readFileSync(raw.slice(1), "utf8") : raw
  try {
    return JSON.parse(text)
  } catch (e) {
    throw new UsageError(`--config must be JSON (or @FILE holding JSON): ${(e as Error).message}`)
  }
}

/** Runs a Trainer in this process and says how it ended (the Trainer prints its own progress). */
const runTrainer = async (options: Record<string, unknown>): Promise<number> => {
  const { Trainer } = await import("../actors/train/driver/trainer.ts")
  try {
    const r = await new Trainer(options as unknown as ConstructorParameters<typeof Trainer>[0]).fit()
    console.log(`gradwire: done: ${r.metricsHistory.length} report rounds, ${r.restarts} restart(s); run directory ${r.path} (report.html)`)
    return 0
  } catch (e) {
    // A run that started has said how it failed, where, and its run directory (the progress
    // summary); one refused before it started has not.
    const result = (e as { result?: { path?: string } }).result
    if (result?.path === undefined) console.error(`gradwire: training failed: ${(e as Error).message}`)
    return 1
  }
}

/**
 * One --dataset's files: a path, glob or nats-obj:// location, or a JSON object of `files` (one
 * or several) and fromFiles' options (`{"files": "rows.csv.gz", "header": false, "label": 64}`).
 */
const datasetFlag = (name: string, value: string, fromFiles: typeof import("../core/data/file-spec.ts").fromFiles): ReturnType<typeof fromFiles> => {
  if (!value.trimStart().startsWith("{")) return fromFiles(value)
  let spec: unknown
  try {
    spec = JSON.parse(value)
  } catch (e) {
    throw new UsageError(`--dataset ${name}: ${value} is not JSON (${(e as Error).message}); write NAME={"files": "data.csv", "header": false}, quoted for the shell`)
  }
  const { files, ...options } = spec as { files?: unknown }
  if (typeof files !== "string" && !(Array.isArray(files) && files.length > 0 && files.every((f) => typeof f === "string"))) {
    throw new UsageError(`--dataset ${name}: the JSON form needs "files", a path, glob or nats-obj:// location or a list of them, got ${JSON.stringify(files)}`)
  }
  return fromFiles(files as string | string[], options)
}

const train = async (flags: Flags, args: string[]): Promise<number> => {
  const [loop, ...more] = args
  if (loop === undefined || more.length > 0 || !/#[A-Za-z_$][\w$]*$/.test(loop)) {
    throw new UsageError(`gradwire train takes one train loop as FILE#EXPORT (e.g. ./train.ts#trainLoop), got ${args.length ? args.map((a) => `"${a}"`).join(" ") : "none"}`)
  }
  const hash = loop.lastIndexOf("#")
  const file = path.resolve(loop.slice(0, hash))
  if (!fs.existsSync(file)) throw new UsageError(`gradwire train: ${file} does not exist`)
  // The export is checked here, before any worker starts to fail on it: the file is imported once
  // in this process too. One that does not import here (a package only the workers' machines have)
  // is left to the workers, which say what is wrong with it.
  const exported = loop.slice(hash + 1)
  const mod = await import(pathToFileURL(file).href).then(
    (m: Record<string, unknown>) => m,
    () => undefined
  )
  if (mod !== undefined && typeof mod[exported] !== "function") {
    const fns = Object.keys(mod).filter((k) => typeof mod[k] === "function")
    throw new UsageError(`gradwire train: export "${exported}" of ${file} is not a function; functions it exports: ${fns.join(", ") || "none"}`)
  }
  const workers = number("workers", flags.workers, 1) ?? 1
  if (!Number.isInteger(workers)) throw new UsageError(`--workers must be a whole number, got ${flags.workers}`)
  const maxFailures = number("max-failures", flags["max-failures"], -1)
  const datasets: Record<string, unknown> = {}
  if (flags.dataset?.length) {
    const { fromFiles } = await import("../core/data/file-spec.ts")
    for (const d of flags.dataset) {
      const eq = d.indexOf("=")
      if (eq <= 0) throw new UsageError(`--dataset wants NAME=FILES (a path, glob or nats-obj:// location) or NAME={"files": ..., options}, got "${d}"`)
      datasets[d.slice(0, eq)] = datasetFlag(d.slice(0, eq), d.slice(eq + 1), fromFiles)
    }
  }
  let cluster: Record<string, unknown> | undefined
  const address = flags.address ?? settings.clusterAddress.read()
  if (address !== undefined) {
    const conn = connection(address, authFromFlags(flags))
    cluster = { address: conn.servers?.join(",") ?? address, clusterName: clusterName(flags), ...conn.auth }
  }
  const port = number("port", flags.port, 0)
  return runTrainer({
    trainLoopPerWorker: `${file}#${exported}`,
    trainLoopConfig: loopConfig(flags.config),
    scalingConfig: { numWorkers: workers, ...(flags.gpu ? { useGpu: true } : {}) },
    runConfig: {
      ...(flags.name !== undefined ? { name: flags.name } : {}),
      ...(flags["storage-path"] !== undefined ? { storagePath: flags["storage-path"] } : {}),
      ...(maxFailures !== undefined ? { failureConfig: { maxFailures } } : {}),
      ...(flags.timeline ? { timeline: true } : {}),
      ...(flags.dashboard || port !== undefined || flags.host !== undefined
        ? { dashboard: { ...(port !== undefined ? { port } : {}), ...(flags.host !== undefined ? { host: flags.host } : {}) } }
        : {})
    },
    ...(Object.keys(datasets).length ? { datasets } : {}),
    ...(cluster ? { cluster } : {}),
    ...(flags["resume-from"] !== undefined ? { resumeFromCheckpoint: await resumeFromFlag(flags["resume-from"]) } : {})
  })
}

/** --resume-from: a checkpoint directory or URL as given, or a run directory (its config.json): the run's latest checkpoint. */
const resumeFromFlag = async (given: string): Promise<string> => {
  if (given.includes("://") || !fs.existsSync(path.join(given, "config.json"))) return given
  const { loadResult } = await import("../actors/train/driver/result-files.ts")
  const r = await loadResult(given)
  if (!r.checkpoint) throw new UsageError(`--resume-from ${given}: that run directory holds no checkpoint`)
  return r.checkpoint.path
}

const demo = async (flags: Flags): Promise<number> => {
  const workers = number("workers", flags.workers, 1) ?? 4
  const epochs = number("epochs", flags.epochs, 1) ?? 20
  const port = number("port", flags.port, 0)
  const { loadDigits, trainTestSplit } = await import("../core/datasets.ts")
  const { train: rows, test } = trainTestSplit(await loadDigits(), 0.2, 2024)
  console.log(`gradwire demo: the digits dataset (${rows.size} training rows, ${test.size} held out), an MLP on ${workers} workers of an embedded cluster, ${epochs} epochs`)
  // A checkout runs this file as TypeScript, an installed package as compiled JavaScript: the loop next to it is the same kind.
  const loop = new URL(`./demo-loop${import.meta.url.endsWith(".ts") ? ".ts" : ".js"}`, import.meta.url).href
  return runTrainer({
    trainLoopPerWorker: { module: loop, export: "demoLoop" },
    trainLoopConfig: { epochs },
    scalingConfig: { numWorkers: workers },
    runConfig: {
      name: flags.name ?? `demo_${new Date().toISOString().replace(/[-:]/g, "").replace(/\..*$/, "").replace("T", "_")}`,
      storagePath: flags["storage-path"] ?? path.join(os.tmpdir(), "gradwire_results"),
      checkpointConfig: { numToKeep: 2, scoreAttribute: "val_accuracy", scoreOrder: "max" },
      failureConfig: { maxFailures: 2 },
      timeline: true,
      dashboard: { ...(port !== undefined ? { port } : {}), ...(flags.host !== undefined ? { host: flags.host } : {}) }
    },
    datasets: { train: rows, test }
  })
}

const stop = async (flags: Flags): Promise<number> => {
  const seconds = number("timeout", flags.timeout, 1) ?? 20
  console.log(await stopAgent(stateDir(flags), seconds * 1_000))
  return 0
}

const main = async (): Promise<number> => {
  // Output piped into `head` and the like: a closed pipe ends the command quietly.
  process.stdout.on("error", (e: NodeJS.ErrnoException) => {
    if (e.code === "EPIPE") process.exit(0)
  })
  const argv = process.argv.slice(2)
  const [command, ...rest] = argv
  if (!command || command === "--help" || command === "-h" || command === "help") {
    console.log(usage)
    return 0
  }
  if (command.startsWith("-")) throw new UsageError(`the command comes first: gradwire <${Object.keys(COMMAND_OPTIONS).join("|")}> [options]`)
  const { values: flags, tokens, positionals } = parseCommand(command, rest)
  if (flags.help) {
    console.log(commandUsage(command))
    return 0
  }
  switch (command) {
    case "start":
      return start(flags, tokens)
    case "status":
      return status(flags)
    case "data":
      return data(flags, positionals)
    case "dashboard":
      return dashboardCommand(flags)
    case "jobs":
      return jobs(flags)
    case "logs":
      return logs(flags, positionals)
    case "stack":
      return stack(flags, positionals)
    case "train":
      return train(flags, positionals)
    case "demo":
      return demo(flags)
    default:
      return stop(flags)
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
