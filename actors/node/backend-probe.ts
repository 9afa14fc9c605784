// Child-process script of the backend probe (see node-probe.ts): tries to load each tfjs backend
// named on the command line, runs one tiny op on it, and prints one JSON line per backend. Runs
// apart from the agent so a native module that crashes or hangs takes only this process down.
// For "webgpu" it first asks Dawn for an adapter (with a deadline) and reports it, found or not.
import { createRequire } from "node:module"
import { requestWebGpuAdapter, withinDeadline, type WebGpuAdapterInfo } from "../../core/webgpu.ts"

/** tfjs's packages are CommonJS: `require`d, as core/engine.ts loads them (no scan for named exports). */
const loadPackage = createRequire(import.meta.url) as <T = typeof import("@tensorflow/tfjs")>(pkg: string) => T

const tryBackend = async (backend: string): Promise<void> => {
  let adapter: WebGpuAdapterInfo | undefined
  try {
    let tf: typeof import("@tensorflow/tfjs")
    if (backend === "webgpu") {
      const found = await requestWebGpuAdapter()
      adapter = found.adapter
      if (!found.ok) throw new Error(found.reason)
      tf = loadPackage("@tensorflow/tfjs")
      loadPackage("@tensorflow/tfjs-backend-webgpu")
    } else if (backend === "tensorflow-gpu") tf = loadPackage("@tensorflow/tfjs-node-gpu")
    else if (backend === "tensorflow") tf = loadPackage("@tensorflow/tfjs-node")
    else {
      tf = loadPackage("@tensorflow/tfjs")
      if (backend === "wasm") loadPackage("@tensorflow/tfjs-backend-wasm")
    }
    const name = backend === "tensorflow-gpu" ? "tensorflow" : backend
    // Dawn may block inside a driver: a deadline of its own, so the reason says where it hung.
    const set = (): Promise<boolean> =>
      backend === "webgpu" ? withinDeadline(tf.setBackend(name), 30_000, `tf.setBackend("${name}")`) : tf.setBackend(name)
    if (tf.getBackend() !== name && !(await set())) throw new Error(`tf.setBackend("${name}") returned false`)
    await tf.ready()
    // An async read: the webgpu backend's dataSync needs OffscreenCanvas, which Node lacks.
    const t = tf.tidy(() => tf.add(tf.tensor1d([1, 2]), tf.tensor1d([3, 4])).sum())
    const sum = (await t.data())[0]
    t.dispose()
    if (sum !== 10) throw new Error(`1+2+3+4 gave ${sum}`)
    process.stdout.write(`${JSON.stringify({ backend, ok: true, ...(adapter ? { adapter } : {}) })}\n`)
  } catch (e) {
    const error = e instanceof Error ? e.message.split("\n")[0] : String(e)
    process.stdout.write(`${JSON.stringify({ backend, ok: false, error, ...(adapter ? { adapter } : {}) })}\n`)
  }
}

for (const backend of process.argv.slice(2)) await tryBackend(backend)
// tfjs may leave handles open (wasm workers), Dawn its GPU; the result lines are out.
process.exit(0)
