#!/usr/bin/env bash
# Prints what a machine offers the GPU backends, for the day a GPU machine is at hand (issue 29):
# nvidia-smi, the Vulkan drivers (ICD manifests) and GPU device nodes, the Vulkan/CUDA/TensorFlow
# libraries the loader knows, node/npm/python versions, and what Dawn (the `webgpu` package, as
# the "webgpu" backend loads it) finds: the adapter's name and limits, or why there is none.
# Installs nothing and changes nothing; a missing tool is reported and the survey goes on.
#
#   bash scripts/gpu-survey.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/bin:$PATH"

section() { printf '\n== %s\n' "$*"; }
have() { command -v "$1" >/dev/null 2>&1; }

section "machine"
uname -srm
[ -r /etc/os-release ] && grep -E '^(PRETTY_NAME)=' /etc/os-release

section "nvidia-smi"
if have nvidia-smi; then
  timeout 20 nvidia-smi || echo "(nvidia-smi exited $?)"
  timeout 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || true
else
  echo "no nvidia-smi on PATH"
fi

section "GPU device nodes"
ls -l /dev/nvidia* /dev/dri 2>&1 | head -n 20

section "Vulkan drivers (ICD manifests)"
for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
  if [ -d "$d" ]; then echo "$d:"; ls -l "$d"; else echo "$d: absent"; fi
done
echo "VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-} VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"
if have vulkaninfo; then timeout 20 vulkaninfo --summary 2>&1 | head -n 40; else echo "no vulkaninfo (Debian: vulkan-tools)"; fi

section "libraries (ldconfig -p | grep -i -E \"vulkan|cuda|tensorflow\")"
if have ldconfig; then ldconfig -p | grep -i -E "vulkan|cuda|tensorflow" || echo "none"
elif [ -x /sbin/ldconfig ]; then /sbin/ldconfig -p | grep -i -E "vulkan|cuda|tensorflow" || echo "none"
else echo "no ldconfig"; fi

section "versions"
for tool in node npm python3; do
  if have "$tool"; then echo "$tool $("$tool" --version 2>&1 | head -n 1)"; else echo "$tool: absent"; fi
done
for pkg in webgpu @tensorflow/tfjs-backend-webgpu @tensorflow/tfjs-node-gpu @tensorflow/tfjs; do
  v=$(node -e "try { console.log(require('$pkg/package.json').version) } catch { console.log('not installed') }" 2>/dev/null)
  echo "$pkg: $v"
done

section "Dawn (webgpu package): requestAdapter"
# In a child with a deadline of its own: Dawn can block inside a broken driver.
timeout 60 node --input-type=module -e '
let dawn
try {
  dawn = await import("webgpu")
} catch (e) {
  console.log(`the webgpu package does not load: ${String(e.message).split("\n")[0]}`)
  console.log("install it with: npm install webgpu @tensorflow/tfjs-backend-webgpu@4.22.0")
  process.exit(0)
}
Object.assign(globalThis, dawn.globals)
const gpu = dawn.create([])
const late = new Promise((resolve) => setTimeout(() => resolve("timeout"), 30_000))
const adapter = await Promise.race([gpu.requestAdapter({ powerPreference: "high-performance" }), late])
if (adapter === "timeout") console.log("requestAdapter did not answer within 30 s")
else if (adapter === null) console.log("no adapter (Dawn found no GPU with a driver it can use; its reason, if any, is on stderr above)")
else {
  const { vendor, architecture, device, description } = adapter.info ?? {}
  console.log(JSON.stringify({ vendor, architecture, device, description }))
  const l = adapter.limits
  console.log(JSON.stringify({
    maxBufferSize: l.maxBufferSize,
    maxStorageBufferBindingSize: l.maxStorageBufferBindingSize,
    maxComputeWorkgroupStorageSize: l.maxComputeWorkgroupStorageSize,
    maxComputeInvocationsPerWorkgroup: l.maxComputeInvocationsPerWorkgroup
  }))
  console.log(`features: ${[...adapter.features].sort().join(", ") || "none"}`)
}
process.exit(0)
' 2>&1
rc=$?
[ "$rc" = 124 ] && echo "the Dawn probe did not finish within 60 s (killed)"
[ "$rc" != 0 ] && [ "$rc" != 124 ] && echo "the Dawn probe exited $rc (a crash in dawn.node?)"
exit 0
