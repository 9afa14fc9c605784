// The Node version check of the package itself: index.ts imports this module first, so that
// `import ... from "gradwire"` (the compiled package, which an older Node can load) fails at once
// on a Node older than 22.19 with an error naming the version found and how to get a newer one,
// instead of failing later and obscurely (type stripping of the train loop's .ts module, the
// worker processes). From a checkout an older Node cannot even parse the .ts sources; there the
// npm scripts and the CLI check first with bin/check-node.js, which holds the same minimum (tested).
import * as Schema from "effect/Schema"

/** The oldest Node gradwire runs on: [major, minor] (package.json "engines"). */
export const MIN_NODE: readonly [number, number] = [22, 19]

/** Whether a `process.versions.node`-style version ("20.20.2") is older than MIN_NODE. */
export const nodeTooOld = (version: string): boolean => {
  const [major, minor] = version.replace(/^v/, "").split(".").map(Number)
  return !(major > MIN_NODE[0] || (major === MIN_NODE[0] && minor >= MIN_NODE[1]))
}

/** gradwire was loaded by a Node older than MIN_NODE. */
export class UnsupportedNode extends Schema.TaggedError<UnsupportedNode>()("UnsupportedNode", {
  found: Schema.String
}) {
  override get message(): string {
    return (
      `gradwire needs Node >= ${MIN_NODE.join(".")} (found ${this.found}): ` +
      `run "npm install -g --prefix /usr/local node@22" (as root) or get it from https://nodejs.org`
    )
  }
}

if (nodeTooOld(process.versions.node)) throw new UnsupportedNode({ found: process.version })
