// What a model-parallel rank exchanges with the others, as interfaces the engine runs on: one-way
// channels to its pipeline neighbours (activations forward, their gradients backward) and groups
// that sum buffers (the stage's data-parallel replicas, its tensor-parallel ranks, the world).
// transport.ts implements them over NATS; tests can implement them in one process.

/** One direction of a link between two neighbouring stages: messages arrive in the order sent. */
export interface Channel {
  /** Sends `buf` (not modified until the promise settles). */
  send(buf: Float32Array): Promise<void>
  /** Receives the next message into `into`, which has exactly its length. */
  recv(into: Float32Array): Promise<void>
}

/** Ranks that reduce buffers together, in place; every member calls the same reductions in the same order. */
export interface SumGroup {
  readonly size: number
  /** This member's index (0 .. size-1). */
  readonly index: number
  sum(buf: Float32Array): Promise<void>
  /** sum(w_i buf_i) / sum(w_i). */
  weightedMean(buf: Float32Array, weight: number): Promise<void>
  /** Copies member `root`'s buffer into every member's. */
  broadcast(buf: Float32Array, root: number): Promise<void>
}

export interface StageLinks {
  /** Activations from the previous stage (absent on the first stage). */
  readonly fromPrev?: Channel
  /** Gradients of those activations back to it. */
  readonly toPrev?: Channel
  /** Activations to the next stage (absent on the last stage). */
  readonly toNext?: Channel
  /** Gradients of them from it. */
  readonly fromNext?: Channel
  /** The replicas of this stage (same stage and tensor rank in every data-parallel replica). */
  readonly replicas: SumGroup
  /** The tensor-parallel ranks of this stage. */
  readonly tensor: SumGroup
  /** Every rank. */
  readonly world: SumGroup
  close(): Promise<void>
}

/** A group of one: every reduction is the identity. */
export const soloGroup: SumGroup = {
  size: 1,
  index: 0,
  sum: () => Promise.resolve(),
  weightedMean: (buf, weight) => {
    if (weight === 0) buf.fill(0)
    return Promise.resolve()
  },
  broadcast: () => Promise.resolve()
}

/**
 * Links whose channels and groups can be made again under the same stage (a regroup forms new
 * communicators): the model and its tensor-parallel pairs hold `links`, which forwards every call
 * to the links `swap` put in last.
 */
export const swappableLinks = (first: StageLinks): { readonly links: StageLinks; swap(next: StageLinks): StageLinks } => {
  let cur = first
  const group = (of: (l: StageLinks) => SumGroup): SumGroup => ({
    get size() {
      return of(cur).size
    },
    get index() {
      return of(cur).index
    },
    sum: (buf) => of(cur).sum(buf),
    weightedMean: (buf, weight) => of(cur).weightedMean(buf, weight),
    broadcast: (buf, root) => of(cur).broadcast(buf, root)
  })
  const channel = (of: (l: StageLinks) => Channel | undefined): Channel | undefined =>
    of(first) ? { send: (buf) => of(cur)!.send(buf), recv: (into) => of(cur)!.recv(into) } : undefined
  const fromPrev = channel((l) => l.fromPrev)
  const toPrev = channel((l) => l.toPrev)
  const toNext = channel((l) => l.toNext)
  const fromNext = channel((l) => l.fromNext)
  const links: StageLinks = {
    ...(fromPrev ? { fromPrev } : {}),
    ...(toPrev ? { toPrev } : {}),
    ...(toNext ? { toNext } : {}),
    ...(fromNext ? { fromNext } : {}),
    replicas: group((l) => l.replicas),
    tensor: group((l) => l.tensor),
    world: group((l) => l.world),
    close: () => cur.close()
  }
  return {
    links,
    /** Puts `next` in place; returns the links it replaced (for the caller to close). */
    swap: (next) => {
      const old = cur
      cur = next
      return old
    }
  }
}
