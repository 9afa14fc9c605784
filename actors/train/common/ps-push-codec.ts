// Compressed pushes to the parameter servers (collectiveConfig.compression with strategy
// "parameter-server" or "auto"). A push is one message of one worker's gradient range to one
// server, so the codecs that fit are those with a byte message of a flat vector (compressor.ts:
// none, fp16, int8, top-k, sign and any registered codec that implements it); PowerSGD (a 'custom'
// aggregation) factors each gradient matrix in two all-reduce rounds that the whole group runs
// together, which a push cannot do, and is refused (pushCodecProblem).
//
// The worker side (PushEncoder) keeps one error-feedback residual per server range (Seide et al.
// 2014, error-feedback.ts): p = g + e; send C(p); e = p - D(C(p)) from its own message, so what a
// push loses is added to the next one and the sum of everything the server decoded plus the
// residual is the sum of the raw gradients. The server side (PushDecoder) decodes into one
// Float32Array it reuses from push to push: ShardServer.push never keeps the gradient it is given
// (ps/shard.ts), so the next push may overwrite it. Message buffers are reused per server as well:
// a worker's next push of a range waits for the server's answer to the last one. A push that
// backup workers drop (it came after its step's quota) leaves the residual as it is: what the codec
// dropped is still sent later, what it sent is dropped like any late gradient.
//
// Without a codec the range goes as it is (fp32), or as binary16 bits with wireDtype "float16"
// (no residual: the cast is round-to-nearest, as the all-reduce's uncompressed fp16 wire). With a
// codec, the codec's message is what travels and wireDtype does not apply to it (as on the
// all-reduce, where it applies to uncompressed buckets only). Pure: no I/O, no timers.
import { ConfigError } from "../../../core/errors.ts"
import { decodeHalf, encodeHalf } from "../../../collectives/float16.ts"
import type { Codec } from "../../../collectives/compression/codec.ts"
import type { Compressor } from "../../../collectives/compression/compressor.ts"
import { ErrorFeedback, type ResidualState } from "../../../collectives/compression/error-feedback.ts"
import { simdSpace } from "../../../collectives/simd.ts"
import { compressionType, createCompressor, type CompressionConfig, type ResolvedCompressionConfig } from "../../../collectives/compression/config.ts"
import { codecs, exampleConfig, formatConfig } from "../../../collectives/compression/registry.ts"

/** What a push carries for its gradient (ServerProtocol push): exactly one of the three is the gradient. */
export interface PushPayload {
  /** fp32 values (empty when `half` or `packed` carries them). */
  readonly grad: Float32Array
  /** binary16 bits (wireDtype "float16", no codec). */
  readonly half?: Uint16Array
  /** A codec's message (collectiveConfig.compression). */
  readonly packed?: Uint8Array
}

/** Bytes pushed for gradients, in the words of the all-reduce's ReducerStats (collectives/gradient-reducer.ts). */
export interface PushStats {
  /** Gradient bytes this rank pushed in its last step (every server's message together). */
  readonly wireBytes: number
  /** What the same pushes would carry as dense fp32. */
  readonly denseBytes: number
  readonly steps: number
  readonly totalWireBytes: number
  readonly totalDenseBytes: number
}

const EMPTY = new Float32Array(0)

/**
 * Residuals at least this long live in SIMD memory, where the codecs' fused error-feedback kernels
 * (int8, top-k) update them in place, as the gradient reducer's do (gradient-reducer.ts).
 */
const SIMD_RESIDUAL_MIN = 1 << 20

const isByteCodec = (c: Codec): c is Codec & Compressor =>
  c.aggregation !== "custom" &&
  typeof (c as Partial<Compressor>).encode === "function" &&
  typeof (c as Partial<Compressor>).decode === "function" &&
  typeof (c as Partial<Compressor>).accumulate === "function" &&
  typeof (c as Partial<Compressor>).wireBytes === "function"

/** The registered codecs a push can carry, as a user writes them: `"none", "fp16", { type: "int8" }, ...`. */
export const pushCompressionForms = (): string =>
  codecs()
    .filter((e) => {
      try {
        return isByteCodec(e.create(exampleConfig(e)))
      } catch {
        return false
      }
    })
    .map((e) => formatConfig(e.example))
    .join(", ")

/**
 * Why `config` cannot compress pushes to parameter servers (a sentence saying what to use), or
 * undefined when it can. The config is a validated one (parseCompressionConfig).
 */
export const pushCodecProblem = (config: CompressionConfig, strategy: string): string | undefined => {
  if (config === "auto") {
    return (
      `compression "auto" decides from the all-reduce's measured communication, which the servers do not run; ` +
      `with strategy "${strategy}" name a codec the pushes can carry: ${pushCompressionForms()} (or strategy "allreduce" with "auto")`
    )
  }
  const codec = createCompressor(config)
  if (isByteCodec(codec)) return undefined
  const why =
    codec.aggregation === "custom"
      ? `${compressionType(config)} runs its own all-reduce rounds over whole gradient matrices${compressionType(config) === "powersgd" ? " (P, then Q: the whole group together)" : ""}, ` +
        `while a push is one message of a worker's flat gradient range to one server`
      : `${compressionType(config)} has no byte message of a flat vector (encode / decode / accumulate) that a push could carry`
  return `${formatConfig(config)} cannot compress pushes to parameter servers: ${why}. With strategy "${strategy}" use one of ${pushCompressionForms()}; or strategy "allreduce" with ${formatConfig(config)}`
}

/** Throws the ConfigError of pushCodecProblem, for `field`. */
export const checkPushCompression = (config: CompressionConfig, strategy: string, field = "collectiveConfig.compression"): void => {
  const problem = pushCodecProblem(config, strategy)
  if (problem) throw new ConfigError({ field, reason: problem })
}

/** A codec for pushes (undefined: "none", sent uncompressed). */
const pushCodec = (config: ResolvedCompressionConfig | undefined, field: string): Compressor | undefined => {
  if (config === undefined || compressionType(config as CompressionConfig) === "none") return undefined
  checkPushCompression(config as CompressionConfig, "parameter-server", field)
  return createCompressor(config as CompressionConfig) as Codec & Compressor
}

/** The residual key of server k's range of s (a checkpoint's residuals from another number of servers are not used). */
export const pushResidualKey = (k: number, s: number): string => `server-${k}-of-${s}`

export interface PushEncoderOptions {
  /** collectiveConfig.compression (absent or "none": uncompressed). */
  readonly compression?: ResolvedCompressionConfig
  /** wireDtype "float16": uncompressed ranges go as binary16. */
  readonly halfWire?: boolean
  readonly numServers: number
}

/** A worker's encoder of its pushes: one codec, one residual and one message buffer per server range. */
export class PushEncoder {
  readonly codec: Compressor | undefined
  readonly numServers: number
  readonly #halfWire: boolean
  readonly ef = new ErrorFeedback()
  readonly #out: Uint8Array[] = []
  readonly #half: Uint16Array[] = []
  #stats = { wireBytes: 0, denseBytes: 0, steps: 0, totalWireBytes: 0, totalDenseBytes: 0 }
  #stepWire = 0
  #stepDense = 0

  constructor(options: PushEncoderOptions) {
    this.codec = pushCodec(options.compression, "collectiveConfig.compression")
    this.numServers = options.numServers
    this.#halfWire = options.halfWire === true
    this.ef.allocate = (_key, n) => (n >= SIMD_RESIDUAL_MIN ? simdSpace([n])?.[0] : undefined) ?? new Float32Array(n)
  }

  /** Whether pushes keep residuals (a codec with error feedback). */
  get feedback(): boolean {
    return this.codec?.errorFeedback === true
  }

  /**
   * Server k's payload for `range` (this step's gradient of its range; only read). `rank` and
   * `step` seed a stochastic codec's dither (int8), so ranks do not share rounding noise and a
   * rerun reproduces it. The payload's arrays are this encoder's and stay valid until the next
   * encode of range k.
   */
  encode(k: number, range: Float32Array, ctx: { readonly rank: number; readonly step: number }): PushPayload {
    const dense = range.byteLength
    let payload: PushPayload
    let wire: number
    const c = this.codec
    if (c) {
      const n = range.length
      let out = this.#out[k]
      const size = c.wireBytes(n)
      if (out === undefined || out.byteLength < size) out = this.#out[k] = new Uint8Array(size)
      const key = pushResidualKey(k, this.numServers)
      const context = { key, rank: ctx.rank, step: ctx.step }
      let bytes: Uint8Array
      if (!c.errorFeedback) bytes = c.encode(range, context, out).bytes
      else {
        const held = this.ef.get(key)
        // A range of another length (the model changed; a checkpoint of another layout): start from zero.
        if (held !== undefined && held.length !== n) this.ef.delete(key)
        bytes = c.encodeFeedback
          ? c.encodeFeedback(range, 1, this.ef.residual(key, n), context, out).bytes
          : this.ef.compress(c, key, range, context, out).bytes
      }
      payload = { grad: EMPTY, packed: bytes }
      wire = bytes.byteLength
    } else if (this.#halfWire) {
      let h = this.#half[k]
      if (h?.length !== range.length) h = this.#half[k] = new Uint16Array(range.length)
      encodeHalf(range, h)
      payload = { grad: EMPTY, half: h }
      wire = h.byteLength
    } else {
      payload = { grad: range }
      wire = dense
    }
    this.#stepWire += wire
    this.#stepDense += dense
    return payload
  }

  /** Ends a step's pushes (every server's): its bytes become the last step's in `stats`. */
  endStep(): void {
    const s = this.#stats
    s.wireBytes = this.#stepWire
    s.denseBytes = this.#stepDense
    s.steps++
    s.totalWireBytes += this.#stepWire
    s.totalDenseBytes += this.#stepDense
    this.#stepWire = 0
    this.#stepDense = 0
  }

  get stats(): PushStats {
    return { ...this.#stats }
  }

  /** The residuals (copies), for a checkpoint; empty without error feedback. */
  state(): ResidualState {
    return this.ef.state()
  }

  /**
   * Takes a checkpoint's residuals: those of this number of servers (a range's length is checked
   * at its next encode; another length starts from zero). Residuals of another number of servers
   * cover other ranges and are dropped: those pushes start from zero residuals.
   */
  restore(state: Readonly<Record<string, ArrayLike<number>>>): number {
    const mine = Object.fromEntries(Object.entries(state).filter(([k]) => k.endsWith(`-of-${this.numServers}`)))
    this.ef.restore(mine)
    return Object.keys(mine).length
  }
}

/** A server's decoder of pushes into one reused buffer of its shard's length. */
export class PushDecoder {
  readonly codec: Compressor | undefined
  readonly length: number
  #buf: Float32Array | undefined

  constructor(compression: ResolvedCompressionConfig | undefined, length: number) {
    this.codec = pushCodec(compression, "ps-server.init.compression")
    this.length = length
  }

  /**
   * The fp32 gradient of a push: `grad` as it came, or `half` / `packed` decoded into this
   * decoder's buffer (valid until the next decode). Throws a WireDecodeError for a message of
   * another codec or length, a ConfigError for a codec message to a server that was given none.
   */
  decode(body: PushPayload): Float32Array {
    if (body.packed !== undefined) {
      if (!this.codec) {
        throw new ConfigError({
          field: "collectiveConfig.compression",
          reason: "a worker pushed a compressed gradient to a server that was initialised without a codec: the workers and rank 0's init disagree on the compression config"
        })
      }
      return this.codec.decode(body.packed, this.#buffer())
    }
    if (body.half !== undefined) {
      if (body.half.length !== this.length) {
        throw new ConfigError({ field: "ps.grad", reason: `a binary16 gradient of ${body.half.length} elements for a shard of ${this.length}: workers and servers disagree on the ranges` })
      }
      const out = this.#buffer()
      decodeHalf(body.half, out)
      return out
    }
    return body.grad
  }

  #buffer(): Float32Array {
    return (this.#buf ??= new Float32Array(this.length))
  }
}
