// The one write into an encoded beat that a beat thread makes (heartbeat.ts beatTemplate encodes
// the beat with `heldMs` last, a msgpack float64: 0xcb and 8 big-endian bytes). Its own module,
// with no imports, so that the beat thread (beat-thread.ts) loads it without heartbeat.ts and the
// encoder and schemas that brings.

/** A copy of an encoded beat `template` with `heldMs` written into its last 8 bytes. */
export const withHeld = (template: Uint8Array, heldMs: number): Uint8Array => {
  const bytes = template.slice()
  new DataView(bytes.buffer).setFloat64(bytes.byteLength - 8, heldMs)
  return bytes
}
