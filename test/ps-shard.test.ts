// The parameter-server shard (actors/train/parameter-server/shard.ts), as pure logic: sync steps equal one
// optimizer step on the weighted mean gradient and release every pusher together, never early;
// backup workers' late gradients are dropped; async applies each gradient on its own and reports
// its staleness; ssp holds a worker more than `staleness` steps ahead of the slowest until the
// slowest pushes or finishes; state()/load() continue a run exactly; abort() rejects what waits;
// bad input is a ConfigError saying what is wrong. Last, random interleavings of worker loops in
// every mode all run to the end (nothing waits forever) within the modes' rules.
import { describe, expect, it } from "vitest"
import { ConfigError } from "../core/errors.ts"
import { seededRng, type Rng } from "../core/random.ts"
import { decodeMessage, encodeMessage } from "../core/wire.ts"
import { createFlatOptimizer, type FlatOptimizerSpec } from "../actors/train/common/optim/flat-optimizers.ts"
import { ShardAbortedError, ShardServer, type PsMode, type PushResult, type ShardServerOptions, type ShardServerState } from "../actors/train/parameter-server/shard.ts"

const N = 37
const SGD: FlatOptimizerSpec = { kind: "sgd", learningRate: 0.1 }
const ADAM: FlatOptimizerSpec = { kind: "adam", learningRate: 0.01 }

const values = (rng: Rng, n = N): Float32Array => {
  const a = new Float32Array(n)
  for (let i = 0; i < n; i++) a[i] = rng() * 2 - 1
  return a
}

/** The weighted mean as the shard forms it: float32 sum of w_i g_i, times 1 / sum w_i. */
const weightedMean = (grads: readonly Float32Array[], weights: readonly number[]): Float32Array => {
  const out = new Float32Array(grads[0].length)
  grads.forEach((g, k) => {
    for (let i = 0; i < out.length; i++) out[i] += weights[k] * g[i]
  })
  const inv = 1 / weights.reduce((a, b) => a + b, 0)
  for (let i = 0; i < out.length; i++) out[i] *= inv
  return out
}

const server = (params: Float32Array, o: Partial<ShardServerOptions> & { mode: PsMode; numWorkers: number }): ShardServer =>
  new ShardServer(params, { staleness: 0, backupWorkers: 0, spec: SGD, ...o })

/** Lets every pending promise callback run. */
const flush = (): Promise<void> => new Promise((r) => setImmediate(r))

/** A push's promise with a flag saying whether it has resolved yet. */
const tracked = (p: Promise<PushResult>): { readonly promise: Promise<PushResult>; readonly done: () => boolean } => {
  let done = false
  const promise = p.then((r) => {
    done = true
    return r
  })
  return { promise, done: () => done }
}

const expectClose = (a: Float32Array, b: Float32Array, tol = 1e-6): void => {
  expect(a.length).toBe(b.length)
  for (let i = 0; i < a.length; i++) expect(Math.abs(a[i] - b[i]), `element ${i}: ${a[i]} vs ${b[i]}`).toBeLessThanOrEqual(tol * Math.max(1, Math.abs(b[i])))
}

describe("ShardServer sync", () => {
  for (const spec of [SGD, ADAM]) {
    it(`${spec.kind}: each step is one optimizer step on the weighted mean, released together and never early`, async () => {
      const rng = seededRng(1)
      const init = values(rng)
      const s = server(init, { mode: "sync", numWorkers: 3, spec })
      const ref = createFlatOptimizer(spec, N)
      const expected = init.slice()
      for (let step = 0; step < 3; step++) {
        const grads = [values(rng), values(rng), values(rng)]
        const weights = [1, 2, 5]
        const a = tracked(s.push(0, step, step, grads[0], weights[0]))
        await flush()
        const b = tracked(s.push(1, step, step, grads[1], weights[1]))
        await flush()
        expect(a.done(), "worker 0 resolved before worker 2 pushed").toBe(false)
        expect(b.done(), "worker 1 resolved before worker 2 pushed").toBe(false)
        expect(s.stats().pending).toBe(2)
        const c = tracked(s.push(2, step, step, grads[2], weights[2]))
        const [ra, rb, rc] = await Promise.all([a.promise, b.promise, c.promise])
        ref.step(expected, weightedMean(grads, weights))
        for (const r of [ra, rb, rc]) {
          expect(r.version).toBe(step + 1)
          expect(r.dropped).toBe(false)
          expect(r.staleness).toBe(0)
          expect(Array.from(r.params)).toEqual(Array.from(ra.params))
        }
        expectClose(ra.params, expected)
        expect(s.pull().version).toBe(step + 1)
      }
      const st = s.stats()
      expect(st).toMatchObject({ version: 3, updates: 3, received: 9, applied: 9, dropped: 0, maxStaleness: 0, pending: 0, waits: 6 })
    })
  }

  it("the results' parameters are a snapshot: later updates do not change them", async () => {
    const s = server(new Float32Array(N).fill(1), { mode: "sync", numWorkers: 1 })
    const r0 = await s.push(0, 0, 0, new Float32Array(N).fill(1), 1)
    const kept = r0.params.slice()
    await s.push(0, 1, 1, new Float32Array(N).fill(1), 1)
    expect(Array.from(r0.params)).toEqual(Array.from(kept))
    expect(s.pull().params[0]).toBeCloseTo(0.8, 6)
  })

  it("with backup workers: the first N - b gradients are applied, the late one dropped; the next step works", async () => {
    const rng = seededRng(2)
    const init = values(rng)
    const s = server(init, { mode: "sync", numWorkers: 3, backupWorkers: 1 })
    const ref = createFlatOptimizer(SGD, N)
    const expected = init.slice()
    const g = [values(rng), values(rng), values(rng)]

    const a = tracked(s.push(2, 0, 0, g[2], 3))
    await flush()
    expect(a.done()).toBe(false)
    const b = s.push(0, 0, 0, g[0], 1)
    const [ra, rb] = await Promise.all([a.promise, b])
    ref.step(expected, weightedMean([g[2], g[0]], [3, 1]))
    expect(ra.version).toBe(1)
    expect(rb.version).toBe(1)
    expect(ra.dropped || rb.dropped).toBe(false)
    expectClose(ra.params, expected)

    // The third gradient of step 0 arrives after the quota: dropped, answered at once with the
    // current parameters, and it changes nothing.
    const late = tracked(s.push(1, 0, 0, values(rng), 100))
    await flush()
    expect(late.done()).toBe(true)
    const rl = await late.promise
    expect(rl).toMatchObject({ dropped: true, version: 1, staleness: 1 })
    expectClose(rl.params, expected)

    // Step 1: the previously late worker is among the first two this time.
    const g1 = [values(rng), values(rng), values(rng)]
    const p1 = s.push(1, 1, 1, g1[1], 2)
    const p0 = s.push(0, 1, 1, g1[0], 4)
    const [r1, r0] = await Promise.all([p1, p0])
    ref.step(expected, weightedMean([g1[1], g1[0]], [2, 4]))
    expect(r1.version).toBe(2)
    expectClose(r0.params, expected)
    const r2 = await s.push(2, 1, 1, g1[2], 1)
    expect(r2).toMatchObject({ dropped: true, version: 2 })
    expect(s.stats()).toMatchObject({ updates: 2, applied: 4, dropped: 2, received: 6 })
  })

  it("with backup workers and unequal batches (stepWeight): the quota is also (N - b) / N of the step's samples", async () => {
    // Two workers, one backup, a global batch of 128 split 127 / 1 (adaptive batching).
    const rng = seededRng(12)
    const init = values(rng)
    const s = server(init, { mode: "sync", numWorkers: 2, backupWorkers: 1 })
    const ref = createFlatOptimizer(SGD, N)
    const expected = init.slice()
    // Step 0: the one-row gradient comes first; alone it is 1 of the 64 samples the step needs.
    const g0 = [values(rng), values(rng)]
    const small = tracked(s.push(1, 0, 0, g0[1], 1, undefined, 128))
    await flush()
    expect(small.done()).toBe(false)
    const big = s.push(0, 0, 0, g0[0], 127, undefined, 128)
    const [rs, rb] = await Promise.all([small.promise, big])
    ref.step(expected, weightedMean([g0[0], g0[1]], [127, 1]))
    expect([rs.dropped, rb.dropped, rb.version]).toEqual([false, false, 1])
    expectClose(rb.params, expected)
    // Step 1: the large one first makes the step alone; the one-row gradient is late and dropped.
    const g1 = [values(rng), values(rng)]
    const r0 = await s.push(0, 1, 1, g1[0], 127, undefined, 128)
    ref.step(expected, weightedMean([g1[0]], [127]))
    expect(r0).toMatchObject({ dropped: false, version: 2 })
    expectClose(r0.params, expected)
    expect(await s.push(1, 1, 1, g1[1], 1, undefined, 128)).toMatchObject({ dropped: true, version: 2 })
    // Equal batches: the count quota as before (the first of two makes the step).
    const r = await s.push(1, 2, 2, values(rng), 64, undefined, 128)
    expect(r).toMatchObject({ dropped: false, version: 3 })
    // A step's total below the gradient's own weight is refused, and nothing changes.
    await expect(s.push(0, 3, 3, values(rng), 64, undefined, 32)).rejects.toThrow(/ps\.stepWeight.*>= this gradient's weight/)
    expect(s.version).toBe(3)
  })

  it("a gradient of an older step than the one collecting is dropped too", async () => {
    const s = server(new Float32Array(N), { mode: "sync", numWorkers: 3, backupWorkers: 1 })
    await Promise.all([s.push(0, 0, 0, values(seededRng(3)), 1), s.push(1, 0, 0, values(seededRng(4)), 1)])
    const pending = tracked(s.push(0, 1, 1, values(seededRng(5)), 1))
    const old = await s.push(2, 0, 0, values(seededRng(6)), 1)
    expect(old).toMatchObject({ dropped: true, version: 1 })
    await flush()
    expect(pending.done()).toBe(false)
    expect((await Promise.all([pending.promise, s.push(1, 1, 1, values(seededRng(7)), 1)]))[0].version).toBe(2)
  })

  it("finish() releases a step once every running worker has pushed it, keeping the finished one's gradient", async () => {
    const rng = seededRng(8)
    const init = values(rng)
    const ref = createFlatOptimizer(SGD, N)
    const expected = init.slice()
    const s = server(init, { mode: "sync", numWorkers: 3 })
    const g = [values(rng), values(rng)]
    const a = tracked(s.push(0, 0, 0, g[0], 1))
    const b = tracked(s.push(1, 0, 0, g[1], 3))
    await flush()
    expect(a.done() || b.done()).toBe(false)
    s.finish(2)
    const [ra] = await Promise.all([a.promise, b.promise])
    ref.step(expected, weightedMean(g, [1, 3]))
    expect(ra.version).toBe(1)
    expectClose(ra.params, expected)

    // Worker 0 has pushed step 1 and then leaves (it crashed): worker 1 is still to push step 1,
    // so the step waits for it and then uses both gradients.
    const g1 = [values(rng), values(rng)]
    const c = tracked(s.push(0, 1, 1, g1[0], 1))
    s.finish(0)
    await flush()
    expect(c.done()).toBe(false)
    const rd = await s.push(1, 1, 1, g1[1], 1)
    ref.step(expected, weightedMean(g1, [1, 1]))
    expectClose(rd.params, expected)
    expect((await c.promise).version).toBe(2)
  })

  it("with backup workers, finish() of the others releases a step below its quota", async () => {
    const s = server(new Float32Array(N), { mode: "sync", numWorkers: 4, backupWorkers: 1 })
    const a = tracked(s.push(0, 0, 0, new Float32Array(N).fill(2), 1))
    s.finish(1)
    s.finish(2)
    await flush()
    expect(a.done()).toBe(false)
    s.finish(3)
    const r = await a.promise
    expect(r.version).toBe(1)
    expect(r.params[0]).toBeCloseTo(-0.2, 6)
  })

  it("with backup workers, away() of the others releases a step below its quota, and an away worker counts again from its next push", async () => {
    // Three workers, one backup: a step needs two gradients. Workers 0 and 2 are away (in a
    // decision round outside the servers) while worker 1, behind them, pushes step 4 alone.
    const s = server(new Float32Array(N), { mode: "sync", numWorkers: 3, backupWorkers: 1 })
    for (let step = 0; step < 4; step++) await Promise.all([s.push(0, step, step, new Float32Array(N).fill(1), 1), s.push(2, step, step, new Float32Array(N).fill(1), 1)])
    s.away(0)
    const late = tracked(s.push(1, 4, 4, new Float32Array(N).fill(2), 1))
    await flush()
    expect(late.done()).toBe(false)
    s.away(2)
    s.away(2) // idempotent
    const r = await late.promise
    expect(r).toMatchObject({ version: 5, dropped: false })
    // SGD 0.1: four steps on 1, then one on worker 1's 2 alone.
    expect(r.params[0]).toBeCloseTo(-0.6, 6)
    // Worker 0 is back (its push clears the mark): step 5 waits for a second gradient again.
    const back = tracked(s.push(0, 5, 5, new Float32Array(N).fill(1), 1))
    await flush()
    expect(back.done()).toBe(false)
    const r1 = await s.push(1, 5, 5, new Float32Array(N).fill(3), 1)
    expect(r1.version).toBe(6)
    expect((await back.promise).params[0]).toBeCloseTo(-0.8, 6)
    // Worker 2, still away, is not waited for but its late gradient of an applied step is dropped.
    expect((await s.push(2, 5, 5, new Float32Array(N).fill(1), 1)).dropped).toBe(true)
  })
})

describe("ShardServer async", () => {
  it("applies each gradient at once on its own (weight ignored) and reports its staleness", async () => {
    const rng = seededRng(10)
    const init = values(rng)
    const s = server(init, { mode: "async", numWorkers: 2, spec: ADAM })
    const ref = createFlatOptimizer(ADAM, N)
    const expected = init.slice()
    const g = [values(rng), values(rng), values(rng), values(rng)]

    const a = tracked(s.push(0, 0, 0, g[0], 7))
    await flush()
    expect(a.done()).toBe(true)
    ref.step(expected, g[0])
    expect(await a.promise).toMatchObject({ version: 1, staleness: 0, dropped: false })
    expectClose((await a.promise).params, expected)

    // Worker 1 computed on version 0: one update went in since.
    const b = await s.push(1, 0, 0, g[1], 1)
    ref.step(expected, g[1])
    expect(b).toMatchObject({ version: 2, staleness: 1 })
    expectClose(b.params, expected)

    // Worker 0 continues from version 1 (what it got): stale by 1; then worker 1 from version 2 after
    // another push: stale by 1 again; a fresh push: 0.
    expect((await s.push(0, 1, 1, g[2], 1)).staleness).toBe(1)
    ref.step(expected, g[2])
    const d = await s.push(0, 2, 3, g[3], 1)
    ref.step(expected, g[3])
    expect(d).toMatchObject({ version: 4, staleness: 0 })
    expectClose(d.params, expected)
    expect(s.stats()).toMatchObject({ updates: 4, applied: 4, maxStaleness: 1, meanStaleness: 0.5, waits: 0 })
  })

  for (const mode of ["async", "ssp"] as const) {
    it(`${mode}: a step the worker pushed already is dropped (the current parameters, nothing applied), not refused`, async () => {
      const s = server(new Float32Array(N), { mode, numWorkers: 1 })
      const g = new Float32Array(N).fill(1)
      expect(await s.push(0, 5, 0, g, 1)).toMatchObject({ version: 1, dropped: false })
      const again = await s.push(0, 5, 1, g, 1)
      expect(again).toMatchObject({ version: 1, dropped: true, staleness: 0 })
      expect(again.params[0]).toBeCloseTo(-0.1, 6)
      expect(await s.push(0, 3, 1, g, 1)).toMatchObject({ version: 1, dropped: true })
      expect(await s.push(0, 6, 1, g, 1)).toMatchObject({ version: 2, dropped: false })
      expect(s.stats()).toMatchObject({ updates: 2, dropped: 2, received: 4 })
    })
  }

  it("a push's learning rate is used from that update on", async () => {
    const s = server(new Float32Array(N), { mode: "async", numWorkers: 1 })
    const g = new Float32Array(N).fill(1)
    expect((await s.push(0, 0, 0, g, 1, 0.5)).params[0]).toBeCloseTo(-0.5, 6)
    expect((await s.push(0, 1, 1, g, 1)).params[0]).toBeCloseTo(-1, 6)
    expect(s.state().learningRate).toBe(0.5)
  })
})

describe("ShardServer ssp", () => {
  it("a worker staleness + 1 steps ahead of the slowest waits for it; one staleness ahead does not; finish() releases", async () => {
    let clock = 0
    const s = server(new Float32Array(N), { mode: "ssp", numWorkers: 2, staleness: 2, now: () => clock })
    const g = new Float32Array(N).fill(1)
    // Worker 0 runs ahead: after steps 0 and 1 it is 1, then 2 steps ahead of worker 1 (clock 0): no wait.
    expect((await s.push(0, 0, 0, g, 1)).version).toBe(1)
    expect((await s.push(0, 1, 1, g, 1)).version).toBe(2)
    // Step 2 would put it 3 ahead: it waits (its gradient is applied already).
    const w = tracked(s.push(0, 2, 2, g, 1))
    await flush()
    expect(w.done()).toBe(false)
    expect(s.pull().version).toBe(3)
    clock = 40
    // The slowest pushes its step 0: worker 0 is now 2 ahead and goes on, with the newest parameters.
    const slow = await s.push(1, 0, 0, g, 1)
    expect(slow).toMatchObject({ version: 4, staleness: 3 })
    const rw = await w.promise
    expect(rw.version).toBe(4)
    expect(rw.staleness).toBe(0)
    expect(s.stats()).toMatchObject({ waits: 1, waitMs: 40 })

    // Ahead again; the slow worker's loop ends instead of pushing: finish() releases.
    const w2 = tracked(s.push(0, 3, 4, g, 1))
    await flush()
    expect(w2.done()).toBe(false)
    clock = 45
    s.finish(1)
    expect((await w2.promise).version).toBe(5)
    expect(s.workerStats()).toEqual([
      { worker: 0, clock: 4, finished: false, waits: 2, waitMs: 45 },
      { worker: 1, clock: 1, finished: true, waits: 0, waitMs: 0 }
    ])
  })

  it("staleness 0: each worker waits until every worker has pushed its step", async () => {
    const s = server(new Float32Array(N), { mode: "ssp", numWorkers: 3, staleness: 0 })
    const g = new Float32Array(N)
    const a = tracked(s.push(0, 0, 0, g, 1))
    const b = tracked(s.push(1, 0, 0, g, 1))
    await flush()
    expect(a.done() || b.done()).toBe(false)
    const c = await s.push(2, 0, 0, g, 1)
    expect(c.version).toBe(3)
    expect((await a.promise).version).toBe(3)
    expect((await b.promise).version).toBe(3)
  })
})

describe("ShardServer state, abort, errors", () => {
  it("state() / load() continue identically, also through the wire encoding", async () => {
    const rng = seededRng(20)
    const init = values(rng)
    const opts = { mode: "sync", numWorkers: 2, spec: ADAM, weightDecay: 0.01 } as const
    const a = server(init, opts)
    for (let step = 0; step < 3; step++) await Promise.all([a.push(0, step, step, values(rng), 1, 0.02), a.push(1, step, step, values(rng), 2)])
    const saved = a.state()
    // b: the same workers continue (clocks kept); c: a resumed run through a checkpoint file
    // (the wire encoding), whose workers start again at the checkpoint's step.
    const b = server(values(rng), opts)
    b.load(saved, { workers: "continue" })
    const c = server(new Float32Array(N), opts)
    c.load(decodeMessage(encodeMessage(saved)) as ShardServerState)
    expect(b.pull().version).toBe(3)
    expect(c.pull().version).toBe(3)
    expect(b.state()).toMatchObject({ clocks: [3, 3], lastAppliedStep: 2 })
    expect(c.state()).toMatchObject({ clocks: [0, 0], lastAppliedStep: -1 })

    for (let step = 3; step < 5; step++) {
      const g = [values(rng), values(rng)]
      const results = await Promise.all(
        [a, b, c].map((s) => Promise.all([s.push(0, step, step, g[0], 1), s.push(1, step, step, g[1], 2)]).then((r) => r[0]))
      )
      expect(results.map((r) => r.version)).toEqual([step + 1, step + 1, step + 1])
      expect(Array.from(results[1].params)).toEqual(Array.from(results[0].params))
      expect(Array.from(results[2].params)).toEqual(Array.from(results[0].params))
    }
    // The saved state was a copy: the run went on without changing it.
    expect(saved.version).toBe(3)
    expect(Array.from(saved.params)).not.toEqual(Array.from(a.pull().params))
  })

  it("load() restarting the workers takes a worker that had pushed past the checkpoint's step; continuing refuses it", async () => {
    const s = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    const g = new Float32Array(N).fill(1)
    await Promise.all([s.push(0, 0, 0, g, 1), s.push(1, 0, 0, g, 1)])
    const ahead = s.push(1, 1, 1, g, 1) // worker 1 pushed step 1 before the checkpoint was taken
    const saved = s.state()
    expect(saved.clocks).toEqual([1, 2])
    s.abort("the run is stopped")
    await expect(ahead).rejects.toThrow(ShardAbortedError)

    // The run resumes at step 1 (the checkpoint's), every worker from there.
    const r = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    r.load(saved)
    const [r0, r1] = await Promise.all([r.push(0, 1, 1, g, 1), r.push(1, 1, 1, g, 1)])
    expect(r0).toMatchObject({ version: 2, dropped: false })
    expect(Array.from(r1.params)).toEqual(Array.from(r0.params))
    expect(r0.params[0]).toBeCloseTo(-0.2, 6)

    const k = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    k.load(saved, { workers: "continue" })
    await expect(k.push(1, 1, 1, g, 1)).rejects.toThrow(/worker 1 pushed step 1 after step 1/)

    // Restarting, the saved clocks need not match the number of workers (another world size).
    const three = server(new Float32Array(N), { mode: "sync", numWorkers: 3 })
    three.load(saved)
    expect(three.state().clocks).toEqual([0, 0, 0])
    expect(() => three.load(saved, { workers: "continue" })).toThrow(/one clock per worker \(3\)/)
  })

  it("a replica fed every update through onUpdate (encoded, as between servers) stays bit for bit its primary, in sync with backup workers and in async", async () => {
    for (const mode of ["sync", "async"] as const) {
      const rng = seededRng(mode === "sync" ? 31 : 32)
      const init = values(rng)
      const opts = { mode, numWorkers: 3, spec: ADAM, weightDecay: 0.01, ...(mode === "sync" ? { backupWorkers: 1 } : {}) } as const
      const sent: Uint8Array[] = []
      const primary = server(init, { ...opts, onUpdate: (grad, learningRate, step) => sent.push(encodeMessage({ grad, learningRate, step })) })
      const replica = server(init, opts)
      // The replica takes each update as it arrives, before the pushes it resolved are answered.
      const replay = (): void => {
        for (const m of sent.splice(0)) {
          const u = decodeMessage(m) as { grad: Float32Array; learningRate: number; step: number }
          replica.replay(u.grad, u.learningRate, u.step)
        }
      }
      for (let step = 0; step < 6; step++) {
        // (a learning rate that changes at step 3; in sync the third gradient of each step comes late)
        const pushes = [0, 1, 2].map((w) => primary.push(w, step, primary.version, values(rng), 1 + w, step === 3 ? 0.005 : undefined))
        replay()
        await Promise.all(pushes)
      }
      const a = primary.state()
      const b = replica.state()
      expect(b.version).toBe(a.version)
      expect(a.version).toBe(mode === "sync" ? 6 : 18)
      expect(b.learningRate).toBe(a.learningRate)
      expect(Array.from(b.params)).toEqual(Array.from(a.params))
      for (const [k, v] of Object.entries(a.optimizer.slots)) expect(Array.from(b.optimizer.slots[k]!), k).toEqual(Array.from(v))
      expect(b.optimizer.scalars).toEqual(a.optimizer.scalars)
      if (mode === "sync") expect(b.lastAppliedStep).toBe(5)
    }
    expect(() => server(new Float32Array(N), { mode: "sync", numWorkers: 1 }).replay(new Float32Array(3), 0.1, 0)).toThrow(/this shard's 37 elements/)
  })

  it("load() of regrouped workers keeps the last sync step applied: a step pushed again is dropped there, and collected where it was not applied", async () => {
    const g = new Float32Array(N).fill(1)
    const ahead = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    const behind = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    await Promise.all([0, 1].map((w) => ahead.push(w, 0, 0, g, 1)))
    await Promise.all([0, 1].map((w) => ahead.push(w, 1, 1, g, 1)))
    await Promise.all([0, 1].map((w) => behind.push(w, 0, 0, g, 1)))
    // Both shards regrouped; the workers push step 1 again (its answers were lost with a server).
    const a = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    a.load(ahead.state(), { workers: "regrouped" })
    const b = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    b.load(behind.state(), { workers: "regrouped" })
    const ra = await Promise.all([0, 1].map((w) => a.push(w, 1, 1, g, 1)))
    expect(ra.map((r) => [r.version, r.dropped])).toEqual([[2, true], [2, true]])
    const rb = await Promise.all([0, 1].map((w) => b.push(w, 1, 1, g, 1)))
    expect(rb.map((r) => [r.version, r.dropped])).toEqual([[2, false], [2, false]])
    // Both shards at the same parameters again; the next step is collected on both.
    expect(Array.from(b.pull().params)).toEqual(Array.from(a.pull().params))
    const next = await Promise.all([a, b].map((s) => Promise.all([0, 1].map((w) => s.push(w, 2, 2, g, 1)))))
    expect(next.map((r) => r[0]!.version)).toEqual([3, 3])
    // A restarting load forgets it: the step pushed again would be applied twice.
    const r = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    r.load(ahead.state())
    expect((await Promise.all([0, 1].map((w) => r.push(w, 1, 1, g, 1))))[0]).toMatchObject({ version: 3, dropped: false })
  })

  it("load() refuses a state that does not fit, or while pushes wait, changing nothing", async () => {
    const s = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    const good = s.state()
    expect(() => s.load({ ...good, params: new Float32Array(N + 1) })).toThrow(/38|37 elements/)
    expect(() => s.load({ ...good, clocks: [0] }, { workers: "continue" })).toThrow(/one clock per worker \(2\)/)
    expect(() => s.load({ ...good, lastAppliedStep: -2 }, { workers: "continue" })).toThrow(/lastAppliedStep/)
    expect(() => s.load({ ...good, optimizer: { kind: "adam", slots: {}, scalars: {} } })).toThrow(ConfigError)
    expect(() => s.load({ ...good, version: -1 })).toThrow(ConfigError)
    expect(s.state()).toEqual(good)
    const p = s.push(0, 0, 0, new Float32Array(N), 1)
    expect(() => s.load(good)).toThrow(/1 push\(es\) wait/)
    s.abort("test over")
    await expect(p).rejects.toThrow(ShardAbortedError)
  })

  it("abort() rejects every waiting push, and every later one at once", async () => {
    const sync = server(new Float32Array(N), { mode: "sync", numWorkers: 3 })
    const p1 = sync.push(0, 0, 0, new Float32Array(N), 1)
    const p2 = sync.push(1, 0, 0, new Float32Array(N), 1)
    sync.abort("shutting down")
    await expect(p1).rejects.toThrow(/shut down: shutting down/)
    await expect(p2).rejects.toBeInstanceOf(ShardAbortedError)
    await expect(sync.push(2, 0, 0, new Float32Array(N), 1)).rejects.toThrow(ShardAbortedError)
    expect(sync.stats().pending).toBe(0)
    expect(sync.pull().version).toBe(0)
    sync.finish(2) // still allowed, a no-op for waits

    const ssp = server(new Float32Array(N), { mode: "ssp", numWorkers: 2, staleness: 0 })
    const p3 = ssp.push(0, 0, 0, new Float32Array(N), 1)
    const reason = new Error("node lost")
    ssp.abort(reason)
    ssp.abort("second call keeps the first reason")
    await expect(p3).rejects.toBe(reason)
    await expect(ssp.push(1, 0, 0, new Float32Array(N), 1)).rejects.toBe(reason)
    expect(ssp.isAborted).toBe(true)
  })

  it("bad input is a ConfigError saying what is wrong, and changes nothing", async () => {
    const s = server(new Float32Array(N), { mode: "sync", numWorkers: 2 })
    const g = new Float32Array(N)
    const bad = async (p: Promise<unknown>, re: RegExp): Promise<void> => {
      const e = await p.then(
        () => undefined,
        (x: unknown) => x
      )
      expect(e).toBeInstanceOf(ConfigError)
      expect((e as Error).message).toMatch(re)
    }
    await bad(s.push(0, 0, 0, new Float32Array(N - 1), 1), /gradient must be a Float32Array of this shard's 37 elements, got Float32Array\(36\)/)
    await bad(s.push(0, 0, 0, new Float64Array(N) as unknown as Float32Array, 1), /got Float64Array\(37\)/)
    await bad(s.push(2, 0, 0, g, 1), /ps\.worker.*\[0, 2\).*got 2/)
    await bad(s.push(-1, 0, 0, g, 1), /got -1/)
    await bad(s.push(0, 0.5, 0, g, 1), /ps\.step/)
    await bad(s.push(0, 0, 1, g, 1), /ps\.basedOn.*\[0, 0\], got 1/)
    await bad(s.push(0, 0, 0, g, 0), /ps\.weight.*> 0/)
    await bad(s.push(0, 0, 0, g, Number.NaN), /ps\.weight/)
    await bad(s.push(0, 0, 0, g, 1, -1), /ps\.learningRate/)
    expect(s.stats().received).toBe(0)

    const p = s.push(0, 3, 0, g, 1)
    await bad(s.push(0, 3, 0, g, 1), /worker 0 pushed step 3 after step 3: a worker's steps must rise/)
    await bad(s.push(0, 2, 0, g, 1), /pushed step 2 after step 3/)
    await bad(s.push(1, 4, 0, g, 1), /step 4 while step 3 still collects gradients \(1 of 2 in\)/)
    expect(s.stats().pending).toBe(1)
    await s.push(1, 3, 0, g, 1)
    await p
    s.finish(1)
    s.finish(1)
    await bad(s.push(1, 4, 1, g, 1), /worker 1 has finished/)
    expect(() => s.finish(5)).toThrow(/ps\.worker/)

    const ctor = (o: Partial<ShardServerOptions>, re: RegExp): void => {
      let e: unknown
      try {
        new ShardServer(new Float32Array(N), { mode: "sync", numWorkers: 2, staleness: 0, backupWorkers: 0, spec: SGD, ...o })
      } catch (x) {
        e = x
      }
      expect(e).toBeInstanceOf(ConfigError)
      expect((e as Error).message).toMatch(re)
    }
    ctor({ backupWorkers: 2 }, /backupWorkers.*less than the number of workers \(2\)/)
    ctor({ mode: "async", backupWorkers: 1 }, /only apply to parameterServer.mode "sync"/)
    ctor({ mode: "bsp" as PsMode }, /one of sync, async, ssp; got "bsp"/)
    ctor({ numWorkers: 0 }, /numWorkers/)
    ctor({ staleness: -1 }, /staleness/)
    ctor({ weightDecay: -0.1 }, /weightDecay/)
    ctor({ spec: { kind: "adam", learningRate: 0.1, beta: 0.9 } }, /optimizer\.beta/)
  })
})

describe("ShardServer under random interleavings", () => {
  const cases: ReadonlyArray<{ mode: PsMode; workers: number; backups?: number; staleness?: number }> = [
    { mode: "sync", workers: 4 },
    { mode: "sync", workers: 4, backups: 1 },
    { mode: "sync", workers: 5, backups: 2 },
    { mode: "async", workers: 3 },
    { mode: "ssp", workers: 4, staleness: 0 },
    { mode: "ssp", workers: 4, staleness: 2 }
  ]
  for (const k of cases) {
    it(`${k.mode} ${k.workers} workers${k.backups ? `, ${k.backups} backups` : ""}${k.staleness !== undefined ? `, staleness ${k.staleness}` : ""}: every loop runs to its end`, async () => {
      for (let seed = 0; seed < 5; seed++) {
        const rng = seededRng(1000 + seed)
        const steps = 12
        const s = server(values(rng, 8), {
          mode: k.mode,
          numWorkers: k.workers,
          backupWorkers: k.backups ?? 0,
          staleness: k.staleness ?? 0
        })
        // One worker stops early (its loop ends) in half the runs.
        const quitter = seed % 2 === 0 ? Math.floor(rng() * k.workers) : -1
        const loop = async (w: number): Promise<void> => {
          let basedOn = 0
          const last = w === quitter ? 5 : steps
          for (let step = 0; step < last; step++) {
            const yields = Math.floor(rng() * 4)
            for (let y = 0; y < yields; y++) await flush()
            const r = await s.push(w, step, basedOn, values(rng, 8), 1 + Math.floor(rng() * 3))
            if (k.mode === "ssp") {
              // The server's clocks (a waiting worker's is raised already); they only rise, so
              // reading them now, a little after the release, still shows the bound.
              const running = s.workerStats().filter((x) => !x.finished)
              expect(Math.min(...running.map((x) => x.clock))).toBeGreaterThanOrEqual(step + 1 - k.staleness!)
            }
            expect(r.version).toBeGreaterThanOrEqual(basedOn)
            basedOn = r.version
          }
          s.finish(w)
        }
        await Promise.all(Array.from({ length: k.workers }, (_, w) => loop(w)))
        const st = s.stats()
        expect(st.pending).toBe(0)
        if (k.mode === "sync") {
          expect(st.updates).toBe(steps)
          if (!k.backups) expect(st.dropped).toBe(0)
          expect(st.applied + st.dropped).toBe(st.received)
        } else {
          expect(st.updates).toBe(st.received)
        }
      }
    })
  }
})
