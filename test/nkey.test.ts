// NATS nkey authentication with Node's Ed25519 (core/nkey.ts) against nats.js's own (nkeys): the
// same public keys, the same signatures (Ed25519 signs deterministically), nkeys's verify accepts
// them, and what is not a seed is refused.
import { describe, expect, it } from "vitest"
import { credsAuthenticator as natsCredsAuthenticator, nkeys, nkeyAuthenticator as natsNkeyAuthenticator } from "@nats-io/nats-core"
import { credsAuthenticator, nkeyAuthenticator, publicNkey } from "../core/nkey.ts"

const te = new TextEncoder()
const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

/** base32 and CRC-16/XMODEM, written out here as the test's own reading of nkeys's format. */
const toBase32 = (bytes: Uint8Array): string => {
  const bits = [...bytes].map((b) => b.toString(2).padStart(8, "0")).join("")
  return Array.from({ length: Math.ceil(bits.length / 5) }, (_, i) => ALPHABET[parseInt(bits.slice(i * 5, i * 5 + 5).padEnd(5, "0"), 2)]).join("")
}
const fromBase32 = (text: string): Uint8Array => {
  const bits = [...text].map((c) => ALPHABET.indexOf(c).toString(2).padStart(5, "0")).join("")
  return Uint8Array.from({ length: Math.floor(bits.length / 8) }, (_, i) => parseInt(bits.slice(i * 8, i * 8 + 8), 2))
}
const xmodem = (bytes: Uint8Array): number => {
  let crc = 0
  for (const b of bytes) for (let i = 7; i >= 0; i--) crc = ((crc << 1) ^ ((((crc >> 15) ^ (b >> i)) & 1) * 0x1021)) & 0xffff
  return crc
}
/** `seed` with its first byte's prefix bits set to `prefix` and the checksum made right again. */
const withPrefix = (seed: string, prefix: number): string => {
  const b = fromBase32(seed)
  b[0] = prefix | (b[0]! & 7)
  const crc = xmodem(b.subarray(0, 34))
  b[34] = crc & 0xff
  b[35] = crc >> 8
  return toBase32(b)
}
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

  it("refuses what is not a seed: a public key, a changed character, a cut one, a character outside base32, a key of seed length with another prefix", () => {
    const seed = seedOf(pairs[0]!)
    // The test's own encoding is nkeys's: the seed re-encoded as it is still is one.
    expect(withPrefix(seed, 144)).toBe(seed)
    // Another character with one of its data bits changed (value ^ 4): the last character's two
    // lowest bits are padding, which nkeys ignores too, so "A" -> "B" there would be the same seed.
    const flip = (s: string, at: number): string => s.slice(0, at) + ALPHABET[ALPHABET.indexOf(s[at]!) ^ 4] + s.slice(at + 1)
    for (const bad of [pairs[0]!.getPublicKey(), flip(seed, 20), flip(seed, seed.length - 1), seed.slice(0, -1), seed.slice(0, -1) + "1", "", "SU", withPrefix(seed, 120)]) {
      expect(publicNkey(bad), bad).toBeUndefined()
      expect(() => nkeyAuthenticator(bad)("nonce"), bad).toThrow(/not an nkey seed/)
    }
  })
})

describe("creds file authentication with Node's Ed25519", () => {
  const kp = nkeys.createUser()
  const jwt = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJ0ZXN0In0.c2lnbmF0dXJl"
  const creds = (): Uint8Array =>
    te.encode(
      [
        "-----BEGIN NATS USER JWT-----",
        jwt,
        "------END NATS USER JWT------",
        "",
        "************************* IMPORTANT *************************",
        "NKEY Seed printed below can be used to sign and prove identity.",
        "",
        "-----BEGIN USER NKEY SEED-----",
        seedOf(kp),
        "------END USER NKEY SEED------",
        "",
        "*************************************************************",
        ""
      ].join("\n")
    )

  it("gives the file's JWT, the seed's public key and the signature nats.js's credsAuthenticator gives", () => {
    const auth = credsAuthenticator(creds())
    for (const nonce of ["a-nonce", "another"]) {
      const ours = auth(nonce)
      expect(ours).toEqual(natsCredsAuthenticator(creds())(nonce))
      expect(ours.jwt).toBe(jwt)
      expect(ours.nkey).toBe(kp.getPublicKey())
      expect(nkeys.fromPublic(ours.nkey).verify(te.encode(nonce), Uint8Array.from(Buffer.from(ours.sig, "base64")))).toBe(true)
    }
  })

  it("refuses contents that are not a creds file when a connection asks, as nats.js does", () => {
    const jwtOnly = te.encode(`-----BEGIN NATS USER JWT-----\n${jwt}\n------END NATS USER JWT------\n`)
    for (const bad of [te.encode(""), te.encode(seedOf(kp)), jwtOnly]) {
      expect(() => natsCredsAuthenticator(bad)("n")).toThrow(/unable to parse credentials/)
      const auth = credsAuthenticator(bad)
      expect(() => auth("n")).toThrow(/unable to parse credentials/)
    }
  })
})
