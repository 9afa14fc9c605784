import { readFileSync, readdirSync } from "node:fs"
const dir = process.argv[2]
for (const f of readdirSync(dir).slice(0, 1)) {
  const p = JSON.parse(readFileSync(`${dir}/${f}`, "utf8"))
  const self = new Map()
  const byId = new Map(p.nodes.map((n) => [n.id, n]))
  const dt = new Map()
  for (let i = 0; i < p.samples.length; i++) dt.set(p.samples[i], (dt.get(p.samples[i]) ?? 0) + (p.timeDeltas[i] ?? 0))
  let total = 0
  for (const [id, t] of dt) {
    const n = byId.get(id)
    const key = `${n.callFrame.functionName || "(anon)"} ${n.callFrame.url.split("/").slice(-2).join("/")}:${n.callFrame.lineNumber}`
    self.set(key, (self.get(key) ?? 0) + t)
    total += t
  }
  console.log(f, "total ms", (total / 1000).toFixed(0))
  for (const [k, t] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 30)) console.log((t / 1000).toFixed(1).padStart(8), k)
}
