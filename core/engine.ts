// Chooses and loads the tfjs engine for this process: the `tensorflow` backend from
// @tensorflow/tfjs-node-gpu or @tensorflow/tfjs-node when installed (optional peers: their install
// downloads libtensorflow), else the wasm backend that ships inside its npm package, else the
// pure-JS cpu backend. The "webgpu" backend (Dawn through the optional `webgpu` peer, see
// webgpu.ts) loads only when asked for by name: "auto" never tries it, so a machine without a GPU
// runs as it would without the package. Loaded lazily: importing tfjs costs hundreds of
// milliseconds, and most of gradwire (NATS, collectives, the CLI) never needs it. The tfjs
// packages are CommonJS, and are loaded with `require` (loadPackage): an `import` of them makes
// Node scan their sources for named exports first (cjs-module-lexer over 6 MB of bundles, which
// the compile cache does not keep), 187 against 50 ms of CPU for tfjs and its wasm backend in a
// fresh process, paid by every worker at its start. The module is the same either way: a loop
// that imports tfjs itself gets the instance the engine set up.
import { createRequire } from "node:module"
import { ConfigError } from "./errors.ts"
import { registerMissingGradients } from "./kernels/gradients.ts"
import { BATCH_NORM_TRAIN, installBatchNormTrain } from "./kernels/batch-norm-train.ts"
import { CONV2D_TRAIN, installTrainLayers } from "./kernels/train-layers.ts"
import { installLayerNorm, LAYER_NORM } from "./kernels/layer-norm.ts"
import { installProbCrossEntropy, PROB_CROSS_ENTROPY } from "./kernels/prob-cross-entropy.ts"
import { installSharedSaves } from "./kernels/saved-tensors.ts"
import { GRU_UPDATE, installGruCell } from "./kernels/gru-cell.ts"
import { installLstmCell, LSTM_CELL } from "./kernels/lstm-cell.ts"
import { LSTM_SEQUENCE } from "./kernels/lstm-sequence.ts"
import { registerWasmKernels } from "./kernels/register.ts"
import { installWebGpuConvFilterGrad } from "./kernels/conv-grads-webgpu.ts"
import { installReluGradWebGpu } from "./kernels/relu-grad.ts"
import { installWebGpuDispatch } from "./kernels/webgpu-dispatch.ts"
import { installWebGpuUpload } from "./kernels/webgpu-upload.ts"
import { DISABLE_WORKGROUP_INIT, WEBGPU_PACKAGES, installedDawnFlags, requestWebGpuAdapter, withinDeadline } from "./webgpu.ts"

import type { Tf } from "./tf.ts"

export type { Tf }

/** Whether `v` is a tfjs module (a function's optional first argument: `(tf, checkpoint)` or `(checkpoint)`). */
export const isTf = (v: unknown): v is Tf =>
  typeof v === "object" && v !== null && typeof (v as { tensor?: unknown }).tensor === "function" && typeof (v as { sequential?: unknown }).sequential === "function"
export type BackendKind = "tensorflow-gpu" | "webgpu" | "tensorflow" | "wasm" | "cpu"

const require = createRequire(import.meta.url)

/** A CommonJS package (tfjs and its backends), by `require`: see the top of this file. */
const loadPackage = <T = unknown>(pkg: string): T => require(pkg) as T

/** Whether a package can be resolved from here (without loading it). */
export const resolvable = (pkg: string): boolean => {
  try {
    require.resolve(pkg)
    return true
  } catch {
    return false
  }
}

let loaded: Promise<{ tf: Tf; backend: BackendKind }> | undefined
let loadedWant: string | undefined
/** Why this process runs the backend it runs: what was asked, and each candidate passed over. */
const why: string[] = []

/** How the engine was chosen, e.g. 'asked for "auto": @tensorflow/tfjs-node-gpu is not installed; ...; wasm loaded'. */
export const engineChoice = (): string => why.join("; ")

const tryNative = async (pkg: string): Promise<Tf | undefined> => {
  if (!resolvable(pkg)) {
    why.push(`${pkg} is not installed`)
    return undefined
  }
  try {
    return loadPackage<Tf>(pkg)
  } catch (e) {
    why.push(`${pkg} does not load (${String(e).split("\n")[0]})`)
    return undefined
  }
}

const WEBGPU_DEADLINE_MS = 30_000

const loadWebGpu = async (): Promise<Tf> => {
  const missing = WEBGPU_PACKAGES.filter((p) => !resolvable(p))
  if (missing.length > 0) {
    throw new ConfigError({
      field: "scalingConfig.backend",
      reason:
        `the "webgpu" backend needs ${missing.join(" and ")}, which ${missing.length === 1 ? "is" : "are"} not installed here: ` +
        'npm install webgpu @tensorflow/tfjs-backend-webgpu@4.22.0 on a machine with a GPU and a Vulkan driver, or use backend "auto"'
    })
  }
  const found = await requestWebGpuAdapter(WEBGPU_DEADLINE_MS)
  if (!found.ok) {
    throw new ConfigError({
      field: "scalingConfig.backend",
      reason:
        `the "webgpu" backend has no GPU here: ${found.reason}. It needs a GPU with a Vulkan driver ` +
        '(Mesa\'s lavapipe lacks features Dawn needs); use backend "auto" or "tensorflow-gpu" on this node'
    })
  }
  const tf = loadPackage<Tf>("@tensorflow/tfjs")
  // Registers the backend now that navigator.gpu is there; its factory asks Dawn for the adapter again.
  loadPackage("@tensorflow/tfjs-backend-webgpu")
  const ok = await withinDeadline(tf.setBackend("webgpu"), WEBGPU_DEADLINE_MS, "tfjs's webgpu backend").catch((e: unknown) => {
    throw new ConfigError({ field: "scalingConfig.backend", reason: `the "webgpu" backend failed to start: ${String(e)}` })
  })
  if (!ok) {
    throw new ConfigError({
      field: "scalingConfig.backend",
      reason: `the "webgpu" backend failed to start on ${found.adapter.description || found.adapter.vendor || "the adapter"} (tf.setBackend returned false; tfjs logged why)`
    })
  }
  await tf.ready()
  // Uploads through the queue into pooled buffers, not a new staging buffer each (kernels/webgpu-upload.ts).
  if (installWebGpuUpload(tf)) why.push("webgpu uploads through queue.writeBuffer into pooled buffers")
  // Records a kernel with its uniforms and bind group reused from earlier steps (kernels/webgpu-dispatch.ts).
  if (installWebGpuDispatch(tf)) why.push("webgpu kernels reuse their uniform buffers and bind groups across steps")
  // A convolution's filter gradient summed over the batch in parallel (kernels/conv-grads-webgpu.ts).
  if (installWebGpuConvFilterGrad(tf)) why.push("convolutions' filter gradients sum over the batch in parallel")
  // ReLU's gradient as one program, where tfjs records two (kernels/relu-grad.ts).
  if (installReluGradWebGpu(tf)) why.push("ReLU's gradient runs as one program")
  // A submit every 64 kernels, not tfjs's 15: on an H200 a submit costs the CPU about 0.5 ms, and a
  // training step bound by the CPU recording kernels ran 7-18% faster (bench/webgpu-recording.ts).
  tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", WEBGPU_SUBMIT_EVERY)
  why.push(`webgpu submits every ${WEBGPU_SUBMIT_EVERY} kernels`)
  // Dawn's instance as core/webgpu.ts made it.
  if (installedDawnFlags()?.includes(DISABLE_WORKGROUP_INIT)) why.push("Dawn does not zero-fill workgroup memory (GRADWIRE_WEBGPU_ZERO_WORKGROUP=1 makes it)")
  return tf
}

/** Kernels the webgpu backend records before it submits them (tfjs's WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE; tfjs's own default is 15). */
export const WEBGPU_SUBMIT_EVERY = 64

const load = async (want: BackendKind | "auto"): Promise<{ tf: Tf; backend: BackendKind }> => {
  why.length = 0
  why.push(`asked for "${want}"`)
  const l = await loadAny(want)
  why.push(`${l.backend} loaded`)
  return l
}

const loadAny = async (want: BackendKind | "auto"): Promise<{ tf: Tf; backend: BackendKind }> => {
  if (want === "webgpu") return { tf: await loadWebGpu(), backend: "webgpu" }
  if (want === "tensorflow-gpu" || want === "auto") {
    const tf = await tryNative("@tensorflow/tfjs-node-gpu")
    if (tf) return { tf, backend: "tensorflow-gpu" }
    if (want === "tensorflow-gpu") {
      throw new ConfigError({
        field: "scalingConfig.backend",
        reason:
          'the "tensorflow-gpu" backend needs @tensorflow/tfjs-node-gpu, which does not load here: ' +
          "npm install @tensorflow/tfjs-node-gpu (needs CUDA and internet access at install), or use backend \"wasm\""
      })
    }
  }
  if (want === "tensorflow" || want === "auto") {
    const tf = await tryNative("@tensorflow/tfjs-node")
    if (tf) return { tf, backend: "tensorflow" }
    if (want === "tensorflow") {
      throw new ConfigError({
        field: "scalingConfig.backend",
        reason:
          'the "tensorflow" backend needs @tensorflow/tfjs-node, which does not load here: ' +
          "npm install @tensorflow/tfjs-node (downloads libtensorflow at install), or use backend \"wasm\""
      })
    }
  }
  const tf = loadPackage<Tf>("@tensorflow/tfjs")
  if (want === "wasm" || want === "auto") {
    try {
      loadPackage("@tensorflow/tfjs-backend-wasm")
      const before = processListeners()
      if (await tf.setBackend("wasm")) {
        await tf.ready()
        dropRethrowingListeners(before)
        // tfjs-backend-wasm lacks the convolution and gather gradients (and a few rarer kernels).
        registerWasmKernels(tf)
        return { tf, backend: "wasm" }
      }
      why.push("tf.setBackend(\"wasm\") returned false")
    } catch (e) {
      if (want === "wasm") {
        throw new ConfigError({ field: "scalingConfig.backend", reason: `the wasm backend failed to load: ${String(e)}` })
      }
      why.push(`the wasm backend failed to load (${String(e).split("\n")[0]})`)
    }
  }
  await tf.setBackend("cpu")
  await tf.ready()
  return { tf, backend: "cpu" }
}

/**
 * The tfjs module with the chosen backend active. One engine per process: asking again for the
 * same choice returns the same module; asking for a different one is an error.
 */
/** The process's uncaughtException and unhandledRejection listeners now. */
const processListeners = (): ReadonlySet<unknown> =>
  new Set([...process.listeners("uncaughtException"), ...process.listeners("unhandledRejection")])

/**
 * The wasm backend's Emscripten runtime adds process listeners that rethrow every uncaught error and
 * unhandled rejection from inside its own file: a program's own bug then reads as thrown at
 * tf-backend-wasm.node.js:8597 and exits with code 7. tfjs removes them itself when the backend is
 * disposed; removed here at once, such errors are Node's own again (the error's stack, exit code 1).
 */
const dropRethrowingListeners = (before: ReadonlySet<unknown>): void => {
  for (const l of process.listeners("uncaughtException")) if (!before.has(l)) process.removeListener("uncaughtException", l)
  for (const l of process.listeners("unhandledRejection")) if (!before.has(l)) process.removeListener("unhandledRejection", l)
}

export const loadEngine = (want: BackendKind | "auto" = "auto"): Promise<{ tf: Tf; backend: BackendKind }> => {
  if (loaded && loadedWant !== want) {
    return loaded.then((l) => {
      if (want === "auto" || l.backend === want) return l
      throw new ConfigError({
        field: "backend",
        reason: `this process already runs the "${l.backend}" backend; one backend per process`
      })
    })
  }
  loadedWant = want
  loaded = load(want).then((l) => {
    // Gradients tfjs-core lacks (comparisons, conv3dTranspose), on whichever backend runs.
    registerMissingGradients(l.tf)
    // An LSTM step's gates as one kernel and their gradient as one more, where the backend has them (kernels/lstm-cell.ts).
    if (installLstmCell(l.tf) && l.tf.getKernel(LSTM_CELL, l.tf.getBackend())) why.push("LSTM cells compute their gates as one kernel")
    // A GRU step's gates as two kernels and their gradients as two more, on wasm, cpu and webgpu (kernels/gru-cell.ts).
    if (installGruCell(l.tf) && l.tf.getKernel(GRU_UPDATE, l.tf.getBackend())) why.push("GRU cells compute their gates as two kernels")
    // On webgpu, an LSTM layer's whole recurrence as one program each way (kernels/lstm-sequence.ts).
    if (l.tf.getKernel(LSTM_SEQUENCE, l.tf.getBackend())) why.push("LSTM layers run their recurrence as one program each way")
    // Layer normalization over the last axis as one kernel and its gradient as one more (kernels/layer-norm.ts).
    if (installLayerNorm(l.tf) && l.tf.getKernel(LAYER_NORM, l.tf.getBackend())) why.push("layer normalization runs as one kernel")
    // Batch normalization while training as one kernel and its gradient as one more (kernels/batch-norm-train.ts).
    if (installBatchNormTrain(l.tf) && l.tf.getKernel(BATCH_NORM_TRAIN, l.tf.getBackend())) why.push("batch normalization trains as one kernel")
    // Convolution layers train as one kernel forward, their input's gradient computed only where used (kernels/train-layers.ts).
    if (installTrainLayers(l.tf) && l.tf.getKernel(CONV2D_TRAIN, l.tf.getBackend())) why.push("convolution and dense layers train with their bias and ReLU in one kernel, no gradient for their data")
    // A compiled cross-entropy on probabilities as one kernel each way, softmax's gradient as one (kernels/prob-cross-entropy.ts).
    if (installProbCrossEntropy(l.tf) && l.tf.getKernel(PROB_CROSS_ENTROPY, l.tf.getBackend())) why.push("a compiled model's cross-entropy runs as one kernel, softmax's gradient as one")
    // What a kernel keeps for its gradient saved as a second reference, not by an Identity kernel (kernels/saved-tensors.ts).
    if (installSharedSaves(l.tf)) why.push("tensors kept for a gradient are second references, not Identity kernels")
    return l
  })
  return loaded
}
