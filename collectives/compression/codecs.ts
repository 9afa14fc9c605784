// The built-in codecs, registered in this order (the order of every list users see). A new codec
// is one module next to these and one line in `builtinCodecs`; see registry.ts for what an entry
// carries and codec.ts for the aggregations a codec can implement.
import { fp16Codec } from "./fp16.ts"
import { int8Codec } from "./int8.ts"
import { noneCodec } from "./none.ts"
import { powerSgdCodec } from "./powersgd.ts"
import { registerCodec } from "./registry.ts"
import { signCodec } from "./sign.ts"
import { topkCodec } from "./topk.ts"

export const builtinCodecs = [noneCodec, fp16Codec, int8Codec, topkCodec, powerSgdCodec, signCodec] as const

for (const c of builtinCodecs) registerCodec(c)

type Builtin = (typeof builtinCodecs)[number]

/** A built-in codec's config in its object form. */
export type BuiltinCodecConfig = Builtin["schema"]["Type"]
/** The built-in codecs that may be written as a bare name. */
export type BuiltinShorthand = Extract<Builtin, { readonly shorthand: true }>["name"]
