// The type of the tfjs module as gradwire hands it around (the engine loads it lazily, so code
// below the engine takes it as a value of this type). Its own module so that the kernels, which
// the engine registers, can name it without importing the engine back.
export type Tf = typeof import("@tensorflow/tfjs")
