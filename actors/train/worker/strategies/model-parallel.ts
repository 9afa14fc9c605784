// Pipeline and tensor parallelism: chosen by the train loop (ctx.preparePipeline), not by
// collectiveConfig.strategy; they live in ../model-parallel/ (stages, schedules, tensor-parallel
// pairs, stage-sharded checkpoints). Their entry lists them with the strategies and says which
// recoveries they support.
import { defineStrategy } from "./strategy.ts"

/**
 * Why a pipelined model restarts from the checkpoint after a lost worker (the restart's reason in
 * events.jsonl and the progress line; TrainContext.preparePipeline hands it to the group session).
 */
export const PIPELINE_NO_PEERS =
  "a pipelined model (ctx.preparePipeline) restarts from the checkpoint: its stages' links and micro-batch schedule are made for the grid it was cut for " +
  "and are not re-formed around a replacement (with one data-parallel replica a lost stage is only in the checkpoint anyway)"

export const pipeline = defineStrategy({
  name: "pipeline",
  hint: "ctx.preparePipeline (pipeline and tensor parallelism, actors/train/worker/model-parallel/)",
  servers: false,
  selectable: false,
  peersCannot: () => PIPELINE_NO_PEERS
})
