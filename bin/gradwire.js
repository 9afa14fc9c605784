#!/usr/bin/env node
// The `gradwire` command. Checks the Node version first (an older Node gets one line saying what
// to install, not a stack trace about ".ts" files), answers --version, then runs the CLI: the
// TypeScript source in a checkout (Node >= 22.18 strips types), the compiled one in an installed
// package (which ships dist/ and not bin/main.ts; Node strips no types under node_modules anyway).
import "./check-node.js"
// Compiled code (and in a checkout the stripped TypeScript) kept across starts; see the file.
import "./fast-start.js"
import { existsSync, readFileSync } from "node:fs"

const arg = process.argv[2]
if (arg === "--version" || arg === "-V") {
  console.log(JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version)
  process.exit(0)
}
const source = new URL("./main.ts", import.meta.url)
await import(existsSync(source) ? source.href : new URL("../dist/bin/main.js", import.meta.url).href)
