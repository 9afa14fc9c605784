// Network namespaces for tests and benchmarks that need real, shaped links between "machines" on
// one host: namespaces, veth pairs, tc tbf, and processes started inside a namespace. Needs root.
// Only addresses on links made here (10.231.x and 10.232.x, inside namespaces made here) are used;
// every namespace made is removed by remove(), and every process started here is killed by its
// stop() and when this process exits.
import { execFileSync, spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { findNatsServerBinary, launchNatsServer } from "../../core/nats-server.ts"

export const sh = (cmd: string, args: ReadonlyArray<string>): string =>
  execFileSync(cmd, [...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 10_000 })

export const nsExec = (ns: string, args: ReadonlyArray<string>): string => sh("ip", ["netns", "exec", ns, ...args])

/** Why namespaces cannot be made here (not root, no ip/tc, no nats-server), or undefined when they can. */
export const netnsUnavailable = (): string | undefined => {
  if (process.getuid?.() !== 0) return "not root (network namespaces and tc need root)"
  try {
    findNatsServerBinary()
  } catch {
    return "no nats-server binary"
  }
  const probe = `gwprobe${process.pid % 100000}`
  try {
    sh("ip", ["netns", "add", probe])
    sh("ip", ["netns", "del", probe])
    sh("tc", ["-V"])
  } catch (e) {
    return `ip netns / tc do not work here (${String(e).split("\n")[0]})`
  }
  return undefined
}

/** Deletes the namespaces that exist (their veth ends go with them). */
export const deleteNetns = (names: ReadonlyArray<string>): void => {
  for (const ns of names) {
    try {
      sh("ip", ["netns", "del", ns])
    } catch {
      // not there
    }
  }
}

/** A tc rate ("1gbit", "500mbit", "20mbit") in bytes per second. */
export const rateBytesPerSecond = (rate: string): number => {
  const m = /^(\d+(?:\.\d+)?)(k|m|g)?bit$/i.exec(rate.trim())
  if (!m) throw new RangeError(`link rate must look like 1gbit, 500mbit or 20mbit, got ${JSON.stringify(rate)}`)
  const mult = { k: 1e3, m: 1e6, g: 1e9 }[(m[2] ?? "").toLowerCase() as "k" | "m" | "g"] ?? 1
  return (Number(m[1]) * mult) / 8
}

/**
 * Shapes what `dev` in `ns` sends with tc tbf. Default bucket: 2 ms of the rate (at least 32 KiB),
 * queue: 20 ms of it (at least 256 KiB); what the scheduler test's 20 Mbit/s link used before.
 */
export const shapeEgress = (ns: string, dev: string, rate: string, opts: { readonly burst?: string; readonly limit?: string } = {}): void => {
  const bps = rateBytesPerSecond(rate)
  const kb = (bytes: number): string => `${Math.ceil(bytes / 1024)}kb`
  const burst = opts.burst ?? kb(Math.max(32 * 1024, bps * 0.002))
  const limit = opts.limit ?? kb(Math.max(256 * 1024, bps * 0.02))
  nsExec(ns, ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "limit", limit])
}

/**
 * A new namespace `ns` joined to this one by a veth pair: `hostEnd` here with `${net}.1/24`,
 * `nsEnd` in the namespace with `${net}.2/24`, both up. Deletes the namespace again if a step fails.
 */
export const vethNamespace = (ns: string, hostEnd: string, nsEnd: string, net: string): void => {
  try {
    sh("ip", ["netns", "add", ns])
    sh("ip", ["link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd, "netns", ns])
    sh("ip", ["addr", "add", `${net}.1/24`, "dev", hostEnd])
    sh("ip", ["link", "set", hostEnd, "up"])
    addressUp(ns, nsEnd, `${net}.2/24`)
  } catch (e) {
    deleteNetns([ns])
    throw e
  }
}

/** Brings `dev` up in `ns` with `cidr`, and the namespace's loopback. */
export const addressUp = (ns: string, dev: string, cidr: string): void => {
  nsExec(ns, ["ip", "link", "set", "lo", "up"])
  nsExec(ns, ["ip", "addr", "add", cidr, "dev", dev])
  nsExec(ns, ["ip", "link", "set", dev, "up"])
}

/** Processes started in namespaces by this module that have not exited; killed when this process exits. */
const live = new Set<ChildProcess>()
let exitHook = false
const track = (child: ChildProcess): ChildProcess => {
  if (!exitHook) {
    exitHook = true
    process.once("exit", () => {
      for (const c of live) c.kill("SIGKILL")
    })
  }
  live.add(child)
  child.once("exit", () => live.delete(child))
  return child
}

/** Kills every process this module started that is still running, and waits for their exits. */
export const killStarted = (): Promise<void> => Promise.all([...live].map((c) => killChild(c))).then(() => undefined)

/** Kills a child and waits (bounded) for its exit. */
export const killChild = (child: ChildProcess, signal: NodeJS.Signals = "SIGKILL", waitMs = 5_000): Promise<void> =>
  new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    const timer = setTimeout(resolve, waitMs)
    child.once("exit", () => {
      clearTimeout(timer)
      resolve()
    })
    child.kill(signal)
  })

/**
 * Starts `args` in `ns` (`ip netns exec` execs it, so the child's pid is the program's), with its
 * stdout and stderr collected; resolves stdout when it exits 0, rejects otherwise or after
 * `timeoutMs` (then it is killed).
 */
export const runIn = (
  ns: string,
  args: ReadonlyArray<string>,
  timeoutMs: number,
  env: NodeJS.ProcessEnv = process.env
): Promise<string> =>
  new Promise((resolve, reject) => {
    const child = track(spawn("ip", ["netns", "exec", ns, ...args], { cwd: process.cwd(), env, stdio: ["ignore", "pipe", "pipe"] }))
    let out = ""
    let err = ""
    child.stdout!.on("data", (d: Buffer) => (out += d.toString()))
    child.stderr!.on("data", (d: Buffer) => (err += d.toString()))
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
    child.on("exit", (code, signal) => {
      clearTimeout(timer)
      if (code === 0) resolve(out)
      else reject(new Error(`${args.join(" ")} in ${ns} exited with ${code ?? signal}: ${err.slice(-2000)}`))
    })
  })

export interface NetnsNatsServer {
  readonly url: string
  readonly child: ChildProcess
  stop(): Promise<void>
}

/**
 * A nats-server in `ns` with the config `lines` (listen, cluster, ...) written to `dir`/`name`.conf;
 * resolves once it logs that it is ready (within 10 s; else it is killed and the promise rejects).
 * `options.nice`: the nice value it runs at (root for a negative one).
 */
export const startNatsIn = (ns: string, dir: string, name: string, url: string, lines: ReadonlyArray<string>, options: { readonly nice?: number } = {}): Promise<NetnsNatsServer> => {
  const conf = path.join(dir, `${name}.conf`)
  fs.writeFileSync(conf, [`server_name: ${name}`, ...lines].join("\n") + "\n")
  // `nice` (root): the server ahead of other processes for the CPU, as a test's ranks may be.
  const command = [...(options.nice !== undefined ? ["nice", "-n", String(options.nice)] : []), findNatsServerBinary(), "-c", conf]
  const child = track(spawn("ip", ["netns", "exec", ns, ...command], { stdio: ["ignore", "ignore", "pipe"] }))
  const server: NetnsNatsServer = { url, child, stop: () => killChild(child, "SIGTERM").then(() => killChild(child)) }
  return new Promise((resolve, reject) => {
    let log = ""
    const fail = (why: string): void => {
      clearTimeout(timer)
      child.kill("SIGKILL")
      reject(new Error(`nats-server ${name} in ${ns} ${why}: ${log.slice(-1000)}`))
    }
    const timer = setTimeout(() => fail("was not ready within 10 s"), 10_000)
    child.stderr!.on("data", (d: Buffer) => {
      log += d.toString()
      if (log.includes("Server is ready")) {
        clearTimeout(timer)
        resolve(server)
      }
    })
    child.once("exit", (code, signal) => fail(`exited with ${code ?? signal}`))
  })
}

export interface StarRank {
  /** The rank's namespace. */
  readonly ns: string
  /** Its address on the star (10.232.x.(10 + i)). */
  readonly ip: string
  /** Its end of the veth pair (the interface gloo and others bind to). */
  readonly dev: string
}

/** A hub namespace with a bridge, and `size` namespaces each joined to it by its own shaped veth pair. */
export interface Star {
  readonly hub: string
  readonly hubIp: string
  readonly ranks: ReadonlyArray<StarRank>
  readonly rate: string
  /** Deletes every namespace of the star. */
  remove(): void
}

/**
 * Makes a star: every "machine" (rank namespace) has one link to a switch (a bridge in the hub
 * namespace), shaped to `rate` in both directions, like hosts on a switched network. Loopback
 * inside a namespace stays unshaped. Anything left from a crashed run with the same names is
 * removed first; on failure, what was made is removed again.
 */
export const createStar = (size: number, rate: string): Star => {
  rateBytesPerSecond(rate) // validates
  const tag = String(process.pid % 100000)
  const net = `10.232.${process.pid % 250}`
  const hub = `gwH${tag}`
  const ranks: StarRank[] = Array.from({ length: size }, (_, i) => ({ ns: `gwR${tag}x${i}`, ip: `${net}.${10 + i}`, dev: `gwr${tag}x${i}` }))
  const all = [hub, ...ranks.map((r) => r.ns)]
  const remove = (): void => deleteNetns(all)
  remove()
  try {
    sh("ip", ["netns", "add", hub])
    nsExec(hub, ["ip", "link", "add", "br0", "type", "bridge"])
    addressUp(hub, "br0", `${net}.1/24`)
    ranks.forEach((r, i) => {
      const hubEnd = `gwh${tag}x${i}`
      sh("ip", ["netns", "add", r.ns])
      sh("ip", ["link", "add", r.dev, "netns", r.ns, "type", "veth", "peer", "name", hubEnd, "netns", hub])
      addressUp(r.ns, r.dev, `${r.ip}/24`)
      nsExec(hub, ["ip", "link", "set", hubEnd, "master", "br0"])
      nsExec(hub, ["ip", "link", "set", hubEnd, "up"])
      shapeEgress(r.ns, r.dev, rate) // what the rank sends
      shapeEgress(hub, hubEnd, rate) // what it receives
    })
  } catch (e) {
    remove()
    throw e
  }
  return { hub, hubIp: `${net}.1`, ranks, rate, remove }
}

/**
 * A plain nats-server (no JetStream) for a benchmark's ranks: on loopback, or with `star` in its hub
 * namespace on the bridge address (config written to `dir`).
 */
export const benchNatsServer = async (maxPayload: number, star: Star | undefined, dir: string): Promise<{ readonly url: string; stop(): Promise<void> }> => {
  if (!star) return launchNatsServer({ jetstream: false, maxPayload })
  const listen = `${star.hubIp}:4222`
  return startNatsIn(star.hub, dir, "gw-bench-hub", `nats://${listen}`, [`listen: "${listen}"`, `max_payload: ${maxPayload}`])
}

/**
 * Runs a benchmark on a star of `size` namespaces with links shaped to `rate` (--link), with a temp
 * directory for its configs; both are removed afterwards, also on failure. Throws a clear error
 * where namespaces cannot be made.
 */
export const onStar = async <T>(size: number, rate: string, body: (star: Star, dir: string) => Promise<T>): Promise<T> => {
  const why = netnsUnavailable()
  if (why) throw new Error(`--link needs network namespaces and tc: ${why}; run as root, or leave --link out to measure on loopback`)
  const star = createStar(size, rate)
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-bench-link-"))
  try {
    return await body(star, dir)
  } finally {
    star.remove()
    fs.rmSync(dir, { recursive: true, force: true })
  }
}
