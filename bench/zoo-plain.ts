// The zoo's benchmark loop in plain tfjs, no gradwire around it (bench/train.ts runs it as a child
// process for the p = 1 row): the same model, batches and loss (zoo-step.ts) and Adam on the same
// backend, with the
// kernels gradwire registers on wasm (they are tfjs's backend, not gradwire's overhead).
//
//   node bench/zoo-plain.ts MODEL BATCH WARMUP STEPS [BACKEND] [--tfjs-upload] [--tfjs-dispatch] [--submit N]
//   -> prints {"samplesPerSec": ...}
//
// On webgpu, to time gradwire's changes to the backend against tfjs's own:
// --tfjs-upload: tfjs's own upload of CPU values (a new staging buffer each) instead of the one
//   gradwire installs (core/kernels/webgpu-upload.ts);
// --tfjs-dispatch: tfjs's own recording of a kernel (a new uniform buffer write and bind group
//   each) and its own buffer pool order instead of gradwire's (core/kernels/webgpu-dispatch.ts);
// --submit N: tfjs's WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE (kernels recorded per submit).
import { loadEngine } from "../index.ts"
import type { ZooModel } from "../examples/zoo/models.ts"
import { plainZooStep } from "./zoo-step.ts"

const args = process.argv.slice(2)
const [model, batchArg, warmupArg, stepsArg, backendArg] = args.filter((a, i) => !a.startsWith("--") && args[i - 1] !== "--submit") as [ZooModel, string, string, string, string | undefined]
const batch = Number(batchArg)
const { tf } = await loadEngine((backendArg ?? "auto") as "auto")
// The backend's own method, from its prototype, where gradwire's sits on the instance.
if (args.includes("--tfjs-upload")) delete (tf.backend() as { uploadToGPU?: unknown }).uploadToGPU
if (args.includes("--tfjs-dispatch")) {
  delete (tf.backend() as { recordAndSubmit?: unknown }).recordAndSubmit
  delete (tf.backend() as { submitQueue?: unknown }).submitQueue
  delete (tf.backend() as unknown as { bufferManager: { releaseBuffer?: unknown } }).bufferManager.releaseBuffer
}
const submit = args.indexOf("--submit")
if (submit >= 0) tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", Number(args[submit + 1]))
const { step } = await plainZooStep(tf, model, batch)
for (let s = 0; s < Number(warmupArg); s++) await step()
const t0 = performance.now()
for (let s = 0; s < Number(stepsArg); s++) await step()
console.log(JSON.stringify({ samplesPerSec: (Number(stepsArg) * batch) / ((performance.now() - t0) / 1000) }))
process.exit(0)
