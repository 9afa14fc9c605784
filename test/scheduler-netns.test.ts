// The scheduler on a real two-"machine" network: two network namespaces joined by a veth pair
// shaped with tc tbf (fast loopback inside a namespace, a slow link between them), a nats-server in
// each, clustered by a route across the veth, three ranks in each namespace. The topology probe must
// see two nodes on two servers, the cost model must pick hierarchical for a large all-reduce, and
// hierarchical must be measured faster than a flat ring in the same run.
//
// The same over the direct links (a Unix socket inside a namespace, TCP across), where each pair of
// nodes' links is fitted from timed exchanges.
//
// Needs root (network namespaces, tc). Without it the test is skipped with the reason in its name.
// Only addresses on the test's own veth (10.231.<n>.1/.2) are used; the namespaces, and with them
// the veth pair, the servers and the ranks, are removed after the test, also when it fails.
import { afterAll, describe, expect, it } from "vitest"
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { addressUp, deleteNetns, killStarted, netnsUnavailable, runIn, sh, shapeEgress, startNatsIn, type NetnsNatsServer } from "./support/netns.ts"

const tag = String(process.pid % 100000)
const NS_A = `gwA${tag}`
const NS_B = `gwB${tag}`
const VETH_A = `gwva${tag}`
const VETH_B = `gwvb${tag}`
const NET = `10.231.${process.pid % 250}`
const IP_A = `${NET}.1`
const IP_B = `${NET}.2`

/** Why the test cannot run here, or undefined when it can. */
const unavailable = netnsUnavailable()

const servers: NetnsNatsServer[] = []
let dir: string | undefined

const cleanup = async (): Promise<void> => {
  await Promise.all(servers.splice(0).map((s) => s.stop()))
  await killStarted() // the ranks
  deleteNetns([NS_A, NS_B])
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
}

afterAll(() => cleanup())

const startServer = async (ns: string, name: string, ownIp: string, peerIp: string): Promise<void> => {
  servers.push(
    await startNatsIn(ns, dir!, name, "nats://127.0.0.1:4222", [
      `listen: "127.0.0.1:4222"`,
      `max_payload: 8388608`,
      `cluster {`,
      `  name: gwnetns`,
      `  listen: "${ownIp}:6222"`,
      `  routes: ["nats-route://${peerIp}:6222"]`,
      `}`
    ], { nice: -10 })
  )
}

/**
 * The two namespaces, the veth between them shaped to `rate` each way, and a nats-server in each
 * clustered across it (what was there before is removed first).
 */
const setUp = async (rate: string): Promise<void> => {
  await cleanup()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-netns-"))
  sh("ip", ["netns", "add", NS_A])
  sh("ip", ["netns", "add", NS_B])
  sh("ip", ["link", "add", VETH_A, "netns", NS_A, "type", "veth", "peer", "name", VETH_B, "netns", NS_B])
  for (const [ns, dev, ip] of [
    [NS_A, VETH_A, IP_A],
    [NS_B, VETH_B, IP_B]
  ] as const) {
    addressUp(ns, dev, `${ip}/24`)
    // The slow link (loopback inside a namespace is ~GB/s): slow enough that the link, not the 2
    // shared cores, bounds both algorithms. Over NATS (10 Mbit/s) with the fan-out all-gather a
    // flat ring crosses it with only ~1.33x the bytes of hierarchical, so a faster link leaves
    // the comparison to CPU noise.
    shapeEgress(ns, dev, rate, { burst: "32kb", limit: "256kb" })
  }
  await startServer(NS_A, "srv-a", IP_A, IP_B)
  await startServer(NS_B, "srv-b", IP_B, IP_A)
}

/** test/support/choice-rank.ts as each rank of `layout` in its namespace; resolves each one's output. */
const runRanks = <L extends { readonly ns: string; readonly node: string }>(
  layout: ReadonlyArray<L>,
  args: Record<string, unknown>,
  own: (l: L) => Record<string, unknown> = () => ({})
): Promise<string[]> =>
  Promise.all(
    layout.map((l, rank) =>
      runIn(
        l.ns,
        [
          // Ahead of other test files' processes for the CPU (the test needs root anyway): with
          // both cores busy, a 256 KiB exchange over a Unix socket waited for a time slice and
          // the fit saw the node's own links only 2.6x faster than the 50 Mbit/s link across.
          "nice",
          "-n",
          "-10",
          process.execPath,
          "test/support/choice-rank.ts",
          JSON.stringify({ rank, worldSize: layout.length, node: l.node, url: "nats://127.0.0.1:4222", deadlineMs: 90_000, ...args, ...own(l) })
        ],
        100_000
      )
    )
  )

describe("scheduler over two network namespaces", () => {
  it.skipIf(unavailable !== undefined)(
    `picks hierarchical across a slow link between two clustered NATS servers, and hierarchical beats a flat ring${unavailable ? ` (skipped: ${unavailable})` : ""}`,
    async () => {
      // 2 MiB at 10 Mbit/s: the link's share of each call as at 4 MiB and 20 Mbit/s, half the work
      // on the shared cores (hierarchical's reduction and broadcast inside each node, which a
      // loaded CI machine once made as slow as the ring's extra third across the link: 2700 against
      // 2615 ms at 4 MiB and 20 Mbit/s).
      await setUp("10mbit")
      const bytes = 2 * 1024 * 1024
      const layout = [
        { ns: NS_A, node: "node-a" },
        { ns: NS_A, node: "node-a" },
        { ns: NS_A, node: "node-a" },
        { ns: NS_B, node: "node-b" },
        { ns: NS_B, node: "node-b" },
        { ns: NS_B, node: "node-b" }
      ]
      // interleaved ring/hierarchical; the median of 5 rides out a burst of load from other test files
      const outs = await runRanks(layout, { sizes: [bytes], algorithms: ["ring", "hierarchical"], reps: 5 })
      const all = JSON.parse(outs[0]!.trim().split("\n").at(-1)!) as {
        observation: string
        cases: Array<{ chosen: string; predicted: Record<string, number>; measured: Record<string, number[]> }>
        explain: string
      }
      const result = { ...all.cases[0]!, observation: all.observation, explain: all.explain }
      const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
      console.log(
        `${result.observation}\n${result.explain}\nmeasured 2 MiB p=6: ring ${med(result.measured.ring!).toFixed(1)} ms, ` +
          `hierarchical ${med(result.measured.hierarchical!).toFixed(1)} ms`
      )
      expect(result.observation).toMatch(/2 node\(s\), 2 server\(s\)/)
      expect(result.chosen).toBe("hierarchical")
      expect(med(result.measured.hierarchical!)).toBeLessThan(med(result.measured.ring!))
    },
    150_000
  )

  it.skipIf(unavailable !== undefined)(
    `over the direct links: fits each pair of nodes' links (Unix sockets inside a node, the slow link across) and picks hierarchical, which beats a flat ring${unavailable ? ` (skipped: ${unavailable})` : ""}`,
    async () => {
      await setUp("50mbit")
      // Before each pair of nodes had its own fit, the direct links had one alpha and beta for
      // every link, fitted from ring calls that the slow link bounds: the Unix sockets looked as
      // slow as it, and the model picked the ring, which crosses the link with 1.5x the bytes.
      const bytes = 2 * 1024 * 1024
      const secret = crypto.randomBytes(32).toString("hex")
      const layout = [
        { ns: NS_A, node: "node-a", ip: IP_A },
        { ns: NS_A, node: "node-a", ip: IP_A },
        { ns: NS_B, node: "node-b", ip: IP_B },
        { ns: NS_B, node: "node-b", ip: IP_B }
      ]
      const outs = await runRanks(layout, { sizes: [bytes], algorithms: ["ring", "hierarchical"], reps: 5, directSecret: secret }, (l) => ({ directHost: l.ip }))
      const all = JSON.parse(outs[0]!.trim().split("\n").at(-1)!) as {
        observation: string
        cases: Array<{ chosen: string; predicted: Record<string, number>; measured: Record<string, number[]> }>
      }
      const c = all.cases[0]!
      const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
      const [ring, hier] = [med(c.measured.ring!), med(c.measured.hierarchical!)]
      console.log(
        `${all.observation}\npredicted 2 MiB p=4: ring ${c.predicted.ring!.toFixed(1)} ms, hierarchical ${c.predicted.hierarchical!.toFixed(1)} ms; ` +
          `measured: ring ${ring.toFixed(1)} ms, hierarchical ${hier.toFixed(1)} ms`
      )
      // each pair of nodes fitted: a node's own links faster than the one across (one alpha and
      // beta for every link would price them alike). Alone, the Unix sockets fitted at 12x and 40x the
      // 50 Mbit/s link; with another test file busy on both cores, the 256 KiB exchanges a node's
      // pair is fitted from waited for a core, and one CI run fitted node-a's at 17 MB/s, 2.8x;
      // another below the 2.75x where the model's pick turns to the ring. A node's own pair is now
      // timed 3x as often and at 2 MiB too (Communicator OWN_NODE_REPS, OWN_NODE_SIZE): with six
      // busy loops at the ranks' priority it fitted at 6-17x (27-61 MB/s, 3.5-7x, before).
      const directPart = all.observation.slice(all.observation.indexOf("direct links"))
      const pairs = [...directPart.matchAll(/(node-\w) <-> (node-\w) (\d+)us (\d+)MB\/s/g)].map((m) => ({ pair: `${m[1]}-${m[2]}`, mbps: Number(m[4]) }))
      expect(pairs.map((p) => p.pair)).toEqual(["node-a-node-a", "node-a-node-b", "node-b-node-b"])
      const across = pairs[1]!.mbps
      expect(pairs[0]!.mbps).toBeGreaterThan(2 * across)
      expect(pairs[2]!.mbps).toBeGreaterThan(2 * across)
      expect(c.chosen).toBe("hierarchical")
      expect(hier).toBeLessThan(ring)
    },
    150_000
  )
})
