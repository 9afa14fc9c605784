// gradwire's own SIGINT / SIGTERM listeners (the Trainer's, the embedded nats-server's) stop what
// they started and then raise the signal again, so that the process ends of it as Node's default
// would (exit status 130 or 143) — unless the program listens for the signal itself. As in Node,
// a listener of its own means the program decides what a signal does: it then goes on, and the
// Trainer's fit() rejects with Interrupted for its catch to see (raising the signal again would
// only call its listener a second time).

const own = new Set<(...args: never[]) => unknown>()

/** Marks a listener as gradwire's own; returns it. */
export const ownSignalListener = <F extends (...args: never[]) => unknown>(listener: F): F => {
  own.add(listener)
  return listener
}

/** Whether a listener that is not gradwire's own listens for `signal`. */
export const programListens = (signal: NodeJS.Signals): boolean => process.listeners(signal).some((l) => !own.has(l as never))
