// The prototype of a tfjs-layers class by its registered class name ("LSTM", "LSTMCell",
// "LayerNormalization"), from tfjs's serialization registry: creating a layer to reach its
// prototype would take one of tfjs-layers' automatic names ("lstm_LSTM1"), and every layer a user
// makes after it would be named one further on.
import type { Tf } from "../tf.ts"

export const layerPrototype = <T>(tf: Tf, className: string): T | undefined => {
  const entry = (tf.serialization.SerializationMap.getMap().classNameMap as Record<string, [unknown, unknown] | undefined>)[className]
  const cls = entry?.[0] as { prototype?: T } | undefined
  return cls?.prototype
}
