// The live dashboard, /metrics, `gradwire jobs` and `gradwire logs`, and the run directory on
// failure and Ctrl-C. A real training run (the digits MLP on 3 workers of an embedded cluster,
// runConfig.dashboard on a free loopback port) is watched in headless Chromium over the DevTools
// protocol: the page loads while it trains, a loss curve gains points, a worker killed with
// kill -9 shows as a restart, /metrics parses as Prometheus text and counts the restart, and the
// CLI lists the job and prints its workers' output. /metrics of a dashboard with a real node agent
// and a job passes Prometheus' own linter (`promtool check metrics`). A cluster with credentials
// gets a token: the page asks for it and every data endpoint refuses without it. Every process
// started here is stopped, also on failure; every wait has a deadline.
import { spawn, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as http from "node:http"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, describe, expect, it } from "vitest"
import { Trainer, loadDigits, trainTestSplit, type Result } from "../index.ts"
import { freePort } from "../core/nats-server.ts"
import { startDashboard } from "../actors/train/dashboard/server.ts"
import { resolveTrainerOptions } from "../actors/train/driver/options.ts"
import { encodeJson, type JobSnapshot } from "../actors/train/common/job-telemetry.ts"
import { clusterSubjects } from "../core/subjects.ts"
import { readTfRecords, decodeEvent } from "../actors/train/common/observe/tensorboard.ts"
import { JobMonitor, type JobFacts } from "../actors/train/driver/job-monitor.ts"
import { fetchJobLogs, followJobLogs, formatJobsTable, listJobs, lossOf } from "../actors/train/dashboard/jobs-client.ts"
import { openKvBucket } from "../core/jetstream-kv.ts"
import { encodeMessage } from "../core/wire.ts"
import { natsFixtures } from "./support/nats.ts"
import { startHeadAgent } from "./support/head-agent.ts"
import { openLivePage, type LivePage } from "./support/cdp.ts"
import { alive, runScript } from "./support/run-script.ts"
import { plainFile } from "../core/data/plain-file.ts"

const ROOT = fileURLToPath(new URL("../", import.meta.url))
const CLI = path.join(ROOT, "bin", "gradwire.js")
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-dashboard-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

/** Polls `probe` until it returns a value, or fails naming `what` after `timeoutMs`. */
const until = async <A>(what: string, probe: () => Promise<A | undefined> | A | undefined, timeoutMs = 60_000): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await probe()
    if (v !== undefined) return v
    if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms for ${what}`)
    await sleep(200)
  }
}

interface Family {
  type?: string
  help?: string
  samples: Array<{ labels: Record<string, string>; value: number }>
}

/** A histogram's or summary's samples carry their family's name with one of these suffixes. */
const COMPOSITE_SUFFIX = /_(bucket|sum|count)$/

/** A Go float as Prometheus reads it (strconv.ParseFloat: NaN and Inf in any case). */
const goFloat = (s: string): number => {
  if (/^nan$/i.test(s)) return NaN
  if (/^[+-]?inf(inity)?$/i.test(s)) return s.startsWith("-") ? -Infinity : Infinity
  const v = Number(s)
  if (Number.isNaN(v)) throw new Error(`bad value ${s}`)
  return v
}

/** A strict reader of Prometheus' text format 0.0.4: anything else on a line throws (empty lines are allowed). */
const parseExposition = (text: string): Map<string, Family> => {
  const families = new Map<string, Family>()
  const fam = (name: string): Family => {
    let f = families.get(name)
    if (!f) families.set(name, (f = { samples: [] }))
    return f
  }
  expect(text.endsWith("\n")).toBe(true)
  for (const line of text.slice(0, -1).split("\n")) {
    if (line === "") continue
    let m = /^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$/.exec(line)
    if (m) {
      fam(m[1]).help = m[2]
      continue
    }
    m = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/.exec(line)
    if (m) {
      expect(fam(m[1]).samples, `TYPE of ${m[1]} after its samples`).toHaveLength(0)
      fam(m[1]).type = m[2]
      continue
    }
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (!m) throw new Error(`not Prometheus text: ${JSON.stringify(line)}`)
    const labels: Record<string, string> = {}
    const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(?:,|$)/y
    const raw = m[2] ?? ""
    while (re.lastIndex < raw.length) {
      const l = re.exec(raw)
      if (!l) throw new Error(`bad labels: ${JSON.stringify(raw)}`)
      labels[l[1]] = l[2].replace(/\\(["\\n])/g, (_, c: string) => (c === "n" ? "\n" : c))
    }
    const value = goFloat(m[3])
    // A histogram's _bucket, _sum and _count samples belong to its family.
    const base = m[1].replace(COMPOSITE_SUFFIX, "")
    const composite = base !== m[1] && /^(histogram|summary)$/.test(families.get(base)?.type ?? "")
    const f = fam(composite ? base : m[1])
    expect(f.type, `${m[1]} has samples but no TYPE`).toBeDefined()
    f.samples.push({ labels, value })
  }
  // What promtool's linter says of names, checked on every exposition read here.
  for (const [name, f] of families) {
    if (f.type === "counter") expect(name, `counter ${name}`).toMatch(/_total$/)
    else expect(name, `${f.type} ${name} is named like a counter`).not.toMatch(/_total$/)
  }
  return families
}

const value = (families: Map<string, Family>, name: string, labels: Record<string, string>): number | undefined =>
  families.get(name)?.samples.find((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value

/** Prometheus' promtool, where Debian's package and most installs put it, else undefined. */
const findPromtool = (): string | undefined =>
  [...(process.env.PATH ?? "").split(path.delimiter).filter(Boolean), "/usr/bin", "/usr/local/bin"]
    .map((d) => path.join(d, "promtool"))
    .find((p) => {
      try {
        fs.accessSync(p, fs.constants.X_OK)
        return true
      } catch {
        return false
      }
    })

/** GET with an optional header; the status and body (an event stream is read for ~300 ms). */
const get = (url: string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> =>
  new Promise((resolve, reject) => {
    const req = http.get(url, { headers }, (res) => {
      let body = ""
      res.on("data", (d: Buffer) => (body += d.toString()))
      const done = (): void => resolve({ status: res.statusCode ?? 0, body })
      res.on("end", done)
      if (/event-stream/.test(String(res.headers["content-type"]))) {
        setTimeout(() => {
          req.destroy()
          done()
        }, 300)
      }
    })
    req.on("error", reject)
    req.setTimeout(10_000, () => req.destroy(new Error(`GET ${url}: no answer within 10 s`)))
  })

/** A long-running CLI command (gradwire dashboard) as its own process: its output so far, and a stop that always ends it. */
const startCli = (args: ReadonlyArray<string>) => {
  const child = spawn(process.execPath, [CLI, ...args], { detached: true, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, CI: "true" } })
  let output = ""
  child.stdout.on("data", (d: Buffer) => (output += d.toString()))
  child.stderr.on("data", (d: Buffer) => (output += d.toString()))
  const exited = new Promise<number | null>((resolve) => child.on("close", (code) => resolve(code)))
  return {
    output: () => output,
    exited,
    stop: async (): Promise<number | null> => {
      child.kill("SIGINT")
      const timer = setTimeout(() => {
        try {
          if (child.pid) process.kill(-child.pid, "SIGKILL")
        } catch {
          // gone
        }
      }, 10_000)
      const code = await exited
      clearTimeout(timer)
      return code
    }
  }
}

describe("dashboard", () => {
  const fixtures = natsFixtures("each")

  it(
    "shows a real run live: a curve gains points, a killed worker shows as a restart, /metrics parses; jobs and logs list it",
    { timeout: 180_000 },
    async () => {
      const { train } = trainTestSplit(await loadDigits(), 0.2, 3)
      const port = await freePort()
      const base = `http://127.0.0.1:${port}`
      const stopFile = path.join(dir, "stop-live")
      const storagePath = path.join(dir, "results")
      let settled: Result | Error | undefined
      const fit = new Trainer({
        trainLoopPerWorker: { module: new URL("./support/dashboard-loop.ts", import.meta.url).href, export: "dashboardLoop" },
        trainLoopConfig: { stopFile, maxEpochs: 300, minEpochMs: 400 },
        scalingConfig: { numWorkers: 3 },
        runConfig: {
          name: "live",
          storagePath,
          progress: false,
          dashboard: { port },
          failureConfig: { maxFailures: 2, recoverFrom: "checkpoint" }
        },
        datasets: { train }
      }).fit()
      fit.then(
        (r) => (settled = r),
        (e: Error) => (settled = e)
      )
      const running = (): void => {
        if (settled !== undefined) throw new Error(`the run ended early: ${settled instanceof Error ? settled.message : "finished"}`)
      }
      let page: LivePage | undefined
      try {
        // The dashboard answers once the cluster is up; the job shows once its workers report progress.
        const state = await until("a job with 3 ranks on the dashboard", async () => {
          running()
          const r = await get(`${base}/api/state`).catch(() => undefined)
          if (r?.status !== 200) return undefined
          const s = JSON.parse(r.body) as { address: string; jobs: Array<{ snapshot: JobSnapshot }> }
          const j = s.jobs[0]?.snapshot
          return j && j.ranks.length === 3 && j.ranks.every((x) => x.pid !== undefined) ? { address: s.address, job: j } : undefined
        }, 90_000)
        expect(state.job.name).toBe("live")
        expect(state.job.state).toBe("running")

        page = await openLivePage(`${base}/`)
        await page.waitFor("document.body.dataset.ready === '1'", "the page's first state")
        const points = `(() => { const p = document.querySelector('#c-loss .curve[data-series="rank 0"]'); return p ? Number(p.dataset.points) : 0 })()`
        const first = await page.waitFor<number>(`${points} >= 2 && ${points}`, "rank 0's loss curve")
        const later = await page.waitFor<number>(`${points} > ${first} && ${points}`, "rank 0's loss curve to gain points")
        expect(later).toBeGreaterThan(first)
        expect(await page.evaluate<string>("document.getElementById('job').dataset.state")).toBe("running")
        expect(await page.evaluate<string>("document.getElementById('nodes').textContent")).toContain("alive")
        running()

        // Prometheus text, and what it says of the run.
        const before = parseExposition((await get(`${base}/metrics`)).body)
        const jobLabels = { job: state.job.job, name: "live" }
        expect(value(before, "gradwire_job_restarts_total", jobLabels)).toBe(0)
        expect(value(before, "gradwire_job_world_size", jobLabels)).toBe(3)
        expect(value(before, "gradwire_job_up", jobLabels)).toBe(1)
        expect(value(before, "gradwire_rank_steps_total", { ...jobLabels, rank: "0" })).toBeGreaterThan(0)
        expect(value(before, "gradwire_rank_samples_total", { ...jobLabels, rank: "2" })).toBeGreaterThan(0)
        expect(value(before, "gradwire_rank_collective_bytes_total", { ...jobLabels, rank: "1", direction: "sent" })).toBeGreaterThan(0)
        expect(value(before, "gradwire_rank_step_seconds", { ...jobLabels, rank: "0", part: "communication" })).toBeGreaterThanOrEqual(0)
        expect(value(before, "gradwire_node_up", { node: "local" })).toBe(1)
        expect(value(before, "gradwire_node_resource_capacity", { node: "local", resource: "CPU" })).toBeGreaterThanOrEqual(3)

        // The CLI, from another process, over the bus: the embedded server admits only the run's
        // nkey, whose seed file the page's address names.
        const reach = /^(\S+) \(--nkey (\S+)\)$/.exec(state.address)
        expect(reach, state.address).not.toBeNull()
        const cluster = ["--address", reach![1], "--nkey", reach![2], "--cluster", "local"]
        const jobsRun = await runScript(CLI, ["jobs", "--json", ...cluster], { timeoutMs: 30_000 })
        expect(jobsRun.code, jobsRun.output).toBe(0)
        const listed = JSON.parse(jobsRun.output) as Array<JobSnapshot & { live: boolean }>
        expect(listed.find((j) => j.job === state.job.job)).toMatchObject({ name: "live", state: "running", live: true, worldSize: 3 })
        const table = await runScript(CLI, ["jobs", ...cluster], { timeoutMs: 30_000 })
        expect(table.output).toMatch(new RegExp(`${state.job.job}\\s+live\\s+running\\s+0\\s+3\\s+0`))
        const logsRun = await runScript(CLI, ["logs", "live", "--rank", "1", "--json", ...cluster], { timeoutMs: 30_000 })
        expect(logsRun.code, logsRun.output).toBe(0)
        const lines = logsRun.output.trim().split("\n").map((l) => JSON.parse(l) as { rank: number; line: string; node: string })
        expect(lines.length).toBeGreaterThan(0)
        expect(lines.every((l) => l.rank === 1 && l.node === "local")).toBe(true)
        expect(lines.some((l) => /^rank 1\/3: \d+ rows/.test(l.line))).toBe(true)
        const follow = await runScript(CLI, ["logs", state.job.job, "--rank", "0", "--follow", "--tail", "1", ...cluster], {
          timeoutMs: 30_000,
          // A line streamed after the tail: an epoch rank 0 finishes from now on.
          onOutput: (all, kill) => void ((all.match(/\(worker rank=0 [^)]*\) rank 0: epoch/g) ?? []).length >= 2 && kill("SIGINT"))
        })
        expect(follow.output).toMatch(/\(worker rank=0 pid=\d+ node=local\) rank 0: epoch \d+ loss/)
        // `gradwire stack`: rank 1's main thread, as its beat thread took it through the inspector
        const stackRun = await runScript(CLI, ["stack", "live", "--rank", "1", "--json", ...cluster], { timeoutMs: 30_000 })
        expect(stackRun.code, stackRun.output).toBe(0)
        const [st] = JSON.parse(stackRun.output) as Array<{ rank: number; node: string; pid: number; frames?: string[]; idle?: boolean; where?: string }>
        expect(st).toMatchObject({ rank: 1, node: "local", pid: state.job.ranks.find((r) => r.rank === 1)!.pid })
        // (computing: its frames; between steps: idle, with where its loop is)
        if (st!.idle) {
          expect(st!.frames).toBeUndefined()
          expect(st!.where, stackRun.output).toMatch(/^(in dp\.fit\(\), epoch \d+ step \d+ of \d+|in report\(\) call \d+|in training step \d+|outside gradwire's calls)/)
        } else {
          expect(st!.frames!.length, stackRun.output).toBeGreaterThan(0)
          for (const f of st!.frames!) expect(f).toMatch(/^\S.* \(.*:\d+:\d+\)$/)
        }
        const noJob = await runScript(CLI, ["stack", "no-such-job", ...cluster], { timeoutMs: 30_000 })
        expect(noJob.code).not.toBe(0)
        expect(noJob.output).toMatch(/no job "no-such-job" in cluster "local"/)

        // `gradwire dashboard` in a process of its own: the running job with its curves so far (from its driver).
        const cliPort = await freePort()
        const cli = startCli(["dashboard", "--port", String(cliPort), ...cluster])
        try {
          const url = await until("gradwire dashboard's URL", () => /dashboard of cluster "local" \(.*\): (http:\S+)/.exec(cli.output())?.[1], 30_000)
          // Given the run's nkey, it serves a cluster with credentials: it requires a token, which its URL carries.
          const token = new RegExp(`^http://127\\.0\\.0\\.1:${cliPort}/#token=(\\S+)$`).exec(url)?.[1]
          expect(token, url).toBeDefined()
          const auth = { Authorization: `Bearer ${token}` }
          const seen = await until("the job on the separate dashboard", async () => {
            const r = await get(`http://127.0.0.1:${cliPort}/api/state`, auth)
            const s = JSON.parse(r.body) as { jobs: Array<{ snapshot: JobSnapshot; points: unknown[]; reports: unknown[]; logs: unknown[] }> }
            const j = s.jobs.find((x) => x.snapshot.job === state.job.job)
            return j && j.points.length > 0 && j.reports.length > 0 ? j : undefined
          }, 30_000)
          expect(seen.snapshot.state).toBe("running")
          expect(seen.logs.length).toBeGreaterThan(0)
          const m = parseExposition((await get(`http://127.0.0.1:${cliPort}/metrics`, auth)).body)
          expect(value(m, "gradwire_job_world_size", { job: state.job.job })).toBe(3)
        } finally {
          expect(await cli.stop()).toBe(0)
        }

        // kill -9 of rank 1's process (its pid, as the dashboard shows it): the page shows the restart.
        const victim = state.job.ranks.find((r) => r.rank === 1)!.pid!
        process.kill(victim, "SIGKILL")
        await page.waitFor("document.getElementById('job').dataset.restarts === '1'", "the restart on the page", 60_000)
        // The count moves first; the incident's line follows once the group is stopped.
        await page.waitFor("/rank 1 failed/.test(document.getElementById('incidents').textContent)", "the restart's line in the incidents", 30_000)
        await page.waitFor("document.querySelectorAll('#c-loss .marker[data-kind=restart]').length >= 1", "a restart marker on the loss curve")
        // Training goes on in the next attempt: rank 0's curve gains points again.
        const resumed = await page.evaluate<number>(points)
        await page.waitFor(`${points} > ${resumed}`, "rank 0's loss curve after the restart", 60_000)
        const after = parseExposition((await get(`${base}/metrics`)).body)
        expect(value(after, "gradwire_job_restarts_total", jobLabels)).toBe(1)
        expect(value(after, "gradwire_job_attempt", jobLabels)).toBe(1)
        expect(value(after, "gradwire_rank_steps_total", { ...jobLabels, rank: "0" })).toBeGreaterThan(value(before, "gradwire_rank_steps_total", { ...jobLabels, rank: "0" })!)
        if (process.env.GW_DASHBOARD_SCREENSHOT) await page.screenshot(process.env.GW_DASHBOARD_SCREENSHOT)
        expect(page.console.filter((l) => /uncaught/.test(l))).toEqual([])
      } finally {
        await page?.close()
        fs.writeFileSync(stopFile, "")
        await until("the run to end", () => settled, 60_000).catch(() => undefined)
      }
      const result = settled
      if (result instanceof Error) throw result
      expect(result!.restarts).toBe(1)
      // The run directory: the report, refreshed and final, with the restart; TensorBoard's scalars.
      const runDir = result!.path
      const html = fs.readFileSync(path.join(runDir, "report.html"), "utf8")
      expect(html).toContain("rank 1 failed")
      expect(JSON.parse(fs.readFileSync(path.join(runDir, "summary.json"), "utf8"))).toMatchObject({ state: "finished", restarts: 1 })
      const tb = fs.readdirSync(runDir).find((f) => f.startsWith("events.out.tfevents."))!
      const scalars = readTfRecords(new Uint8Array(fs.readFileSync(path.join(runDir, tb)))).flatMap((r) => {
        const e = decodeEvent(r)
        return e.scalars.map((s) => ({ ...s, step: e.step }))
      })
      // (steps are the run's report numbers: a round made again after the restart writes its step again)
      const lossSteps = new Set(scalars.filter((s) => s.tag === "loss").map((s) => s.step))
      expect([...lossSteps].sort((a, b) => a - b)).toEqual(result!.metricsHistory.map((_, i) => i))
    }
  )

  it("asks for a token on a cluster with credentials, and every data endpoint refuses without it", { timeout: 60_000 }, async () => {
    const server = await fixtures.server({ auth: { user: "gw", password: "s3cret-pass" } })
    const { nc } = await fixtures.connect(server.url, { user: "gw", pass: "s3cret-pass" })
    // A job as a driver would publish it, so the page has something to show once in.
    const job: JobSnapshot = {
      v: 1, job: "tok-abcdefgh", name: "tok", cluster: "secure", state: "running", startedAt: Date.now(), updatedAt: Date.now(), attempt: 0, worldSize: 1,
      minWorkers: 1, maxWorkers: 1, restarts: 0, countedFailures: 0, resizes: [], strategy: { strategy: "allreduce", algorithm: "ring", compression: "none", zeroStage: 0 },
      reports: 0, checkpoints: { count: 0 }, incidents: [], ranks: [], runDir: "/tmp/x", driver: { host: "h", pid: 1 }, address: "nats://127.0.0.1"
    }
    const query = nc.subscribe(clusterSubjects("secure").jobsQuery, { callback: (_e, m) => void m.respond(encodeJson({ ...job, updatedAt: Date.now() })) })
    const d = await startDashboard({ nc, cluster: "secure", address: server.url, port: 0, requireToken: true })
    let page: LivePage | undefined
    try {
      expect(d.token).toMatch(/^[A-Za-z0-9_-]{32}$/)
      expect(d.url).toBe(`${d.baseUrl}/#token=${d.token}`)
      for (const p of ["/api/state", "/api/events", "/metrics", "/api/jobs/tok-abcdefgh/logs"]) {
        const none = await get(`${d.baseUrl}${p}`)
        expect(none.status, p).toBe(401)
        expect(none.body).not.toContain("tok-abcdefgh")
        expect((await get(`${d.baseUrl}${p}`, { Authorization: "Bearer wrong-token-wrong-token-wrong-tok" })).status, p).toBe(401)
        expect((await get(`${d.baseUrl}${p}?token=${d.token}`)).status, p).toBe(200)
      }
      const ok = await get(`${d.baseUrl}/api/state`, { Authorization: `Bearer ${d.token}` })
      expect(ok.status).toBe(200)
      expect(ok.body).toContain("tok-abcdefgh")
      parseExposition((await get(`${d.baseUrl}/metrics`, { Authorization: `Bearer ${d.token}` })).body)
      // The page itself holds no data; a Host that is not loopback is turned away (DNS rebinding).
      const pageHtml = await get(`${d.baseUrl}/`)
      expect(pageHtml.status).toBe(200)
      expect(pageHtml.body).not.toContain("tok-abcdefgh")
      expect((await get(`${d.baseUrl}/api/state?token=${d.token}`, { Host: `evil.example:${d.port}` })).status).toBe(403)

      // In the browser: without the token it asks for it and shows nothing; with it, the job.
      page = await openLivePage(`${d.baseUrl}/`)
      await page.waitFor("!document.getElementById('login').hidden", "the token form")
      expect(await page.evaluate<string>("document.body.dataset.ready")).toBe("0")
      expect(await page.evaluate<boolean>("document.getElementById('main').hidden")).toBe(true)
      await page.evaluate(`(() => { document.getElementById('token').value = ${JSON.stringify(d.token)}; document.getElementById('login-form').requestSubmit(); return 1 })()`)
      await page.waitFor("document.body.dataset.ready === '1'", "the state after the token")
      await page.waitFor("document.getElementById('jobs').textContent.includes('tok-abcdefgh')", "the job in the table")
    } finally {
      await page?.close()
      query.unsubscribe()
      await d.close()
    }
  })

  it("serves /metrics that promtool check metrics passes without a warning, process metrics included", { timeout: 60_000 }, async () => {
    // Debian's prometheus package has it; the set-up script installs it with --test.
    const promtool = findPromtool()
    if (!promtool) throw new Error('promtool is missing (Prometheus\' linter, which checks /metrics here): run "bash scripts/setup.sh --test", which installs it')
    const server = await fixtures.server()
    const { nc } = await fixtures.connect(server.url)
    const agent = await startHeadAgent(server.url, "prom", "prom-agent")
    // A job as its driver would answer, with a name and a metric key that need escaping.
    const rank = (r: number) => ({
      rank: r, actor: `w0-${r}`, node: "prom-node", pid: 100 + r, attempt: 0, epoch: 1, step: 3, stepsPerEpoch: 10, loss: 0.5, samplesPerSec: 120.5,
      computeMs: 12, commMs: 3, waitMs: 1, steps: 13, samples: 416, computeMsTotal: 156, commMsTotal: 39, waitMsTotal: 13, bytesSent: 4096, bytesReceived: 4096, updatedAt: Date.now()
    })
    const job: JobSnapshot = {
      v: 1, job: "prom-abcdefgh", name: 'q"uote\\back\nline', cluster: "prom", state: "running", startedAt: Date.now(), updatedAt: Date.now(), attempt: 0, worldSize: 2,
      minWorkers: 2, maxWorkers: 2, restarts: 0, countedFailures: 0, resizes: [], strategy: { strategy: "allreduce", algorithm: "ring", compression: "none", zeroStage: 0 },
      reports: 1, lastMetrics: { "val/loss": 0.25, note: "text" }, checkpoints: { count: 1 }, incidents: [], ranks: [rank(0), rank(1)], runDir: "/tmp/x",
      driver: { host: "h", pid: 1 }, address: server.url
    }
    const query = nc.subscribe(clusterSubjects("prom").jobsQuery, { callback: (_e, m) => void m.respond(encodeJson({ ...job, updatedAt: Date.now() })) })
    const d = await startDashboard({ nc, cluster: "prom", address: server.url, port: 0 })
    try {
      const text = await until("the node and the job on /metrics", async () => {
        const r = await get(`${d.baseUrl}/metrics`)
        expect(r.status).toBe(200)
        return /^gradwire_node_up\{/m.test(r.body) && /^gradwire_rank_steps_total\{/m.test(r.body) ? r.body : undefined
      }, 20_000)
      const lint = spawnSync(promtool, ["check", "metrics"], { input: text, encoding: "utf8", timeout: 30_000 })
      expect(lint.error).toBeUndefined()
      expect(`${lint.stdout}${lint.stderr}`.trim(), "promtool's warnings").toBe("")
      expect(lint.status).toBe(0)

      const families = parseExposition(text)
      const jobLabels = { job: "prom-abcdefgh", name: 'q"uote\\back\nline' }
      expect(value(families, "gradwire_node_up", { node: "prom-node" })).toBe(1)
      expect(value(families, "gradwire_node_resource_capacity", { node: "prom-node", resource: "CPU" })).toBeGreaterThanOrEqual(2)
      expect(value(families, "gradwire_node_resource_used", { node: "prom-node", resource: "CPU" })).toBe(0)
      expect(value(families, "gradwire_job_world_size", jobLabels)).toBe(2)
      expect(value(families, "gradwire_job_checkpoints", jobLabels)).toBe(1)
      expect(value(families, "gradwire_job_metric", { ...jobLabels, metric: "val_loss" })).toBe(0.25)
      expect(value(families, "gradwire_rank_steps_total", { ...jobLabels, rank: "1" })).toBe(13)
      expect(value(families, "gradwire_rank_step_seconds_total", { ...jobLabels, rank: "0", part: "compute" })).toBeCloseTo(0.156)
      expect(value(families, "gradwire_rank_collective_bytes_total", { ...jobLabels, rank: "0", direction: "received" })).toBe(4096)
      // The dashboard process's own: CPU, memory, event loop lag.
      for (const name of ["process_cpu_seconds_total", "process_resident_memory_bytes", "nodejs_eventloop_lag_seconds", "nodejs_heap_size_used_bytes"]) {
        expect(families.get(name)?.samples.length, name).toBeGreaterThan(0)
      }
    } finally {
      query.unsubscribe()
      await d.close()
      await agent.stop()
    }
  })
})

describe("runConfig.dashboard", () => {
  it("is validated before anything starts", () => {
    const options = (dashboard: unknown) => ({ trainLoopPerWorker: "./x.ts#loop", scalingConfig: { numWorkers: 1 }, runConfig: { dashboard } }) as never
    expect(resolveTrainerOptions(options(true)).run.dashboard).toBe(true)
    expect(resolveTrainerOptions(options({ port: 0, host: "127.0.0.1" })).run.dashboard).toEqual({ port: 0, host: "127.0.0.1" })
    expect(() => resolveTrainerOptions(options({ port: 70_000 }))).toThrow(/runConfig\.dashboard/)
    expect(() => resolveTrainerOptions(options({ prot: 8265 }))).toThrow(/runConfig\.dashboard/)
    expect(() => resolveTrainerOptions(options({ token: "short" }))).toThrow(/runConfig\.dashboard/)
  })
})

describe("gradwire jobs' LOSS column", () => {
  it("shows the loss the loop last reported, not rank 0's last batch's; before any report the step's, marked so", () => {
    const rank0 = { rank: 0, loss: 0.001845 } as JobSnapshot["ranks"][number]
    expect(lossOf({ lastMetrics: { loss: 3.2321, epoch: 9 }, ranks: [rank0] })).toBe("3.232")
    expect(lossOf({ lastMetrics: { accuracy: 0.9 }, ranks: [rank0] })).toBe("0.001845 (step)")
    expect(lossOf({ ranks: [{ ...rank0, rank: 1 }] })).toBe("-")
    expect(lossOf({ lastMetrics: { loss: "n/a" }, ranks: [] })).toBe("-")
  })
})

describe("jobs on the bus", () => {
  const fixtures = natsFixtures("each")

  it("lists running jobs from their drivers, ended and lost ones from the KV bucket, and streams logs until the end", async () => {
    const server = await fixtures.server()
    const { nc } = await fixtures.connect(server.url)
    const facts = (state: JobFacts["state"]): JobFacts => ({
      state, attempt: 0, worldSize: 2, restarts: 0, countedFailures: 0, resizes: [], incidents: [], reports: 3, lastMetrics: { loss: 0.5, note: "x" },
      checkpoints: { count: 0 }, members: [{ rank: 0, actor: "w0-0", node: "n1", pid: 11 }, { rank: 1, actor: "w0-1", node: "n2", pid: 12 }]
    })
    let state: JobFacts["state"] = "running"
    const monitor = JobMonitor.start({
      nc, cluster: "c1", job: "bus-job-12345678", name: "bus-job", runDir: "/nowhere/bus-job", address: server.url, minWorkers: 2, maxWorkers: 2,
      strategy: { strategy: "allreduce", algorithm: "ring", compression: "none", zeroStage: 0 },
      // (an ended job's group is gone: its driver knows no members any more)
      facts: () => ({ ...facts(state), ...(state === "finished" ? { members: [] } : {}) })
    })
    for (const rank of [0, 1]) monitor.progress({ attempt: 0, rank, epoch: 0, step: 3, stepsPerEpoch: 10, samples: 128, loss: 0.5 })
    // A job whose driver died without a word: its last state, long ago, in the bucket.
    const kv = (await openKvBucket(nc, clusterSubjects("c1").jobsBucket, { maxAgeMs: 60_000 }))!
    const old = Date.now() - 120_000
    await kv.put("gone-87654321", encodeJson({ ...monitor.snapshot(), job: "gone-87654321", name: "gone", startedAt: old, updatedAt: old }))
    try {
      const running = await listJobs(nc, "c1")
      expect(running.map((j) => [j.job, j.state, j.live, j.lost])).toEqual([
        ["bus-job-12345678", "running", true, false],
        ["gone-87654321", "running", false, true]
      ])
      expect(running[0].lastMetrics).toEqual({ loss: 0.5, note: "x" })
      // A driver that stopped answering 3 s ago (not yet lost): its duration runs to when it was
      // last heard of, as a lost one's does (it had run on to now, then fell back once lost).
      const started = Date.now() - 60_000
      await kv.put("quiet-11112222", encodeJson({ ...monitor.snapshot(), job: "quiet-11112222", name: "quiet", startedAt: started, updatedAt: started + 57_000 }))
      const quiet = (await listJobs(nc, "c1")).filter((j) => j.job === "quiet-11112222")
      expect(quiet.map((j) => [j.state, j.live, j.lost])).toEqual([["running", false, false]])
      const row = formatJobsTable("c1", server.url, quiet).split("\n").find((l) => l.startsWith("quiet-11112222"))
      expect(row, formatJobsTable("c1", server.url, quiet)).toMatch(/ 57s /)
      // Agents publish worker output per line; the driver keeps the tail, a follower gets the stream.
      const got: string[] = []
      const follow = followJobLogs(nc, "c1", "bus-job-12345678", (l) => got.push(`${l.rank}:${l.line}`), { rank: 1 })
      const publish = (actor: string, line: string): void =>
        nc.publish(clusterSubjects("c1").job("bus-job-12345678").log(actor), encodeMessage({ stream: "stdout", line, name: actor, pid: 1, node: "n" }))
      await nc.flush()
      publish("w0-0", "zero")
      publish("w0-1", "one")
      publish("w0-1", "two")
      await until("the follower's lines", () => (got.length >= 2 ? true : undefined), 10_000)
      expect(got).toEqual(["1:one", "1:two"])
      const tail = await until("the driver's tail", async () => {
        const t = await fetchJobLogs(nc, "c1", "bus-job-12345678", { rank: 1 })
        return t && t.length === 2 ? t : undefined
      }, 10_000)
      expect(tail.map((l) => l.line)).toEqual(["one", "two"])
      // The end: the follower stops by itself, and the bucket keeps the final state.
      state = "finished"
      await monitor.close({ state: "finished" })
      expect((await follow.ended)?.state).toBe("finished")
      const after = await listJobs(nc, "c1")
      expect(after.find((j) => j.job === "bus-job-12345678")).toMatchObject({ state: "finished", live: false, lost: false, reports: 3 })
      // its ranks still name the workers they were (/metrics labels its rank series by node)
      expect(after.find((j) => j.job === "bus-job-12345678")!.ranks.map((r) => [r.rank, r.node])).toEqual([
        [0, "n1"],
        [1, "n2"]
      ])
    } finally {
      await monitor.close({ state: "finished" })
    }
  })
})

describe("the launcher", () => {
  it("gradwire train FILE#EXPORT --workers N runs a loop with no driver to write", { timeout: 90_000 }, async () => {
    const storage = path.join(dir, "launched")
    const r = await runScript(
      CLI,
      ["train", "test/support/launch-loop.ts#launchLoop", "--workers", "2", "--config", JSON.stringify({ epochs: 3, tag: "hello" }), "--name", "launched", "--storage-path", storage],
      { timeoutMs: 75_000 }
    )
    expect(r.code, r.output).toBe(0)
    expect(r.output).toContain("launched hello: rank 0 of 2")
    expect(r.output).toContain("launched hello: rank 1 of 2")
    expect(r.output).toMatch(/gradwire: done: 3 report rounds, 0 restart\(s\); run directory .*launched/)
    expect(fs.existsSync(path.join(storage, "launched", "report.html"))).toBe(true)
    expect(r.output).not.toMatch(/resuming from|starting from the checkpoint/)
    // another run started from that one (--resume-from its run directory: its latest checkpoint)
    const next = await runScript(
      CLI,
      ["train", "test/support/launch-loop.ts#launchLoop", "--workers", "2", "--config", JSON.stringify({ epochs: 5, tag: "again" }), "--name", "launched-next", "--storage-path", storage, "--resume-from", path.join(storage, "launched")],
      { timeoutMs: 75_000 }
    )
    expect(next.code, next.output).toBe(0)
    expect(next.output).toContain("launched again: resumed after epoch 2")
    // said as it starts, with the checkpoint the run directory's latest is
    expect(next.output).toContain(`gradwire: starting from the checkpoint ${path.join(storage, "launched", "checkpoint_000002")}`)
    // the first run's name again: it goes on from its own latest checkpoint, and says so first
    const rerun = await runScript(
      CLI,
      ["train", "test/support/launch-loop.ts#launchLoop", "--workers", "2", "--config", JSON.stringify({ epochs: 3, tag: "rerun" }), "--name", "launched", "--storage-path", storage],
      { timeoutMs: 75_000 }
    )
    expect(rerun.code, rerun.output).toBe(0)
    expect(rerun.output).toContain(`gradwire: run "launched" has checkpoints already: resuming from its latest, ${path.join(storage, "launched", "checkpoint_000002")}`)
    expect(rerun.output.indexOf("has checkpoints already")).toBeLessThan(rerun.output.indexOf("launched rerun: resumed after epoch 2"))
    // with another trainLoopConfig than its checkpoints were made with: said, with what changed
    expect(rerun.output).toContain('gradwire: run "launched" goes on from its own checkpoint with another trainLoopConfig than it was made with: tag "rerun" (was "hello");')
    // (the run started from another's checkpoint, resumeFromCheckpoint, is not compared)
    expect(next.output).not.toContain("another trainLoopConfig")
    expect(next.output).toMatch(/gradwire: done: 2 report rounds, 0 restart\(s\); run directory .*launched-next/)
    const bad = await runScript(CLI, ["train", "test/support/launch-loop.ts", "--workers", "2"], { timeoutMs: 30_000 })
    expect(bad.code).toBe(2)
    expect(bad.output).toContain("FILE#EXPORT")
  })

  it("gradwire train --dataset streams files, a gzip CSV without a header through the JSON form's options", { timeout: 90_000 }, async () => {
    const digits = path.resolve("examples/data/digits.csv.gz")
    try {
      const r = await runScript(
        CLI,
        [
          "train", "test/support/launch-loop.ts#launchLoop", "--workers", "3", "--config", JSON.stringify({ epochs: 1, tag: "data", data: "digits" }),
          "--dataset", `digits=${JSON.stringify({ files: digits, header: false })}`, "--name", "files", "--storage-path", path.join(dir, "launched")
        ],
        { timeoutMs: 75_000 }
      )
      expect(r.code, r.output).toBe(0)
      // 1797 rows, none taken for a header: 599 a rank (a header would leave 598); the 64 pixels as
      // features, the last column the label; its 10 classes found by the driver's scan (none given).
      expect(r.output).toMatch(/report 0: rows=599 {2}features=64 {2}classes=10 {2}loss=\d/)
      const bad = await runScript(CLI, ["train", "test/support/launch-loop.ts#launchLoop", "--dataset", `digits={"files": "${digits}", "hedaer": false}`], { timeoutMs: 30_000 })
      expect(bad.code).toBe(1)
      expect(bad.output).toMatch(/fromFiles\.hedaer": unknown option; allowed: format, header/)
      const notJson = await runScript(CLI, ["train", "test/support/launch-loop.ts#launchLoop", "--dataset", "digits={files: 1}"], { timeoutMs: 30_000 })
      expect(notJson.code).toBe(2)
      expect(notJson.output).toMatch(/--dataset digits: \{files: 1\} is not JSON/)
    } finally {
      await fs.promises.rm(await plainFile(digits), { force: true })
    }
  })

  it("gradwire demo trains the digits example with the dashboard on", { timeout: 90_000 }, async () => {
    const r = await runScript(CLI, ["demo", "--workers", "2", "--epochs", "2", "--port", "0", "--storage-path", path.join(dir, "demo"), "--name", "demo"], { timeoutMs: 75_000 })
    expect(r.code, r.output).toBe(0)
    expect(r.output).toMatch(/gradwire: dashboard at http:\/\/127\.0\.0\.1:\d+\//)
    expect(r.output).toMatch(/report 1: .*val_accuracy=0\.\d+/)
    expect(r.output).toContain("gradwire: done: 2 report rounds")
  })
})

describe("the run directory", () => {
  it("is complete when the run fails", { timeout: 90_000 }, async () => {
    const { train, test } = trainTestSplit(await loadDigits(), 0.2, 5)
    const error = await new Trainer({
      trainLoopPerWorker: { module: new URL("../examples/digits/train.ts", import.meta.url).href, export: "trainLoop" },
      trainLoopConfig: { epochs: 4, fail: { how: "throw", rank: 0, epoch: 1 } },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "fails", storagePath: path.join(dir, "results"), progress: false },
      datasets: { train, test }
    })
      .fit()
      .then(
        () => undefined,
        (e: Error & { result?: Result }) => e
      )
    expect(error?.name).toBe("TrainingFailed")
    const runDir = error!.result!.path
    for (const f of ["report.html", "metrics.csv", "summary.json", "config.json", "events.jsonl"]) expect(fs.existsSync(path.join(runDir, f)), f).toBe(true)
    const summary = JSON.parse(fs.readFileSync(path.join(runDir, "summary.json"), "utf8")) as { state: string; reports: number; error: string }
    expect(summary.state).toBe("failed")
    expect(summary.error).toMatch(/injected failure on rank 0/)
    // Epoch 0's round completes unless the failure overtakes rank 1's report of it.
    expect(summary.reports).toBeLessThanOrEqual(1)
    expect(fs.readFileSync(path.join(runDir, "report.html"), "utf8")).toMatch(/run failed: .*injected failure on rank 0/)
    expect(fs.readFileSync(path.join(runDir, "metrics.csv"), "utf8").trim().split("\n")).toHaveLength(summary.reports + 1)
  })

  it("is complete after Ctrl-C, and no worker is left", { timeout: 90_000 }, async () => {
    const storagePath = path.join(dir, "interrupted")
    const pids = new Set<number>()
    let reports = 0
    const run = await runScript(path.join(ROOT, "test/support/interrupt-driver.ts"), [storagePath, "ctrl-c", path.join(dir, "stop-never")], {
      timeoutMs: 75_000,
      onOutput: (all, kill) => {
        for (const m of all.matchAll(/\(worker rank=\d+ pid=(\d+)/g)) pids.add(Number(m[1]))
        const n = (all.match(/^REPORT \d+$/gm) ?? []).length
        // Ctrl-C once two rounds were reported.
        if (n >= 2 && reports < 2) kill("SIGINT")
        reports = n
      }
    })
    try {
      expect(run.signal, run.output).toBe("SIGINT")
      expect(run.output).toContain("gradwire: run directory ")
      const runDir = path.join(storagePath, "ctrl-c")
      const summary = JSON.parse(fs.readFileSync(path.join(runDir, "summary.json"), "utf8")) as { state: string; reports: number; error: string }
      expect(summary.state).toBe("interrupted")
      expect(summary.reports).toBeGreaterThanOrEqual(2)
      expect(summary.error).toMatch(/SIGINT/)
      expect(fs.readFileSync(path.join(runDir, "report.html"), "utf8")).toMatch(/interrupted \d{4}-\d\d-\d\dT/)
      expect(fs.readFileSync(path.join(runDir, "metrics.csv"), "utf8").trim().split("\n").length).toBe(summary.reports + 1)
      expect(pids.size).toBe(2)
      await until("the workers to exit", () => ([...pids].some(alive) ? undefined : true), 15_000)
    } finally {
      for (const pid of pids) if (alive(pid)) process.kill(pid, "SIGKILL")
    }
  })

  it("a program that listens for SIGINT itself goes on after Ctrl-C, its listener called once: fit() rejects with Interrupted for its catch", { timeout: 90_000 }, async () => {
    const storagePath = path.join(dir, "interrupted-caught")
    const pids = new Set<number>()
    let sent = false
    const run = await runScript(path.join(ROOT, "test/support/interrupt-driver.ts"), [storagePath, "ctrl-c-caught", path.join(dir, "stop-never"), "catch"], {
      timeoutMs: 75_000,
      onOutput: (all, kill) => {
        for (const m of all.matchAll(/\(worker rank=\d+ pid=(\d+)/g)) pids.add(Number(m[1]))
        if (!sent && (all.match(/^REPORT \d+$/gm) ?? []).length >= 1) {
          sent = true
          kill("SIGINT")
        }
      }
    })
    try {
      // it ended on its own, after its catch ran; its listener heard the one Ctrl-C once (the
      // Trainer and the embedded server raised the signal again after their clean-up, calling it
      // two more times: a program counting Ctrl-Cs to force its way out would have left at once)
      expect(run.signal, run.output).toBeNull()
      expect(run.code, run.output).toBe(0)
      expect(run.output.match(/^PROGRAM SIGINT$/gm), run.output).toHaveLength(1)
      expect(run.output).toMatch(/^CAUGHT Interrupted interrupted$/m)
      expect(run.output).toMatch(/^AFTER$/m)
      expect(pids.size).toBe(2)
      await until("the workers to exit", () => ([...pids].some(alive) ? undefined : true), 15_000)
    } finally {
      for (const pid of pids) if (alive(pid)) process.kill(pid, "SIGKILL")
    }
  })
})
