// The dashboard's HTTP server (node:http, nothing to build): the page at /, its data as JSON
// (/api/state) and as server-sent events (/api/events: everything at connect, then every change
// the live cluster view sees), a job's log tail (/api/jobs/<job>/logs), and Prometheus metrics at
// /metrics. Read-only: nothing it serves changes the cluster. Loopback by default; a token is
// required when the cluster has credentials, when it listens beyond loopback, or when one is
// given: then every data endpoint answers 401 without it (Authorization: Bearer, or ?token= for
// EventSource, which cannot set headers), and the page only asks for it. On loopback the Host
// header must name a loopback address, so a web page elsewhere cannot reach it by DNS rebinding.
import * as http from "node:http"
import { randomBytes, timingSafeEqual } from "node:crypto"
import type { AddressInfo } from "node:net"
import type { NatsConnection } from "@nats-io/nats-core"
import * as Schema from "effect/Schema"
import * as settings from "../../../core/settings.ts"
import { renderDashboardPage } from "../common/observe/dashboard-page.ts"
import { LiveCluster, type LiveEvent } from "./live-cluster.ts"
import { clusterRegistry } from "./metrics.ts"

/** Ray's dashboard port, so muscle memory works. */
export const DEFAULT_DASHBOARD_PORT = 8265

/** The dashboard's server could not listen (port taken, address not on this machine, no permission). */
export class DashboardUnavailable extends Schema.TaggedError<DashboardUnavailable>()("DashboardUnavailable", {
  host: Schema.String,
  port: Schema.Number,
  reason: Schema.String
}) {
  override get message(): string {
    return `the dashboard cannot listen on ${this.host}:${this.port}: ${this.reason}; pick another port (--port N, or 0 for any free one; runConfig.dashboard: { port })`
  }
}

export interface DashboardOptions {
  readonly nc: NatsConnection
  readonly cluster: string
  /** The NATS servers, as shown on the page (never with credentials). */
  readonly address: string
  /** Default 127.0.0.1. */
  readonly host?: string
  /** Default 8265; 0 takes any free port. */
  readonly port?: number
  /** The token to require (default $GRADWIRE_DASHBOARD_TOKEN); one is made up when a token is required and none is given. */
  readonly token?: string
  /** Require a token (the cluster has credentials). */
  readonly requireToken?: boolean
}

export interface Dashboard {
  /** The page's address; with a token, in the fragment (#token=...), which browsers never send to servers. */
  readonly url: string
  /** The server's base address (http://host:port). */
  readonly baseUrl: string
  readonly port: number
  readonly token: string | undefined
  readonly live: LiveCluster
  close(): Promise<void>
}

const LOOPBACK = new Set(["127.0.0.1", "::1", "localhost"])
export const isLoopback = (host: string): boolean => LOOPBACK.has(host) || /^127\./.test(host)

/** A client this far behind on events is dropped (it reconnects and starts from the whole state). */
const MAX_BUFFERED_BYTES = 16 * 1024 * 1024

const sameToken = (given: string | undefined, want: string): boolean => {
  if (given === undefined) return false
  const a = Buffer.from(given)
  const b = Buffer.from(want)
  return a.length === b.length && timingSafeEqual(a, b)
}

export const startDashboard = async (o: DashboardOptions): Promise<Dashboard> => {
  const host = o.host ?? "127.0.0.1"
  const loopback = isLoopback(host)
  const token = o.token ?? settings.dashboardToken.read() ?? (o.requireToken || !loopback ? randomBytes(24).toString("base64url") : undefined)
  const live = await LiveCluster.open({ nc: o.nc, cluster: o.cluster, address: o.address })
  const clients = new Set<http.ServerResponse>()
  let port = o.port ?? DEFAULT_DASHBOARD_PORT
  const page = renderDashboardPage({ cluster: o.cluster, tokenRequired: token !== undefined })
  const metrics = clusterRegistry(live)

  const allowedHost = (h: string | undefined): boolean => {
    if (!loopback) return true
    if (!h) return false
    const name = h.replace(/:\d+$/, "").replace(/^\[(.*)\]$/, "$1")
    return isLoopback(name)
  }
  const authorized = (req: http.IncomingMessage, url: URL): boolean => {
    if (token === undefined) return true
    const bearer = /^Bearer\s+(.+)$/i.exec(req.headers.authorization ?? "")?.[1]
    return sameToken(bearer ?? url.searchParams.get("token") ?? undefined, token)
  }
  const send = (res: http.ServerResponse, status: number, type: string, body: string): void => {
    res.writeHead(status, {
      "Content-Type": type,
      "Cache-Control": "no-store",
      "X-Content-Type-Options": "nosniff",
      "X-Frame-Options": "DENY",
      "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
    })
    res.end(body)
  }
  const json = (res: http.ServerResponse, value: unknown): void => send(res, 200, "application/json; charset=utf-8", JSON.stringify(value))

  const onEvents = (res: http.ServerResponse): void => {
    res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", Connection: "keep-alive", "X-Content-Type-Options": "nosniff" })
    const write = (event: string, data: unknown): void => {
      if (res.writableLength > MAX_BUFFERED_BYTES) {
        res.destroy()
        return
      }
      res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`)
    }
    write("init", live.state())
    const off = live.on((e: LiveEvent) => write(e.type, e))
    const beat = setInterval(() => res.write(": keep-alive\n\n"), 15_000)
    clients.add(res)
    res.on("close", () => {
      off()
      clearInterval(beat)
      clients.delete(res)
    })
  }

  const server = http.createServer((req, res) => {
    try {
      const url = new URL(req.url ?? "/", "http://dashboard")
      if (!allowedHost(req.headers.host)) return send(res, 403, "text/plain; charset=utf-8", "this dashboard answers only on a loopback address\n")
      if (req.method !== "GET" && req.method !== "HEAD") return send(res, 405, "text/plain; charset=utf-8", "read-only: GET only\n")
      if (url.pathname === "/" || url.pathname === "/index.html") return send(res, 200, "text/html; charset=utf-8", page)
      const isData = url.pathname === "/metrics" || url.pathname.startsWith("/api/")
      if (!isData) return send(res, 404, "text/plain; charset=utf-8", "not found\n")
      if (!authorized(req, url)) {
        res.setHeader("WWW-Authenticate", 'Bearer realm="gradwire dashboard"')
        return send(res, 401, "text/plain; charset=utf-8", "a token is required: the one `gradwire dashboard` printed (Authorization: Bearer TOKEN)\n")
      }
      if (url.pathname === "/metrics") {
        metrics.metrics().then(
          (text) => send(res, 200, metrics.contentType, text),
          (e: unknown) => send(res, 500, "text/plain; charset=utf-8", `${e instanceof Error ? e.message : String(e)}\n`)
        )
        return
      }
      if (url.pathname === "/api/state") return json(res, live.state())
      if (url.pathname === "/api/events") return onEvents(res)
      const logs = /^\/api\/jobs\/([A-Za-z0-9_-]+)\/logs$/.exec(url.pathname)
      if (logs) {
        const v = live.jobs.get(logs[1])
        if (!v) return send(res, 404, "text/plain; charset=utf-8", `no job ${logs[1]}\n`)
        const rank = url.searchParams.get("rank")
        const lines = Math.min(5_000, Math.max(1, Number(url.searchParams.get("lines") ?? 500) || 500))
        return json(res, { lines: v.logs.filter((l) => rank === null || l.rank === Number(rank)).slice(-lines) })
      }
      return send(res, 404, "text/plain; charset=utf-8", "not found\n")
    } catch (e) {
      send(res, 500, "text/plain; charset=utf-8", `${e instanceof Error ? e.message : String(e)}\n`)
    }
  })
  try {
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject)
      server.listen(port, host, () => {
        server.off("error", reject)
        resolve()
      })
    })
  } catch (e) {
    live.close()
    const err = e as NodeJS.ErrnoException
    throw new DashboardUnavailable({ host, port, reason: err.code === "EADDRINUSE" ? "the port is in use" : err.code === "EADDRNOTAVAIL" ? "no such address here" : err.message })
  }
  port = (server.address() as AddressInfo).port
  const shownHost = host.includes(":") ? `[${host}]` : host === "0.0.0.0" ? "127.0.0.1" : host
  const baseUrl = `http://${shownHost}:${port}`
  return {
    url: token ? `${baseUrl}/#token=${token}` : `${baseUrl}/`,
    baseUrl,
    port,
    token,
    live,
    close: async () => {
      live.close()
      for (const c of clients) c.destroy()
      const closed = new Promise<void>((resolve) => server.close(() => resolve()))
      server.closeAllConnections()
      await closed
    }
  }
}
