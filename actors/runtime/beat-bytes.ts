// The one write into an encoded beat that a beat thread makes (heartbeat.ts beatTemplate encodes
// the beat with `cpuMs`, then `heldMs` last, each a msgpack float64: 0xcb and 8 big-endian bytes).
// Its own module, with no imports, so that the beat thread (beat-thread.ts) loads it without
// heartbeat.ts and the encoder and schemas that brings.

/** Where `cpuMs`'s 8 bytes start, from the end: then the key "heldMs" (7 bytes) and its float64 (9). */
export const CPU_FROM_END = 24

/**
 * A copy of an encoded beat `template` with `heldMs` written into its last 8 bytes and, when
 * given, `cpuMs` into its own 8.
 */
export const withHeld = (template: Uint8Array, heldMs: number, cpuMs?: number): Uint8Array => {
  const bytes = template.slice()
  const view = new DataView(bytes.buffer)
  view.setFloat64(bytes.byteLength - 8, heldMs)
  if (cpuMs !== undefined) view.setFloat64(bytes.byteLength - CPU_FROM_END, cpuMs)
  return bytes
}
