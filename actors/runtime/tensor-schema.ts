// Schemas for tensors inside actor messages. A tensor travels as a WireTensor (core/wire.ts:
// dtype, shape, raw bytes, chunked when large); these schemas let a protocol say "this field is a
// tensor" (optionally of one dtype) so that the receiving actor checks it like any other field.
import * as Schema from "effect/Schema"
import { WireTensor, type DType } from "../../core/wire.ts"

/** Any WireTensor. */
export const WireTensorSchema = Schema.declare((u: unknown): u is WireTensor => u instanceof WireTensor, {
  identifier: "WireTensor"
})

/** A WireTensor of one dtype. */
export const wireTensorOf = <D extends DType>(dtype: D) =>
  Schema.declare((u: unknown): u is WireTensor<D> => u instanceof WireTensor && u.dtype === dtype, {
    identifier: `WireTensor<${dtype}>`
  })
