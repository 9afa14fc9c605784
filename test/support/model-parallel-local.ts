// Model-parallel ranks in one process: channels are queues, groups meet at an in-process
// rendezvous (each reduction waits for every member, sums in member order, hands every member the
// same result). For tests of the pipeline and tensor-parallel math; the NATS path is covered by
// the Trainer's integration test. Every wait has a deadline, so a schedule bug fails instead of hanging.
import type { Channel, StageLinks, SumGroup } from "../../actors/train/worker/model-parallel/links.ts"
import { rankAt, replicaGroup, tensorGroup, type GridPlace } from "../../actors/train/worker/model-parallel/grid.ts"

const DEADLINE_MS = 20_000

const withDeadline = <A>(p: Promise<A>, what: string): Promise<A> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  return Promise.race([
    p,
    new Promise<A>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`local fabric: ${what} waited ${DEADLINE_MS} ms`)), DEADLINE_MS)
    })
  ]).finally(() => clearTimeout(timer))
}

class Queue implements Channel {
  readonly #items: Float32Array[] = []
  readonly #waiters: Array<(b: Float32Array) => void> = []
  readonly name: string
  sent = 0
  constructor(name: string) {
    this.name = name
  }
  send(buf: Float32Array): Promise<void> {
    this.sent++
    const w = this.#waiters.shift()
    if (w) w(buf)
    else this.#items.push(buf)
    return Promise.resolve()
  }
  async recv(into: Float32Array): Promise<void> {
    const b = this.#items.shift() ?? (await withDeadline(new Promise<Float32Array>((r) => this.#waiters.push(r)), `recv on ${this.name}`))
    if (b.length !== into.length) throw new Error(`${this.name}: message of ${b.length} values, receiver expected ${into.length}`)
    into.set(b)
  }
}

type Call = { kind: string; buf: Float32Array; weight: number; root: number; resolve: () => void; reject: (e: Error) => void }

const rendezvous = (members: ReadonlyArray<number>): ((member: number) => SumGroup) => {
  const calls: Call[][] = []
  const count = new Map<number, number>()
  const arrive = (member: number, kind: string, buf: Float32Array, weight: number, root: number): Promise<void> => {
    const k = count.get(member) ?? 0
    count.set(member, k + 1)
    return withDeadline(
      new Promise<void>((resolve, reject) => {
        const slot = (calls[k] ??= [])
        slot[members.indexOf(member)] = { kind, buf, weight, root, resolve, reject }
        if (slot.filter(Boolean).length < members.length) return
        const kinds = new Set(slot.map((c) => c.kind))
        const lens = new Set(slot.map((c) => c.buf.length))
        if (kinds.size > 1 || lens.size > 1) {
          for (const c of slot) c.reject(new Error(`mismatched call ${k}: ${slot.map((c) => `${c.kind}[${c.buf.length}]`).join(", ")}`))
          return
        }
        const n = slot[0].buf.length
        const out = new Float32Array(n)
        if (kind === "broadcast") out.set(slot[slot[0].root].buf)
        else {
          const total = slot.reduce((a, c) => a + c.weight, 0)
          for (const c of slot) {
            const f = kind === "mean" ? (total > 0 ? c.weight / total : 0) : 1
            for (let i = 0; i < n; i++) out[i] += f * c.buf[i]
          }
        }
        for (const c of slot) {
          c.buf.set(out)
          c.resolve()
        }
      }),
      `${kind} #${k} of member ${member} in group [${members.join(",")}]`
    )
  }
  return (member) => ({
    size: members.length,
    index: members.indexOf(member),
    sum: (buf) => arrive(member, "sum", buf, 1, 0),
    weightedMean: (buf, w) => arrive(member, "mean", buf, w, 0),
    broadcast: (buf, root) => arrive(member, "broadcast", buf, 1, root)
  })
}

/** A fabric for `worldSize` ranks: world(rank) and links(place) as PrepareDeps wants them. */
export const localFabric = (worldSize: number) => {
  const queues = new Map<string, Queue>()
  const q = (name: string): Queue => {
    let x = queues.get(name)
    if (!x) queues.set(name, (x = new Queue(name)))
    return x
  }
  const groups = new Map<string, (m: number) => SumGroup>()
  const group = (members: number[]): ((m: number) => SumGroup) => {
    const key = members.join(",")
    let g = groups.get(key)
    if (!g) groups.set(key, (g = rendezvous(members)))
    return g
  }
  const all = Array.from({ length: worldSize }, (_, r) => r)
  return {
    queues,
    world: (rank: number): SumGroup => group(all)(rank),
    links: (p: GridPlace): Promise<StageLinks> => {
      const prev = p.stage > 0 ? rankAt(p, p.replica, p.stage - 1, p.tpRank) : -1
      const next = p.stage < p.stages - 1 ? rankAt(p, p.replica, p.stage + 1, p.tpRank) : -1
      const links: StageLinks = {
        ...(prev >= 0 ? { fromPrev: q(`act ${prev}->${p.rank}`), toPrev: q(`grad ${p.rank}->${prev}`) } : {}),
        ...(next >= 0 ? { toNext: q(`act ${p.rank}->${next}`), fromNext: q(`grad ${next}->${p.rank}`) } : {}),
        replicas: group(replicaGroup(p))(p.rank),
        tensor: group(tensorGroup(p))(p.rank),
        world: group(all)(p.rank),
        close: () => Promise.resolve()
      }
      return Promise.resolve(links)
    }
  }
}
