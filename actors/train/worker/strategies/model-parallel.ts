// Pipeline and tensor parallelism: chosen by the train loop (ctx.preparePipeline), not by
// collectiveConfig.strategy; they live in ../model-parallel/ (stages, schedules, tensor-parallel
// pairs, stage-sharded checkpoints). Their entry lists them with the strategies and says which
// recoveries they support.
import { defineStrategy } from "./strategy.ts"

/**
 * Why a loop with several prepared models (pipelined ones, or a pipelined one beside
 * ctx.prepareModel's) restarts from the checkpoint after a lost worker (the restart's reason in
 * events.jsonl and the progress line; TrainContext.preparePipeline hands it to the group session).
 * One pipelined model alone is regrouped from the survivors, each stage's state from a replica of it
 * (with one data-parallel replica a lost stage is only in the checkpoint: the regroup says so).
 */
export const PIPELINE_NO_PEERS =
  "a loop that prepares more than one model (several ctx.preparePipeline calls, or one beside ctx.prepareModel) restarts from the checkpoint: " +
  "a regroup hands over one model's state"

/** Why a pipelined model's group waits for replacements at the lost ranks (Position.wholeGroup). */
export const PIPELINE_WHOLE_GROUP = "a pipelined model's grid (replicas x stages x tensorParallel) needs every rank at its place"

export const pipeline = defineStrategy({
  name: "pipeline",
  hint: "ctx.preparePipeline (pipeline and tensor parallelism, actors/train/worker/model-parallel/)",
  servers: false,
  selectable: false,
  peersCannot: () => undefined
})
