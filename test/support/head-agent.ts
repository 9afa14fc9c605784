// A head node agent in the test process, on a nats-server the test started: node id
// `<cluster>-node`, the wasm and cpu backends, at least 2 CPUs. What the Trainer tests on a joined
// cluster start before they fit; stop() stops the agent, then closes its connection.
import * as os from "node:os"
import { launchAgent } from "../../actors/node/agent.ts"
import { silentLogger } from "../../actors/runtime/log.ts"
import { openNats } from "../../core/connection.ts"

export interface HeadAgent {
  /** The agent's connection (a test may use it too, e.g. to upload to the object store). */
  readonly conn: Awaited<ReturnType<typeof openNats>>
  stop(): Promise<void>
}

export const startHeadAgent = async (url: string, cluster: string, name: string, connect: { readonly maxReconnectAttempts?: number } = {}): Promise<HeadAgent> => {
  const conn = await openNats({ servers: url, name, ...connect })
  try {
    const agent = await launchAgent({
      nc: conn.nc,
      connection: { servers: [url] },
      cluster,
      nodeId: `${cluster}-node`,
      head: true,
      backends: ["wasm", "cpu"],
      log: silentLogger,
      ownerTimeoutMs: 5_000,
      numCpus: Math.max(2, os.availableParallelism())
    })
    return {
      conn,
      stop: async () => {
        await agent.stop("test finished").catch(() => {})
        await conn.close().catch(() => {})
      }
    }
  } catch (e) {
    await conn.close().catch(() => {})
    throw e
  }
}
