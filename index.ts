// gradwire's public entry point: everything a user touches is exported from here; the rest is
// internal and may change.
export * from "./core/errors.ts"
