// The types of a gradient codec's byte-message contract (compressor.ts has the header and the
// helpers, codec.ts the codec definition). Types only, imported by both: codec.ts reaches them
// without importing compressor.ts, which imports the registry, which imports codec.ts.
/** How a codec's messages are combined across ranks (codec.ts says what each means). */
export type Aggregation = "none" | "linear" | "allgather" | "custom"

/** A codec's identity in its messages' headers: the registry's wireId and the name for errors. */
export interface WireCodec {
  readonly id: number
  readonly name: string
}


/** Where an encode happens; stochastic codecs derive their random stream from it. */
export interface EncodeContext {
  /** Stable identity of the tensor or compress point (also the residual key). */
  readonly key?: string
  readonly step?: number
  readonly rank?: number
}

/** One encoded tensor: the bytes to publish, plus what the header says, for convenience. */
export interface CompressedMessage {
  readonly codec: string
  /** Dense element count. */
  readonly length: number
  /** The complete wire message (header + payload). */
  readonly bytes: Uint8Array
}

export interface Compressor {
  readonly name: string
  /** "allgather" for codecs aggregated through these messages; others implement them as a format only. */
  readonly aggregation: Exclude<Aggregation, "custom">
  /** Whether callers should keep a residual for this codec (on by default; see error-feedback.ts). */
  readonly errorFeedback: boolean
  /** Exact size in bytes of the message for a tensor of n elements (k for top-k is derived from n). */
  wireBytes(n: number): number
  /**
   * Encodes `input`. When `out` is given and large enough the message is written into it (no
   * allocation); the returned `bytes` is then a view of `out`.
   */
  encode(input: Float32Array, ctx?: EncodeContext, out?: Uint8Array): CompressedMessage
  /** Decodes into `out` (allocated when absent) and returns it. */
  decode(msg: CompressedMessage | Uint8Array, out?: Float32Array): Float32Array
  /** into[i] += weight * decoded[i], without materialising the decoded tensor. */
  accumulate(msg: CompressedMessage | Uint8Array, into: Float32Array, weight?: number): void
  /**
   * Optional, fused error feedback: e = f32(e + f32(g·scale)), the message of e, then e -= its
   * decoded values; the same message and residual bits as that compensation, encode(e) and
   * accumulate(message, e, -1). `g` is only read. Callers run those three steps for a codec
   * without it.
   */
  encodeFeedback?(g: Float32Array, scale: number, e: Float32Array, ctx?: EncodeContext, out?: Uint8Array): CompressedMessage
  /**
   * Optional: into = the sum of the messages' decoded values, added in the order given; the bits
   * of into.fill(0) and then accumulate(message, into, 1) for each, which callers run otherwise.
   */
  sumInto?(msgs: ReadonlyArray<CompressedMessage | Uint8Array>, into: Float32Array): void
}
