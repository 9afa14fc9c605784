// NATS nkey authentication with Node's Ed25519 (core/nkey.ts) against nats.js's own (nkeys): the
// same public keys, the same signatures (Ed25519 signs deterministically), nkeys's verify accepts
// them, and what is not a seed is refused.
import { describe, expect, it } from "vitest"
import { nkeys, nkeyAuthenticator as natsNkeyAuthenticator } from "@nats-io/nats-core"
import { nkeyAuthenticator, publicNkey } from "../core/nkey.ts"

const te = new TextEncoder()
const seedOf = (kp: { getSeed(): Uint8Array }): string => new TextDecoder().decode(kp.getSeed())

describe("nkey authentication with Node's Ed25519", () => {
  const pairs = [
    ...Array.from({ length: 16 }, () => nkeys.createUser()),
    nkeys.createAccount(),
    nkeys.createServer(),
    nkeys.createOperator(),
    nkeys.createCluster()
  ]

  it("derives the public key nkeys derives, for users and every other role", () => {
    for (const kp of pairs) expect(publicNkey(seedOf(kp))).toBe(kp.getPublicKey())
    expect(publicNkey(seedOf(pairs[0]!))!.startsWith("U")).toBe(true)
  })

  it("signs a nonce as nats.js's nkeyAuthenticator does, and nkeys's verify accepts it", () => {
    for (const [i, kp] of pairs.entries()) {
      const seed = seedOf(kp)
      const nonce = `nonce-${i}-${"x".repeat(i)}`
      const ours = nkeyAuthenticator(seed)(nonce)
      expect(ours).toEqual(natsNkeyAuthenticator(te.encode(seed))(nonce))
      const sig = Uint8Array.from(Buffer.from(ours.sig, "base64"))
      expect(nkeys.fromPublic(ours.nkey).verify(te.encode(nonce), sig)).toBe(true)
      expect(nkeys.fromPublic(ours.nkey).verify(te.encode(`${nonce}!`), sig)).toBe(false)
    }
    // No nonce: the key alone, as nats.js's.
    const seed = seedOf(pairs[0]!)
    expect(nkeyAuthenticator(seed)()).toEqual({ nkey: pairs[0]!.getPublicKey(), sig: "" })
  })

  it("refuses what is not a seed: a public key, a changed character, a cut one, a character outside base32", () => {
    const seed = seedOf(pairs[0]!)
    const flip = (s: string, at: number): string => s.slice(0, at) + (s[at] === "A" ? "B" : "A") + s.slice(at + 1)
    for (const bad of [pairs[0]!.getPublicKey(), flip(seed, 20), flip(seed, seed.length - 1), seed.slice(0, -1), seed.slice(0, -1) + "1", "", "SU"]) {
      expect(publicNkey(bad), bad).toBeUndefined()
      expect(() => nkeyAuthenticator(bad)("nonce"), bad).toThrow(/not an nkey seed/)
    }
  })
})
