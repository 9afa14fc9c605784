// The multi-node example end to end on one machine: 3 routed nats-servers, 3 agents started with
// the real CLI (`gradwire start --address ... --block`), the digits job placed across them through
// `cluster: { address, clusterName }`, per-rank logs collected by the driver from remote agents,
// the direct links' cost fitted per pair of nodes (explain.txt), and nothing left running
// afterwards, after a normal run and after Ctrl-C in the middle of one.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { alive, runScript } from "./support/run-script.ts"

const storage = fs.mkdtempSync(path.join(os.tmpdir(), "gw-multinode-test-"))
const pids: number[] = []

afterAll(() => {
  // Anything a failed run left behind.
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL")
    } catch {
      // gone
    }
  }
  fs.rmSync(storage, { recursive: true, force: true })
})

/** The nats-server and agent pids the example printed. */
const startedPids = (out: string): number[] => {
  const found = [...out.matchAll(/pids ([\d, ]+)\)?/g)].flatMap((m) => m[1].split(",").map((s) => Number(s.trim())))
  pids.push(...found)
  return found
}

const gone = async (list: number[]): Promise<number[]> => {
  for (let i = 0; i < 50 && list.some(alive); i++) await new Promise((r) => setTimeout(r, 100))
  return list.filter(alive)
}

describe("examples/multi-node/local-cluster.ts", () => {
  it("trains across 3 CLI-started agents on 3 clustered nats-servers and tears everything down", async () => {
    const r = await runScript("examples/multi-node/local-cluster.ts", ["--epochs", "1", "--storage", storage], { timeoutMs: 150_000 })
    const started = startedPids(r.output)
    expect(started).toHaveLength(6)
    expect(r.code, r.output).toBe(0)
    expect(r.output).toContain("3 nodes alive")
    expect(r.output).toMatch(/node-a\s+alive[\s\S]*node-b\s+alive[\s\S]*node-c\s+alive/)
    // SPREAD: one worker on each node.
    for (const node of ["node-a", "node-b", "node-c"]) expect(r.output).toMatch(new RegExp(`\\(worker rank=\\d pid=\\d+ node=${node}\\)`))
    expect(r.output).toMatch(/held-out accuracy: \d+\.\d% after 1 epochs/)
    const dir = /run directory: (\S+)/.exec(r.output)?.[1]
    expect(dir).toBeDefined()
    // Worker output of remote agents lands in the driver's run directory.
    expect(fs.readdirSync(path.join(dir!, "logs")).sort()).toEqual(["worker_rank=0.log", "worker_rank=1.log", "worker_rank=2.log"])
    expect(fs.existsSync(path.join(dir!, "report.html"))).toBe(true)
    // the cost model's direct links fitted for each pair of nodes from timed exchanges between them
    const explain = fs.readFileSync(path.join(dir!, "explain.txt"), "utf8")
    expect(explain, explain).toMatch(
      /direct links node-a <-> node-b \d+us (\d+|inf)MB\/s, node-a <-> node-c \d+us (\d+|inf)MB\/s, node-b <-> node-c \d+us (\d+|inf)MB\/s \(ring over the direct links at 3 sizes, each pair of nodes/
    )
    expect(r.output).toContain("torn down")
    expect(await gone(started)).toEqual([])
  })

  it("tears everything down on Ctrl-C in the middle of training", async () => {
    let sent = false
    const r = await runScript("examples/multi-node/local-cluster.ts", ["--epochs", "50", "--storage", storage], {
      timeoutMs: 150_000,
      onOutput: (out, kill) => {
        if (!sent && /report 0:/.test(out)) {
          sent = true
          kill("SIGINT")
        }
      }
    })
    const started = startedPids(r.output)
    expect(sent, r.output).toBe(true)
    expect(r.output).toContain("SIGINT: tearing down")
    expect(r.output).toContain("torn down")
    expect(await gone(started)).toEqual([])
  })
})
