// Topology probing over NATS for a group that has just formed: implements scheduler/topology.ts's
// TopologyProbeIO on the rank's collective connection (the path gradients take). Each rank answers
// two kinds of requests on gw.<cluster>.<job>.probe.<group>.<rank>: an echo (first byte 0: the
// payload comes straight back) and, from rank 0, a probe command (first byte 1, JSON: ping `to`
// with `bytes`, `reps` times, reply the round-trip times). Every request has a deadline.
import type { NatsConnection, Subscription } from "@nats-io/nats-core"
import { jobSubjects } from "../../../core/subjects.ts"
import type { Communicator } from "../../../collectives/communicator.ts"
import { observeTopology, type ObservedTopology, type ProbeOptions, type TopologyProbeIO } from "../../../scheduler/topology.ts"

const ECHO = 0
const COMMAND = 1

export interface ProbeGroupOptions extends ProbeOptions {
  readonly nc: NatsConnection
  readonly comm: Communicator
  readonly cluster: string
  readonly job: string
  /** Deadline of one request (echo or command). Default 5 s. */
  readonly requestTimeoutMs?: number
}

/** Observes the group's topology; every rank calls it right after Communicator.create. */
export const probeGroupTopology = async (opts: ProbeGroupOptions): Promise<ObservedTopology> => {
  const { nc, comm } = opts
  const subjects = jobSubjects(opts.cluster, opts.job)
  const subject = (rank: number) => subjects.probe(comm.group, rank)
  const timeout = opts.requestTimeoutMs ?? 5_000
  const topology = comm.peers.map((p) => ({ nodeId: p.node, server: p.server }))
  const ping = async (to: number, bytes: number, reps: number): Promise<number[]> => {
    const msg = new Uint8Array(Math.max(1, bytes))
    msg[0] = ECHO
    const out: number[] = []
    for (let i = 0; i < reps; i++) {
      const t0 = performance.now()
      const reply = await nc.request(subject(to), msg, { timeout })
      out.push(performance.now() - t0)
      if (reply.data.length !== msg.length) throw new Error(`echo from rank ${to} came back with ${reply.data.length} of ${msg.length} bytes`)
    }
    return out
  }
  let sub: Subscription | undefined
  if (comm.worldSize > 1) {
    sub = nc.subscribe(subject(comm.rank), {
      callback: (err, m) => {
        if (err) return
        if (m.data[0] === ECHO) {
          m.respond(m.data)
          return
        }
        if (m.data[0] === COMMAND) {
          const cmd = JSON.parse(new TextDecoder().decode(m.data.subarray(1))) as { to: number; bytes: number; reps: number }
          ping(cmd.to, cmd.bytes, cmd.reps).then(
            (rtts) => m.respond(new TextEncoder().encode(JSON.stringify({ rtts }))),
            (e: unknown) => m.respond(new TextEncoder().encode(JSON.stringify({ error: String(e) })))
          )
        }
      }
    })
    await nc.flush()
    // Everyone is subscribed before rank 0 sends anything (core NATS drops unheard messages).
    await comm.barrier()
  }
  const io: TopologyProbeIO = {
    rank: comm.rank,
    worldSize: comm.worldSize,
    topology,
    pingPong: async (from, to, bytes, reps) => {
      if (from === comm.rank) return ping(to, bytes, reps)
      const body = new TextEncoder().encode(JSON.stringify({ to, bytes, reps }))
      const msg = new Uint8Array(body.length + 1)
      msg[0] = COMMAND
      msg.set(body, 1)
      const reply = await nc.request(subject(from), msg, { timeout: timeout * (reps + 1) })
      const r = JSON.parse(new TextDecoder().decode(reply.data)) as { rtts?: number[]; error?: string }
      if (!r.rtts) throw new Error(r.error ?? `rank ${from} sent no timings`)
      return r.rtts
    },
    broadcast: (buf) => comm.broadcast(buf, 0),
    // the chunk the collectives will really use (4 MiB on the embedded cluster, under 1 MiB on a default server)
    chunkBytes: comm.chunkElems * 4
  }
  try {
    return await observeTopology(io, opts)
  } finally {
    sub?.unsubscribe()
  }
}
