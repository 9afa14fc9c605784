// The shaped star the `--link` benchmarks run on (test/support/netns.ts): every rank namespace
// reaches the nats-server in the hub over its own link, each link is shaped both ways at the
// asked rate, ranks cannot reach anything but the star, and remove() leaves no namespace behind.
// Needs root; without it the network part is skipped with the reason in its name.
import { afterAll, describe, expect, it } from "vitest"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { createStar, killStarted, netnsUnavailable, nsExec, rateBytesPerSecond, runIn, sh, startNatsIn, type NetnsNatsServer, type Star } from "./support/netns.ts"

describe("link rates", () => {
  it("reads tc rates in bits per second as bytes per second, and refuses anything else", () => {
    expect(rateBytesPerSecond("1gbit")).toBe(125e6)
    expect(rateBytesPerSecond("500mbit")).toBe(62.5e6)
    expect(rateBytesPerSecond("20Mbit")).toBe(2.5e6)
    expect(rateBytesPerSecond("1.5kbit")).toBe(187.5)
    for (const bad of ["1gb", "fast", "", "-1gbit", "1 gbit/s"]) expect(() => rateBytesPerSecond(bad)).toThrow(/link rate must look like/)
  })
})

const unavailable = netnsUnavailable()
let star: Star | undefined
let server: NetnsNatsServer | undefined
let dir: string | undefined

afterAll(async () => {
  await server?.stop()
  await killStarted()
  star?.remove()
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

// A rank's round trip through the hub's server: subscribe, publish 256 KiB, check it came back whole.
const PING = `
import { connect } from "@nats-io/transport-node"
const nc = await connect({ servers: process.argv[1], maxReconnectAttempts: 0, timeout: 5000 })
const data = new Uint8Array(256 * 1024).map((_, i) => (i * 7 + Number(process.argv[2])) & 255)
const sub = nc.subscribe("star.ping." + process.argv[2], { max: 1 })
nc.publish("star.ping." + process.argv[2], data)
for await (const m of sub) console.log(JSON.stringify({ ok: Buffer.from(m.data).equals(Buffer.from(data)) }))
await nc.close()
`

describe("a shaped star of network namespaces", () => {
  it.skipIf(unavailable !== undefined)(
    `joins every rank to the hub's nats-server over its own link, shaped both ways, and removes it all${unavailable ? ` (skipped: ${unavailable})` : ""}`,
    async () => {
      star = createStar(3, "200mbit")
      dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-star-"))
      const listen = `${star.hubIp}:4222`
      server = await startNatsIn(star.hub, dir, "gw-star-hub", `nats://${listen}`, [`listen: "${listen}"`])
      const outs = await Promise.all(
        star.ranks.map((r, i) => runIn(r.ns, [process.execPath, "--input-type=module", "-e", PING, server!.url, String(i)], 30_000))
      )
      for (const out of outs) expect(JSON.parse(out.trim())).toEqual({ ok: true })
      // every link shaped at the rate, on the rank's end (what it sends) and the hub's (what it receives)
      const hubQdiscs = nsExec(star.hub, ["tc", "qdisc", "show"])
      for (const r of star.ranks) {
        expect(nsExec(r.ns, ["tc", "qdisc", "show", "dev", r.dev])).toMatch(/tbf .*rate 200Mbit/)
        const peer = r.dev.replace(/^gwr/, "gwh")
        expect(hubQdiscs).toMatch(new RegExp(`tbf [0-9a-f]+: dev ${peer} root .*rate 200Mbit`))
        // the only routes a rank has are its link's subnet (and loopback): nothing outside the star
        expect(nsExec(r.ns, ["ip", "route", "show"]).trim().split("\n")).toEqual([expect.stringMatching(/^10\.232\.\d+\.0\/24 dev /)])
      }
      await server.stop()
      server = undefined
      const names = [star.hub, ...star.ranks.map((r) => r.ns)]
      star.remove()
      star = undefined
      const left = sh("ip", ["netns", "list"])
      for (const ns of names) expect(left).not.toContain(ns)
    },
    60_000
  )
})
