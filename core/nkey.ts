// NATS nkey authentication with Node's own Ed25519 (OpenSSL) instead of nats.js's pure-JavaScript
// one (tweetnacl). Every gradwire process connects with the cluster's nkey (the embedded cluster
// makes one per run): its connections each sign the server's nonce, and the public key is derived
// from the seed. In tweetnacl, code that runs a few times per process and so is never optimised,
// a fresh process's first three connections took 131-165 ms of CPU (3.2-3.6 ms here), and a
// worker's heartbeat thread pays it again in its own isolate: the largest single item in the
// profile of a replacement worker's start, whose CPU on shared cores comes out of the running
// workers' time. Seeds and public keys are read and written here as nkeys does (base32, a
// prefix byte, a CRC-16 checksum): a test compares the two, and checks the signatures with nkeys's
// verify. Clusters joined with a creds file sign the same way (credsAuthenticator).
import * as crypto from "node:crypto"

/** What a CONNECT carries for nkey authentication (nats.js's NKeyAuth). */
export interface NkeyAuth {
  readonly nkey: string
  readonly sig: string
}

interface NativeKey {
  readonly publicKey: string
  readonly privateKey: crypto.KeyObject
}

const BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

/** RFC 4648 base32 without padding, as nkeys writes keys. */
const base32 = (bytes: Uint8Array): string => {
  let out = ""
  let bits = 0
  let value = 0
  for (const b of bytes) {
    value = (value << 8) | b
    bits += 8
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31]
      bits -= 5
    }
  }
  if (bits > 0) out += BASE32[(value << (5 - bits)) & 31]
  return out
}

/** CRC-16/XMODEM (polynomial 0x1021, from 0), nkeys's checksum. */
const crc16 = (bytes: Uint8Array): number => {
  let crc = 0
  for (const b of bytes) {
    crc ^= b << 8
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff
  }
  return crc
}

/** Bytes of RFC 4648 base32 text without padding; undefined where a character is not base32. */
const unbase32 = (text: string): Uint8Array | undefined => {
  const out = new Uint8Array(Math.floor((text.length * 5) / 8))
  let bits = 0
  let value = 0
  let n = 0
  for (const c of text) {
    const v = BASE32.indexOf(c)
    if (v < 0) return undefined
    value = ((value << 5) | v) & 0xffff
    bits += 5
    if (bits >= 8) {
      out[n++] = (value >>> (bits - 8)) & 0xff
      bits -= 8
    }
  }
  return out
}

/** Seeds' prefix (nkeys's Prefix.Seed): the top five bits of a seed's first byte. */
const SEED_PREFIX = 144

/**
 * A seed's role byte (nkeys's Prefix: User, Account...) and its 32 raw bytes, or undefined when
 * `seed` is not an nkey seed (its length, characters, checksum or prefix).
 */
const decodeSeed = (seed: string): { role: number; raw: Uint8Array } | undefined => {
  const bytes = unbase32(seed)
  if (!bytes || bytes.length !== 36) return undefined
  if (crc16(bytes.subarray(0, 34)) !== (bytes[34]! | (bytes[35]! << 8))) return undefined
  if ((bytes[0]! & 248) !== SEED_PREFIX) return undefined
  return { role: ((bytes[0]! & 7) << 5) | ((bytes[1]! & 248) >> 3), raw: bytes.subarray(2, 34) }
}

/** The DER header of a PKCS #8 Ed25519 private key; the 32-byte seed follows it. */
const PKCS8_ED25519 = Buffer.from("302e020100300506032b657004220420", "hex")

const keys = new Map<string, NativeKey>()

/**
 * The key pair of an nkey seed ("SU…"), made once per process and seed. Throws for a seed that is
 * not one.
 */
const nativeKey = (seed: string): NativeKey => {
  const known = keys.get(seed)
  if (known) return known
  const decoded = decodeSeed(seed)
  if (!decoded) throw new Error("not an nkey seed (a seed is 58 base32 characters starting with S, e.g. SU... for a user)")
  const privateKey = crypto.createPrivateKey({ key: Buffer.concat([PKCS8_ED25519, decoded.raw]), format: "der", type: "pkcs8" })
  const spki = crypto.createPublicKey(privateKey).export({ format: "der", type: "spki" })
  // A public key: its role byte, the 32 bytes, the checksum; "U…" for a user's.
  const body = new Uint8Array(35)
  body[0] = decoded.role
  body.set(spki.subarray(spki.length - 32), 1)
  const crc = crc16(body.subarray(0, 33))
  body[33] = crc & 0xff
  body[34] = crc >> 8
  const key = { publicKey: base32(body), privateKey }
  keys.set(seed, key)
  return key
}

/** The public key ("U…") of an nkey seed; undefined when it is not a valid seed. */
export const publicNkey = (seed: string): string | undefined => {
  try {
    return nativeKey(seed).publicKey
  } catch {
    return undefined
  }
}

/**
 * nats.js's nkeyAuthenticator(seed), natively: the public key and the nonce signed with the seed.
 * A seed that is not one throws when a connection asks (as nats.js's does).
 */
export const nkeyAuthenticator =
  (seed: string) =>
  (nonce?: string): NkeyAuth => {
    const key = nativeKey(seed)
    return { nkey: key.publicKey, sig: nonce ? crypto.sign(null, Buffer.from(nonce, "utf8"), key.privateKey).toString("base64") : "" }
  }

/** What a CONNECT carries for a creds file (nats.js's JwtAuth): the user JWT, with the nkey auth. */
export interface CredsAuth extends NkeyAuth {
  readonly jwt: string
}

/**
 * nats.js's credsAuthenticator(creds), natively: the JWT and the seed read from a creds file's
 * contents as nats.js reads them (the first two blocks between `-----...-----` lines), the nonce
 * signed as nkeyAuthenticator signs it. Contents that hold no such blocks throw "unable to parse
 * credentials" when a connection asks, as nats.js's does.
 */
export const credsAuthenticator = (creds: Uint8Array) => {
  let parsed: { jwt: string; seed: string } | undefined
  const parse = (): { jwt: string; seed: string } => {
    if (parsed) return parsed
    const blocks = /\s*(?:(?:[-]{3,}[^\n]*[-]{3,}\n)(.+)(?:\n\s*[-]{3,}[^\n]*[-]{3,}\n))/gi
    const text = new TextDecoder().decode(creds)
    const jwt = blocks.exec(text)
    const seed = jwt ? blocks.exec(text) : null
    if (!jwt || !seed) throw new Error("unable to parse credentials")
    parsed = { jwt: jwt[1]!.trim(), seed: seed[1]!.trim() }
    return parsed
  }
  return (nonce?: string): CredsAuth => {
    const { jwt, seed } = parse()
    return { jwt, ...nkeyAuthenticator(seed)(nonce) }
  }
}
