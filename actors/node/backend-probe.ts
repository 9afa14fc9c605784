// Child-process script of the backend probe (see node-probe.ts): tries to load each tfjs backend
// named on the command line, runs one tiny op on it, and prints one JSON line per backend. Runs
// apart from the agent so a native module that crashes or hangs takes only this process down.
const tryBackend = async (backend: string): Promise<void> => {
  try {
    let tf: typeof import("@tensorflow/tfjs")
    if (backend === "tensorflow-gpu") tf = (await import("@tensorflow/tfjs-node-gpu" as string)) as typeof import("@tensorflow/tfjs")
    else if (backend === "tensorflow") tf = (await import("@tensorflow/tfjs-node" as string)) as typeof import("@tensorflow/tfjs")
    else {
      tf = await import("@tensorflow/tfjs")
      if (backend === "wasm") await import("@tensorflow/tfjs-backend-wasm")
    }
    const name = backend === "tensorflow-gpu" ? "tensorflow" : backend
    if (tf.getBackend() !== name && !(await tf.setBackend(name))) throw new Error(`tf.setBackend("${name}") returned false`)
    await tf.ready()
    const sum = tf.tidy(() => tf.add(tf.tensor1d([1, 2]), tf.tensor1d([3, 4])).sum().dataSync()[0])
    if (sum !== 10) throw new Error(`1+2+3+4 gave ${sum}`)
    process.stdout.write(`${JSON.stringify({ backend, ok: true })}\n`)
  } catch (e) {
    process.stdout.write(`${JSON.stringify({ backend, ok: false, error: e instanceof Error ? e.message.split("\n")[0] : String(e) })}\n`)
  }
}

for (const backend of process.argv.slice(2)) await tryBackend(backend)
// tfjs may leave handles open (wasm workers); the result lines are out.
process.exit(0)
