// One rank of `npm run bench -- group-form`: `node bench/group-form-rank.ts <rank> <p> <rounds> <url>`
// opens its two NATS connections (data and control, as a worker does), then per round waits at a
// barrier (rank 0 releases every rank at once over NATS), closes the previous round's communicator
// and times Communicator.create of a new group of p ranks with direct links, as every rank of a
// regroup does (worker-run.ts build). Prints one line `RESULT [ms, ...]`.
import { openNats } from "../core/connection.ts"
import { Communicator } from "../collectives/communicator.ts"

const [rankArg, pArg, roundsArg, url] = process.argv.slice(2)
const rank = Number(rankArg)
const p = Number(pArg)
const rounds = Number(roundsArg)
const nc = (await openNats({ servers: url!, noEcho: true })).nc
const cnc = (await openNats({ servers: url!, noEcho: true })).nc
const secret = new Uint8Array(32).fill(7)
// Rank 0: which ranks wait at each round's barrier ("<round> <rank>"; repeated until released).
const waiting = new Map<number, Set<string>>()
nc.subscribe(`bench.${p}.ready`, {
  callback: (_, m) => {
    const [round, r] = m.string().split(" ")
    const set = waiting.get(Number(round)) ?? new Set<string>()
    waiting.set(Number(round), set.add(r!))
  }
})
await nc.flush()
const times: number[] = []
let previous: Communicator | undefined
try {
  for (let i = 0; i < rounds; i++) {
    if (rank === 0) {
      // Every other rank said it waits for this round's start (bounded: a rank that died ends the run).
      const until = Date.now() + 30_000
      while ((waiting.get(i)?.size ?? 0) < p - 1) {
        if (Date.now() > until) throw new Error(`round ${i}: ${waiting.get(i)?.size ?? 0} of ${p - 1} ranks at the barrier after 30 s`)
        await new Promise((resolve) => setTimeout(resolve, 1))
      }
      nc.publish(`bench.${p}.go.${i}`)
    } else {
      const go = nc.subscribe(`bench.${p}.go.${i}`, { max: 1, timeout: 30_000 })
      await nc.flush()
      // Said again until released: rank 0 may not listen yet.
      const say = (): void => nc.publish(`bench.${p}.ready`, `${i} ${rank}`)
      say()
      const again = setInterval(say, 50)
      try {
        for await (const _ of go) break
      } finally {
        clearInterval(again)
      }
    }
    await previous?.close()
    const t0 = performance.now()
    previous = await Communicator.create({ nc, controlNc: cnc, cluster: "bench", job: "form", group: `p${p}-g${i}`, rank, worldSize: p, timeoutMs: 30_000, direct: { secret, transport: "auto" } })
    times.push(performance.now() - t0)
  }
} finally {
  await previous?.close()
  await nc.close()
  await cnc.close()
}
console.log(`RESULT ${JSON.stringify(times)}`)
process.exit(0)
