// Benchmark entry: `npm run bench -- <name> [args]`. Each benchmark prints its figures next to a
// baseline measured in the same run; nothing here passes or fails.
const benches: Record<string, { about: string; modules: ReadonlyArray<string> }> = {
  codec: { about: "tensor wire format and chunked NATS transfer vs plain copy / raw NATS", modules: ["./codec.ts", "./transport.ts"] }
}

const [name, ...rest] = process.argv.slice(2)
const entry = name ? benches[name] : undefined
if (!entry) {
  console.log("usage: npm run bench -- <name>\n")
  for (const [key, b] of Object.entries(benches)) console.log(`  ${key.padEnd(14)} ${b.about}`)
  process.exit(name ? 2 : 0)
}
for (const mod of entry.modules) {
  const m = (await import(mod)) as { run: (args: ReadonlyArray<string>) => Promise<void> }
  await m.run(rest)
}
