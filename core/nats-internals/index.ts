// Installs the nats.js patches of this folder (socket reads into pooled buffers, large messages
// received into and flushed from pooled buffers; see README.md), all or none, after shapes.ts has
// checked that the nats.js found has what they rely on. Called by the connection module before it
// connects (core/connection.ts) and by Communicator.create; the first call decides, later ones
// return the same answer.
//
// A mismatch does not fail the process: the patches change where bytes are kept, never which bytes
// are sent or received, and nats.js's own paths are correct, only slower on large messages. So a
// nats.js that differs (a user's dedupe or override of the pinned version) trains as before the
// pools existed, with one process warning (NatsInternalsMismatch: what is missing, the version
// found and the one they were made for). All or none, because the three share buffers: the read
// pool's buffers are given back by the receive patch, and the send patch copies the receive
// pool's buffers when it cannot flush.
import { DataBuffer, Parser, ProtocolHandler } from "@nats-io/nats-core/internal"
// A deep import (the package has no exports map today; README.md says what breaks if it gets one).
import { NodeTransport, VERSION as TRANSPORT_NODE_VERSION } from "@nats-io/transport-node/lib/node_transport.js"
import { installReadPatch } from "./read.ts"
import { installReceivePatch } from "./receive.ts"
import { installSendPatch } from "./send.ts"
import { checkNatsInternals, installedNatsCoreVersion, type NatsInternals, type NatsInternalsMismatch } from "./shapes.ts"

export { NATS_JS_MADE_FOR, NatsInternalsMismatch, checkNatsInternals, type NatsInternals } from "./shapes.ts"
export { READ_BYTES, readPoolStats } from "./read.ts"
export { RECEIVE_POOL_MIN_BYTES, isPooledReceive, receivePoolStats, releaseReceived, takeReceiveBuffer } from "./receive.ts"
export { SEND_POOL_MIN_BYTES, sendPoolStats } from "./send.ts"

/** Whether the patches are in place, and if not, why. */
export type NatsPatchStatus = { readonly installed: true } | { readonly installed: false; readonly mismatch: NatsInternalsMismatch }

/** The nats.js classes this process loaded. */
export const installedNatsInternals = (): NatsInternals => ({
  NodeTransport,
  Parser,
  ProtocolHandler,
  DataBuffer,
  version: `transport-node ${TRANSPORT_NODE_VERSION}, nats-core ${installedNatsCoreVersion()}`
})

/**
 * Checks `nats` and patches it, all or nothing; on a mismatch calls `warn` with the error and
 * patches nothing. The building block of installNatsPatches (tests pass a stand-in).
 */
export const installNatsPatchesInto = (nats: NatsInternals, warn: (mismatch: NatsInternalsMismatch) => void): NatsPatchStatus => {
  const mismatch = checkNatsInternals(nats)
  if (mismatch !== undefined) {
    warn(mismatch)
    return { installed: false, mismatch }
  }
  installReadPatch(nats.NodeTransport)
  installReceivePatch(nats.Parser)
  installSendPatch(nats.ProtocolHandler)
  return { installed: true }
}

let status: NatsPatchStatus | undefined

/** Installs the patches into this process's nats.js once; warns once (a process warning) when it differs. */
export const installNatsPatches = (): NatsPatchStatus =>
  (status ??= installNatsPatchesInto(installedNatsInternals(), (mismatch) =>
    process.emitWarning(mismatch.message, { code: "GRADWIRE_NATS_INTERNALS", type: "NatsInternalsMismatch" })
  ))

/**
 * The local address of a NATS connection's socket (nats.js keeps it on its transport, which it does
 * not expose): where peers on the bus's network reach this host; 127.0.0.1 on loopback or when
 * the connection's socket cannot be seen.
 */
export const connectionLocalAddress = (nc: object): string => {
  const socket = (nc as { protocol?: { transport?: { socket?: { localAddress?: string } } } }).protocol?.transport?.socket
  const a = socket?.localAddress
  if (!a) return "127.0.0.1"
  return a.startsWith("::ffff:") ? a.slice(7) : a
}
