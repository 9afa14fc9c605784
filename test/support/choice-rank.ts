// One rank of a measured-vs-predicted algorithm comparison: the network-namespace scheduler test
// (test/scheduler-netns.test.ts, started with `ip netns exec <ns> node ... <json>`) and the
// `autochoice` benchmark. Joins the group through `url`, observes the topology (rank 0 probes,
// everyone gets the model), asks the cost model which algorithm it picks for each size, then times
// each algorithm at each size, alternating rounds. Rank 0 prints one JSON line with the results.
// Bounded: every collective has a deadline and the process exits after `deadlineMs`.
import { connect } from "@nats-io/transport-node"
import { installNatsPatches } from "../../core/nats-internals/index.ts"
import { Communicator, type AllReduceAlgorithm } from "../../collectives/communicator.ts"
import { allReduceAlgorithms } from "../../collectives/algorithms/index.ts"
import { autoCandidates } from "../../collectives/compression/index.ts"
import { probeGroupTopology } from "../../actors/train/worker/topology-probe.ts"
import { chooseAlgorithm, explain, planCommunication } from "../../scheduler/algorithm-choice.ts"
import { describeObservation } from "../../scheduler/topology.ts"

interface Args {
  readonly rank: number
  readonly worldSize: number
  readonly node: string
  readonly url: string
  readonly sizes: readonly number[]
  readonly algorithms: readonly AllReduceAlgorithm[]
  readonly reps: number
  readonly deadlineMs: number
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
  createTimeoutMs: 20_000
})
try {
  const observed = await probeGroupTopology({ nc, comm, cluster: "netns", job: "sched" })
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
  const run = async (buf: Float32Array, algorithm: AllReduceAlgorithm): Promise<number> => {
    buf.fill(args.rank + 1)
    await comm.barrier()
    const t0 = performance.now()
    await comm.allReduce(buf, { algorithm })
    // The slowest rank decides: a max over ranks of each rank's time.
    const t = Float32Array.of(performance.now() - t0)
    await comm.allReduce(t, { op: "max", algorithm: "tree" })
    if (buf[0] !== (args.worldSize * (args.worldSize + 1)) / 2) throw new Error(`${algorithm} gave ${buf[0]}`)
    return t[0]!
  }
  for (const bytes of args.sizes) {
    const buf = new Float32Array(bytes / 4)
    const times: Record<string, number[]> = {}
    for (const a of args.algorithms) {
      times[a] = []
      await run(buf, a) // warm-up
    }
    for (let i = 0; i < args.reps; i++) for (const a of args.algorithms) times[a]!.push(await run(buf, a))
    measured[bytes] = times
  }
  if (args.rank === 0) {
    console.log(
      JSON.stringify({
        observation: describeObservation(observed),
        cases: args.sizes.map((bytes, i) => ({
          bytes,
          chosen: choices[i]!.algorithm,
          predicted: Object.fromEntries(choices[i]!.predictions.map((p) => [p.algorithm, p.ms])),
          measured: measured[bytes]
        })),
        explain: explain(plan).text
      })
    )
  }
} finally {
  await comm.close().catch(() => {})
  await nc.close().catch(() => {})
}
