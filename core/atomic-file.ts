// Files written so that a crash mid-write never leaves a half-written file behind: the bytes go to
// a temp file in the same directory, are fsynced, and are renamed into place. Checkpoints and the
// run directory's records both write through here.
import * as fs from "node:fs/promises"
import { randomBytes } from "node:crypto"

/** Writes and fsyncs `file` (no rename: the caller owns atomicity, e.g. a temp directory). */
export const writeFileSynced = async (file: string, data: Uint8Array | string): Promise<void> => {
  const h = await fs.open(file, "w")
  try {
    await h.writeFile(data)
    await h.sync()
  } finally {
    await h.close()
  }
}

/** Writes `data` to `file` through a temp file and a rename, so readers see old or new, never half. */
export const writeFileAtomic = async (file: string, data: Uint8Array | string): Promise<void> => {
  const tmp = `${file}.tmp-${randomBytes(4).toString("hex")}`
  await writeFileSynced(tmp, data)
  await fs.rename(tmp, file)
}

