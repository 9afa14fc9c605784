// A standby worker's lowered CPU priority (core/priority.ts), in child processes so that the test
// runner's own threads keep theirs: every thread is lowered (V8's among them), given back to the
// value the process started with, and nothing is lowered where it could not be given back.
import { describe, expect, it } from "vitest"
import { execFileSync, spawn } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { idleStartPrefix, lowerChild, mayRaiseTo, raiseChild, starved, watchStarvation } from "../core/priority.ts"
import { alive } from "./support/run-script.ts"
import { chrtRuns, highestNice, SCHED_IDLE, threadNices, threadPolicies } from "./support/nice.ts"
import { standbySchedIdle } from "../core/settings.ts"

const PRIORITY = path.resolve("core/priority.ts")
const NICE = path.resolve("test/support/nice.ts")

/** Runs `body` in a fresh node process with core/priority.ts imported as `p` (and `nices`, `policies` of its threads); its JSON output. */
const inChild = (body: string, env: NodeJS.ProcessEnv = process.env): unknown => {
  const script = `
    import * as p from ${JSON.stringify(PRIORITY)}
    import { threadNices as nices, threadPolicies } from ${JSON.stringify(NICE)}
    const policies = () => [...new Set(threadPolicies())]
    ${body}`
  return JSON.parse(execFileSync(process.execPath, ["--input-type=module", "-e", script], { env, encoding: "utf8", timeout: 20_000 }))
}

describe.runIf(process.platform === "linux")("a standby's CPU priority", () => {
  const base = os.getPriority()
  const may = mayRaiseTo(base)
  // GRADWIRE_STANDBY_SCHED_IDLE as the children get it (on unless the runner's environment says 0).
  const idle = may && chrtRuns() && standbySchedIdle.read()

  it("lowers every thread and gives all of them back; a second lowering while lowered does nothing", () => {
    const out = inChild(`
      const before = nices()
      const policyBefore = policies()
      const lowered = p.backgroundPriority(7)
      const during = nices()
      const policyDuring = policies()
      const onIdle = p.onIdlePolicy()
      const again = p.backgroundPriority(3)
      const inBackground = p.inBackground()
      const back = p.foregroundPriority()
      const restored = await p.policyRestored()
      console.log(JSON.stringify({ before, policyBefore, lowered, during, policyDuring, onIdle, again, inBackground, back, restored, after: nices(), policyAfter: policies(), onIdleAfter: p.onIdlePolicy(), schedIdle: p.backgroundSchedIdle() ?? null, inBackgroundAfter: p.inBackground() }))`) as Record<string, unknown>
    const threads = (out.before as number[]).length
    expect(threads).toBeGreaterThan(1)
    expect(out.before).toEqual(Array(threads).fill(base))
    if (may) {
      expect(out.lowered).toBe(Math.min(19, base + 7))
      expect(out.during).toEqual(Array((out.during as number[]).length).fill(Math.min(19, base + 7)))
      expect(out.inBackground).toBe(true)
    } else {
      // No way back (not root, no CAP_SYS_NICE, RLIMIT_NICE 0): nothing is lowered.
      expect(out.lowered).toBeUndefined()
      expect(out.during).toEqual(Array((out.during as number[]).length).fill(base))
      expect(out.inBackground).toBe(false)
    }
    // Lowered, every thread also ran on SCHED_IDLE (with chrt; GRADWIRE_STANDBY_SCHED_IDLE is on by
    // default), and all of them are back on the normal policy (0) after.
    expect(out.policyBefore).toEqual([0])
    expect(out.policyDuring).toEqual([idle ? SCHED_IDLE : 0])
    expect(out.onIdle).toBe(idle)
    expect(out.schedIdle).toBe(may ? idle : null)
    expect(out.again).toBeUndefined()
    expect(out.back).toBe(true)
    expect(out.restored).toBe(true)
    expect(out.after).toEqual(Array((out.after as number[]).length).fill(base))
    expect(out.policyAfter).toEqual([0])
    expect(out.onIdleAfter).toBe(false)
    expect(out.inBackgroundAfter).toBe(false)
  })

  it("with GRADWIRE_STANDBY_SCHED_IDLE=0 lowers the nice value alone", () => {
    const out = inChild(
      `const lowered = p.backgroundPriority(4)
       const during = { nice: Math.max(...nices()), policy: policies(), schedIdle: p.backgroundSchedIdle() ?? null }
       p.foregroundPriority()
       console.log(JSON.stringify({ lowered: lowered ?? null, during, after: { nice: Math.max(...nices()), policy: policies() } }))`,
      { ...process.env, GRADWIRE_STANDBY_SCHED_IDLE: "0" }
    )
    expect(out).toEqual({
      lowered: may ? Math.min(19, base + 4) : null,
      during: { nice: may ? Math.min(19, base + 4) : base, policy: [0], schedIdle: may ? false : null },
      after: { nice: base, policy: [0] }
    })
  })

  it("lowers nothing for 0 or a negative step, and giving back without lowering is a no-op", () => {
    const out = inChild(`console.log(JSON.stringify({ zero: p.backgroundPriority(0) ?? null, neg: p.backgroundPriority(-3) ?? null, back: p.foregroundPriority(), now: nices() }))`) as Record<string, unknown>
    expect(out).toEqual({ zero: null, neg: null, back: true, now: Array((out.now as number[]).length).fill(base) })
  })

  it("gives the priority back by itself after its limit, in case nothing asks for it", () => {
    const out = inChild(`
      const lowered = p.backgroundPriority(6, 200)
      const during = nices()
      const policyDuring = policies()
      await new Promise((r) => setTimeout(r, 600))
      await p.policyRestored()
      console.log(JSON.stringify({ lowered: lowered ?? null, during, policyDuring, after: nices(), policyAfter: policies(), inBackground: p.inBackground() }))`) as Record<string, unknown>
    expect(out.lowered).toBe(may ? Math.min(19, base + 6) : null)
    expect(Math.max(...(out.during as number[]))).toBe(may ? Math.min(19, base + 6) : base)
    expect(out.policyDuring).toEqual([idle ? SCHED_IDLE : 0])
    expect(out.after).toEqual(Array((out.after as number[]).length).fill(base))
    expect(out.policyAfter).toEqual([0])
    expect(out.inBackground).toBe(false)
  })

  it("keeping a lowered process lowered sets a new limit without giving its priority back meanwhile; an unlowered one is lowered", () => {
    const out = inChild(`
      const lowered = p.backgroundPriority(6, 300)
      const kept = p.keepInBackground(6, 900)
      await new Promise((r) => setTimeout(r, 600))
      const during = { nice: Math.max(...nices()), policy: policies(), inBackground: p.inBackground() }
      await new Promise((r) => setTimeout(r, 600))
      await p.policyRestored()
      const after = { nice: Math.max(...nices()), policy: policies(), inBackground: p.inBackground() }
      const again = p.keepInBackground(5, 60_000)
      const againDuring = { nice: Math.max(...nices()), inBackground: p.inBackground() }
      p.foregroundPriority()
      console.log(JSON.stringify({ lowered: lowered ?? null, kept: kept ?? null, during, after, again: again ?? null, againDuring }))`) as Record<string, unknown>
    const low = Math.min(19, base + 6)
    expect(out).toEqual({
      lowered: may ? low : null,
      kept: may ? low : null,
      // 600 ms in, past the first limit (300 ms) but inside the new one (900 ms): still lowered.
      during: { nice: may ? low : base, policy: [idle ? SCHED_IDLE : 0], inBackground: may },
      after: { nice: base, policy: [0], inBackground: false },
      again: may ? Math.min(19, base + 5) : null,
      againDuring: { nice: may ? Math.min(19, base + 5) : base, inBackground: may }
    })
  })

  it("a child lowered at spawn comes back to its parent's value, not the lowered one it started with", async () => {
    const child = spawn(
      process.execPath,
      [
        "--input-type=module",
        "-e",
        `import * as p from ${JSON.stringify(PRIORITY)}
         import * as os from "node:os"
         await new Promise((r) => process.stdin.once("data", r))
         const started = os.getPriority()
         p.backgroundPriority(5)
         p.foregroundPriority()
         console.log(JSON.stringify({ started, back: os.getPriority() }))
         process.exit(0)`
      ],
      { stdio: ["pipe", "pipe", "inherit"] }
    )
    try {
      lowerChild(child.pid!, 5)
      let out = ""
      child.stdout!.on("data", (d: Buffer) => (out += d.toString()))
      const exited = new Promise((resolve) => child.once("exit", resolve))
      child.stdin!.end("go\n")
      await exited
      const { started, back } = JSON.parse(out) as { started: number; back: number }
      expect(started).toBe(may ? Math.min(19, base + 5) : base)
      expect(back).toBe(base)
    } finally {
      child.kill("SIGKILL")
    }
  })

  /** Starts `body` as an agent starts a lowered host (idleStartPrefix, then lowerChild by 5); its JSON output and the prefix used. */
  const startedLowered = async (body: string, env: NodeJS.ProcessEnv): Promise<{ prefix: ReadonlyArray<string>; out: Record<string, unknown> }> => {
    const prefix = idleStartPrefix(5, env)
    const script = `
      import { threadPolicies } from ${JSON.stringify(NICE)}
      const policies = () => [...new Set(threadPolicies())]
      const started = policies()
      const p = await import(${JSON.stringify(PRIORITY)})
      ${body}`
    const [command, ...args] = [...prefix, process.execPath, "--input-type=module", "-e", script]
    const child = spawn(command!, args, { env, stdio: ["ignore", "pipe", "inherit"] })
    try {
      lowerChild(child.pid!, 5)
      let out = ""
      child.stdout!.on("data", (d: Buffer) => (out += d.toString()))
      await new Promise((resolve) => child.once("close", resolve))
      return { prefix, out: JSON.parse(out) as Record<string, unknown> }
    } finally {
      child.kill("SIGKILL")
    }
  }

  it("a child the agent starts lowered runs on SCHED_IDLE from its first line, and on the normal policy once its priority is given back", async () => {
    const { prefix, out } = await startedLowered(
      `const lowered = p.backgroundPriority(5)
       const during = policies()
       const back = p.foregroundPriority()
       const restored = await p.policyRestored()
       console.log(JSON.stringify({ started, lowered, during, back, restored, after: policies() }))`,
      process.env
    )
    expect(prefix.length > 0).toBe(idle)
    expect(out).toEqual({
      // Every thread node had started by the script's first line, on SCHED_IDLE already.
      started: [idle ? SCHED_IDLE : 0],
      lowered: may ? Math.min(19, base + 5) : undefined,
      during: [idle ? SCHED_IDLE : 0],
      back: true,
      restored: true,
      after: [0]
    })
    // Where the child's environment asks for the nice value alone, or nothing is lowered, no prefix.
    expect(idleStartPrefix(5, { ...process.env, GRADWIRE_STANDBY_SCHED_IDLE: "0" })).toEqual([])
    expect(idleStartPrefix(0, process.env)).toEqual([])
  })

  it("a child started on SCHED_IDLE without chrt on its own PATH still counts itself on it, and says it could not leave it", async () => {
    const { out } = await startedLowered(
      `p.backgroundPriority(5)
       const onIdle = p.onIdlePolicy()
       const back = p.foregroundPriority()
       console.log(JSON.stringify({ started, onIdle, back, after: policies() }))`,
      { ...process.env, PATH: "" }
    )
    // (Where nothing starts on SCHED_IDLE here, nothing is on it either.)
    expect(out).toEqual(idle ? { started: [SCHED_IDLE], onIdle: true, back: false, after: [SCHED_IDLE] } : { started: [0], onIdle: false, back: true, after: [0] })
  })

  it("a lowered child is raised from its parent (raiseChild): every thread back at the parent's value, on the normal policy", async () => {
    // The child lowers itself for good (no limit) and waits; the parent raises it from outside,
    // as an agent does with a lowered warm process a spawn at its own priority takes.
    const prefix = idleStartPrefix(5, process.env)
    const script = `
      const p = await import(${JSON.stringify(PRIORITY)})
      p.backgroundPriority(5, Infinity)
      console.log("lowered")
      setInterval(() => {}, 1000)`
    const [command, ...args] = [...prefix, process.execPath, "--input-type=module", "-e", script]
    const child = spawn(command!, args, { env: process.env, stdio: ["ignore", "pipe", "inherit"] })
    try {
      lowerChild(child.pid!, 5)
      await new Promise<void>((resolve) => child.stdout!.on("data", (d: Buffer) => d.toString().includes("lowered") && resolve()))
      /** The child's threads' distinct nice values and policies. */
      const state = () => ({ nices: [...new Set(threadNices(child.pid!))], policies: [...new Set(threadPolicies(child.pid!))] })
      const lowered = state()
      expect(lowered).toEqual({ nices: [may ? Math.min(19, base + 5) : base], policies: [idle ? SCHED_IDLE : 0] })
      raiseChild(child.pid!)
      // The nice values are set at once; the policy by a chrt the call started (not waited for).
      const deadline = Date.now() + 10_000
      let now = lowered
      while (Date.now() < deadline) {
        now = state()
        if (now.policies.every((x) => x === 0)) break
        await new Promise((r) => setTimeout(r, 50))
      }
      expect(now).toEqual({ nices: [base], policies: [0] })
    } finally {
      child.kill("SIGKILL")
    }
  })

  /** The pids of process `pid`'s children (every thread's), from /proc; none where it is gone. */
  const childrenOf = (pid: number): number[] => {
    try {
      return readdirSync(`/proc/${pid}/task`).flatMap((t) => readFileSync(`/proc/${pid}/task/${t}/children`, "utf8").split(" ").filter((x) => x !== "").map(Number))
    } catch {
      return []
    }
  }
  /** Waits up to 10 s for `check`; its last value. */
  const waitFor = async <A>(check: () => A, done: (a: A) => boolean): Promise<A> => {
    const deadline = Date.now() + 10_000
    let now = check()
    while (!done(now) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 25))
      now = check()
    }
    return now
  }

  it.runIf(idle)("a lowered process is put back on the normal policy by a helper it started as it lowered, which ends after its one use, or with the process", async () => {
    // The process lowers itself (no limit), says so, gives its priority back on a line from its
    // stdin, says so, and waits to be killed: no fork of its own on the way back, the helper's
    // chrt instead.
    const script = `
      const p = await import(${JSON.stringify(PRIORITY)})
      p.backgroundPriority(5, Infinity)
      console.log("lowered")
      process.stdin.once("data", async () => {
        const back = p.foregroundPriority()
        console.log(JSON.stringify({ back, restored: await p.policyRestored() }))
      })
      setInterval(() => {}, 1000)`
    const start = () => spawn(process.execPath, ["--input-type=module", "-e", script], { env: process.env, stdio: ["pipe", "pipe", "inherit"] })
    const lines = (c: ReturnType<typeof start>): string[] => {
      const seen: string[] = []
      c.stdout!.on("data", (d: Buffer) => seen.push(...d.toString().split("\n").filter((x) => x !== "")))
      return seen
    }
    const used = start()
    const unused = start()
    try {
      const usedOut = lines(used)
      const unusedOut = lines(unused)
      await waitFor(() => usedOut.length + unusedOut.length, (n) => n >= 2)
      // Lowered: one child each, on the normal policy at the nice value the process came from.
      const helper = (await waitFor(() => childrenOf(used.pid!), (c) => c.length === 1))[0]!
      const unusedHelper = (await waitFor(() => childrenOf(unused.pid!), (c) => c.length === 1))[0]!
      expect(await waitFor(() => [...new Set(threadPolicies(helper))], (x) => x.length === 1 && x[0] === 0)).toEqual([0])
      expect(threadNices(helper)).toEqual([base])
      expect([...new Set(threadPolicies(used.pid!))]).toEqual([SCHED_IDLE])
      used.stdin!.write("go\n")
      await waitFor(() => usedOut.length, (n) => n >= 2)
      expect(JSON.parse(usedOut[1]!)).toEqual({ back: true, restored: true })
      expect([...new Set(threadPolicies(used.pid!))]).toEqual([0])
      expect(await waitFor(() => alive(helper), (a) => !a)).toBe(false)
      // The other process dies lowered (kill -9): its helper reads the end of its stdin and ends.
      unused.kill("SIGKILL")
      expect(await waitFor(() => alive(unusedHelper), (a) => !a)).toBe(false)
    } finally {
      used.kill("SIGKILL")
      unused.kill("SIGKILL")
    }
  })

  it("counts a thread starved when it was runnable through a window and ran under a tenth of it", () => {
    const s = 1e9
    expect(starved(0.02 * s, s, true)).toBe(true)
    expect(starved(0.2 * s, s, true)).toBe(false) // it runs: a lowered start on cores with idle time
    expect(starved(0, s, false)).toBe(false) // it sleeps: a standby waiting to be let in
  })

  it.runIf(idle)("a lowered child that other work starves is raised from its parent (watchStarvation); one that sleeps stays lowered", async () => {
    // Everything on CPU 0: a busy loop at the normal priority, a SCHED_IDLE child that wants to
    // compute (starved: it gets next to nothing) and a SCHED_IDLE child that sleeps.
    const prefix = idleStartPrefix(5, process.env)
    const children: ReturnType<typeof spawn>[] = []
    const stops: Array<() => void> = []
    const start = (script: string, lowered: boolean) => {
      const [command, ...args] = ["taskset", "-c", "0", ...(lowered ? prefix : []), process.execPath, "-e", script]
      const c = spawn(command!, args, { env: process.env, stdio: ["ignore", "pipe", "ignore"] })
      children.push(c)
      if (lowered) lowerChild(c.pid!, 5)
      return c
    }
    const raised: Array<{ pid: number; why: string }> = []
    const watch = (pid: number) => stops.push(watchStarvation(pid, (why) => raised.push({ pid, why }), 500, 3))
    try {
      // The sleeper first, while CPU 0 is free: it needs the CPU to start (starved, it would be raised).
      const sleeper = start("console.log('asleep'); setInterval(() => {}, 1000)", true)
      await new Promise<void>((resolve, reject) => {
        sleeper.stdout!.on("data", (d: Buffer) => d.toString().includes("asleep") && resolve())
        sleeper.on("exit", () => reject(new Error("the sleeping child exited")))
      })
      start("for (;;) {}", false)
      const hungry = start("for (;;) {}", true)
      watch(sleeper.pid!)
      watch(hungry.pid!)
      const policies = (pid: number) => [...new Set(threadPolicies(pid))]
      // (on SCHED_IDLE once chrt has exec'd node; taskset runs first under the same pid)
      expect(await waitFor(() => policies(hungry.pid!), (x) => x.length === 1 && x[0] === SCHED_IDLE)).toEqual([SCHED_IDLE])
      // Raised within a few checks: the normal policy and the parent's nice value on every thread.
      const after = await waitFor(() => policies(hungry.pid!), (x) => x.length === 1 && x[0] === 0)
      expect(after).toEqual([0])
      expect(threadNices(hungry.pid!).every((n) => n === base)).toBe(true)
      expect(raised.map((r) => r.pid)).toEqual([hungry.pid])
      expect(raised[0]!.why).toMatch(/runnable but on a CPU \d+\.\d% of the last 2 s/)
      // The sleeping one was never starved: still lowered, not raised.
      expect(policies(sleeper.pid!)).toEqual([SCHED_IDLE])
    } finally {
      for (const stop of stops) stop()
      for (const c of children) c.kill("SIGKILL")
    }
  })

  it("reads the nice value of a process's threads as the tests do", () => {
    expect(highestNice()).toBe(base)
  })
})
