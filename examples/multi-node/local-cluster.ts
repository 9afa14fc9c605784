// The multi-node walk-through (README.md) on one machine: 3 nats-servers joined by routes (as on
// 3 machines: each started from a config file like the one you would put on each machine), 3 node
// agents started with the real CLI (`gradwire start --address ... --block`),
// each on a different server, then the digits training placed across them (SPREAD: one worker per
// node) through `cluster: { address, clusterName }`, and `gradwire status` before and after.
// Everything it starts is stopped at the end, on failure, and on Ctrl-C / SIGTERM.
//
//   node examples/multi-node/local-cluster.ts [--epochs 5] [--workers 3]
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"
import { Trainer, loadDigits, trainTestSplit } from "../../index.ts"

const { values } = parseArgs({
  options: {
    epochs: { type: "string", default: "5" },
    workers: { type: "string", default: "3" },
    storage: { type: "string", default: path.join(os.tmpdir(), "gradwire_results") }
  }
})

const CLUSTER = "demo"
const GRADWIRE = fileURLToPath(new URL("../../bin/gradwire.js", import.meta.url))
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gw-multinode-"))

/** Runs `gradwire <args>` to completion (bounded: killed after 20 s) and returns its stdout. */
const gradwire = (args: string[]): Promise<string> =>
  new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [GRADWIRE, ...args], { stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let err = ""
    p.stdout.on("data", (d: Buffer) => (out += d.toString()))
    p.stderr.on("data", (d: Buffer) => (err += d.toString()))
    const timer = setTimeout(() => p.kill("SIGKILL"), 20_000)
    p.on("error", reject)
    p.on("close", (code) => {
      clearTimeout(timer)
      if (code === 0) resolve(out)
      else reject(new Error(`gradwire ${args.join(" ")} exited ${code}: ${err.trim()}`))
    })
  })

/** Free loopback ports, as the OS hands them out (released again for nats-server to take). */
const freePorts = async (n: number): Promise<number[]> => {
  const held = await Promise.all(
    Array.from({ length: n }, () => new Promise<net.Server>((resolve, reject) => {
      const s = net.createServer()
      s.once("error", reject)
      s.listen(0, "127.0.0.1", () => resolve(s))
    }))
  )
  const ports = held.map((s) => (s.address() as net.AddressInfo).port)
  await Promise.all(held.map((s) => new Promise((resolve) => s.close(resolve))))
  return ports
}

const isExecutable = (file: string): boolean => {
  try {
    fs.accessSync(file, fs.constants.X_OK)
    return fs.statSync(file).isFile()
  } catch {
    return false
  }
}

/** nats-server: $NATS_SERVER_BIN, else on PATH or where the Debian and Homebrew packages put it. */
const natsServerBinary = (): string => {
  if (process.env.NATS_SERVER_BIN) return process.env.NATS_SERVER_BIN
  const dirs = [...(process.env.PATH ?? "").split(path.delimiter).filter(Boolean), "/usr/sbin", "/usr/local/bin", "/opt/homebrew/bin"]
  const found = dirs.map((dir) => path.join(dir, "nats-server")).find(isExecutable)
  if (!found) throw new Error("nats-server not found: install it (apt-get install nats-server, brew install nats-server) or set NATS_SERVER_BIN")
  return found
}

/** Resolves once `port` accepts connections; rejects if `proc` exits first or 10 s pass. */
const listening = (port: number, proc: ChildProcess, log: () => string): Promise<void> =>
  new Promise((resolve, reject) => {
    const deadline = Date.now() + 10_000
    const onExit = (code: number | null) => reject(new Error(`nats-server on port ${port} exited (${code}): ${log()}`))
    proc.once("exit", onExit)
    const attempt = (): void => {
      const c = net.connect(port, "127.0.0.1", () => {
        c.destroy()
        proc.off("exit", onExit)
        resolve()
      })
      c.once("error", () => {
        if (Date.now() > deadline) reject(new Error(`nats-server on port ${port} did not listen within 10 s: ${log()}`))
        else setTimeout(attempt, 100)
      })
    }
    attempt()
  })

/**
 * Three nats-servers joined by routes, each from its own config file: on three machines each would
 * listen on 0.0.0.0 and name the others' addresses instead of 127.0.0.1 ports.
 */
const startNatsServers = async (): Promise<{ urls: string[]; procs: ChildProcess[] }> => {
  const bin = natsServerBinary()
  const [c0, c1, c2, r0, r1, r2] = await freePorts(6)
  const client = [c0, c1, c2]
  const route = [r0, r1, r2]
  const procs: ChildProcess[] = []
  const started = client.map((port, i) => {
    const conf = path.join(work, `nats-${i}.conf`)
    fs.writeFileSync(
      conf,
      [
        `server_name: demo-${i}`,
        `listen: 127.0.0.1:${port}`,
        // larger messages than the 1 MiB default: gradients travel in 4 MiB chunks
        "max_payload: 8388608",
        "cluster {",
        `  name: ${CLUSTER}`,
        `  listen: 127.0.0.1:${route[i]}`,
        `  routes: [${route.filter((_, j) => j !== i).map((p) => `nats-route://127.0.0.1:${p}`).join(", ")}]`,
        "}"
      ].join("\n") + "\n"
    )
    const proc = spawn(bin, ["-c", conf], { stdio: ["ignore", "ignore", "pipe"] })
    procs.push(proc)
    let log = ""
    proc.stderr?.on("data", (b: Buffer) => (log = (log + b.toString()).slice(-2_000)))
    return listening(port, proc, () => log)
  })
  natsServers = procs
  await Promise.all(started)
  return { urls: client.map((p) => `nats://127.0.0.1:${p}`), procs }
}

/** Stops a process: SIGTERM, then SIGKILL after `graceMs`. */
const stop = (p: ChildProcess, graceMs: number): Promise<void> =>
  new Promise<void>((resolve) => {
    if (p.exitCode !== null || p.signalCode !== null) return resolve()
    const force = setTimeout(() => p.kill("SIGKILL"), graceMs)
    p.once("exit", () => {
      clearTimeout(force)
      resolve()
    })
    p.kill("SIGTERM")
  })

const agents: ChildProcess[] = []
let natsServers: ChildProcess[] = []
let tornDown: Promise<void> | undefined

/** Stops the agents (SIGTERM: each kills its worker processes first), then the NATS servers. */
const teardown = (): Promise<void> =>
  (tornDown ??= (async () => {
    await Promise.all(agents.map((a) => stop(a, 15_000)))
    await Promise.all(natsServers.map((s) => stop(s, 5_000)))
    fs.rmSync(work, { recursive: true, force: true })
    console.log("torn down: agents and nats-servers stopped")
  })())

// `on`, not `once`: fit() re-raises the signal after its own cleanup, and that second delivery
// must not kill this process (the default action) before the agents are stopped.
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (tornDown) return
    console.log(`\n${signal}: tearing down`)
    void teardown().finally(() => process.exit(130))
  })
}

const main = async (): Promise<void> => {
  // 1. The NATS cluster. On real machines: one nats-server per machine with routes to the others
  //    (or `gradwire start --head` on the head, which starts one for you).
  const nats = await startNatsServers()
  console.log(`nats cluster: ${nats.urls.join(", ")} (pids ${nats.procs.map((p) => p.pid).join(", ")})`)

  // 2. One agent per "machine", each joined through a different server of the cluster.
  nats.urls.forEach((url, i) => {
    const node = `node-${"abc"[i]}`
    const a = spawn(
      process.execPath,
      [GRADWIRE, "start", "--address", url, "--cluster", CLUSTER, "--node-id", node, "--num-cpus", "2", "--backends", "wasm,cpu", "--block", "--state-dir", path.join(work, node)],
      { stdio: ["ignore", "pipe", "pipe"] }
    )
    // Agent output (including its workers' lines) with the node in front, like a log aggregator.
    for (const stream of [a.stdout, a.stderr]) {
      let buf = ""
      stream?.on("data", (d: Buffer) => {
        buf += d.toString()
        const lines = buf.split("\n")
        buf = lines.pop() ?? ""
        // Worker lines ("(worker rank=...) ...") also reach the driver, which prints them and
        // keeps them in the run directory's logs/: show only the agent's own.
        for (const line of lines) if (line.trim() && !line.startsWith("(")) console.log(`[${node}] ${line}`)
      })
    }
    agents.push(a)
  })
  console.log(`agents: pids ${agents.map((a) => a.pid).join(", ")}`)

  // 3. Wait until the head's view (any server: the cluster routes the queries) has all 3 alive.
  const deadline = Date.now() + 60_000
  for (;;) {
    const report = JSON.parse(await gradwire(["status", "--address", nats.urls[0], "--cluster", CLUSTER, "--json"]).catch(() => "{}")) as {
      nodes?: Array<{ state: string }>
    }
    const alive = report.nodes?.filter((n) => n.state === "alive").length ?? 0
    if (alive === 3) break
    if (Date.now() > deadline) throw new Error(`only ${alive} of 3 agents came up within 60 s`)
    await new Promise((r) => setTimeout(r, 500))
  }
  console.log("3 nodes alive:")
  console.log(await gradwire(["status", "--address", nats.urls[0], "--cluster", CLUSTER]))

  // 4. The job, against the cluster's address: the driver joins through server 0, the workers are
  //    spawned by the agents (SPREAD: one per node when there are 3).
  const { train, test } = trainTestSplit(await loadDigits(), 0.2, 2024)
  const result = await new Trainer({
    trainLoopPerWorker: { module: new URL("../digits/train.ts", import.meta.url).href, export: "trainLoop" },
    trainLoopConfig: { epochs: Number(values.epochs) },
    scalingConfig: { numWorkers: Number(values.workers), placementStrategy: "SPREAD" },
    runConfig: { name: `multinode_${Date.now()}`, storagePath: values.storage, timeline: true },
    cluster: { address: nats.urls[0], clusterName: CLUSTER },
    datasets: { train, test }
  }).fit()
  console.log(`held-out accuracy: ${(Number(result.metrics?.val_accuracy) * 100).toFixed(1)}% after ${result.metricsHistory.length} epochs`)
  console.log(`run directory: ${result.path}`)
  console.log(await gradwire(["status", "--address", nats.urls[0], "--cluster", CLUSTER]))
}

let code = 0
try {
  await main()
} catch (e) {
  console.error(`local cluster example failed: ${e instanceof Error ? e.message : String(e)}`)
  code = 1
} finally {
  await teardown()
}
process.exit(code)
