// Pipeline and tensor parallelism: chosen by the train loop (ctx.preparePipeline), not by
// collectiveConfig.strategy; they live in ../model-parallel/ (stages, schedules, tensor-parallel
// pairs, stage-sharded checkpoints). Their entry lists them with the strategies and says which
// recoveries they support.
import { defineStrategy } from "./strategy.ts"

export const pipeline = defineStrategy({
  name: "pipeline",
  hint: "ctx.preparePipeline (pipeline and tensor parallelism, actors/train/worker/model-parallel/)",
  servers: false,
  selectable: false,
  peersCannot: () => "a pipelined model's stages each hold only their own layers, so a lost stage is only in the checkpoint"
})
