// A NATS client in a process of its own (NODE_EXTRA_CA_CERTS must be set at start), for the read
// pool's TLS test: connects to GW_TLS_URL with no TLS options, so nats.js upgrades to TLS only
// because the server offers it, over the socket that core/nats-internals/read.ts dialled. Sends itself a
// few messages and prints one JSON line with what it got.
import { installNatsPatches, readPoolStats } from "../../core/nats-internals/index.ts"
import { connect } from "@nats-io/transport-node"

installNatsPatches()

const nc = await connect({ servers: process.env.GW_TLS_URL, timeout: 10_000 })
const sizes = [10, 5000, 100_000]
const got: number[][] = []
const sub = nc.subscribe("tls.check", { max: sizes.length })
for (const [i, n] of sizes.entries()) nc.publish("tls.check", new Uint8Array(n).fill(i + 1))
for await (const m of sub) got.push([m.data.length, m.data.every((b) => b === got.length + 1) ? 1 : 0])
const encrypted = (nc as unknown as { protocol?: { transport?: { socket?: { encrypted?: boolean } } } }).protocol?.transport?.socket?.encrypted === true
await nc.close()
console.log(JSON.stringify({ got, encrypted, taken: readPoolStats.taken, returned: readPoolStats.returned }))
