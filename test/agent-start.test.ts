// A node agent's start on a real nats-server: its node is advertised only once its control actor
// answers. With the backends probe cached in its state directory (any agent started before on the
// machine), the probe resolved at once and advertised the node before the control actor had
// claimed its subject, so a driver that placed a worker there on that first advertisement (a
// replacement waiting for room) was told no agent runs for the node.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { launchAgent, type NodeAgent } from "../actors/node/agent.ts"
import { cacheKey, probeHardware } from "../actors/node/node-probe.ts"
import { agentRef } from "../actors/node/spawn.ts"
import { silentLogger } from "../actors/runtime/log.ts"
import { ActorSystem } from "../actors/runtime/system.ts"
import { clusterSubjects } from "../core/subjects.ts"
import { natsFixtures } from "./support/nats.ts"

const nats = natsFixtures("all")
const dirs: string[] = []
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true })
})

describe("a node agent's start", () => {
  it("advertises the node only once its control actor answers, with the backends probe cached too", { timeout: 60_000 }, async () => {
    const server = await nats.server()
    const conn = await nats.connect(server.url)
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-agent-start-"))
    dirs.push(stateDir)
    const hw = await probeHardware()
    fs.writeFileSync(path.join(stateDir, "backends.json"), JSON.stringify({ key: cacheKey(hw.gpus), backends: ["wasm", "cpu"], errors: {} }))
    const driver = new ActorSystem({ nc: conn.nc, cluster: "c", job: "probe", log: silentLogger })
    try {
      for (let i = 0; i < 5; i++) {
        const nodeId = `start-${i}`
        // As a driver does: the first advertisement heard, at once a request to the node's agent.
        const answered = new Promise<string>((resolve) => {
          const sub = conn.nc.subscribe(clusterSubjects("c").nodeHeartbeat(nodeId), {
            max: 1,
            callback: () => {
              sub.unsubscribe()
              driver.askPromise(agentRef(driver, nodeId), "info", null, { timeoutMs: 5_000 }).then(
                (ad) => resolve(`answered ${ad.nodeId}`),
                (e: Error) => resolve(`${(e as { _tag?: string })._tag ?? "error"}: ${e.message}`)
              )
            }
          })
        })
        await conn.nc.flush()
        const agentConn = await nats.connect(server.url)
        let agent: NodeAgent | undefined
        try {
          agent = await launchAgent({ nc: agentConn.nc, connection: { servers: [server.url] }, cluster: "c", nodeId, stateDir, log: silentLogger, output: () => {} })
          expect(await answered).toBe(`answered ${nodeId}`)
        } finally {
          await agent?.stop("test finished").catch(() => {})
        }
      }
    } finally {
      driver.close()
    }
  })
})
