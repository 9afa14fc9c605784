#!/usr/bin/env node
// The `gradwire` command. Runs the compiled CLI when the package is built (as when installed
// from the registry, where Node does not strip types inside node_modules), else the TypeScript
// source directly (Node >= 22.18 strips types).
import { existsSync } from "node:fs"
import { fileURLToPath } from "node:url"

const built = fileURLToPath(new URL("../dist/bin/main.js", import.meta.url))
await import(existsSync(built) ? built : "./main.ts")
