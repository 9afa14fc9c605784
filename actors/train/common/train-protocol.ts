// What the trainer's controller (in the driver) and its workers (one process per rank) say to
// each other. Workers ask the controller for datasets and the checkpoint to resume from, and
// report metrics (with checkpoint bytes) as they go; the controller tells workers to run.
import * as Schema from "effect/Schema"
import { defineProtocol } from "../../runtime/protocol.ts"
import { TrainingStrategySchema } from "../../../core/config.ts"

const Bytes = Schema.instanceOf(Uint8Array<ArrayBufferLike>)
const Metrics = Schema.Record(Schema.String, Schema.Unknown)

/** A report round's metric when state parity repaired ranks: how many (and `<name>_ranks`: which). */
export const PARITY_METRIC = "gradwire/parity_repaired"

/**
 * A rank's report metric when its loop updated weights through tfjs's optimizer (model.fit,
 * trainOnBatch, optimizer.minimize) on a model it never prepared since its previous report: how many
 * times (worker/unprepared.ts). Each rank's own, in its metrics.
 */
export const UNPREPARED_METRIC = "gradwire/unprepared_updates"

/** What an UNPREPARED_METRIC of `n` means, and what to do (the worker's log and the driver's line). */
export const UNPREPARED_HINT = (n: number): string =>
  `${n} weight update(s) through tfjs's optimizer (model.fit, model.trainOnBatch or optimizer.minimize) on a model not passed to ctx.prepareModel(): ` +
  "their gradients were not all-reduced, so each rank trained that model alone and the ranks' weights drift apart; " +
  "prepare the model before training it (const dp = await ctx.prepareModel(model), then model.fit, dp.fit or dp.trainStep), " +
  "or ignore this for a model each rank trains by itself on purpose"

/**
 * The key of a checkpoint's metadata under which the driver keeps its own facts of it (RunFacts);
 * the loop's metadata stays as the loop gave it, and ctx.getCheckpoint() returns it without these.
 */
export const RUN_FACTS_KEY = "_gradwire"

/** What the driver records with a checkpoint it saves. */
export interface RunFacts {
  /** The generation (attempt) whose report saved it. */
  readonly attempt?: number
  /** That generation's report round. */
  readonly round?: number
  /** The run's report number (its rounds counted across restarts and reruns: metrics.jsonl's "report"). */
  readonly report?: number
  /** The group's size when it was saved (compression residuals follow only a group of that size). */
  readonly worldSize?: number
}

/** The driver's facts of a checkpoint (checkpoints saved before they moved under RUN_FACTS_KEY: the top-level worldSize). */
export const runFactsOf = (metadata: Readonly<Record<string, unknown>>): RunFacts => {
  const f = metadata[RUN_FACTS_KEY]
  const num = (v: unknown): number | undefined => (typeof v === "number" && Number.isFinite(v) ? v : undefined)
  if (f !== null && typeof f === "object") {
    const o = f as Record<string, unknown>
    const facts = { attempt: num(o.attempt), round: num(o.round), report: num(o.report), worldSize: num(o.worldSize) }
    return Object.fromEntries(Object.entries(facts).filter(([, v]) => v !== undefined))
  }
  const worldSize = num(metadata.worldSize)
  return worldSize !== undefined ? { worldSize } : {}
}

/** A checkpoint's metadata as the loop gave it (without the driver's RUN_FACTS_KEY). */
export const loopMetadata = (metadata: Readonly<Record<string, unknown>>): Record<string, unknown> => {
  if (!(RUN_FACTS_KEY in metadata)) return { ...metadata }
  const { [RUN_FACTS_KEY]: _facts, ...rest } = metadata
  return rest
}

export const CheckpointPayload = Schema.Struct({
  files: Schema.Record(Schema.String, Bytes),
  metadata: Schema.Record(Schema.String, Schema.Unknown)
})
export type CheckpointPayload = typeof CheckpointPayload.Type

/** An in-memory dataset's rows (makeDataset): class ids or float targets. */
export const ArrayDatasetPayload = Schema.Struct({
  kind: Schema.Literal("array"),
  x: Schema.instanceOf(Float32Array<ArrayBufferLike>),
  y: Schema.Union([Schema.instanceOf(Int32Array<ArrayBufferLike>), Schema.instanceOf(Float32Array<ArrayBufferLike>)]),
  featureShape: Schema.Array(Schema.Number),
  labelShape: Schema.optionalKey(Schema.Array(Schema.Number)),
  numClasses: Schema.Number
})

/** A file dataset as the driver resolved it: metadata only (core/data/resolve.ts); every worker reads its own rows. */
export const FileDatasetPayload = Schema.Struct({
  kind: Schema.Literal("files"),
  resolved: Schema.Unknown
})

/** A dataset made on each worker by a module's export (datasetFactory). */
export const FactoryDatasetPayload = Schema.Struct({
  kind: Schema.Literal("factory"),
  module: Schema.String,
  export: Schema.String,
  options: Schema.Unknown
})

export const DatasetPayload = Schema.Union([ArrayDatasetPayload, FileDatasetPayload, FactoryDatasetPayload])
export type DatasetPayload = typeof DatasetPayload.Type

/**
 * Where a streamed epoch is (core/data/plan.ts): the plan every rank of the group opened the epoch
 * with (`consumed`: the rows each rank had taken of its part when it was opened), and the rows a
 * rank takes per micro-batch; the step indices of a Position count from that opening.
 */
export const StreamCursor = Schema.Struct({
  plan: Schema.Struct({
    version: Schema.Literal(1),
    fingerprint: Schema.String,
    epoch: Schema.Number,
    intervals: Schema.Array(Schema.Tuple([Schema.Number, Schema.Number])),
    worldSize: Schema.Number,
    consumed: Schema.Number
  }),
  batch: Schema.Number
})
export type StreamCursor = typeof StreamCursor.Type

/**
 * Where a rank's loop is: the group operations of the data-parallel model it completed (gradient
 * reductions, epoch metric sums, batch-size exchanges; the start-up weight broadcast does not
 * count) and the report() calls it made, both since its loop started (from a checkpoint, or from
 * scratch); and, when it is inside dp.fit(), the epoch and the step in it (of stepsPerEpoch, as
 * this rank's group cuts the epoch; stepInEpoch = stepsPerEpoch at the epoch's metric sum).
 */
export const Position = Schema.Struct({
  ops: Schema.Number,
  reports: Schema.Number,
  /** Training steps completed since the last report() call (how a hand-written trainStep loop is placed). */
  stepsSinceReport: Schema.Number,
  inFit: Schema.Boolean,
  epoch: Schema.Number,
  stepInEpoch: Schema.Number,
  stepsPerEpoch: Schema.Number,
  /** dp.fit() over a stream (a file dataset): the plan its group reads the epoch from, which a regroup plans again. */
  stream: Schema.optionalKey(StreamCursor),
  /** Why this rank's streamed data cannot follow a regroup (a loader, which its factory made for this rank's place). */
  dataPinned: Schema.optionalKey(Schema.String),
  /** Why this rank's strategy state cannot follow a regroup now (strategy auto on the parameter servers, or moving between strategies). */
  strategyPinned: Schema.optionalKey(Schema.String),
  /** The loop has called dp.fit(): a joiner replays it and takes its place only at a step inside dp.fit(). */
  fitLoop: Schema.optionalKey(Schema.Boolean),
  /** Outside dp.fit(): why no rank can join the group here (a file dataset in the middle of an epoch the loop reads itself). */
  joinLater: Schema.optionalKey(Schema.String),
  /**
   * Group operations completed since the last report() call, steps and others alike (a pipelined
   * model's epoch sums and evaluations): where a joiner replaying such a loop takes its place.
   */
  opsSinceReport: Schema.optionalKey(Schema.Number),
  /**
   * Why the group cannot go on short-handed or renumber its ranks (a pipelined model's grid): a
   * regroup keeps every survivor at its rank and waits for replacements at the lost ranks.
   */
  wholeGroup: Schema.optionalKey(Schema.String),
  /** The rank was parked before its step's push applied as sent: it sends that push in the new group, and a rank behind it sends one as that step. */
  pushPending: Schema.optionalKey(Schema.Boolean),
  /**
   * The group's figures of the loop's recent distributed evaluations, [report() calls before it,
   * its number since the last report() call, loss, accuracy or NaN]: a joiner replaying the loop
   * from the checkpoint answers its evaluations with them (data-parallel.ts EVALUATIONS_KEPT).
   */
  evaluations: Schema.optionalKey(Schema.Array(Schema.Array(Schema.Number))),
  /** dp.fit()'s recent epoch results, [epoch, loss, accuracy or NaN, samples, steps]: a joiner's replay returns them for the epochs it skips. */
  epochs: Schema.optionalKey(Schema.Array(Schema.Array(Schema.Number)))
})
export type Position = typeof Position.Type

/**
 * A pipelined model's survivor says which files of its stage it holds (its shard: weights and
 * optimizer state; and the layout) with the optimizer steps it has taken, and names every stage
 * shard the grid needs: the regroup picks, per shard, the replica furthest on and asks only that
 * one for it (its snapshot), and gives up when a shard was held only by lost ranks
 * (actors/train/common/stage-handover.ts). The bytes are not in the pause reply: a grid's every
 * survivor would send its stage where one copy of each is needed.
 */
export const StageHandover = Schema.Struct({
  step: Schema.Number,
  holds: Schema.Array(Schema.String),
  needs: Schema.Array(Schema.Struct({ name: Schema.String, what: Schema.String }))
})
export type StageHandover = typeof StageHandover.Type

/**
 * A surviving rank's training state, handed to the other members of a regrouped generation so
 * they continue from it instead of a checkpoint: the model's weights and the optimizer's state (as
 * checkpoint files), where its loop is, and where it is in the epoch.
 */
export const PeerState = Schema.Struct({
  position: Position,
  files: Schema.Record(Schema.String, Bytes),
  /** Training steps the model has taken (its step counter). */
  step: Schema.Number
})
export type PeerState = typeof PeerState.Type

/**
 * What a group measured of its links (the direct links' threshold, the probed topology), kept by
 * each member for the next regroup: a regroup whose nodes it covers hands it to every member, who
 * then skip measuring again.
 */
export const LinkMeasurements = Schema.Struct({
  /** The nodes of the group that measured them. */
  nodes: Schema.Array(Schema.String),
  /** The direct links' threshold: calls of at least this many bytes go direct. */
  minBytes: Schema.optionalKey(Schema.Number),
  /** scheduler/topology.ts ObservedTopology. */
  observed: Schema.optionalKey(Schema.Unknown),
  /**
   * What algorithm 'auto' measured on training's own calls, per group shape (the node of each rank;
   * the most recent first, a few kept): a regroup into a shape measured before takes its picks
   * instead of timing every candidate again on processes a fault has just disturbed.
   */
  tuned: Schema.optionalKey(
    Schema.Array(
      Schema.Struct({
        nodes: Schema.Array(Schema.String),
        candidates: Schema.Array(Schema.String),
        /** Measured on warm processes (from the group's call 200 on: auto-config.ts CONFIRM_AT_CALL). */
        confirmed: Schema.Boolean,
        /** scheduler/algorithm-tuner.ts TunedSize, per bucket size. */
        sizes: Schema.Array(
          Schema.Struct({
            bytes: Schema.Number,
            candidates: Schema.Array(Schema.String),
            ms: Schema.Array(Schema.Number),
            picked: Schema.String,
            modelPick: Schema.String
          })
        )
      })
    )
  )
})
export type LinkMeasurements = typeof LinkMeasurements.Type

/** Whether measurements cover a group on `nodes` (every one of them among the nodes they were measured on). */
export const measurementsCover = (m: LinkMeasurements | undefined, nodes: ReadonlyArray<string>): m is LinkMeasurements => m !== undefined && nodes.every((n) => m.nodes.includes(n))

/**
 * Whether a regroup onto `nodes` hands the members these measurements instead of having them
 * measure their links and probe the topology again: when they cover every node, or when they
 * hold a topology observation taken across two nodes or more and cover most of the new group's
 * nodes (more covered than not). A replacement or spare on a node no group measured yet then
 * joins without stalling the survivors for the measurement (under a 0.6-core quota the
 * group stalled 1.1-2.9 s): the new node's links are priced by their link class, whose links between nodes
 * were measured, and algorithm 'auto' times every candidate on the new group's own calls anyway.
 */
export const measurementsServe = (m: LinkMeasurements | undefined, nodes: ReadonlyArray<string>): m is LinkMeasurements => {
  if (m === undefined) return false
  const distinct = [...new Set(nodes)]
  const covered = distinct.filter((n) => m.nodes.includes(n)).length
  if (covered === distinct.length) return true
  return observedNodes(m.observed).size >= 2 && covered > distinct.length - covered
}

/** The nodes a topology observation (scheduler/topology.ts ObservedTopology, carried untyped) was taken on. */
export const observedNodes = (observed: unknown): Set<string> => {
  const topology = (observed as { topology?: unknown } | undefined)?.topology
  return new Set(Array.isArray(topology) ? topology.flatMap((r) => (typeof (r as { nodeId?: unknown })?.nodeId === "string" ? [(r as { nodeId: string }).nodeId] : [])) : [])
}

/**
 * What a group on `nodes` keeps of its links for the next regroup. Measurements it reused from an
 * earlier group (the topology observation among them) cover that group's nodes as well as its own:
 * kept so, a short group that grows back onto one of them (a replacement on the lost worker's node)
 * reuses them too instead of measuring and probing again, and a group of one rank, which measures
 * nothing, hands on what it was given. A group that measured for itself covers its own nodes.
 * `observed` comes later (the probe's, or the reused one, once prepared).
 */
export const measurementsHandedOn = (
  reused: LinkMeasurements | undefined,
  nodes: ReadonlyArray<string>,
  minBytes: number | undefined,
  tuned: LinkMeasurements["tuned"]
): LinkMeasurements => {
  const carried = reused?.observed !== undefined
  return {
    nodes: [...new Set(carried ? [...reused.nodes, ...nodes] : nodes)],
    ...(minBytes !== undefined ? { minBytes } : {}),
    ...(carried ? { observed: reused.observed } : {}),
    ...(tuned ? { tuned } : {})
  }
}
/** One group shape's measured picks (LinkMeasurements.tuned). */
export type TunedShape = NonNullable<LinkMeasurements["tuned"]>[number]

/** A surviving worker's new place after a regroup (see WorkerProtocol.resume). */
export const Placement = Schema.Struct({
  attempt: Schema.Number,
  rank: Schema.Number,
  worldSize: Schema.Number,
  localRank: Schema.Number,
  localWorldSize: Schema.Number,
  nodeRank: Schema.Number,
  /** Node id per rank (hierarchical all-reduce groups by it). */
  nodes: Schema.Array(Schema.String),
  /** The communicator's group name, new for every generation. */
  group: Schema.String,
  /** A regroup's: what an earlier group of these nodes measured, reused instead of measuring again. */
  measured: Schema.optionalKey(LinkMeasurements),
  /** A regroup's, with parameter servers: their actor names now, in shard order (a lost one's replacement among them). */
  servers: Schema.optionalKey(Schema.Array(Schema.String)),
  /** A regroup's: the rank each survivor had in the generation before (survivors take ranks 0.., joiners follow). */
  survivorRanks: Schema.optionalKey(Schema.Array(Schema.Number)),
  /**
   * A regroup's: the generation runs below the size it is refilled or grown to. A hand-written
   * loop's ranks then agree at each report() whether to park there for the grow (GroupSession).
   */
  belowSize: Schema.optionalKey(Schema.Boolean)
})
export type Placement = typeof Placement.Type

/**
 * Where a worker joining a regrouped generation meets the survivors: it runs the loop from the
 * checkpoint its checkpoint request is given (the latest of the lineage at or before the
 * survivors' report() calls, with its own count: `reports`), skips the steps and reports the
 * survivors made already, up to `to`.
 */
export const JoinPosition = Schema.Struct({ to: Position })
export type JoinPosition = typeof JoinPosition.Type

export const ControllerProtocol = defineProtocol("trainer-controller", {
  /** A rank's report number `index`; answered once the controller holds it (checkpoint bytes included). */
  report: {
    request: Schema.Struct({
      attempt: Schema.Number,
      rank: Schema.Number,
      index: Schema.Number,
      metrics: Metrics,
      checkpoint: Schema.optionalKey(CheckpointPayload),
      /** This rank's own state for a checkpoint of this round (compression residuals), by file name. */
      aux: Schema.optionalKey(Schema.Record(Schema.String, Bytes))
    }),
    reply: Schema.Null
  },
  /** The state a regrouped generation continues from (a surviving rank's, held by the controller). */
  /** The state held for a regrouped generation; with `files`, only those of its files (a pipelined model's rank needs its stage's). */
  peerState: { request: Schema.Struct({ attempt: Schema.Number, files: Schema.optionalKey(Schema.Array(Schema.String)) }), reply: PeerState },
  /**
   * A rank's collective wait passed its deadline and `ranks` did not answer its liveness probe, or
   * answered but had not started the call: those the driver hears beating from their thread, with
   * how long each one's event loop has been held (one long synchronous computation), the cores its
   * process used lately, and when it would be taken for hung. A rank missing from the reply is not
   * known alive (collectives/communicator.ts CommunicatorOptions.peerLiveness). Answered as it
   * arrives, not behind a running handler (a checkpoint being saved).
   */
  liveness: {
    request: Schema.Struct({ attempt: Schema.Number, ranks: Schema.Array(Schema.Number) }),
    reply: Schema.Array(
      Schema.Struct({ rank: Schema.Number, heardAgoMs: Schema.Number, heldMs: Schema.Number, cpu: Schema.optionalKey(Schema.Number), hungAfterMs: Schema.Number })
    ),
    immediate: true
  },
  /** A named dataset given to the Trainer: its rows (in memory), its files' metadata, or its factory. */
  dataset: { request: Schema.Struct({ name: Schema.String }), reply: DatasetPayload },
  /**
   * The checkpoint to resume from, or null. With `omit`, without those of its files (a pipelined
   * model's rank leaves out the other stages' shards: it restores only its own). With `joinAt`, a
   * rank joining generation `attempt` where the survivors had made `reports` report() calls: the
   * latest checkpoint of the lineage made at or before that report, once the survivors' reports
   * before it are in (bounded), with its count of report() calls made before it (`reports`), from
   * which the joiner counts its own.
   */
  checkpoint: {
    request: Schema.NullOr(
      Schema.Struct({
        omit: Schema.optionalKey(Schema.Array(Schema.String)),
        joinAt: Schema.optionalKey(Schema.Struct({ attempt: Schema.Number, reports: Schema.Number }))
      })
    ),
    reply: Schema.NullOr(Schema.Struct({ path: Schema.String, metrics: Metrics, payload: CheckpointPayload, reports: Schema.optionalKey(Schema.Number) }))
  },
  /** Step progress for the live display and straggler hints. */
  progress: {
    request: Schema.Struct({
      attempt: Schema.Number,
      rank: Schema.Number,
      epoch: Schema.Number,
      step: Schema.Number,
      stepsPerEpoch: Schema.Number,
      /** Samples this rank has trained on so far in this attempt. */
      samples: Schema.Number,
      loss: Schema.Number,
      /** The mean of this rank's step losses (weighted by samples) over the epoch so far, or since the last report() call in a loop without epochs: what the progress line shows, as Keras's bar does. */
      meanLoss: Schema.optionalKey(Schema.Number),
      computeMs: Schema.Number,
      commMs: Schema.Number,
      /** Every step since the last progress message: [step, forward/backward ms, all-reduce ms, apply ms, ms waited since the previous step]. */
      stepTimes: Schema.optionalKey(Schema.Array(Schema.Array(Schema.Number))),
      /** Bytes this rank's collective connections sent and received so far (this process): the dashboard's per-rank traffic. */
      bytesSent: Schema.optionalKey(Schema.Number),
      bytesReceived: Schema.optionalKey(Schema.Number)
    })
  },
  /** Rank 0's all-reduce plan (algorithm per bucket, compression) with predicted times: explain.txt / explain.json. */
  explain: {
    request: Schema.Struct({
      attempt: Schema.Number,
      text: Schema.String,
      json: Schema.Unknown,
      summary: Schema.String,
      /**
       * "algorithm" (absent: the all-reduce plan), "strategy" (collectiveConfig.strategy "auto"'s
       * choice), "kernels" (a rank's backend and the kernels it ran on the cpu fallback; every rank
       * sends its own, with `rank`; an empty summary is not printed) or "deadlines" (rank 0's
       * collective deadline once derived from measured steps, collectives/deadlines.ts).
       */
      part: Schema.optionalKey(Schema.Literals(["algorithm", "strategy", "kernels", "deadlines"])),
      rank: Schema.optionalKey(Schema.Number)
    })
  },
  /** Timeline events of a rank (Chrome trace "X" events), flushed in batches. */
  trace: {
    request: Schema.Struct({ attempt: Schema.Number, rank: Schema.Number, events: Schema.Array(Schema.Unknown) })
  },
  /** The loop returned (`reports`: how often this rank called report). */
  finished: {
    request: Schema.Struct({
      attempt: Schema.Number,
      rank: Schema.Number,
      reports: Schema.Number,
      /** Micro-batches the loop added with { accumulate: true } that no update applied: dropped as it ended. */
      unapplied: Schema.optional(Schema.Struct({ microBatches: Schema.Number, samples: Schema.Number }))
    })
  },
  /** The loop threw. */
  failed: {
    request: Schema.Struct({
      attempt: Schema.Number,
      rank: Schema.Number,
      tag: Schema.String,
      message: Schema.String,
      stack: Schema.String,
      /** Ranks a collective error blames (dead or stalled peers), when the failure is one. */
      blamed: Schema.optionalKey(Schema.Array(Schema.Number)),
      /**
       * The rank is alive and waiting (its group broke under it): the controller may regroup it
       * with the other survivors (WorkerProtocol.pause / resume) instead of restarting it.
       */
      parked: Schema.optionalKey(Schema.Boolean),
      /**
       * The group broke because the ranks called different collectives (or with different lengths):
       * the controller puts this rank's `where` beside the others'.
       */
      mismatch: Schema.optionalKey(Schema.Boolean),
      /** Where this rank's loop was (GroupSession.where), when it had started its group. */
      where: Schema.optionalKey(Schema.String)
    })
  }
})
export type ControllerProtocol = typeof ControllerProtocol

export const WorkerArgs = Schema.Struct({
  /** The rank's place in its first generation (attempt, rank, world size, nodes, group). */
  ...Placement.fields,
  controller: Schema.String,
  loopModule: Schema.String,
  loopExport: Schema.String,
  /** Modules of datasetFactory datasets: the agent checks them as it checks the loop's. */
  datasetModules: Schema.optionalKey(Schema.Array(Schema.String)),
  loopConfig: Schema.Unknown,
  backend: Schema.String,
  /** The GPUs placed for this worker (its CUDA_VISIBLE_DEVICES; shared with others when it asked for a fraction of one). */
  gpus: Schema.optionalKey(Schema.String),
  collective: Schema.Struct({
    algorithm: Schema.String,
    compression: Schema.Unknown,
    bucketSizeMiB: Schema.Number,
    firstBucketSizeMiB: Schema.Number,
    wireDtype: Schema.String,
    timeoutMs: Schema.Number,
    /** collectiveConfig.timeoutMs was set explicitly: every collective wait has it (absent: deadlines are derived from measured steps, timeoutMs their cap). */
    timeoutFixed: Schema.optionalKey(Schema.Boolean),
    /** collectiveConfig.transport (absent: "auto"). */
    transport: Schema.optionalKey(Schema.Literals(["auto", "nats", "direct"])),
    /** The run's secret for the direct links (hex), made by the driver per run and handed out over the bus, never written to the run directory. */
    directSecret: Schema.optionalKey(Schema.String),
    /** Heterogeneity-aware per-rank batches for fit({ globalBatchSize }). */
    adaptiveBatching: Schema.optionalKey(Schema.Boolean),
    /** collectiveConfig.zeroStage (absent: 0). */
    zeroStage: Schema.optionalKey(Schema.Literals([0, 1, 2])),
    /** Stage 1 recovering from peers: each rank keeps a replica of its predecessor's optimizer shard. */
    zeroReplica: Schema.optionalKey(Schema.Boolean),
    /** collectiveConfig.strategy: a registered strategy's name (strategies/registry.ts, checked by the driver). */
    strategy: Schema.optionalKey(TrainingStrategySchema),
    /** strategy "local-sgd": the outer loop (optim/outer-optimizer.ts LocalSgdSettings); its codec is `compression`. */
    localSgd: Schema.optionalKey(
      Schema.Struct({
        syncEvery: Schema.Number,
        outerOptimizer: Schema.Literals(["average", "nesterov"]),
        outerLr: Schema.Number,
        outerMomentum: Schema.Number,
        fragments: Schema.Number,
        overlap: Schema.Boolean
      })
    ),
    backupWorkers: Schema.optionalKey(Schema.Number),
    parameterServer: Schema.optionalKey(
      Schema.Struct({
        numServers: Schema.Number,
        mode: Schema.Literals(["sync", "async", "ssp"]),
        staleness: Schema.Number,
        /** Each server keeps a replica of the one before it, from which a lost server is made again (two servers or more). */
        replicas: Schema.optionalKey(Schema.Boolean)
      })
    )
  }),
  seed: Schema.Number,
  timeline: Schema.Boolean,
  /** failureConfig.natsOutageTimeoutMs: the worker exits when NATS stays away longer. */
  natsOutageTimeoutMs: Schema.optionalKey(Schema.Number),
  /** failureConfig.parityEvery: report rounds between state-parity checks (0 or absent: none). */
  parityEvery: Schema.optionalKey(Schema.Number),
  /**
   * A worker joining a regrouped generation: it runs the loop from the checkpoint the controller
   * gives it (the latest at or before the survivors' report() calls, with its count), skips
   * the training steps and reports the survivors have already done (up to `to`), then takes the
   * survivors' state and continues with them.
   */
  join: Schema.optionalKey(JoinPosition),
  /**
   * The largest world size, and what stays fixed when the size changes: elastic groups, and a
   * fixed-size group running short-handed while a replacement starts (`fixed`: not elastic).
   */
  elastic: Schema.optionalKey(
    Schema.Struct({ maxWorkers: Schema.Number, batch: Schema.Literals(["keep-global", "keep-per-worker"]), fixed: Schema.optionalKey(Schema.Boolean) })
  ),
  /** The parameter-server strategy: the actor names of this generation's servers, in shard order. */
  servers: Schema.optionalKey(Schema.Array(Schema.String)),
  parameterServer: Schema.optionalKey(
    Schema.Struct({
      mode: Schema.Literals(["sync", "async", "ssp"]),
      staleness: Schema.Number,
      backupWorkers: Schema.Number,
      /** Deadline of a worker's wait for a server's answer. */
      timeoutMs: Schema.Number,
      /** collectiveConfig.strategy "auto": start on the all-reduce, move to the servers when they are predicted faster. */
      auto: Schema.optionalKey(Schema.Boolean)
    })
  )
})
export type WorkerArgs = typeof WorkerArgs.Type

const F32 = Schema.instanceOf(Float32Array<ArrayBufferLike>)

/** Fresh parameters of one server's shard, told to a worker that pushed a gradient (ps-server.ts). */
export const PsParams = Schema.Struct({
  server: Schema.Number,
  step: Schema.Number,
  params: F32,
  version: Schema.Number,
  staleness: Schema.Number,
  dropped: Schema.Boolean,
  /** The server process's CPU ms per push since it was initialised (strategy "auto" prices the servers by it). */
  cpuMsPerPush: Schema.optionalKey(Schema.Number),
  /** The push's group (its generation), echoed: an answer to a push of a group left behind is not taken for a later one's. */
  group: Schema.optionalKey(Schema.Number),
  /** Set instead of the rest when the server could not take the gradient (bad input, shutdown). */
  error: Schema.optionalKey(Schema.String)
})
export type PsParams = typeof PsParams.Type

/** A server shard's options as an init (or a replica's init) carries them: the workers' optimizer and the mode. */
const shardOptionFields = {
  spec: Schema.Record(Schema.String, Schema.Unknown),
  numWorkers: Schema.Number,
  mode: Schema.Literals(["sync", "async", "ssp"]),
  staleness: Schema.Number,
  backupWorkers: Schema.Number,
  weightDecay: Schema.Number
}

/** A parameter server (collectiveConfig.strategy "parameter-server"): one shard of the flat parameters. */
export const ServerProtocol = defineProtocol("ps-server", {
  /**
   * Takes the shard's initial values and the workers' optimizer (rank 0 sends it after the start-up
   * broadcast), or, with `state`, a checkpoint's (params, optimizer state, clocks). Answered when set.
   */
  init: {
    request: Schema.Struct({
      params: F32,
      ...shardOptionFields,
      state: Schema.optionalKey(Schema.instanceOf(Uint8Array<ArrayBufferLike>)),
      /** collectiveConfig.compression (a codec the pushes can carry: ps-push-codec.ts); absent: pushes come uncompressed. */
      compression: Schema.optionalKey(Schema.Unknown),
      /** The workers' group (generation): pushes of an earlier one are refused. */
      group: Schema.optionalKey(Schema.Number),
      /** A server made from a replica after a lost one: the last sync step applied is kept (a step pushed again is dropped, not applied twice). */
      keepApplied: Schema.optionalKey(Schema.Boolean),
      /** A spare taking a lost server's place: the shard it serves from now on, and the server keeping its replica. */
      index: Schema.optionalKey(Schema.Number),
      successor: Schema.optionalKey(Schema.String)
    }),
    reply: Schema.Null
  },
  /** The predecessor's whole shard (its state and options), which this server keeps a replica of from now on. */
  replicaInit: {
    request: Schema.Struct({
      index: Schema.Number,
      state: Schema.instanceOf(Uint8Array<ArrayBufferLike>),
      ...shardOptionFields,
      compression: Schema.optionalKey(Schema.Unknown)
    }),
    reply: Schema.Null
  },
  /** An update the predecessor applied (the gradient, its learning rate and step), in order: the replica replays it. */
  replicaUpdate: { request: Schema.Struct({ index: Schema.Number, grad: F32, learningRate: Schema.Number, step: Schema.Number }), reply: Schema.Null },
  /** The driver, after shard `index` was lost: initialise the server `to` (a new one, or a spare: it then serves shard `index`, replicating to `successor`) from this server's replica of it, for `numWorkers` workers of `group`. */
  handOver: {
    request: Schema.Struct({ index: Schema.Number, to: Schema.String, numWorkers: Schema.Number, group: Schema.Number, successor: Schema.optionalKey(Schema.String) }),
    reply: Schema.Null
  },
  /** The driver, after this server's successor was replaced: send the new one (`to`) this shard, and the updates from now on. */
  replicateTo: { request: Schema.Struct({ to: Schema.String }), reply: Schema.Null },
  /**
   * The workers were regrouped (recovery from surviving peers, a grow): the shard keeps its
   * parameters, version, optimizer state and last sync step applied, and serves `numWorkers`
   * workers from now on, their clocks starting again (survivors are renumbered); pushes waiting are
   * dropped (their workers were paused and push again: a step applied already is dropped), and
   * pushes of an earlier group are refused.
   */
  regroup: { request: Schema.Struct({ numWorkers: Schema.Number, group: Schema.Number }), reply: Schema.Null },
  /** A worker's gradient of this shard (told; the parameters come back as the worker's psParams). */
  push: {
    request: Schema.Struct({
      worker: Schema.Number,
      replyTo: Schema.String,
      step: Schema.Number,
      basedOn: Schema.Number,
      grad: F32,
      /** collectiveConfig.wireDtype "float16": the gradient as binary16 bits instead (grad is then empty). */
      half: Schema.optionalKey(Schema.instanceOf(Uint16Array<ArrayBufferLike>)),
      /** collectiveConfig.compression: the gradient as the codec's message instead, error feedback on the worker (grad is then empty). */
      packed: Schema.optionalKey(Bytes),
      weight: Schema.Number,
      /** Sync: the step's samples over every worker (dp.fit's global batch), when the worker knows them. */
      stepWeight: Schema.optionalKey(Schema.Number),
      learningRate: Schema.optionalKey(Schema.Number),
      /** The pushing worker's group (generation); absent: 0. */
      group: Schema.optionalKey(Schema.Number)
    }),
    reply: Schema.Null
  },
  /** The shard's state for a checkpoint (params, version, optimizer state, clocks), encoded. */
  state: { request: Schema.Null, reply: Schema.instanceOf(Uint8Array<ArrayBufferLike>) },
  /** The shard's current parameters. */
  pull: { request: Schema.Null, reply: Schema.Struct({ params: F32, version: Schema.Number }) },
  /** A worker's loop ended: sync and ssp steps stop waiting for it. */
  finish: { request: Schema.Struct({ worker: Schema.Number, group: Schema.optionalKey(Schema.Number) }), reply: Schema.Null },
  /** A worker is away until its next push (in a collective outside the servers): sync steps do not wait for it meanwhile. */
  away: { request: Schema.Struct({ worker: Schema.Number, group: Schema.optionalKey(Schema.Number) }), reply: Schema.Null },
  /** Counters: updates, dropped gradients, staleness. */
  stats: { request: Schema.Null, reply: Schema.Record(Schema.String, Schema.Number) }
})
export type ServerProtocol = typeof ServerProtocol

export const ServerArgs = Schema.Struct({
  index: Schema.Number,
  numServers: Schema.Number,
  /** The server that keeps a replica of this one's shard (the next one, cyclically); none with one server. */
  successor: Schema.optionalKey(Schema.String),
  /** A lost server's replacement, started while the workers run (a spare has index -1): it optimizes its hot code sooner (core/tier-up.ts). */
  joining: Schema.optionalKey(Schema.Boolean)
})
export type ServerArgs = typeof ServerArgs.Type

/**
 * Where a standby worker (one started ahead, while the group ran short-handed) goes when it is let
 * in: its place in the regrouped generation, and where it joins the survivors.
 */
export const Admission = Schema.Struct({ placement: Placement, join: Schema.optionalKey(JoinPosition) })
export type Admission = typeof Admission.Type

/**
 * A standby worker's warm-up before it said it was ready (actors/train/worker/warm-up.ts): training
 * steps, whole ms; `raised`: it had been started lowered and its agent raised it, starved by other
 * work on its cores (core/priority.ts watchStarvation).
 */
export const WarmUp = Schema.Struct({ steps: Schema.Number, ms: Schema.Number, raised: Schema.optionalKey(Schema.Boolean) })
export type WarmUp = typeof WarmUp.Type

export const WorkerProtocol = defineProtocol("trainer-worker", {
  /**
   * Load the engine, open the collective connections and import the loop module, without joining
   * a group (a standby worker), then warm up (warm-up.ts): answered when done, with the warm-up's
   * steps and time (null when it did none). `run` does the same first when it was not asked.
   */
  prepare: { request: Schema.Null, reply: Schema.NullOr(WarmUp) },
  /**
   * Start the user's loop (answered at once; the loop runs in the background). A standby worker is
   * given its admission here: the placement and join it runs with instead of its spawn args'.
   */
  run: { request: Schema.NullOr(Admission), reply: Schema.Null },
  /**
   * Stop at the next group operation (the group is being re-formed after a failure): answered
   * once the loop waits there, with where it is; "unsupported" when this rank cannot be regrouped
   * (no prepared model, its loop already ended, or it failed). `atReport` (a grow): a hand-written
   * loop of a generation below its size stops at the first report() call where every rank has
   * been asked instead, so that new ranks join at a report boundary (a loop's epochs are sized
   * by ctx.worldSize there); dp.fit() stops at its next group operation all the same.
   */
  pause: {
    request: Schema.Struct({ attempt: Schema.Number, atReport: Schema.optionalKey(Schema.Boolean) }),
    reply: Schema.Struct({
      state: Schema.Literals(["parked", "unsupported"]),
      position: Position,
      reason: Schema.String,
      /** What this rank's last group measured of its links, if anything. */
      measured: Schema.optionalKey(LinkMeasurements),
      /** ZeRO stage 1: this survivor's optimizer shard and its replica of its predecessor's (merged by the regroup). */
      shards: Schema.optionalKey(Schema.Record(Schema.String, Bytes)),
      /** A pipelined model: this survivor's stage (merged by the regroup with its replicas'). */
      stage: Schema.optionalKey(StageHandover)
    })
  },
  /** This rank's state, for the other members of the regrouped generation (asked of one survivor). */
  snapshot: { request: Schema.Null, reply: PeerState },
  /** Continue in the regrouped generation at `placement`, from the state of the survivor at `source` (its position). */
  resume: { request: Schema.Struct({ placement: Placement, source: Position }), reply: Schema.Null },
  /** A parameter server's answer to this rank's push (told). */
  // Outside the mailbox: a grow's pause (answered at the loop's next report() call) holds it while
  // the loop's steps wait for these answers.
  psParams: { request: PsParams, reply: Schema.Null, immediate: true }
})
export type WorkerProtocol = typeof WorkerProtocol
