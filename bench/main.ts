// Benchmark entry: `npm run bench -- <name> [args]`. Each benchmark prints its figures next to a
// baseline measured in the same run; nothing here passes or fails.
const benches: Record<string, { about: string; modules: ReadonlyArray<string> }> = {
  codec: { about: "tensor wire format and chunked NATS transfer vs plain copy / raw NATS", modules: ["./codec.ts", "./transport.ts"] },
  actors: { about: "actor ask round trip vs raw NATS request-reply; spawn-to-ready", modules: ["./actors.ts"] },
  allreduce: { about: "every registered all-reduce algorithm vs its raw NATS pattern and torch gloo", modules: ["./allreduce.ts"] },
  compression: { about: "compressors: wire bytes, codec cost, 64 MiB all-reduce at p=4", modules: ["./compression.ts"] },
  trainer: { about: "fit() to first step, recovery time, data-parallel wrapper overhead", modules: ["./trainer.ts"] },
  chaos: { about: "goodput under a seeded fault schedule (worker kill -9, SIGSTOP, nats-server kill -9) vs the same job fault-free: detect, resume, steps lost per fault", modules: ["./chaos.ts"] },
  "group-form": { about: "a new group's forming (every regroup makes one) vs torch.distributed's new_group over gloo", modules: ["./group-form.ts"] },
  recovery: { about: "worker kill, NATS kill, node loss, node join: detection, time to resumed training, steps lost", modules: ["./recovery.ts"] },
  hetero: { about: "heterogeneity-aware batching vs equal split", modules: ["./hetero.ts"] },
  autochoice: { about: "the cost model's algorithm pick vs the measured fastest over (size, p)", modules: ["./autochoice.ts"] },
  zero: { about: "ZeRO stage 0/1/2 at p = 1, 2, 4: optimizer state per rank, step time, bytes on the wire", modules: ["./zero.ts"] },
  pipeline: { about: "pipeline (GPipe, 1F1B) and tensor parallelism: measured bubble vs (S-1)/(m+S-1), activation memory per stage, a model over the per-worker limit vs data parallel, recovery of a lost stage from its replica vs the checkpoint (--part recovery)", modules: ["./pipeline.ts"] },
  strategy: { about: "all-reduce vs parameter servers (sync, backup workers, async, SSP) with a straggler: steps/s, accuracy, staleness", modules: ["./strategy.ts"] },
  lowbw: { about: "local SGD / DiLoCo vs synchronous all-reduce (uncompressed, PowerSGD) on shaped 100/10 Mbit/s links: bytes/sample, steps/s, time to accuracy", modules: ["./lowbw.ts"] },
  train: { about: "the model zoo (MLP, CNNs, embedding, transformer, LSTM) at p = 1, 2, 4 vs PyTorch DDP: samples/s and the step split", modules: ["./train.ts"] },
  overlap: { about: "the gradient all-reduce overlapped with the backward pass (split at the model's cut points) vs one whole backward then the all-reduce", modules: ["./overlap.ts"] },
  data: { about: "file datasets streamed per worker vs in-memory arrays: driver/worker RSS, time to first step, rows/s, data wait share", modules: ["./data.ts"] }
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
