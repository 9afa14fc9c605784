// A live page in headless Chromium, driven over the DevTools protocol (Node's own WebSocket, no
// library): for pages that keep changing (the dashboard), where --dump-dom's one-shot DOM is not
// enough. Same Chromium and flags as chromium.ts; its whole process group is killed on close()
// and on every failure to start, and every wait has a deadline.
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { FLAGS, findChromium } from "./chromium.ts"

export interface LivePage {
  /** The value of a JavaScript expression in the page (awaited when it is a promise). */
  evaluate<T>(expression: string): Promise<T>
  /** Polls `expression` until it is truthy; its value, or an error naming `what` after `timeoutMs`. */
  waitFor<T>(expression: string, what: string, timeoutMs?: number): Promise<T>
  /** A PNG of the whole page. */
  screenshot(file: string): Promise<void>
  /** What the page printed to its console, and its uncaught errors. */
  readonly console: ReadonlyArray<string>
  close(): Promise<void>
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

export const openLivePage = async (url: string, options: { readonly width?: number; readonly height?: number; readonly startTimeoutMs?: number } = {}): Promise<LivePage> => {
  const bin = findChromium()
  if (!bin) throw new Error("chromium is not installed: apt-get install -y chromium (.ci/run installs it)")
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "gw-cdp-"))
  const child: ChildProcess = spawn(
    bin,
    [...FLAGS, `--user-data-dir=${profile}`, "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", `--window-size=${options.width ?? 1400},${options.height ?? 1000}`, "about:blank"],
    { detached: true, stdio: ["ignore", "ignore", "pipe"] }
  )
  const killGroup = (): void => {
    try {
      if (child.pid) process.kill(-child.pid, "SIGKILL")
    } catch {
      // gone already
    }
  }
  let socket: WebSocket | undefined
  const cleanup = (): void => {
    try {
      socket?.close()
    } catch {
      // closed
    }
    killGroup()
    fs.rmSync(profile, { recursive: true, force: true })
  }
  try {
    const wsUrl = await new Promise<string>((resolve, reject) => {
      let err = ""
      const timer = setTimeout(() => reject(new Error(`chromium did not open its DevTools port within ${options.startTimeoutMs ?? 30_000} ms: ${err.slice(-1000)}`)), options.startTimeoutMs ?? 30_000)
      child.stderr!.on("data", (d: Buffer) => {
        err += d.toString()
        const m = /DevTools listening on (ws:\/\/\S+)/.exec(err)
        if (m) {
          clearTimeout(timer)
          resolve(m[1])
        }
      })
      child.on("exit", (code) => {
        clearTimeout(timer)
        reject(new Error(`chromium exited (${code}) before opening its DevTools port: ${err.slice(-1000)}`))
      })
    })
    const ws = new WebSocket(wsUrl)
    socket = ws
    await new Promise<void>((resolve, reject) => {
      ws.onopen = () => resolve()
      ws.onerror = () => reject(new Error(`cannot connect to chromium's DevTools at ${wsUrl}`))
    })
    let id = 0
    const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>()
    const consoleLines: string[] = []
    ws.onmessage = (ev) => {
      const msg = JSON.parse(String(ev.data)) as { id?: number; result?: unknown; error?: { message: string }; method?: string; params?: Record<string, unknown> }
      if (msg.id !== undefined) {
        const p = pending.get(msg.id)
        pending.delete(msg.id)
        if (msg.error) p?.reject(new Error(msg.error.message))
        else p?.resolve(msg.result)
      } else if (msg.method === "Runtime.consoleAPICalled") {
        const args = (msg.params?.args as Array<{ value?: unknown; description?: string }>) ?? []
        consoleLines.push(args.map((a) => String(a.value ?? a.description ?? "")).join(" "))
      } else if (msg.method === "Runtime.exceptionThrown") {
        consoleLines.push(`uncaught: ${JSON.stringify((msg.params?.exceptionDetails as { exception?: { description?: string } })?.exception?.description ?? msg.params)}`)
      }
    }
    const send = <T>(method: string, params: Record<string, unknown> = {}, sessionId?: string, timeoutMs = 20_000): Promise<T> =>
      new Promise<T>((resolve, reject) => {
        const n = ++id
        const timer = setTimeout(() => {
          pending.delete(n)
          reject(new Error(`DevTools ${method} had no answer within ${timeoutMs} ms`))
        }, timeoutMs)
        pending.set(n, {
          resolve: (v) => {
            clearTimeout(timer)
            resolve(v as T)
          },
          reject: (e) => {
            clearTimeout(timer)
            reject(e)
          }
        })
        ws.send(JSON.stringify({ id: n, method, params, ...(sessionId ? { sessionId } : {}) }))
      })
    const { targetId } = await send<{ targetId: string }>("Target.createTarget", { url: "about:blank" })
    const { sessionId } = await send<{ sessionId: string }>("Target.attachToTarget", { targetId, flatten: true })
    await send("Runtime.enable", {}, sessionId)
    await send("Page.enable", {}, sessionId)
    await send("Page.navigate", { url }, sessionId)
    const evaluate = async <T>(expression: string): Promise<T> => {
      const r = await send<{ result: { value?: unknown }; exceptionDetails?: { text: string; exception?: { description?: string } } }>(
        "Runtime.evaluate",
        { expression, returnByValue: true, awaitPromise: true },
        sessionId
      )
      if (r.exceptionDetails) throw new Error(`in the page: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`)
      return r.result.value as T
    }
    return {
      evaluate,
      waitFor: async <T>(expression: string, what: string, timeoutMs = 30_000): Promise<T> => {
        const deadline = Date.now() + timeoutMs
        let last: unknown
        for (;;) {
          try {
            last = await evaluate<unknown>(expression)
            if (last) return last as T
          } catch (e) {
            last = e
          }
          if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms for ${what}; last: ${String(last)}; page console: ${consoleLines.slice(-10).join(" | ")}`)
          await sleep(200)
        }
      },
      screenshot: async (file) => {
        const m = await send<{ cssContentSize: { width: number; height: number } }>("Page.getLayoutMetrics", {}, sessionId)
        const { data } = await send<{ data: string }>(
          "Page.captureScreenshot",
          { format: "png", captureBeyondViewport: true, clip: { x: 0, y: 0, width: m.cssContentSize.width, height: m.cssContentSize.height, scale: 1 } },
          sessionId,
          60_000
        )
        fs.writeFileSync(file, Buffer.from(data, "base64"))
      },
      console: consoleLines,
      close: async () => {
        cleanup()
        await sleep(50)
      }
    }
  } catch (e) {
    cleanup()
    throw e
  }
}
