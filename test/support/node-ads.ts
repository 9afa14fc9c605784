// A node agent's advertisement for pure tests of what reads them (elastic sizing, the webgpu
// round trip): every field at a plain default, the test's own fields over them.
import type { NodeAdvertisement } from "../../scheduler/node-info.ts"

export const nodeAd = (over: Readonly<Record<string, unknown>> = {}): NodeAdvertisement =>
  ({
    v: 1,
    cluster: "c",
    nodeId: "n",
    hostname: String(over.nodeId ?? "n"),
    pid: 1,
    head: false,
    startedAt: 0,
    sentAt: 0,
    seq: 0,
    heartbeatMs: 500,
    cpus: 8,
    memoryBytes: 8e9,
    gpus: [],
    backends: ["wasm", "cpu"],
    backendsProbed: true,
    backendErrors: {},
    nats: { serverId: "s", serverName: "s", url: "nats://127.0.0.1:4222", cluster: "" },
    labels: {},
    custom: {},
    used: { cpus: 0, memoryBytes: 0, gpuIndices: [], custom: {} },
    processes: [],
    leaving: false,
    version: "test",
    ...over
  }) as unknown as NodeAdvertisement
