// The one connection spec: the URL forms of the NATS CLI and the Go client (credentials in the URL,
// tokens, tls://, comma-separated lists) parsed into servers and credentials, one kind of
// credentials at a time, redaction wherever a spec is shown, and openConnection against real
// servers with each kind: user/password and token from URLs, an nkey seed, a creds file (operator
// mode), TLS with a CA file; errors (a wrong password, say) never echo a secret.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { resolveClusterConfig } from "../core/config.ts"
import {
  connectionFromAddress,
  describeConnection,
  openConnection,
  redactConnection,
  redactUrl,
  scrubSecrets,
  type ConnectionSpec
} from "../core/connection-spec.ts"
import { ConfigError, NatsConnectError } from "../core/errors.ts"
import { natsFixtures } from "./support/nats.ts"
import { nkeyServerConfig, nkeyUser, operatorSetup } from "./support/nats-auth.ts"

const nats = natsFixtures()
const dirs: string[] = []
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true })
})
const tempDir = (): string => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "gw-conn-spec-"))
  dirs.push(d)
  return d
}

const configError = (fn: () => unknown): ConfigError => {
  try {
    fn()
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError)
    return e as ConfigError
  }
  throw new Error("expected a ConfigError")
}

/** Opens, checks the connection carries a message, closes. */
const roundTrip = async (spec: ConnectionSpec): Promise<void> => {
  const c = await openConnection(spec, "gw-conn-spec-test", { timeoutMs: 3_000 })
  try {
    const sub = c.nc.subscribe("spec.check", { max: 1 })
    c.nc.publish("spec.check", new Uint8Array([7]))
    for await (const m of sub) expect(Array.from(m.data)).toEqual([7])
  } finally {
    await c.close()
  }
}

const openError = async (spec: ConnectionSpec): Promise<NatsConnectError> => {
  const e = await openConnection(spec, "gw-conn-spec-test", { timeoutMs: 3_000 }).then(
    async (c) => {
      await c.close()
      return undefined
    },
    (x: unknown) => x
  )
  expect(e).toBeInstanceOf(NatsConnectError)
  return e as NatsConnectError
}

describe("connectionFromAddress", () => {
  it("takes user/password, a token and tls:// out of URLs, as the NATS CLI and Go client do", () => {
    expect(connectionFromAddress("nats://gw:pa55@10.0.0.5:4222")).toEqual({ servers: ["nats://10.0.0.5:4222"], user: "gw", password: "pa55" })
    expect(connectionFromAddress("nats://s3cr3t-token@host")).toEqual({ servers: ["nats://host"], token: "s3cr3t-token" })
    expect(connectionFromAddress("tls://host:4222")).toEqual({ servers: ["tls://host:4222"], tls: {} })
    expect(connectionFromAddress("127.0.0.1:4222")).toEqual({ servers: ["nats://127.0.0.1:4222"] })
    // Percent-encoded characters in the password, and "user:" (empty password) is a user, not a token.
    expect(connectionFromAddress("nats://gw:p%40ss%3Aw%2Frd@h:1")).toMatchObject({ user: "gw", password: "p@ss:w/rd" })
    expect(connectionFromAddress("nats://gw:@h:1")).toMatchObject({ user: "gw", password: "" })
    // Several servers: the credentials may be on one or all of them.
    expect(connectionFromAddress("nats://gw:pw@a:4222, nats://b:4222,nats://gw:pw@c:4222")).toEqual({
      servers: ["nats://a:4222", "nats://b:4222", "nats://c:4222"],
      user: "gw",
      password: "pw"
    })
    // Explicit fields, and the same credentials both ways.
    expect(connectionFromAddress("nats://h:1", { nkeySeed: nkeyUser().seed, tls: { caFile: "/ca.pem" } })).toMatchObject({ servers: ["nats://h:1"], tls: { caFile: "/ca.pem" } })
    expect(connectionFromAddress("nats://gw:pw@h:1", { user: "gw", password: "pw" })).toMatchObject({ user: "gw", password: "pw" })
  })

  it("refuses what cannot work, naming the field and never showing a secret", () => {
    const cases: Array<[() => unknown, RegExp]> = [
      [() => connectionFromAddress("http://gw:hunter2@h:4222"), /expected a NATS URL/],
      [() => connectionFromAddress("ws://h:8080"), /websocket URLs are not supported/],
      [() => connectionFromAddress("nats://gw:hunter2@h:4222/path"), /no path/],
      [() => connectionFromAddress("nats://gw:hunter2@a:1,nats://gw:other@b:1"), /different credentials/],
      [() => connectionFromAddress("nats://gw:hunter2@h:1", { user: "gw", password: "hunter3" }), /both in the URL and as options/],
      [() => connectionFromAddress("nats://h:1", { user: "gw", password: "hunter2", token: "hunter2" }), /one kind of credentials, not user\/password and token/],
      [() => connectionFromAddress("nats://h:1", { password: "hunter2" }), /a password needs a user/],
      [() => connectionFromAddress("nats://h:1", { nkeySeed: "SUhunter2" }), /not a user nkey seed/],
      [() => connectionFromAddress(""), /no server address/]
    ]
    for (const [fn, reason] of cases) {
      const e = configError(fn)
      expect(e.message).toMatch(reason)
      expect(e.message).not.toContain("hunter2")
      expect(e.field).toBe("address")
    }
    const seed = nkeyUser().seed
    const both = configError(() => connectionFromAddress("nats://h:1", { nkeySeed: seed, credsFile: "/u.creds" }))
    expect(both.message).toContain("nkey seed and creds file")
    expect(both.message).not.toContain(seed)
  })
})

describe("redaction", () => {
  it("masks passwords, tokens and nkey seeds wherever a spec or address is shown", () => {
    const user = nkeyUser()
    expect(redactUrl("nats://gw:hunter2@h:4222,nats://tok3n@b:1,tls://c:2")).toBe("nats://gw:***@h:4222,nats://***@b:1,tls://c:2")
    const spec = connectionFromAddress("nats://gw:hunter2@h:4222", { tls: { caFile: "/etc/ca.pem" } })
    expect(redactConnection(spec)).toEqual({ servers: ["nats://h:4222"], user: "gw", password: "***", tls: { caFile: "/etc/ca.pem" } })
    expect(describeConnection(spec)).toBe('nats://h:4222 (user "gw" with a password, TLS)')
    // An nkey shows its public key (what the server config lists); a creds file its path.
    const nk: ConnectionSpec = { servers: ["nats://h:1"], nkeySeed: user.seed }
    expect(redactConnection(nk)).toEqual({ servers: ["nats://h:1"], nkey: user.publicKey })
    expect(JSON.stringify(redactConnection(nk))).not.toContain(user.seed)
    expect(describeConnection({ servers: ["nats://h:1"], token: "hunter2" })).toBe("nats://h:1 (a token)")
    expect(redactConnection({ servers: ["nats://h:1"], credsFile: "/k/u.creds" })).toEqual({ servers: ["nats://h:1"], credsFile: "/k/u.creds" })
    expect(scrubSecrets("x hunter2 y hunter%402 nats://a:b@h", { password: "hunter2" })).toBe("x *** y hunter%402 nats://a:***@h")
    expect(scrubSecrets("p=p%40ss", { password: "p@ss" })).toBe("p=***")
  })

  it("the Trainer's cluster option: URL or fields; its errors never show a secret, even in a wrong field", () => {
    expect(resolveClusterConfig({ address: "nats://gw:hunter2@h:4222", clusterName: "c1" })).toEqual({
      clusterName: "c1",
      connection: { servers: ["nats://h:4222"], user: "gw", password: "hunter2" }
    })
    expect(resolveClusterConfig({ address: "nats://h:4222", token: "t" }).connection).toEqual({ servers: ["nats://h:4222"], token: "t" })
    const typo = configError(() => resolveClusterConfig({ address: "nats://gw:hunter2@h:4222", passwrd: "hunter2" }))
    expect(typo.field).toBe("cluster.passwrd")
    const wrongType = configError(() => resolveClusterConfig({ address: "nats://gw:hunter2@h:4222", clusterName: "not a name" }))
    expect(wrongType.field).toBe("cluster.clusterName")
    const badUrl = configError(() => resolveClusterConfig({ address: "http://gw:hunter2@h:4222" }))
    expect(badUrl.field).toBe("cluster.address")
    for (const e of [typo, wrongType, badUrl]) expect(e.message).not.toContain("hunter2")
  })
})

describe("openConnection against real servers", () => {
  it("user/password and token given in the URL; a wrong password is an error that does not echo it", async () => {
    const server = await nats.server({ jetstream: false, auth: { user: "gw", password: "pa55word" } })
    const port = new URL(server.url).port
    await roundTrip(connectionFromAddress(`nats://gw:pa55word@127.0.0.1:${port}`))
    const wrong = await openError(connectionFromAddress(`nats://gw:wr0ngpass@127.0.0.1:${port}`))
    expect(wrong.message).toContain("rejected the credentials")
    expect(wrong.message).not.toContain("wr0ngpass")
    const tokenServer = await nats.server({ jetstream: false, auth: { token: "t0kenvalue" } })
    await roundTrip(connectionFromAddress(`nats://t0kenvalue@127.0.0.1:${new URL(tokenServer.url).port}`))
    const badToken = await openError(connectionFromAddress(`nats://n0tthetoken@127.0.0.1:${new URL(tokenServer.url).port}`))
    expect(badToken.message).not.toContain("n0tthetoken")
  })

  it("an nkey-only server: the seed connects, another seed or none is refused", async () => {
    const user = nkeyUser()
    const server = await nats.server({ jetstream: false, extraConfig: nkeyServerConfig(user.publicKey) })
    await roundTrip({ servers: [server.url], nkeySeed: user.seed })
    const other = nkeyUser().seed
    const wrong = await openError({ servers: [server.url], nkeySeed: other })
    expect(wrong.message).toContain("rejected the credentials")
    expect(wrong.message).not.toContain(other)
    expect((await openError({ servers: [server.url] })).message).toContain("requires credentials")
  })

  it("a server in operator mode (JWT): the creds file connects, nothing else does", async () => {
    const op = operatorSetup()
    const dir = tempDir()
    fs.writeFileSync(path.join(dir, "user.creds"), op.creds, { mode: 0o600 })
    const server = await nats.server({ jetstream: false, extraConfig: op.serverConfig })
    await roundTrip({ servers: [server.url], credsFile: path.join(dir, "user.creds") })
    expect((await openError({ servers: [server.url] })).message).toContain("requires credentials")
    // The user's nkey alone is not enough in operator mode: the server wants the JWT too.
    expect((await openError({ servers: [server.url], nkeySeed: op.userSeed })).message).toContain("authorization violation")
  })

  it("tls:// with a CA file: TLS is required and verified; without the CA the certificate is refused", async () => {
    const dir = tempDir()
    const made = spawnSync(
      "openssl",
      ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", path.join(dir, "key.pem"), "-out", path.join(dir, "cert.pem"), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
      { stdio: "ignore", timeout: 30_000 }
    )
    expect(made.status, "openssl must be installed to make a test certificate").toBe(0)
    const server = await nats.server({
      jetstream: false,
      auth: { user: "gw", password: "pa55word" },
      extraConfig: `tls { cert_file: ${JSON.stringify(path.join(dir, "cert.pem"))}, key_file: ${JSON.stringify(path.join(dir, "key.pem"))} }`
    })
    const port = new URL(server.url).port
    await roundTrip(connectionFromAddress(`tls://gw:pa55word@127.0.0.1:${port}`, { tls: { caFile: path.join(dir, "cert.pem") } }))
    const untrusted = await openError(connectionFromAddress(`tls://gw:pa55word@127.0.0.1:${port}`))
    expect(untrusted.message).toMatch(/certificate/i)
    expect(untrusted.message).not.toContain("pa55word")
  })
})
