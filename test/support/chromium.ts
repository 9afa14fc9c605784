// Headless Chromium for tests that render HTML: Debian's `chromium` with no sandbox (CI runs as
// root), no GPU and every background network feature off, a fresh profile per call, and the whole
// process group killed afterwards (Chromium forks zygote and renderer processes) even on timeout.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"

export const findChromium = (): string | undefined => {
  for (const c of [process.env.CHROMIUM_BIN, "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]) {
    if (c && fs.existsSync(c)) return c
  }
  return undefined
}

export const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-dev-shm-usage",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-extensions",
  "--disable-default-apps",
  "--no-first-run",
  "--no-default-browser-check",
  "--metrics-recording-only",
  "--mute-audio"
]

/** Runs Chromium on a file with extra flags; resolves with stdout once it exits (killed after timeoutMs). */
export const runChromium = async (file: string, extra: ReadonlyArray<string>, timeoutMs = 60_000): Promise<string> => {
  const bin = findChromium()
  if (!bin) throw new Error("chromium is not installed: apt-get install -y chromium (.ci/run installs it)")
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "gw-chromium-"))
  const child = spawn(bin, [...FLAGS, `--user-data-dir=${profile}`, ...extra, `file://${path.resolve(file)}`], {
    detached: true,
    stdio: ["ignore", "pipe", "pipe"]
  })
  let out = ""
  let err = ""
  child.stdout.on("data", (d: Buffer) => (out += d.toString()))
  child.stderr.on("data", (d: Buffer) => (err += d.toString()))
  const killGroup = (): void => {
    try {
      if (child.pid) process.kill(-child.pid, "SIGKILL")
    } catch {
      // already gone
    }
  }
  const timer = setTimeout(killGroup, timeoutMs)
  try {
    const code = await new Promise<number | null>((resolve, reject) => {
      child.on("error", reject)
      child.on("close", (c) => resolve(c))
    })
    if (code !== 0) throw new Error(`chromium exited ${code}: ${err.slice(-2000)}`)
    return out
  } finally {
    clearTimeout(timer)
    killGroup()
    fs.rmSync(profile, { recursive: true, force: true })
  }
}

/** The DOM after scripts ran. */
export const dumpDom = (file: string): Promise<string> => runChromium(file, ["--virtual-time-budget=5000", "--dump-dom"])

/** A PNG screenshot of the page. */
export const screenshot = async (file: string, png: string, size = "1400,1000"): Promise<void> => {
  await runChromium(file, ["--virtual-time-budget=5000", "--hide-scrollbars", `--window-size=${size}`, `--screenshot=${png}`])
}
