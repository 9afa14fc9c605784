// Where bin/fast-start.js is, for the processes gradwire starts: `node --import` it first, and the
// process keeps and reuses compiled code (and, in a checkout, the stripped TypeScript) across
// starts. From core/ in a checkout and from dist/core/ in the installed package alike.
import { pathToFileURL, fileURLToPath } from "node:url"

const FAST_START_FILE = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "../bin/fast-start.js" : "../../bin/fast-start.js", import.meta.url))

/** Node flags that load bin/fast-start.js before a process's own modules. */
export const FAST_START_ARGS: ReadonlyArray<string> = ["--import", pathToFileURL(FAST_START_FILE).href]
