// Defaults that more than one part of gradwire relies on, defined once. Where two parts used to
// disagree, the comment says which value won and why; the guides in docs/ quote these values.

/** Bytes in a MiB. */
export const MiB = 1024 * 1024

// ---------------------------------------------------------------------------------------------
// Collectives

/**
 * Deadline of every collective wait (CollectiveConfig.timeoutMs, CommunicatorOptions.timeoutMs): a
 * collective fails when no frame for it arrived for this long. 30 s, the Trainer's value since the
 * start, also for a Communicator created directly (which used 60 s): inside the Trainer a dead
 * worker is found in at most WORKER_DEAD_AFTER_MS anyway, and outside it this deadline is the only
 * detector of a hung peer, so a shorter one serves both; a rank that legitimately falls behind
 * for longer (a long checkpoint write between collectives) needs a larger timeoutMs either way.
 * Without an explicit timeoutMs, the Trainer's workers derive a shorter deadline from their
 * measured steps (DEADLINE_FACTOR below) and this is its cap and its value until then.
 */
export const COLLECTIVE_TIMEOUT_MS = 30_000

/**
 * Collective deadlines from measurements (collectives/deadlines.ts): once DEADLINE_WARMUP_STEPS
 * training steps are measured, a collective wait without an explicit timeoutMs fails after
 * DEADLINE_FACTOR x the median step time + COLLECTIVE_DEADLINE_FLOOR_MS of silence, never more
 * than COLLECTIVE_TIMEOUT_MS. Twice the step: a peer that computes the same step as this rank is at
 * most about one step behind it. The floor (10 s) absorbs what a median does not see: a GC pause, a
 * loaded machine's scheduling (seconds on a shared 2-core machine), an epoch boundary's evaluation
 * and checkpoint upload.
 */
export const DEADLINE_FACTOR = 2

/** The additive floor of a measured collective deadline (see DEADLINE_FACTOR). */
export const COLLECTIVE_DEADLINE_FLOOR_MS = 10_000

/** Steps measured before a collective deadline is derived; until then COLLECTIVE_TIMEOUT_MS applies (the first steps compile kernels). */
export const DEADLINE_WARMUP_STEPS = 5

/** Step and collective times a measured deadline's medians are taken over (the latest ones). */
export const DEADLINE_WINDOW = 64

/** Deadline of a communicator's start-up handshake: ranks start at different times (process spawn, tfjs backend load). */
export const COLLECTIVE_CREATE_TIMEOUT_MS = 60_000

/**
 * Largest data payload per collective message. The communicator uses the smaller of this and what
 * the smallest max_payload of the group's servers allows: 4 MiB on the embedded cluster
 * (EMBEDDED_MAX_PAYLOAD_BYTES), just under 1 MiB on a default nats-server. The cost model is told
 * the communicator's actual chunk; without one it assumes COST_MODEL_CHUNK_BYTES.
 */
export const COLLECTIVE_CHUNK_BYTES = 4 * MiB

/**
 * Largest data payload per frame in a group whose every rank reads every peer's direct link (at
 * most half the window): a frame costs 0.1-0.2 ms of CPU on 2 cores however large, and a 64 MiB
 * ring all-reduce at p = 8 took 0.98-1.01x gloo's time in 8 MiB frames against 1.07-1.32x in
 * 4 MiB ones (docs/benchmarks.md). A frame that must go through NATS instead (its link closed) is
 * split into messages that fit max_payload.
 */
export const COLLECTIVE_DIRECT_CHUNK_BYTES = 8 * MiB

/** Credits per call: unacknowledged bytes a rank lets its senders have (well under nats-server's 64 MiB max_pending). */
export const COLLECTIVE_WINDOW_BYTES = 16 * MiB

/** Frames held for collectives a rank has not started yet, at most. */
export const COLLECTIVE_EARLY_LIMIT_BYTES = 512 * MiB

/** Gradient bucket size (CollectiveConfig.bucketSizeMiB), as PyTorch DDP's bucket_cap_mb. */
export const BUCKET_SIZE_MIB = 25

/** The first bucket's size (CollectiveConfig.firstBucketSizeMiB): small, so communication starts early. */
export const FIRST_BUCKET_SIZE_MIB = 1

// ---------------------------------------------------------------------------------------------
// NATS

/** nats-server's own default max_payload: what a server that says nothing else allows. */
export const NATS_MAX_PAYLOAD_BYTES = 1 * MiB

/** max_payload of the embedded cluster's nats-server: large enough for 4 MiB collective chunks. */
export const EMBEDDED_MAX_PAYLOAD_BYTES = 8 * MiB

/**
 * The chunk the cost model assumes when it is not told the communicator's: what the communicator
 * uses on a server with the default max_payload (the smaller of the two; the header's few bytes
 * aside).
 */
export const COST_MODEL_CHUNK_BYTES = Math.min(COLLECTIVE_CHUNK_BYTES, NATS_MAX_PAYLOAD_BYTES)

// ---------------------------------------------------------------------------------------------
// Liveness

/**
 * Silence after which the Trainer counts a worker as dead. Exits (crash, kill -9) are reported by
 * the agent at once; this only catches hung processes and lost nodes, and a worker busy in a long
 * tfjs kernel on an oversubscribed machine must not be mistaken for one. The floor: the driver
 * waits DEADLINE_FACTOR x the longest measured step computation when that is longer.
 */
export const WORKER_DEAD_AFTER_MS = 10_000
/** The same for a job with GPU workers (webgpu compiles kernels on first use, holding the event loop). */
export const GPU_WORKER_DEAD_AFTER_MS = 30_000
/**
 * The same before any step is measured: a worker's first computations (its dry step in
 * prepareModel, its first training step, every kernel compiled on first use) hold its event loop
 * for as long as a step of its model, unknown until one is reported. A ResNet-18 step takes about
 * a second alone on a core and its first ones took over 10 s on a loaded 2-core machine, where the
 * fixed 10 s counted the worker as dead. A hang before the first step is found this much later;
 * a crash or kill at once, as ever (its agent reports the exit).
 */
export const WORKER_START_DEAD_AFTER_MS = 60_000

/**
 * A worker process beats from a thread of its own (actors/runtime/heartbeat.ts), so a long
 * computation on its main thread no longer silences it: silence means the process is stopped or
 * cut off, and counts after the heartbeat deadline's floor. Its event loop, held by one
 * synchronous stretch (a step, an evaluation whose awaits resolve at once: a 64-image resnet18
 * evaluation loop held one for 18 s on a loaded 2-core machine), is taken for hung only after
 * this long, or the heartbeat deadline if longer; its peers wait for it that long in their
 * collectives (collectives/communicator.ts peerLiveness). Not much longer: nats-server drops a
 * client that leaves two of its pings (2 min apart) unanswered.
 */
export const WORKER_HELD_DEAD_AFTER_MS = 120_000

/**
 * How long a collective waits past its deadline for a peer that is behind the call while its
 * process works (its event loop free, at least a quarter of a core: an evaluation on one rank that
 * awaits between its batches), as DDP waits out its process group's timeout: 30 min, Ray Train's
 * and PyTorch's gloo default. A peer behind and idle is named at the deadline.
 */
export const BUSY_PEER_WAIT_MS = 1_800_000

/** Silence after which a node (its agent beats every 500 ms) is dead in the cluster view. */
export const NODE_DEAD_AFTER_MS = 2_500

/** Silence after which a watched actor is dead, unless its watcher asks for another value. */
export const ACTOR_DEAD_AFTER_MS = 2_000

/**
 * How long a process waits for a lost NATS connection to come back before it gives up
 * (failureConfig.natsOutageTimeoutMs): the driver fails the run with NatsUnavailable, workers exit;
 * node agents keep retrying. A supervised nats-server is back within a second; a minute covers a
 * server being replaced by hand or a short network outage.
 */
export const NATS_OUTAGE_TIMEOUT_MS = 60_000

/**
 * How long a worker asks its driver's controller again when nobody subscribes to it (the server's
 * "no responders") before its report(), dataset or checkpoint call fails: after a NATS outage a
 * worker's connection can come back before the driver's has resubscribed (the client waits up to
 * its reconnect interval between tries), and a report sent then found nobody and failed the loop.
 */
export const CONTROLLER_UNAVAILABLE_MS = 15_000

/**
 * How long a joiner's checkpoint request waits for the survivors' last reports before the
 * regroup (fit-run.ts #joinCheckpoint): they come as soon as the survivors are regrouped; past
 * this the joiner starts from the latest checkpoint there is, and one that cannot meet the
 * survivors from there makes the group restart from the checkpoint, saying why.
 */
export const JOIN_CHECKPOINT_WAIT_MS = 10_000

/**
 * How long a group waits for room before PlacementInfeasible (scalingConfig.placementTimeoutMs):
 * after a lost node, the time a spot machine takes to be replaced or an agent to restart.
 */
export const PLACEMENT_TIMEOUT_MS = 60_000
