// Ctrl-C on the driver stops every worker and the embedded nats-server: no orphans.
import { afterAll, describe, expect, it } from "vitest"
import { spawn, execFileSync } from "node:child_process"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** Every process below `root` (children, grandchildren...). */
const descendants = (root: number): number[] => {
  const rows = execFileSync("ps", ["-eo", "pid=,ppid="], { encoding: "utf8" })
    .trim()
    .split("\n")
    .map((l) => l.trim().split(/\s+/).map(Number))
  const out: number[] = []
  const walk = (p: number) => {
    for (const [pid, ppid] of rows) if (ppid === p) (out.push(pid), walk(pid))
  }
  walk(root)
  return out
}

const started: number[] = []
afterAll(() => {
  for (const pid of started) if (alive(pid)) process.kill(pid, "SIGKILL")
})

describe("driver interrupt", () => {
  it("SIGINT on the driver kills every worker and the nats-server it started", async () => {
    const storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-int-"))
    const driver = spawn(process.execPath, ["examples/digits/main.ts", "--workers", "2", "--epochs", "500", "--storage", storage, "--name", "interrupted"], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, CI: "true" }
    })
    started.push(driver.pid!)
    let out = ""
    driver.stdout!.on("data", (d) => (out += d))
    driver.stderr!.on("data", (d) => (out += d))
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => driver.on("exit", (code, signal) => resolve({ code, signal })))
    const deadline = Date.now() + 60_000
    while (!/report 0:/.test(out) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
    expect(out).toMatch(/report 0:/)
    const children = descendants(driver.pid!)
    started.push(...children)
    // nats-server (through its guardian) and the two worker processes at least.
    expect(children.length).toBeGreaterThanOrEqual(3)
    driver.kill("SIGINT")
    const how = await Promise.race([exited, new Promise<"timeout">((r) => setTimeout(() => r("timeout"), 30_000))])
    expect(how).not.toBe("timeout")
    const until = Date.now() + 10_000
    while (children.some(alive) && Date.now() < until) await new Promise((r) => setTimeout(r, 100))
    expect(children.filter(alive)).toEqual([])
    // The run's files say it was interrupted, not that it failed: the controller's last state and the summary.
    const runDir = path.join(storage, "interrupted")
    const states = (await fs.readFile(path.join(runDir, "events.jsonl"), "utf8"))
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map((l) => JSON.parse(l) as { type: string; to?: string })
      .filter((e) => e.type === "state")
    expect(states.at(-1)?.to).toBe("interrupted")
    expect(JSON.parse(await fs.readFile(path.join(runDir, "summary.json"), "utf8")).state).toBe("interrupted")
    await fs.rm(storage, { recursive: true, force: true })
  })
})
