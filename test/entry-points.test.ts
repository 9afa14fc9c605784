// The two public entry points keep their naming rule: "gradwire" (index.ts) is the Promise API with
// plain names and no Effect versions or Layers; "gradwire/effect" (effect.ts) holds the Effect
// versions, each named after a root function (or class) with "Effect" added, plus Layers and
// services; and internals stay out of both.
import { describe, expect, it } from "vitest"
import * as root from "../index.ts"
import * as fx from "../effect.ts"

/** Effect versions whose Promise twin is a class (its constructor or a static create). */
const TWIN_CLASS: Record<string, string> = { createCommunicatorEffect: "Communicator", makeActorSystemEffect: "ActorSystem" }

describe("entry points", () => {
  it("gradwire/effect: every function is <root name>Effect or a Layer, every class a service", () => {
    const names = Object.keys(fx)
    expect(names.length).toBeGreaterThan(5)
    for (const name of names) {
      if (name.endsWith("Layer")) continue
      if (name.endsWith("Effect")) {
        const twin = TWIN_CLASS[name] ?? name.slice(0, -"Effect".length)
        expect(Object.keys(root), `${name}'s Promise twin ${twin} in gradwire`).toContain(twin)
        continue
      }
      // a Context service (Nats, ActorSystemService): a class with a key
      expect(typeof (fx as Record<string, unknown>)[name], name).toBe("function")
      expect((fx as Record<string, { key?: unknown }>)[name].key, `${name} is a service`).toEqual(expect.any(String))
    }
  })

  it("gradwire: no Effect versions or Layers, and no internals", () => {
    const names = Object.keys(root)
    for (const name of names) expect(name.endsWith("Effect") || name.endsWith("Layer"), name).toBe(false)
    for (const internal of ["launchNatsServer", "launchNatsCluster", "encodeMessage", "decodeMessage", "wireTensor", "WireTensor", "Nats", "NatsLayer", "NodeAgent", "launchAgent", "installNatsPatches"]) {
      expect(names, internal).not.toContain(internal)
    }
    for (const user of ["Trainer", "TrainContext", "DatasetShard", "DataParallelModel", "loadDigits", "trainTestSplit", "ConfigError", "TrainingFailed", "CollectiveTimeout", "Communicator", "defineActor", "launchActor", "spawnActor", "openNats"]) {
      expect(names, user).toContain(user)
    }
  })
})
