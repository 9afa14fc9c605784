#!/usr/bin/env node
// Refuses a Node older than gradwire needs, in one line that names the version found and the
// command that fixes it, before anything tries to load a .ts file (an older Node fails on those
// with a stack trace about the ".ts" extension). The npm scripts run it first
// (`node bin/check-node.js && ...`), bin/gradwire.js and vitest.config.ts import it first. Plain
// JavaScript with nothing newer than Node 14 in it, so that every Node can run it. The built
// package's own check, for `import ... from "gradwire"`, is core/node-version.ts.
import { existsSync } from "node:fs"

/** The oldest Node gradwire runs on: [major, minor]. package.json's "engines" says the same (tested). */
export const MIN_NODE = [22, 19]

/** Whether a `process.versions.node`-style version ("20.20.2") is older than MIN_NODE. */
export const nodeTooOld = (version) => {
  const [major, minor] = String(version).replace(/^v/, "").split(".").map(Number)
  return !(major > MIN_NODE[0] || (major === MIN_NODE[0] && minor >= MIN_NODE[1]))
}

/**
 * The one line to show for `version`. In a checkout (scripts/setup.sh is there) the fix is the
 * set-up script; in an installed package it is installing Node 22.
 */
export const nodeVersionMessage = (version, checkout) => {
  const found = "v" + String(version).replace(/^v/, "")
  const fix = checkout
    ? 'run "bash scripts/setup.sh" (or "npm install -g --prefix /usr/local node@22")'
    : 'run "npm install -g --prefix /usr/local node@22" (as root) or get it from https://nodejs.org'
  return `gradwire needs Node >= ${MIN_NODE.join(".")} (found ${found}): ${fix}`
}

if (nodeTooOld(process.versions.node)) {
  const checkout = existsSync(new URL("../scripts/setup.sh", import.meta.url))
  process.stderr.write(nodeVersionMessage(process.versions.node, checkout) + "\n")
  process.exit(1)
}
