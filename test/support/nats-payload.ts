// Deterministic message bodies for the NATS transport tests (nats-read, nats-receive, nats-send).

/** n pseudo-random bytes from `seed` (the same bytes for the same n and seed). */
export const payload = (n: number, seed: number): Uint8Array => {
  const b = new Uint8Array(n)
  let x = seed | 1
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) | 0
    b[i] = x >>> 24
  }
  return b
}
