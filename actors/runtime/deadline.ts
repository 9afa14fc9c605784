// One helper for "wait, but not forever": every wait of the runtime that is not already an ask
// with its own deadline goes through it.

export const TIMED_OUT: unique symbol = Symbol("timed out")

/** Resolves with the promise's value, or with TIMED_OUT after `ms`; rejections pass through. */
export const withDeadline = <A>(promise: PromiseLike<A>, ms: number): Promise<A | typeof TIMED_OUT> =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(TIMED_OUT), Math.max(0, ms))
    promise.then(
      (a) => {
        clearTimeout(timer)
        resolve(a)
      },
      (e: unknown) => {
        clearTimeout(timer)
        reject(e)
      }
    )
  })

/** Waits for the promise at most `ms`, ignoring its outcome (for best-effort flushes and stops). */
export const settleWithin = async (promise: PromiseLike<unknown>, ms: number): Promise<void> => {
  await withDeadline(promise, ms).catch(() => undefined)
}
