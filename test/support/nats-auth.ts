// Credentials for tests of nkey and JWT (operator mode) clusters, made here with the nkeys that
// nats.js ships: an nkey user for `authorization { users = [{ nkey }] }`, and an operator, account
// and user with their JWTs (signed with those nkeys, as nsc would) for a nats-server in operator
// mode with a memory resolver, plus the user's .creds file.
import { createHash, randomUUID } from "node:crypto"
import { nkeys } from "@nats-io/nats-core"

const b64url = (bytes: Uint8Array | string): string => Buffer.from(bytes).toString("base64url")
const text = (bytes: Uint8Array): string => new TextDecoder().decode(bytes)

export interface NkeyUser {
  readonly seed: string
  readonly publicKey: string
}

/** A fresh user nkey: the seed stays with the client, the public key goes into the server config. */
export const nkeyUser = (): NkeyUser => {
  const kp = nkeys.createUser()
  return { seed: text(kp.getSeed()), publicKey: kp.getPublicKey() }
}

/** nats-server config lines admitting exactly this nkey user. */
export const nkeyServerConfig = (publicKey: string): string => `authorization { users = [ { nkey: ${JSON.stringify(publicKey)} } ] }`

/** A NATS JWT (v2, "ed25519-nkey"): header.claims signed by the issuer's nkey. */
const encodeJwt = (issuer: nkeys.KeyPair, subject: string, name: string, nats: Record<string, unknown>): string => {
  const claims: Record<string, unknown> = {
    jti: "",
    iat: Math.floor(Date.now() / 1000),
    iss: issuer.getPublicKey(),
    name,
    sub: subject,
    nats: { ...nats, version: 2 }
  }
  claims.jti = createHash("sha256").update(JSON.stringify(claims) + randomUUID()).digest("base64url")
  const head = b64url(JSON.stringify({ typ: "JWT", alg: "ed25519-nkey" }))
  const body = b64url(JSON.stringify(claims))
  const signature = b64url(issuer.sign(new TextEncoder().encode(`${head}.${body}`)))
  return `${head}.${body}.${signature}`
}

export interface OperatorSetup {
  /** nats-server config lines: the operator JWT and the account, preloaded into a memory resolver. */
  readonly serverConfig: string
  /** The user's .creds file content (user JWT + seed), as `nsc generate creds` writes it. */
  readonly creds: string
  readonly userSeed: string
  readonly userJwt: string
}

/** An operator with one account and one user of it, no limits (what a creds-only cluster needs). */
export const operatorSetup = (): OperatorSetup => {
  const operator = nkeys.createOperator()
  const account = nkeys.createAccount()
  const user = nkeys.createUser()
  const unlimited = { subs: -1, data: -1, payload: -1 }
  const operatorJwt = encodeJwt(operator, operator.getPublicKey(), "gw-test-operator", { type: "operator" })
  const accountJwt = encodeJwt(operator, account.getPublicKey(), "GW", {
    type: "account",
    limits: { ...unlimited, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 },
    default_permissions: { pub: {}, sub: {} }
  })
  const userJwt = encodeJwt(account, user.getPublicKey(), "gw-user", { type: "user", pub: {}, sub: {}, ...unlimited })
  const userSeed = text(user.getSeed())
  const creds =
    `-----BEGIN NATS USER JWT-----\n${userJwt}\n------END NATS USER JWT------\n\n` +
    `************************* IMPORTANT *************************\n` +
    `NKEY Seed printed below can be used to sign and prove identity.\nNKEYs are sensitive and should be treated as secrets.\n\n` +
    `-----BEGIN USER NKEY SEED-----\n${userSeed}\n------END USER NKEY SEED------\n`
  const serverConfig = [
    `operator: ${JSON.stringify(operatorJwt)}`,
    "resolver: MEMORY",
    `resolver_preload: { ${account.getPublicKey()}: ${JSON.stringify(accountJwt)} }`
  ].join("\n")
  return { serverConfig, creds, userSeed, userJwt }
}
