// The group session's replay of a hand-written trainStep loop on a rank that joins survivors
// (actors/train/worker/group-session.ts): steps the survivors made are skipped, at their position (the
// same report() calls and steps since the last) the rank takes their state and runs the step with
// them, and a loop that gets past that position, or is in dp.fit() where they are not, is refused.
// A step's last operation (ZeRO's all-gather after the update) completes the step when the group breaks under it.
// A request to the parameter servers beside the steps parks for a lost server's regroup and is asked again.
// A pipelined model's joiner is placed by group operations since the last report, and its
// survivors hand over their stages in the pause reply and load only their own stage's files.
// Pure logic: the group and the model are stand-ins that record what the session asked of them.
import { describe, expect, it, vi } from "vitest"
import { GroupSession, PeerRecoveryMisaligned, type LiveGroup, type RecoverableModel } from "../actors/train/worker/group-session.ts"
import type { PeerState, Placement, Position } from "../actors/train/common/train-protocol.ts"
import { PeerLinkLost } from "../collectives/errors.ts"
import { latestAtOrBefore } from "../actors/train/driver/regroup.ts"

const placement = { attempt: 1, rank: 2, worldSize: 3 } as unknown as Placement
const group = { placement, comm: {}, reducer: {} } as unknown as LiveGroup

const at = (reports: number, stepsSinceReport: number, inFit = false): Position => ({
  ops: 40,
  reports,
  stepsSinceReport,
  inFit,
  epoch: inFit ? 1 : 0,
  stepInEpoch: inFit ? 3 : 0,
  stepsPerEpoch: inFit ? 10 : 0
})

/** A rank that is not joining, whose hooks are never used. */
const plainSession = (): GroupSession =>
  new GroupSession(group, {
    build: () => Promise.reject(new Error("unused")),
    close: () => Promise.resolve(),
    parked: () => {},
    fetchState: () => Promise.reject(new Error("unused")),
    log: () => {}
  })

/**
 * A joiner given a checkpoint made after `fromReports` report() calls, bound for `to`, with a model that
 * records adopt() (`model` overrides its other parts); `fetched`: the files each fetch of the state asked for.
 */
const joiner = (fromReports: number, to: Position, model: Partial<RecoverableModel> = {}) => {
  const adopted: PeerState[] = []
  const logged: string[] = []
  const fetched: Array<ReadonlyArray<string> | undefined> = []
  const state = { files: {}, step: 17, position: to } as unknown as PeerState
  const session = new GroupSession(
    group,
    {
      build: () => Promise.reject(new Error("no regroup in these tests")),
      close: () => Promise.resolve(),
      parked: () => {},
      fetchState: (_attempt, files) => {
        fetched.push(files)
        return Promise.resolve(state)
      },
      log: (line) => void logged.push(line)
    },
    { to }
  )
  session.attach({
    snapshot: () => Promise.reject(new Error("not asked")),
    adopt: (s) => {
      adopted.push(s)
      return Promise.resolve()
    },
    regrouped: () => {},
    loopPosition: () => ({ inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 }),
    ...model
  })
  session.resumedFromCheckpoint(fromReports)
  return { session, adopted, logged, fetched, state }
}

describe("a joiner replaying a hand-written trainStep loop", () => {
  it("skips the survivors' steps and reports, then takes their state where they are and runs that step", async () => {
    // The checkpoint is after report 2; the survivors made report 3 and 4 steps since.
    const { session, adopted, logged } = joiner(2, at(3, 4))
    const calls: string[] = []
    const step = async (): Promise<void> => {
      const r = await session.replayStep()
      calls.push(r)
      if (r === "run") session.countStep()
    }
    for (let i = 0; i < 5; i++) await step() // the rest of the epoch after the checkpoint
    expect(session.skipReport(session.reports)).toBe(true) // its report is the survivors' already
    session.reported()
    for (let i = 0; i < 6; i++) await step()
    expect(calls).toEqual([...Array(5).fill("skip"), ...Array(4).fill("skip"), "run", "run"])
    expect(adopted).toHaveLength(1)
    expect(session.joinTarget).toBeUndefined()
    expect(session.ops).toBe(40)
    expect(session.position()).toMatchObject({ reports: 3, stepsSinceReport: 6 })
    expect(logged.join("\n")).toMatch(/joined the survivors after 3 report\(\) calls and 4 steps/)
    // Joined: its reports count again.
    expect(session.skipReport(session.reports)).toBe(false)
  })

  it("counts from the checkpoint its request was given, where that is newer than the regroup's (a survivor's last report came after the regroup formed)", async () => {
    // The regroup chose the checkpoint after report 2; the survivors had made 3 and 1 step since.
    const { session, adopted } = joiner(2, at(3, 1))
    // Its checkpoint request says where the survivors are...
    expect(session.joinAt()).toEqual({ attempt: 1, reports: 3 })
    // ...and is given the checkpoint after report 3 (latestAtOrBefore): it counts from there.
    session.resumedFromCheckpoint(3)
    expect(await session.replayStep()).toBe("skip")
    expect(await session.replayStep()).toBe("run")
    expect(adopted).toHaveLength(1)
    expect(session.joinAt()).toBeUndefined()
  })

  it("a joiner's checkpoint: the latest of the lineage at or before the survivors' report() calls", () => {
    const lineage = new Map([
      ["start", 0],
      ["ckpt-1", 2],
      ["ckpt-3", 5],
      ["ckpt-2", 3]
    ])
    expect(latestAtOrBefore(lineage, 4)).toEqual({ path: "ckpt-2", reports: 3 })
    expect(latestAtOrBefore(lineage, 5)).toEqual({ path: "ckpt-3", reports: 5 })
    expect(latestAtOrBefore(lineage, 9)).toEqual({ path: "ckpt-3", reports: 5 })
    expect(latestAtOrBefore(lineage, 1)).toEqual({ path: "start", reports: 0 })
    expect(latestAtOrBefore(new Map([["ckpt-1", 2]]), 1)).toBeUndefined()
  })

  it("joins at once when the survivors are where its checkpoint is", async () => {
    const { session, adopted } = joiner(2, at(2, 0))
    expect(await session.replayStep()).toBe("run")
    expect(adopted).toHaveLength(1)
  })

  it("refuses a loop that gets past the survivors' position without meeting it", async () => {
    // The loop reports without stepping (a resume bug): report 3 with 0 steps, the survivors at 2 + 5.
    const { session, adopted } = joiner(2, at(2, 5))
    session.reported()
    await expect(session.replayStep()).rejects.toThrow(PeerRecoveryMisaligned)
    await expect(session.replayStep()).rejects.toThrow(/3 report\(\) calls and 0 steps since the last, past the survivors' 2 and 5/)
    expect(adopted).toHaveLength(0)
  })

  it("refuses a trainStep outside dp.fit() when the survivors are inside it", async () => {
    const { session } = joiner(2, at(2, 3, true))
    await expect(session.replayStep()).rejects.toThrow(/outside dp.fit\(\); the survivors are in dp.fit\(\) at epoch 1, step 3 of 10/)
  })

  it("runs every step on a rank that is not joining, and counts steps from its last report", async () => {
    const session = plainSession()
    expect(await session.replayStep()).toBe("run")
    session.countStep()
    session.countStep()
    expect(session.position()).toMatchObject({ reports: 0, stepsSinceReport: 2 })
    session.reported()
    expect(session.position()).toMatchObject({ reports: 1, stepsSinceReport: 0 })
  })
})

/**
 * A survivor whose regroups form at once (a stand-in group), taking `state`: counts its parks and
 * records each adopt()'s options; `model` overrides the stand-in model's parts.
 */
const survivor = (first: LiveGroup, state: PeerState, model: Partial<RecoverableModel> & Pick<RecoverableModel, "loopPosition">, log: (line: string) => void = () => {}) => {
  const closing = { comm: { close: () => Promise.resolve() }, reducer: {} }
  const adopted: Array<{ redoingStep?: boolean }> = []
  const counts = { parked: 0 }
  const session = new GroupSession(first, {
    build: () => Promise.resolve(closing as unknown as Pick<LiveGroup, "comm" | "reducer">),
    close: () => Promise.resolve(),
    parked: () => void counts.parked++,
    fetchState: () => Promise.resolve(state),
    log
  })
  session.attach({
    snapshot: () => Promise.reject(new Error("not asked")),
    adopt: (_s, o) => {
      adopted.push(o ?? {})
      return Promise.resolve()
    },
    regrouped: () => {},
    ...model
  })
  return { session, adopted, counts }
}

describe("a survivor behind the furthest one at a regroup", () => {
  it("takes its state at the operation the other finished, and makes the report that one made already without a parity check", async () => {
    // Rank 1 was in the epoch's metric sum when the bus went down; rank 0 had finished it, made
    // report 2 (its parity check failed with the bus) and was in the next epoch's first step.
    const logged: string[] = []
    const closing = { comm: { close: () => Promise.resolve() }, reducer: {} }
    const first = { placement: { attempt: 1, rank: 1, worldSize: 2 }, ...closing } as unknown as LiveGroup
    const next = { attempt: 2, rank: 1, worldSize: 2 } as unknown as Placement
    const source: Position = { ops: 41, reports: 3, stepsSinceReport: 0, inFit: true, epoch: 3, stepInEpoch: 0, stepsPerEpoch: 23 }
    const { session, adopted, counts } = survivor(
      first,
      { files: {}, step: 40, position: source } as unknown as PeerState,
      { loopPosition: () => ({ inFit: true, epoch: 2, stepInEpoch: 23, stepsPerEpoch: 23 }) },
      (line) => void logged.push(line)
    )
    session.ops = 40
    session.reported()
    session.reported()
    let sum = ""
    const op = session.operation(() => Promise.reject(new Error("the bus went down")), () => (sum = "adopted"))
    await new Promise((r) => setTimeout(r, 10))
    expect(counts.parked).toBe(1)
    expect(await session.pause(2)).toMatchObject({ state: "parked", position: { ops: 40, reports: 2, epoch: 2 } })
    session.resume(next, source)
    await op
    expect(sum).toBe("adopted")
    expect(adopted).toEqual([{ redoingStep: false }])
    expect(session.ops).toBe(41)
    // Report 2 is the survivor's already; report 3 is both ranks' next one.
    expect(session.reportMadeAlready(session.reports)).toBe(true)
    session.reported()
    expect(session.reportMadeAlready(session.reports)).toBe(false)
    expect(logged.join("\n")).toMatch(/made report 2 already/)
  })

  it("a step's last operation (ZeRO's all-gather after the update): a pause waits for the next operation; a group broken under it counts the step as done and hands over the shards", async () => {
    const closing = { comm: { close: () => Promise.resolve() }, reducer: {} }
    const first = { placement: { attempt: 1, rank: 0, worldSize: 3 }, ...closing } as unknown as LiveGroup
    const shards = { "optimizer.shard-0-of-3.msgpack": new Uint8Array([1]) }
    const { session, adopted, counts } = survivor(first, { files: {}, step: 8, position: at(0, 0) } as unknown as PeerState, {
      loopPosition: () => ({ inFit: true, epoch: 1, stepInEpoch: 4, stepsPerEpoch: 10 }),
      peerFiles: () => shards
    })
    session.ops = 20
    session.reported()
    for (let i = 0; i < 4; i++) session.countStep()
    // A grow's pause asked before the last operation: it runs (the group is whole), the next one parks.
    const paused = session.pause(2)
    let ran = 0
    expect(
      await session.operation(
        () => Promise.resolve(++ran),
        () => -1,
        undefined,
        true
      )
    ).toBe(1)
    expect(counts.parked).toBe(0)
    const next = session.operation(() => Promise.resolve("next"), () => "adopted")
    expect(await paused).toMatchObject({ state: "parked", position: { ops: 21, stepsSinceReport: 4, stepInEpoch: 4 }, shards })
    session.resume({ attempt: 2, rank: 0, worldSize: 3 } as unknown as Placement, { ...at(1, 4, true), ops: 21 })
    expect(await next).toBe("next")

    // The group breaks in the last operation: parked as after the step (one more operation, step and step in the epoch).
    const last = session.operation(() => Promise.reject(new Error("a peer died")), () => false, () => true, true)
    await new Promise((r) => setTimeout(r, 10))
    expect(counts.parked).toBe(1)
    expect(await session.pause(3)).toMatchObject({ state: "parked", position: { ops: 23, stepsSinceReport: 5, stepInEpoch: 5 }, shards })
    session.resume({ attempt: 3, rank: 0, worldSize: 2 } as unknown as Placement, { ...at(1, 5, true), ops: 23 })
    // Completed by the regroup: adopted, not redone, and the step counted once.
    expect(await last).toBe(false)
    expect(adopted.at(-1)).toEqual({ redoingStep: false })
    expect(session.ops).toBe(23)
  })

  it("a request to the parameter servers beside the steps (rank 0's checkpoint of their state) parks when a lost server fails it, then asks the new servers; without a pause its error is thrown", async () => {
    const closing = { comm: { close: () => Promise.resolve() }, reducer: {} }
    const first = { placement: { attempt: 1, rank: 0, worldSize: 3 }, ...closing } as unknown as LiveGroup
    const source: Position = { ops: 20, reports: 2, stepsSinceReport: 0, inFit: true, epoch: 2, stepInEpoch: 0, stepsPerEpoch: 10 }
    const { session, adopted, counts } = survivor(first, { files: {}, step: 20, position: source } as unknown as PeerState, {
      loopPosition: () => ({ inFit: true, epoch: 2, stepInEpoch: 0, stepsPerEpoch: 10 })
    })
    session.ops = 20
    const asked: string[] = []
    let servers = "ps0-0,ps0-1"
    // The lost server answers at once ("no responders"); the driver's pause comes a moment later.
    const request = session.serverRequest(async () => {
      asked.push(servers)
      if (servers.includes("ps0-1,")) throw new Error("no responders: ps0-1")
      if (servers === "ps0-0,ps0-1") throw new Error("503 no responders")
      return "state"
    })
    await new Promise((r) => setTimeout(r, 20))
    expect(await session.pause(2)).toMatchObject({ state: "parked", position: { ops: 20 } })
    // (the rank did not report itself parked: the server's loss is the driver's to act on)
    expect(counts.parked).toBe(0)
    servers = "ps0-0,ps0-1-g2"
    session.resume({ attempt: 2, rank: 0, worldSize: 3 } as unknown as Placement, source)
    expect(await request).toBe("state")
    expect(asked).toEqual(["ps0-0,ps0-1", "ps0-0,ps0-1-g2"])
    expect(adopted).toHaveLength(1)
    // Not a group operation: the count stays where the other ranks' is.
    expect(session.ops).toBe(20)

    vi.useFakeTimers()
    try {
      const alone = session.serverRequest(() => Promise.reject(new Error("the state is too large")))
      const failed = expect(alone).rejects.toThrow(/the state is too large/)
      await vi.advanceTimersByTimeAsync(5_000)
      await failed
    } finally {
      vi.useRealTimers()
    }
    expect(counts.parked).toBe(0)
  })

  it("parks again when the new group breaks while it forms (a member dies during its handshake or probe), and joins the regroup after it", async () => {
    const closing = { comm: { close: () => Promise.resolve() }, reducer: {} }
    const first = { placement: { attempt: 1, rank: 0, worldSize: 3 }, ...closing } as unknown as LiveGroup
    const source: Position = { ops: 40, reports: 2, stepsSinceReport: 3, inFit: true, epoch: 2, stepInEpoch: 3, stepsPerEpoch: 10 }
    const built: number[] = []
    const parkedAt: number[] = []
    let session!: GroupSession
    session = new GroupSession(first, {
      build: (p) => {
        built.push(p.attempt)
        // generation 2's probe meets a member that died: its link closed mid-call
        if (p.attempt === 2) return Promise.reject(new PeerLinkLost({ op: "broadcast", group: "g2", rank: 0, peer: 2 }))
        return Promise.resolve(closing as unknown as Pick<LiveGroup, "comm" | "reducer">)
      },
      close: () => Promise.resolve(),
      parked: () => void parkedAt.push(session.placement.attempt),
      fetchState: () => Promise.resolve({ files: {}, step: 40, position: source } as unknown as PeerState),
      log: () => {}
    })
    const adopted: number[] = []
    session.attach({
      snapshot: () => Promise.reject(new Error("not asked")),
      adopt: () => {
        adopted.push(session.placement.attempt)
        return Promise.resolve()
      },
      regrouped: () => {},
      loopPosition: () => ({ inFit: true, epoch: 2, stepInEpoch: 3, stepsPerEpoch: 10 })
    })
    session.ops = 40
    let result = ""
    const op = session.operation(() => Promise.reject(new Error("a member died")), () => (result = "adopted"), () => (result = "again"))
    await new Promise((r) => setTimeout(r, 10))
    expect(await session.pause(2)).toMatchObject({ state: "parked" })
    session.resume({ attempt: 2, rank: 0, worldSize: 3 } as unknown as Placement, source)
    await new Promise((r) => setTimeout(r, 10))
    // the failed formation is reported as generation 2's, and the rank waits for the next regroup
    expect(built).toEqual([2])
    expect(parkedAt).toEqual([1, 2])
    expect(result).toBe("")
    expect(await session.pause(3)).toMatchObject({ state: "parked" })
    session.resume({ attempt: 3, rank: 0, worldSize: 2 } as unknown as Placement, source)
    await op
    expect(built).toEqual([2, 3])
    expect(adopted).toEqual([3])
    expect(session.placement.attempt).toBe(3)
    expect(result).toBe("again")
  })

  it("does not hide a failure to form a group that is not a member lost: the loop fails with it", async () => {
    const closing = { comm: { close: () => Promise.resolve() }, reducer: {} }
    const first = { placement: { attempt: 1, rank: 0, worldSize: 2 }, ...closing } as unknown as LiveGroup
    const source: Position = { ops: 5, reports: 0, stepsSinceReport: 5, inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 }
    const session = new GroupSession(first, {
      build: () => Promise.reject(new TypeError("a bug in building the group")),
      close: () => Promise.resolve(),
      parked: () => {},
      fetchState: () => Promise.reject(new Error("not asked")),
      log: () => {}
    })
    session.attach({
      snapshot: () => Promise.reject(new Error("not asked")),
      adopt: () => Promise.resolve(),
      regrouped: () => {},
      loopPosition: () => ({ inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 })
    })
    const op = session.operation(() => Promise.reject(new Error("a member died")), () => "adopted")
    await new Promise((r) => setTimeout(r, 10))
    await session.pause(2)
    session.resume({ attempt: 2, rank: 0, worldSize: 2 } as unknown as Placement, source)
    await expect(op).rejects.toThrow(/a bug in building the group/)
  })

  it("a grow's pause for a hand-written loop below its size waits for the report() where every rank was asked, one between dp.fit() calls for the next dp.fit() operation; otherwise it pauses at the next operation", async () => {
    const closed: number[] = []
    const loop = { inFit: false }
    const make = (belowSize: boolean, inFit = false, fitUsed = false) => {
      loop.inFit = inFit
      const placement = { attempt: 1, rank: 0, worldSize: 2, ...(belowSize ? { belowSize } : {}) } as unknown as Placement
      const built: number[] = []
      const session = new GroupSession({ placement, comm: { close: () => (closed.push(1), Promise.resolve()) }, reducer: {} } as unknown as LiveGroup, {
        build: (p) => {
          built.push(p.attempt)
          return Promise.resolve({ comm: { close: () => Promise.resolve() }, reducer: {} } as unknown as Pick<LiveGroup, "comm" | "reducer">)
        },
        close: () => Promise.resolve(),
        parked: () => {},
        fetchState: () => Promise.resolve({ files: {}, step: 9, position: at(3, 0) } as unknown as PeerState),
        log: () => {}
      })
      session.attach({
        snapshot: () => Promise.reject(new Error("not asked")),
        adopt: () => Promise.resolve(),
        regrouped: () => {},
        loopPosition: () => ({ inFit: loop.inFit, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 }),
        fitUsed: () => fitUsed
      })
      return { session, built }
    }
    // Below its size: the pause is held; steps go on (nothing closed, the operation runs).
    const { session, built } = make(true)
    let answered: string | undefined
    const paused = session.pause(2, true).then((r) => (answered = r.state))
    expect(await session.operation(() => Promise.resolve("stepped"), () => "adopted")).toBe("stepped")
    expect(closed).toEqual([])
    // A report where the other rank has not been asked yet: no park.
    let gathered: number[] = []
    await session.reportBoundary((flag) => ((gathered = [...flag]), Promise.resolve(Float32Array.of(flag[0]!, 0))))
    expect(gathered).toEqual([1])
    expect(answered).toBeUndefined()
    // The next report, every rank asked: parks there, answers the pause, joins the new generation.
    session.reported()
    const boundary = session.reportBoundary((flag) => Promise.resolve(Float32Array.of(flag[0]!, 1)))
    await paused
    expect(answered).toBe("parked")
    expect(session.position()).toMatchObject({ stepsSinceReport: 0, reports: 1 })
    session.resume({ attempt: 2, rank: 0, worldSize: 3 } as unknown as Placement, at(1, 0))
    await boundary
    expect(built).toEqual([2])
    // Between a loop's dp.fit() calls (its evaluation, its report): the pause is held, operations
    // there run, and it parks at the first operation back in dp.fit(), where a joiner can join.
    const between = make(true, false, true)
    closed.length = 0
    let held: string | undefined
    const heldPause = between.session.pause(2, true).then((r) => (held = r.state))
    expect(await between.session.operation(() => Promise.resolve("evaluated"), () => "adopted")).toBe("evaluated")
    await new Promise((r) => setTimeout(r, 10))
    expect(closed).toEqual([])
    expect(held).toBeUndefined()
    loop.inFit = true
    let ran = 0
    const inFit = between.session.operation(() => (ran++, Promise.resolve("stepped")), () => "adopted")
    await heldPause
    expect(held).toBe("parked")
    expect(ran).toBe(0)
    expect(between.session.position()).toMatchObject({ inFit: true })
    between.session.resume({ attempt: 2, rank: 0, worldSize: 3 } as unknown as Placement, at(0, 0))
    expect(await inFit).toBe("stepped")
    // Not below its size, or in dp.fit(): the same pause stops the next operation (the old group closed).
    for (const [below, inFit, fitUsed] of [[false, false, false], [true, true, true]] as const) {
      const other = make(below, inFit, fitUsed)
      closed.length = 0
      let state: string | undefined
      void other.session.pause(2, true).then((r) => (state = r.state))
      await new Promise((r) => setTimeout(r, 10))
      expect(closed).toEqual([1])
      const op = other.session.operation(() => Promise.resolve("stepped"), () => "adopted")
      await new Promise((r) => setTimeout(r, 10))
      expect(state).toBe("parked")
      other.session.resume({ attempt: 2, rank: 0, worldSize: 3 } as unknown as Placement, at(0, 0))
      expect(await op).toBe("stepped")
    }
  })

  it("checks parity at every report when it was level with the furthest survivor", async () => {
    const session = plainSession()
    for (let i = 0; i < 3; i++) {
      expect(session.reportMadeAlready(session.reports)).toBe(false)
      session.reported()
    }
  })
})

describe("a pipelined model's regroup (its joiners placed by group operations, its stage handed over)", () => {
  it("a joiner skips the survivors' operations, steps and others alike, and takes their state (its stage's files, fetched once) at the operation they are in", async () => {
    // The survivors are in the second operation after report 3: a step done, an epoch sum in flight.
    const to: Position = { ...at(3, 1), opsSinceReport: 1 }
    const { session, adopted, fetched, state } = joiner(2, to, { stateFiles: () => ["not fetched again"] })
    // As its loop builds its stage (before the replay): the layout and its stage's shard of the held state.
    expect(await session.joinState(["pipeline/layout.json", "pipeline/stage-1-of-2.tp-0-of-1.msgpack"])).toBe(state)
    const calls: string[] = []
    // the rest of the epoch after the checkpoint: 2 steps and an epoch sum, then report 2
    for (const step of [true, true, false]) calls.push(await session.replayOperation(step))
    session.reported()
    // after report 3: one step (skipped), then the epoch sum the survivors are in (run)
    calls.push(await session.replayOperation(true))
    calls.push(await session.replayOperation(false))
    expect(calls).toEqual(["skip", "skip", "skip", "skip", "run"])
    expect(adopted).toEqual([state])
    expect(fetched).toEqual([["pipeline/layout.json", "pipeline/stage-1-of-2.tp-0-of-1.msgpack"]])
    expect(session.joinTarget).toBeUndefined()
    expect(session.ops).toBe(40)
    expect(session.opsSinceReport).toBe(1)
    expect(session.stepsSinceReport).toBe(1)
  })

  it("refuses a joiner that gets past the survivors' operation", async () => {
    const to: Position = { ...at(0, 0), opsSinceReport: 1 }
    const { session } = joiner(0, to)
    expect(await session.replayOperation(true)).toBe("skip")
    session.reported()
    await expect(session.replayOperation(true)).rejects.toBeInstanceOf(PeerRecoveryMisaligned)
  })

  it("a parked survivor says what it holds of its stage in its pause reply, answers a pause asked again while it made it, and loads only its stage's files", async () => {
    const closing = { comm: { close: () => Promise.resolve() }, reducer: {} }
    const first = { placement: { attempt: 1, rank: 1, worldSize: 4 }, ...closing } as unknown as LiveGroup
    const fetched: Array<ReadonlyArray<string> | undefined> = []
    const source: Position = { ops: 12, reports: 1, stepsSinceReport: 2, opsSinceReport: 2, inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 }
    const session = new GroupSession(first, {
      build: () => Promise.resolve(closing as unknown as Pick<LiveGroup, "comm" | "reducer">),
      close: () => Promise.resolve(),
      parked: () => {},
      fetchState: (_attempt, files) => {
        fetched.push(files)
        return Promise.resolve({ files: {}, step: 0, position: source } as unknown as PeerState)
      },
      log: () => {}
    })
    let handOver!: () => void
    const handover = { step: 9, holds: ["pipeline/stage-1-of-2.tp-0-of-1.msgpack"], needs: [] }
    const interrupted: string[] = []
    session.attach({
      snapshot: () => Promise.reject(new Error("not asked")),
      adopt: () => Promise.resolve(),
      regrouped: () => void interrupted.push("regrouped"),
      loopPosition: () => ({ inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0, wholeGroup: "a grid" }),
      stageHandover: () => new Promise((resolve) => (handOver = () => resolve(handover))),
      interrupt: () => void interrupted.push("interrupted"),
      stateFiles: () => ["pipeline/layout.json", "pipeline/stage-1-of-2.tp-0-of-1.msgpack"]
    })
    session.ops = 11
    let runs = 0
    const op = session.operation(
      () => (++runs === 1 ? Promise.reject(new PeerLinkLost({ op: "broadcast", group: "g1", rank: 1, peer: 3 })) : Promise.resolve("stepped")),
      () => "adopted"
    )
    await new Promise((r) => setTimeout(r, 10))
    const asked = session.pause(2)
    await new Promise((r) => setTimeout(r, 10))
    // asked again (the first reply lost) while the stage is still being read
    const again = session.pause(2)
    handOver()
    const [a, b] = await Promise.all([asked, again])
    for (const reply of [a, b]) expect(reply).toMatchObject({ state: "parked", stage: handover, position: { wholeGroup: "a grid", opsSinceReport: 0 } })
    expect(interrupted).toEqual(["interrupted"])
    session.resume({ attempt: 2, rank: 1, worldSize: 4 } as unknown as Placement, source)
    // behind the furthest survivor: the step is done (adopted), at the survivor's operations
    expect(await op).toBe("adopted")
    expect(fetched).toEqual([["pipeline/layout.json", "pipeline/stage-1-of-2.tp-0-of-1.msgpack"]])
    expect(session.ops).toBe(12)
    expect(session.opsSinceReport).toBe(2)
    expect(interrupted).toEqual(["interrupted", "regrouped"])
  })
})
