// The controller state machine (actors/train/driver/controller.ts), without processes: report rounds,
// the outcome of a generation, restart decisions and what counts toward maxFailures, elastic
// resizes at report boundaries, messages from old generations, and the recovery choices (peers or
// checkpoint, a death reclassified as its node's loss).
import { describe, expect, it } from "vitest"
import { Controller, MISMATCH_GATHER_MS, SERVER_DOWN, deathOrNodeLoss, ranksToCheck, recoveryFor, restartReason, startFailureKind, type ControllerEvent, type GroupFailure, type Outcome } from "../actors/train/driver/controller.ts"
import { MAX_INFRA_RESTARTS_WITHOUT_PROGRESS, decide } from "../actors/train/driver/failure-policy.ts"
import { joinsAt } from "../actors/train/driver/regroup.ts"
import { TrainingFailed } from "../actors/train/driver/result.ts"

type Ckpt = { readonly tag: string }

const make = (opts: { maxFailures?: number; min?: number; max?: number } = {}) => {
  const events: Array<ControllerEvent<Ckpt>> = []
  const c = new Controller<Ckpt>({ maxFailures: opts.maxFailures ?? 0, minWorkers: opts.min ?? 2, maxWorkers: opts.max ?? opts.min ?? 2 }, (e) => events.push(e))
  const states = () => events.flatMap((e) => (e.type === "state" ? [e.to] : []))
  const rounds = () => events.flatMap((e) => (e.type === "round" ? [e.round] : []))
  return { c, events, states, rounds }
}

const settled = async (p: Promise<Outcome>): Promise<Outcome | "pending"> => Promise.race([p, new Promise<"pending">((r) => setTimeout(() => r("pending"), 10))])

describe("controller: report rounds", () => {
  it("completes a round when every rank reported it, preferring rank 0's checkpoint", async () => {
    const { c, rounds } = make({ min: 3 })
    const g = c.begin(3)
    c.report({ attempt: 0, rank: 2, index: 0, metrics: { loss: 3 }, checkpoint: { tag: "r2" } })
    c.report({ attempt: 0, rank: 1, index: 0, metrics: { loss: 2 } })
    expect(rounds()).toHaveLength(0)
    c.report({ attempt: 0, rank: 0, index: 0, metrics: { loss: 1 }, checkpoint: { tag: "r0" }, aux: { "a.bin": new Uint8Array([1]) } })
    expect(rounds()).toHaveLength(1)
    const r = rounds()[0]
    expect(r.metrics.map((m) => m.loss)).toEqual([1, 2, 3])
    expect(r.checkpoint).toEqual({ tag: "r0" })
    expect(Object.keys(r.aux)).toEqual(["a.bin"])
    expect(g.completedRounds).toBe(1)
    expect(g.checkpointed).toBe(true)
    // A repeated report of one rank does not complete a round by itself.
    c.report({ attempt: 0, rank: 0, index: 1, metrics: {} })
    c.report({ attempt: 0, rank: 0, index: 1, metrics: {} })
    c.report({ attempt: 0, rank: 1, index: 1, metrics: {} })
    expect(rounds()).toHaveLength(1)
  })

  it("a report sent again (its reply was lost with the connection) counts once, also after its round completed", () => {
    const { c, rounds } = make()
    c.begin(2)
    c.report({ attempt: 0, rank: 0, index: 0, metrics: {} })
    c.report({ attempt: 0, rank: 0, index: 0, metrics: {} })
    expect(rounds()).toHaveLength(0)
    c.report({ attempt: 0, rank: 1, index: 0, metrics: {} })
    c.report({ attempt: 0, rank: 1, index: 0, metrics: {} })
    c.report({ attempt: 0, rank: 0, index: 0, metrics: {} })
    expect(rounds()).toHaveLength(1)
    expect(c.current!.rounds.size).toBe(0)
  })

  it("finishes when every rank finished with the same number of reports", async () => {
    const { c, states } = make()
    const g = c.begin(2)
    for (const rank of [0, 1]) c.report({ attempt: 0, rank, index: 0, metrics: {} })
    c.finished({ attempt: 0, rank: 0, reports: 1 })
    expect(await settled(g.outcome)).toBe("pending")
    c.finished({ attempt: 0, rank: 1, reports: 1 })
    expect(await g.outcome).toEqual({ type: "finished" })
    expect(c.next({ type: "finished" })).toEqual({ action: "finish" })
    expect(states()).toEqual(["running", "finished"])
  })

  it("ends interrupted, not errored, on a signal's abort; abort() outside a generation says which end", async () => {
    const a = make({ maxFailures: 3 })
    const g = a.c.begin(2)
    a.c.fail(undefined, { kind: "interrupted", rank: -1, tag: "Interrupted", message: "SIGINT" })
    const o = await g.outcome
    expect(a.c.next(o)).toMatchObject({ action: "fail" })
    expect(a.states()).toEqual(["running", "interrupted"])
    expect(() => a.c.begin(2)).toThrow(/begin\(\) while interrupted/)
    // A loop's own error that happens to be called "Interrupted" is an error like any other.
    const own = make({ maxFailures: 0 })
    const og = own.c.begin(2)
    own.c.fail(og, { kind: "loop-error", rank: 1, tag: "Interrupted", message: "the loop's own" })
    expect(own.c.next(await og.outcome)).toMatchObject({ action: "fail" })
    expect(own.states()).toEqual(["running", "errored"])

    const b = make()
    b.c.begin(2)
    b.c.abort("interrupted")
    expect(b.states()).toEqual(["running", "interrupted"])
    const e = make()
    e.c.begin(2)
    e.c.abort()
    e.c.abort("interrupted")
    expect(e.states()).toEqual(["running", "errored"])
  })

  it("fails with report-mismatch when ranks report a different number of times, either order", async () => {
    const a = make()
    const g = a.c.begin(2)
    a.c.finished({ attempt: 0, rank: 0, reports: 0 })
    a.c.report({ attempt: 0, rank: 1, index: 0, metrics: {} })
    const o = await g.outcome
    expect(o.type === "failed" && o.failure.kind).toBe("report-mismatch")
    expect(a.c.next(o)).toMatchObject({ action: "fail", reason: expect.stringContaining("not retryable") })
    expect(a.states()).toEqual(["running", "errored"])

    const b = make()
    const h = b.c.begin(2)
    for (const rank of [0, 1]) b.c.report({ attempt: 0, rank, index: 0, metrics: {} })
    b.c.finished({ attempt: 0, rank: 1, reports: 1 })
    b.c.finished({ attempt: 0, rank: 0, reports: 2 })
    const o2 = await h.outcome
    expect(o2.type === "failed" && o2.failure.message).toMatch(/rank 0 finished after 2 report\(\) calls but rank 1 made 1/)
  })
})

describe("controller: ranks whose calls mismatch", () => {
  const said = (attempt: number, rank: number, where: string) => ({
    attempt,
    rank,
    tag: "OpMismatch",
    message: `collective #9: rank ${rank} called barrier but rank ${1 - rank} called allGather\nstack`,
    stack: "s",
    blamed: [1 - rank],
    parked: true,
    mismatch: true,
    where
  })

  it("fail a fresh generation as a call-mismatch that names every rank's place, not retryable even with no failure limit", async () => {
    const { c } = make({ maxFailures: -1 })
    const g = c.begin(2)
    c.failed(said(0, 1, "in training step 6 since report() call 1"))
    // the other rank's word is waited for (not the death of the rank the first one blamed)
    expect(await settled(g.outcome)).toBe("pending")
    c.failed(said(0, 0, "in report() call 2, after 5 training step(s) since report() call 1"))
    const o = await g.outcome
    expect(o).toMatchObject({ type: "failed", failure: { kind: "call-mismatch", rank: 0, tag: "OpMismatch" } })
    const failure = (o as { failure: GroupFailure }).failure
    expect(failure.message).toContain("(rank 0 in report() call 2, after 5 training step(s) since report() call 1; rank 1 in training step 6 since report() call 1)")
    expect(failure.message).toContain("collective #9: rank 0 called barrier")
    expect(failure.message).not.toContain("stack")
    expect(c.next(o)).toMatchObject({ action: "fail", reason: "not retryable (call-mismatch)" })
  })

  it("conclude with the places heard when a rank does not say (it died meanwhile)", async () => {
    const { c } = make({ min: 3 })
    const g = c.begin(3)
    c.failed(said(0, 1, "in training step 2 since the loop's start"))
    // the others' word is waited for a while (MISMATCH_GATHER_MS), then it concludes without it
    expect(await settled(g.outcome)).toBe("pending")
    expect(MISMATCH_GATHER_MS).toBeGreaterThan(10)
    const o = await g.outcome
    expect(o).toMatchObject({ type: "failed", failure: { kind: "call-mismatch", rank: 1 } })
    expect((o as { failure: GroupFailure }).failure.message).toContain("(rank 1 in training step 2 since the loop's start)")
  })

  it("in a regrouped generation, restart from the checkpoint: survivors and joiners did not line up", async () => {
    const { c } = make({ min: 2, maxFailures: 5 })
    c.begin(2)
    c.next({ type: "failed", failure: { kind: "died", rank: 1, tag: "exited", message: "x" } })
    const g = c.regroup({ worldSize: 2, survivors: [{ from: 0, to: 0 }], survivorsOnlyBelow: 0 })
    c.failed(said(g.number, 0, "in training step 1 since report() call 3"))
    c.failed(said(g.number, 1, "in report() call 3, after 0 training step(s) since report() call 2"))
    const o = await g.outcome
    expect(o).toMatchObject({ type: "failed", failure: { kind: "recovery", rank: -1 } })
    expect((o as { failure: GroupFailure }).failure.message).toMatch(/^the regrouped ranks' loops did not line up \(rank 0 in training step 1/)
    expect(recoveryFor({ type: "failure", failure: (o as { failure: GroupFailure }).failure }, "peers", false)).toMatchObject({ from: "checkpoint" })
    expect(c.next(o)).toMatchObject({ action: "restart", counted: false })
  })
})

describe("controller: failures and restarts", () => {
  it("a worker death restarts while maxFailures allows, counting each, then fails", async () => {
    const { c, states } = make({ maxFailures: 2 })
    for (let i = 0; i < 3; i++) {
      const g = c.begin(2)
      expect(g.number).toBe(i)
      c.workerDown(i, 1, { reason: "exited", detail: "killed by SIGKILL" })
      const o = await g.outcome
      expect(o).toMatchObject({ type: "failed", failure: { kind: "died", rank: 1 } })
      const next = c.next(o)
      if (i < 2) expect(next).toMatchObject({ action: "restart", counted: true, size: { min: 2, max: 2 } })
      else expect(next).toMatchObject({ action: "fail", reason: expect.stringContaining("maxFailures (2)") })
    }
    expect(c.countedFailures).toBe(2)
    expect(states()).toEqual(["running", "restarting", "scheduling", "running", "restarting", "scheduling", "running", "errored"])
  })

  it("names the peer a collective error blames, and ignores a finished rank's exit", async () => {
    const { c } = make({ min: 3 })
    const g = c.begin(3)
    c.finished({ attempt: 0, rank: 2, reports: 0 })
    c.workerDown(0, 2, { reason: "exited", detail: "exit 0" })
    expect(await settled(g.outcome)).toBe("pending")
    c.failed({ attempt: 0, rank: 0, tag: "PeerUnreachable", message: "no data from rank 1", stack: "", blamed: [1] })
    expect(await g.outcome).toMatchObject({ type: "failed", failure: { kind: "died", rank: 1, message: expect.stringContaining("reported by rank 0") } })
  })

  it("a ConfigError in the loop is not retried", async () => {
    const { c } = make({ maxFailures: -1 })
    const g = c.begin(2)
    c.failed({ attempt: 0, rank: 0, tag: "ConfigError", message: "bad", stack: "" })
    expect(c.next(await g.outcome)).toMatchObject({ action: "fail" })
  })

  it("ignores messages of an older generation", async () => {
    const { c, rounds } = make({ maxFailures: 1 })
    const g0 = c.begin(2)
    c.workerDown(0, 0, { reason: "exited", detail: "x" })
    c.next(await g0.outcome)
    const g1 = c.begin(2)
    c.report({ attempt: 0, rank: 0, index: 0, metrics: {} })
    c.report({ attempt: 0, rank: 1, index: 0, metrics: {} })
    c.workerDown(0, 1, { reason: "exited", detail: "late notice from the old group" })
    c.failed({ attempt: 0, rank: 1, tag: "Error", message: "old", stack: "" })
    expect(rounds()).toHaveLength(0)
    expect(await settled(g1.outcome)).toBe("pending")
  })

  it("lost nodes and bus outages do not count toward maxFailures, unless they repeat without progress", async () => {
    const { c } = make({ maxFailures: 0 })
    // With progress in between, any number of infrastructure failures restart without counting.
    for (let i = 0; i < MAX_INFRA_RESTARTS_WITHOUT_PROGRESS + 2; i++) {
      const g = c.begin(2)
      for (const rank of [0, 1]) c.report({ attempt: g.number, rank, index: 0, metrics: {} })
      c.workerDown(g.number, 0, { reason: "node-lost", detail: "node a stopped heartbeating" })
      expect(c.next(await g.outcome)).toMatchObject({ action: "restart", counted: false })
    }
    // Without progress: MAX of them restart, the next one counts (and maxFailures 0 ends the run).
    for (let i = 0; i < MAX_INFRA_RESTARTS_WITHOUT_PROGRESS; i++) {
      const g = c.begin(2)
      c.fail(g, { kind: "bus", rank: -1, tag: "NatsDisconnected", message: "lost the connection" })
      expect(c.next(await g.outcome)).toMatchObject({ action: "restart", counted: false })
    }
    const g = c.begin(2)
    c.fail(g, { kind: "bus", rank: -1, tag: "NatsDisconnected", message: "lost the connection" })
    expect(c.next(await g.outcome)).toMatchObject({ action: "fail", reason: expect.stringContaining("without a completed report round") })
  })

  it("decide() is pure: the same inputs give the same decision", () => {
    const f = { kind: "died", rank: 0, tag: "exited", message: "" } as const
    expect(decide(f, 0, -1)).toEqual({ action: "restart", counted: true, failuresSoFar: 1 })
    expect(decide(f, 5, 5)).toMatchObject({ action: "fail" })
    expect(decide({ ...f, kind: "node-lost" }, 5, 5)).toEqual({ action: "restart", counted: false, failuresSoFar: 5 })
    // an error in the loop's own code, or a batch the heap cannot hold, comes back on a restart: not
    // retried even with no limit; another error of the loop is
    const loop = { kind: "loop-error", rank: 1, message: "" } as const
    expect(decide({ ...loop, tag: "TypeError" }, 0, -1)).toEqual({ action: "fail", reason: expect.stringMatching(/^not retryable \(TypeError: an error in the loop's code/) })
    expect(decide({ ...loop, tag: "HeapExhausted" }, 0, -1)).toMatchObject({ action: "fail" })
    expect(decide({ ...loop, tag: "Error" }, 0, -1)).toEqual({ action: "restart", counted: true, failuresSoFar: 1 })
  })
})

describe("controller: elastic sizes", () => {
  it("grows at the next report round that carries a checkpoint, without counting a failure", async () => {
    const { c, states } = make({ min: 2, max: 4 })
    expect(c.elastic).toBe(true)
    const g = c.begin(2)
    c.capacity(4, "node b joined")
    expect(c.pendingResize).toEqual({ size: 4, reason: "node b joined" })
    for (const rank of [0, 1]) c.report({ attempt: 0, rank, index: 0, metrics: {} })
    expect(await settled(g.outcome)).toBe("pending")
    for (const rank of [0, 1]) c.report({ attempt: 0, rank, index: 1, metrics: {}, ...(rank === 0 ? { checkpoint: { tag: "c1" } } : {}) })
    const o = await g.outcome
    expect(o).toEqual({ type: "resize", size: 4, reason: "node b joined" })
    expect(c.next(o)).toMatchObject({ action: "restart", counted: false, cause: { type: "resize", size: 4 }, size: { min: 2, max: 4 } })
    expect(states()).toEqual(["running", "resizing", "scheduling"])
    expect(c.countedFailures).toBe(0)
  })

  it("capacity no larger than the group cancels a pending resize; fixed-size runs ignore capacity", async () => {
    const { c } = make({ min: 2, max: 4 })
    c.begin(3)
    c.capacity(4, "x")
    c.capacity(3, "y")
    expect(c.pendingResize).toBeUndefined()
    const fixed = make({ min: 2 })
    fixed.c.begin(2)
    fixed.c.capacity(4, "z")
    expect(fixed.c.pendingResize).toBeUndefined()
  })

  it("a fixed-size group's survivors regroup short-handed, down to one worker; an elastic group's only down to its min", () => {
    const fixed = make({ min: 3, maxFailures: 5 })
    expect(fixed.c.floor).toBe(1)
    fixed.c.begin(3)
    fixed.c.next({ type: "failed", failure: { kind: "died", rank: 1, tag: "exited", message: "x" } })
    expect(fixed.c.regroup({ worldSize: 2, survivors: [{ from: 0, to: 0 }, { from: 2, to: 1 }], survivorsOnlyBelow: 0 }).worldSize).toBe(2)
    const elastic = make({ min: 2, max: 4, maxFailures: 5 })
    expect(elastic.c.floor).toBe(2)
    elastic.c.begin(2)
    elastic.c.next({ type: "failed", failure: { kind: "died", rank: 1, tag: "exited", message: "x" } })
    expect(() => elastic.c.regroup({ worldSize: 1, survivors: [{ from: 0, to: 0 }], survivorsOnlyBelow: 0 })).toThrow(/outside 2..4/)
  })

  it("refill ends a short generation at once with a resize (no checkpoint round needed), only for the live one and only to grow", async () => {
    const { c, states } = make({ min: 3, maxFailures: 5 })
    const g0 = c.begin(3)
    c.next({ type: "failed", failure: { kind: "died", rank: 2, tag: "exited", message: "x" } })
    const g = c.regroup({ worldSize: 2, survivors: [{ from: 0, to: 0 }, { from: 1, to: 1 }], survivorsOnlyBelow: 0 })
    // Not the live generation, or no larger: nothing happens.
    expect(c.refill(g0, 3, "ready")).toBe(false)
    expect(c.refill(g, 2, "ready")).toBe(false)
    expect(await settled(g.outcome)).toBe("pending")
    // Clamped to the size: numWorkers.
    expect(c.refill(g, 5, "1 replacement worker(s) ready")).toBe(true)
    const o = await g.outcome
    expect(o).toEqual({ type: "resize", size: 3, reason: "1 replacement worker(s) ready" })
    expect(c.next(o)).toMatchObject({ action: "restart", counted: false, cause: { type: "resize", size: 3 }, size: { min: 3, max: 3 } })
    // The failure counted; its refill does not.
    expect(c.countedFailures).toBe(1)
    expect(states().slice(-2)).toEqual(["resizing", "scheduling"])
  })

  it("refuses world sizes outside the bounds and transitions out of a final state", async () => {
    const { c } = make({ min: 2, max: 4 })
    expect(() => c.begin(5)).toThrow(/outside 2..4/)
    const g = c.begin(4)
    c.finished({ attempt: 0, rank: 0, reports: 0 })
    for (const rank of [1, 2, 3]) c.finished({ attempt: 0, rank, reports: 0 })
    c.next(await g.outcome)
    expect(() => c.begin(2)).toThrow(/begin\(\) while finished/)
    expect(() => new Controller({ maxFailures: 0, minWorkers: 3, maxWorkers: 2 })).toThrow(RangeError)
  })
})

describe("controller: regroup from surviving peers", () => {
  it("carries the survivors' reports over under their new ranks and completes rounds the dead rank left open", async () => {
    const { c, rounds, states } = make({ maxFailures: 1, min: 3 })
    const g = c.begin(3)
    // Round 0 complete; round 1: rank 0 reported, rank 1 dies before it does, rank 2 reports only
    // after the generation ended (before the regroup): that report carries over too.
    for (const rank of [0, 1, 2]) c.report({ attempt: 0, rank, index: 0, metrics: { r: rank } })
    c.report({ attempt: 0, rank: 0, index: 1, metrics: { r: 0 }, checkpoint: { tag: "c1" } })
    c.workerDown(0, 1, { reason: "exited", detail: "SIGKILL" })
    expect(c.next(await g.outcome)).toMatchObject({ action: "restart", counted: true })
    c.report({ attempt: 0, rank: 2, index: 1, metrics: { r: 2 } })
    // Survivors 0 and 2 become ranks 0 and 1; a joiner is rank 2; the furthest survivor made 2 reports.
    const g1 = c.regroup({ worldSize: 3, survivors: [{ from: 0, to: 0 }, { from: 2, to: 1 }], survivorsOnlyBelow: 2 })
    expect(states().slice(-1)).toEqual(["running"])
    // Round 1 completes at once with the survivors' two reports, rank 0's checkpoint kept.
    expect(rounds().map((r) => r.index)).toEqual([0, 1])
    expect(rounds()[1]).toMatchObject({ attempt: 1, checkpoint: { tag: "c1" } })
    expect(rounds()[1].metrics.map((m) => m.r)).toEqual([0, 2, undefined])
    // A joiner's report of a round below survivorsOnlyBelow does not count; round 2 needs all three.
    c.report({ attempt: 1, rank: 2, index: 1, metrics: { r: "joiner" } })
    for (const rank of [0, 1]) c.report({ attempt: 1, rank, index: 2, metrics: {} })
    expect(rounds()).toHaveLength(2)
    c.report({ attempt: 1, rank: 2, index: 2, metrics: {} })
    expect(rounds()).toHaveLength(3)
    for (const rank of [0, 1, 2]) c.finished({ attempt: 1, rank, reports: 3 })
    expect(await g1.outcome).toEqual({ type: "finished" })
  })

  it("a failed regroup is a recovery failure: restarted from the checkpoint, not counted", async () => {
    const { c } = make({ maxFailures: 0, min: 2 })
    const g = c.begin(2)
    c.failed({ attempt: 0, rank: 1, tag: "PeerRecoveryMisaligned", message: "joiner at epoch 1, survivors at 3", stack: "" })
    expect(await g.outcome).toMatchObject({ type: "failed", failure: { kind: "recovery" } })
    expect(c.next((await g.outcome) as Outcome)).toMatchObject({ action: "restart", counted: false })
  })

  it("a parked rank whose group broke without naming a culprit fails the generation for the checkpoint path (rank -1)", async () => {
    const { c } = make({ min: 2 })
    const g = c.begin(2)
    c.failed({ attempt: 0, rank: 0, tag: "CollectiveTimeout", message: "no frame", stack: "", parked: true })
    expect(await g.outcome).toMatchObject({ type: "failed", failure: { kind: "died", rank: -1 } })
    // given up on, the failure names no rank rather than "rank -1"
    const failure = ((await g.outcome) as Extract<Outcome, { type: "failed" }>).failure
    const e = new TrainingFailed(failure, 1, "failureConfig.maxFailures is 0")
    expect(e.message).toMatch(/^training failed \(died\): rank 0's group broke: no frame; giving up: failureConfig\.maxFailures is 0$/)
    expect(new TrainingFailed({ ...failure, rank: 2 }, 1, "x").message).toMatch(/^training failed on rank 2 \(died\): /)
  })
})

describe("controller: recovery choices (peers or checkpoint, a death or a lost node)", () => {
  const failure = (f: Partial<GroupFailure>): { type: "failure"; failure: GroupFailure } => ({
    type: "failure",
    failure: { kind: "died", rank: 1, tag: "WorkerDied", message: "exit 137\nmore", ...f }
  })
  const resize = { type: "resize", size: 4, reason: "room for 4 workers" } as const

  it("regroups the survivors of a lost worker or node, and every worker after a bus outage", () => {
    expect(recoveryFor(failure({}), "peers", false)).toEqual({ from: "peers" })
    expect(recoveryFor(failure({ kind: "node-lost" }), "peers", false)).toEqual({ from: "peers" })
    expect(recoveryFor(failure({ kind: "bus", rank: -1 }), "peers", true)).toEqual({ from: "peers" })
  })

  it("makes a lost parameter server of several again from its replica (every worker survives it); with one server, the checkpoint", () => {
    const server = (f: Partial<GroupFailure>) => failure({ rank: -1, tag: SERVER_DOWN, message: "parameter server 1 went down", ...f })
    expect(recoveryFor(server({ server: 1 }), "peers", false)).toEqual({ from: "peers" })
    expect(recoveryFor(server({ server: 1, kind: "node-lost", rank: 2 }), "peers", false)).toEqual({ from: "peers" })
    expect(recoveryFor(server({}), "peers", false)).toMatchObject({ from: "checkpoint", reason: expect.stringMatching(/with one server its shard's parameters and optimizer state are only in the checkpoint/) })
    expect(recoveryFor(server({ server: 1 }), "checkpoint", false)).toEqual({ from: "checkpoint", reason: 'failureConfig.recoverFrom is "checkpoint"' })
  })

  it("restarts from the checkpoint, saying why: recoverFrom, a failed recovery, a failure that leaves no survivors", () => {
    expect(recoveryFor(failure({}), "checkpoint", false)).toEqual({ from: "checkpoint", reason: 'failureConfig.recoverFrom is "checkpoint"' })
    // Where the strategy made the checkpoint the default, the restart says why.
    expect(recoveryFor(failure({}), "checkpoint", false, "with strategy \"auto\" training may move")).toEqual({
      from: "checkpoint",
      reason: 'failureConfig.recoverFrom is "checkpoint" (the default here: with strategy "auto" training may move)'
    })
    expect(recoveryFor(failure({ kind: "recovery", rank: -1, message: "a survivor did not answer\nstack" }), "peers", false)).toEqual({
      from: "checkpoint",
      reason: "recovering from them failed: a survivor did not answer"
    })
    expect(recoveryFor(failure({ kind: "died", rank: -1 }), "peers", false)).toEqual({
      from: "checkpoint",
      reason: 'a failure of kind "died" of the whole group leaves no survivors to regroup'
    })
    expect(recoveryFor(failure({ kind: "loop-error", tag: "TypeError" }), "peers", false)).toEqual({
      from: "checkpoint",
      reason: 'a failure of kind "loop-error" leaves no survivors to regroup'
    })
  })

  it("grows in place unless recoverFrom is checkpoint or the bus is down", () => {
    expect(recoveryFor(resize, "peers", false)).toEqual({ from: "peers" })
    expect(recoveryFor(resize, "peers", true)).toEqual({ from: "checkpoint", reason: "the bus is down" })
    expect(recoveryFor(resize, "checkpoint", false)).toEqual({ from: "checkpoint", reason: 'failureConfig.recoverFrom is "checkpoint"' })
  })

  it("reclassifies a rank's death as its node's loss only when the cluster saw the node go", () => {
    const died: Outcome = { type: "failed", failure: failure({ rank: 2 }).failure }
    expect(ranksToCheck(died, 4)).toEqual([2])
    expect(ranksToCheck({ type: "failed", failure: failure({ kind: "loop-error" }).failure }, 4)).toEqual([])
    expect(ranksToCheck({ type: "finished" }, 4)).toEqual([])
    expect(deathOrNodeLoss(died, "n1", "alive")).toBe(died)
    expect(deathOrNodeLoss(died, "n1", undefined)).toBe(died)
    for (const state of ["dead", "left"] as const) {
      expect(deathOrNodeLoss(died, "n1", state)).toEqual({
        type: "failed",
        failure: { kind: "node-lost", rank: 2, tag: "WorkerDied", message: "node n1 was lost with it: exit 137\nmore" }
      })
    }
    // A group that broke under a rank without naming a culprit: every rank's node is watched, and
    // a lost one takes the blame (one of its ranks), so the survivors regroup and nothing is counted.
    const unnamed: Outcome = { type: "failed", failure: failure({ rank: -1 }).failure }
    expect(ranksToCheck(unnamed, 3)).toEqual([0, 1, 2])
    expect(deathOrNodeLoss(unnamed, "n2", "alive", 2)).toBe(unnamed)
    const lost = deathOrNodeLoss(unnamed, "n2", "dead", 2)
    expect(lost).toMatchObject({ type: "failed", failure: { kind: "node-lost", rank: 2 } })
    expect(recoveryFor({ type: "failure", failure: (lost as Extract<Outcome, { type: "failed" }>).failure }, "peers", false)).toEqual({ from: "peers" })
    // Only a rank's death is reclassified.
    const loopError: Outcome = { type: "failed", failure: failure({ kind: "loop-error" }).failure }
    expect(deathOrNodeLoss(loopError, "n1", "dead")).toBe(loopError)
  })

  it("names a group that could not start, and the reason a restart's resize gives", () => {
    expect(startFailureKind("SpawnError", true)).toBe("bus")
    expect(startFailureKind("ModuleNotAllowed", false)).toBe("config")
    expect(startFailureKind("EnvNotAllowed", false)).toBe("config")
    expect(startFailureKind("SpawnError", false)).toBe("died")
    expect(restartReason(failure({ kind: "node-lost", message: "node n1 was lost\nx" }))).toBe("lost a node: node n1 was lost")
    expect(restartReason(failure({}))).toBe("died: WorkerDied")
    expect(restartReason(resize)).toBe("room for 4 workers")
  })
})

describe("where a grow's new workers can join (regroup.ts joinsAt)", () => {
  const at = (inFit: boolean, fitLoop: boolean, ops: number) => ({ ops, reports: 2, stepsSinceReport: 0, inFit, epoch: 1, stepInEpoch: inFit ? 9 : 10, stepsPerEpoch: 10, ...(fitLoop ? { fitLoop: true } : {}) })
  it("inside dp.fit(): at the furthest survivor's step", () => {
    expect(joinsAt(at(true, true, 40), [at(true, true, 40), at(true, true, 38)])).toBe(true)
  })
  it("a dp.fit() loop's furthest survivor between two dp.fit() calls, another still in its epoch's last step (asynchronous ranks): not there", () => {
    const ahead = at(false, true, 41)
    expect(joinsAt(ahead, [at(true, true, 39), ahead])).toBe(false)
  })
  it("a hand-written loop outside dp.fit(): at its report() boundary, as before", () => {
    expect(joinsAt(at(false, false, 30), [at(false, false, 30), at(false, false, 30)])).toBe(true)
  })
})
