// One rank of a measured-vs-predicted algorithm comparison: the network-namespace scheduler test
// (test/scheduler-netns.test.ts, started with `ip netns exec <ns> node ... <json>`) and the
// `autochoice` benchmark. Joins the group through `url`, observes the topology (rank 0 probes,
// everyone gets the model), asks the cost model which algorithm it picks for each size, then times
// each algorithm at each size, alternating rounds. Before those rounds (with `tune`) it tunes as training does
// (scheduler/algorithm-tuner.ts), so the measured pick is judged on later calls than it was
// made from. With `directSecret` every call goes over the direct links, whose timed calls fit
// the model's direct links first (on several nodes each pair of nodes' links, from timed exchanges). Rank 0 prints one JSON line with the results.
// Bounded: every collective has a deadline and the process exits after `deadlineMs`.
import { connect } from "@nats-io/transport-node"
import { installNatsPatches } from "../../core/nats-internals/index.ts"
import { Communicator, type AllReduceAlgorithm } from "../../collectives/communicator.ts"
import { allReduceAlgorithms, findAllReduceAlgorithm } from "../../collectives/algorithms/index.ts"
import { autoCandidates } from "../../collectives/compression/index.ts"
import { probeGroupTopology } from "../../actors/train/worker/topology-probe.ts"
import { chooseAlgorithm, explain, planCommunication } from "../../scheduler/algorithm-choice.ts"
import { describeObservation } from "../../scheduler/topology.ts"
import { AlgorithmTuner, type TunedSize } from "../../scheduler/algorithm-tuner.ts"
import { TUNE_KEEP_WITHIN, TUNE_ROUNDS } from "../../actors/train/worker/auto-config.ts"

interface Args {
  readonly rank: number
  readonly worldSize: number
  readonly node: string
  readonly url: string
  readonly sizes: readonly number[]
  readonly algorithms: readonly AllReduceAlgorithm[]
  readonly reps: number
  readonly deadlineMs: number
  /** Tune before measuring, as training does (the autochoice bench); default false. */
  readonly tune?: boolean
  /** Every call over the direct links (collectives/direct.ts) with this hex secret; absent: NATS. */
  readonly directSecret?: string
  /** With `directSecret`: the address this rank's direct links listen on (default 127.0.0.1; another namespace's ranks need its own). */
  readonly directHost?: string
  /** With `directSecret`: fit each pair of nodes' direct links from the timed exchanges (default true; false: one alpha and beta for every link, as before). */
  readonly pairs?: boolean
  /** With `tune`: independent tunings per size (each its own tuner and agreed table; the first is `tuned`); default 1. */
  readonly tunings?: number
  /** CPU work (ms, a busy loop) before every timed call, as a step's forward and backward pass comes before its all-reduce; default 0. */
  readonly computeMs?: number
  /** Also time each algorithm as training runs it: blocks of steps (the CPU work, then the call) without a barrier; default false. */
  readonly steady?: boolean
}

const args = JSON.parse(process.argv[2]!) as Args
setTimeout(() => {
  console.error(`rank ${args.rank}: deadline of ${args.deadlineMs} ms passed`)
  process.exit(3)
}, args.deadlineMs).unref()

installNatsPatches() // as openNats does
const nc = await connect({ servers: args.url, noEcho: true, name: `netns rank ${args.rank}` })
const comm = await Communicator.create({
  nc,
  cluster: "netns",
  job: "sched",
  group: "g",
  rank: args.rank,
  worldSize: args.worldSize,
  node: args.node,
  timeoutMs: 20_000,
  createTimeoutMs: 20_000,
  ...(args.directSecret !== undefined
    ? { direct: { transport: "direct" as const, secret: Buffer.from(args.directSecret, "hex"), ...(args.directHost !== undefined ? { host: args.directHost } : {}) } }
    : {})
})
try {
  // Over the direct links: the timed calls that fit the model's direct links, as a worker does.
  const ladder = args.directSecret !== undefined ? await comm.measureTransport() : undefined
  const observed = await probeGroupTopology({
    nc,
    comm,
    cluster: "netns",
    job: "sched",
    ...(ladder ? { direct: { algorithm: findAllReduceAlgorithm(ladder.algorithm)!, timings: ladder.direct, minBytes: 0, ...(ladder.pairs && args.pairs !== false ? { pairs: ladder.pairs } : {}) } } : {})
  })
  const choices = args.sizes.map((bytes) => chooseAlgorithm(bytes, observed.topology, observed.model, allReduceAlgorithms()))
  const plan = planCommunication({
    bucketBytes: [...args.sizes],
    topology: observed.topology,
    model: observed.model,
    algorithms: allReduceAlgorithms(),
    compressors: autoCandidates(args.sizes.map((bytes) => ({ shape: [bytes / 4], size: bytes / 4 }))).profiles,
    compression: "none"
  })
  const measured: Record<string, Record<string, number[]>> = {}
  // A step's CPU work before its call (under a CPU quota it spends the quota the call then runs on).
  const compute = (): void => {
    const until = performance.now() + (args.computeMs ?? 0)
    let x = 0
    while (performance.now() < until) for (let i = 0; i < 1000; i++) x += Math.sqrt(i + x)
    if (x < 0) console.log(x)
  }
  const run = async (buf: Float32Array, algorithm: AllReduceAlgorithm): Promise<number> => {
    buf.fill(args.rank + 1)
    compute()
    await comm.barrier()
    const t0 = performance.now()
    await comm.allReduce(buf, { algorithm })
    // The slowest rank decides: a max over ranks of each rank's time.
    const t = Float32Array.of(performance.now() - t0)
    await comm.allReduce(t, { op: "max", algorithm: "tree" })
    if (buf[0] !== (args.worldSize * (args.worldSize + 1)) / 2) throw new Error(`${algorithm} gave ${buf[0]}`)
    return t[0]!
  }
  // The measured pick as training makes it (AutoGradientReducer): each algorithm timed
  // TUNE_ROUNDS times per size, each call's slowest rank agreed, the median of each algorithm's
  // calls compared; `tunings` times per size, each with a tuner of its own.
  const modelPick = (bytes: number): string => choices[args.sizes.indexOf(bytes)]!.algorithm
  const tunings: Record<string, TunedSize[]> = {}
  const steady: Record<string, Record<string, number[]>> = {}
  const STEADY_BLOCK = 10
  for (const bytes of args.sizes) {
    const buf = new Float32Array(bytes / 4)
    const times: Record<string, number[]> = {}
    for (const a of args.algorithms) {
      times[a] = []
      await run(buf, a) // warm-up
    }
    tunings[bytes] = []
    for (let n = 0; n < (args.tune === true ? Math.max(1, args.tunings ?? 1) : 0); n++) {
      const tuner = new AlgorithmTuner(args.algorithms, TUNE_ROUNDS, TUNE_KEEP_WITHIN)
      for (let i = 0; i < tuner.steps; i++) {
        const a = tuner.next(bytes)
        buf.fill(args.rank + 1)
        compute()
        await comm.barrier()
        const t0 = performance.now()
        await comm.allReduce(buf, { algorithm: a })
        tuner.record(bytes, a, performance.now() - t0)
      }
      const table = tuner.table()
      await comm.allReduce(table, { op: "max", algorithm: "tree" })
      tunings[bytes]!.push(...tuner.decide(table, modelPick))
    }
    for (let i = 0; i < args.reps; i++) for (const a of args.algorithms) times[a]!.push(await run(buf, a))
    measured[bytes] = times
    // As training runs: blocks of STEADY_BLOCK steps (the CPU work, then the call, no barrier
    // between), one algorithm per block, blocks interleaved; a block's time per step on its slowest rank.
    if (args.steady === true) {
      const per: Record<string, number[]> = {}
      for (const a of args.algorithms) per[a] = []
      for (let i = 0; i < args.reps; i++) {
        for (const a of args.algorithms) {
          await comm.barrier()
          const t0 = performance.now()
          for (let k = 0; k < STEADY_BLOCK; k++) {
            buf.fill(args.rank + 1)
            compute()
            await comm.allReduce(buf, { algorithm: a })
          }
          const t = Float32Array.of((performance.now() - t0) / STEADY_BLOCK)
          await comm.allReduce(t, { op: "max", algorithm: "tree" })
          per[a]!.push(t[0]!)
        }
      }
      steady[bytes] = per
    }
  }
  if (args.rank === 0) {
    console.log(
      JSON.stringify({
        observation: describeObservation(observed),
        cases: args.sizes.map((bytes, i) => ({
          bytes,
          chosen: choices[i]!.algorithm,
          predicted: Object.fromEntries(choices[i]!.predictions.map((p) => [p.algorithm, p.ms])),
          measured: measured[bytes],
          tuned: tunings[bytes]![0]?.picked,
          tunings: tunings[bytes],
          ...(args.steady === true ? { steady: steady[bytes] } : {})
        })),
        explain: explain(plan).text
      })
    )
  }
} finally {
  await comm.close().catch(() => {})
  await nc.close().catch(() => {})
}
