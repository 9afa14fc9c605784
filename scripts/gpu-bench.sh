#!/usr/bin/env bash
# gradwire on a real GPU, on a bare machine that has an NVIDIA GPU and its driver but no Node: unpacks
# what scripts/gpu-pack.sh put in .gpu/ (node, nats-server, node_modules, the Vulkan loader), points
# Vulkan at NVIDIA's driver, runs the survey (scripts/gpu-survey.sh), then `bench -- train` with
# webgpu workers against PyTorch on CUDA (DDP) in the same run. Writes every log under $OUT (or
# /tmp/gradwire-gpu) and ends with the tables.
#
#   bash scripts/gpu-bench.sh                     # a one-model check, then the zoo at batch 32 and 256,
#                                                 # then two workers sharing the GPU ({ GPU: 0.5 })
#   GPU_BENCH_QUICK=1 bash scripts/gpu-bench.sh   # the check alone
#   GPU_BENCH_SHORT=1 bash scripts/gpu-bench.sh   # the zoo's cnn, mlp and resnet at batch 32 alone
#   GPU_BENCH_SHORT=1 GPU_BENCH_MODELS=gru,lstm bash scripts/gpu-bench.sh   # the named models at batch 32 alone
#   GPU_BENCH_RECORDING=1 bash scripts/gpu-bench.sh   # the check, bench/webgpu-recording.ts, the zoo at batch 32
#   GPU_BENCH_ZOO=1 bash scripts/gpu-bench.sh     # the zoo at batch 32, the cnn, resnet and mobilenet at batch 256
#   GPU_BENCH_FUSED=1 bash scripts/gpu-bench.sh   # the zoo at batch 32, then its resnet, transformer and lstm
#                                                 # (the fused kernels' models) with Dawn's workgroup zero-fill
#                                                 # back on, the cnn and resnet at batch 256, and the all-reduce
#                                                 # against gloo at p = 8 and 4 on the machine's cores
#   GPU_BENCH_AB=1 bash scripts/gpu-bench.sh      # the zoo at batch 32, the convolution models at batch 256, then
#                                                 # A/B runs without PyTorch: the convolution models with tfjs's
#                                                 # filter gradient (GRADWIRE_WEBGPU_CONV_FILTER=tfjs), and, where
#                                                 # .gpu/old holds an earlier tree (GPU_BENCH_OLD names its commit),
#                                                 # the same models from that tree
#   GPU_BENCH_AB=2 bash scripts/gpu-bench.sh      # the zoo at batch 32 and the convolution models at batch 256, then
#                                                 # the transformer alternated with the tree in .gpu/old twice, and the
#                                                 # small CNN and LeNet alternated with tfjs's filter gradient
#   GPU_BENCH_ALLREDUCE=1 bash scripts/gpu-bench.sh   # no GPU: the all-reduce over the direct links against gloo
#                                                 # at p = 8, 4 and 2 on the machine's cores, with each rank's CPU a
#                                                 # call (its busiest thread, all its threads: --cpu)
# Each benchmark runs under a deadline of its own (the whole script stays under about 10 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gradwire-gpu}
mkdir -p "$out" /tmp/gw/bin
export PATH="$PATH:/sbin:/usr/sbin"
t0=$(date +%s)
# The zoo's ten models (bench/zoo-step.ts, examples/zoo/models.ts); deadlines below are sized for ten.
zoo=cnn,mlp,resnet,resnet28,mobilenet,embedding,lenet,transformer,lstm,gru
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

if ! command -v node >/dev/null 2>&1 || [ -n "${GPU_BENCH_PACKED:-}" ]; then
  xz -dc .gpu/node.xz > /tmp/gw/bin/node && chmod +x /tmp/gw/bin/node
  export PATH="/tmp/gw/bin:$PATH"
fi
if ! command -v nats-server >/dev/null 2>&1 || [ -n "${GPU_BENCH_PACKED:-}" ]; then
  xz -dc .gpu/nats-server.xz > /tmp/gw/bin/nats-server && chmod +x /tmp/gw/bin/nats-server
  export PATH="/tmp/gw/bin:$PATH"
fi
[ -d node_modules/@tensorflow ] || tar -xJf .gpu/node_modules.tar.xz
if ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1; then
  for f in .gpu/gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$icd" ] && [ -z "${VK_ICD_FILENAMES:-}" ]; then export VK_DRIVER_FILES="$icd"; break; fi
done
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ]; then
  echo "no nvidia_icd.json in the usual places; found: $(find /usr/local/nvidia /usr/share /etc /usr/lib -name 'nvidia_icd*.json' 2>/dev/null | head -n 3 | tr '\n' ' ')"
fi
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$egl"
stamp "node $(node --version), nats-server $(nats-server --version 2>&1 | head -n 1), VK_DRIVER_FILES=${VK_DRIVER_FILES:-unset}"

if [ -n "${GPU_BENCH_ALLREDUCE:-}" ]; then
  # Where the direct path is behind gloo on many cores (1.6-2.1x at p = 8 and 4 from 4 MiB on a 16-core
  # machine): is each rank one busy thread the whole call (then threads would help), or waiting.
  for p in 8 4 2; do
    stamp "bench allreduce --p $p --cpu (deadline 170 s)"
    timeout -k 5 170 node bench/main.ts allreduce --no-payload-sweep --no-raw --p "$p" --sizes 4M,64M --transports direct --algorithms ring,tree,hierarchical --cpu > "$out/allreduce-p$p.txt" 2>&1
    echo "exit $?" >> "$out/allreduce-p$p.txt"
    grep -E "^[0-9]|^p  |^summary|^exit" "$out/allreduce-p$p.txt"
  done
  stamp "done"
  exit 0
fi
bash scripts/gpu-survey.sh > "$out/survey.txt" 2>&1
grep -A1 "== Dawn" "$out/survey.txt"
stamp "survey done"

bench() { # name, deadline in s, args...
  local name=$1 deadline=$2; shift 2
  stamp "bench train $* (deadline ${deadline} s)"
  timeout -k 5 "$deadline" node bench/main.ts train "$@" > "$out/$name.txt" 2>&1
  local code=$?
  echo "exit $code" >> "$out/$name.txt"
  grep -E "^(machine|batch|gradwire:|model|mlp|cnn|lenet|resnet|resnet28|mobilenet|embedding|transformer|lstm|gru|exit)" "$out/$name.txt" || tail -n 15 "$out/$name.txt"
  return $code
}
recording() { # where a webgpu step's CPU time goes, and what gradwire's upload and recording save
  stamp "webgpu recording: tfjs's upload and recording against gradwire's (deadline $1 s)"
  timeout -k 5 "$1" node bench/webgpu-recording.ts --models mlp,cnn,resnet,lstm --rounds 2 --seconds 1.5 --breakdown --profile "$out/profiles" > "$out/recording.txt" 2>&1
  echo "exit $?" >> "$out/recording.txt"
  grep -v "^Orthogonal" "$out/recording.txt"
}
if [ -n "${GPU_BENCH_RECORDING:-}" ]; then
  bench quick 75 --models mlp --p 1 --seconds 0.2 --warmup 5 --backend webgpu || { stamp "the check failed: see $out/quick.txt"; exit 1; }
  recording 150
  bench batch32 330 --models "$zoo" --p 1 --seconds 1 --backend webgpu
  stamp "done"
  exit 0
fi
if [ -n "${GPU_BENCH_FUSED:-}" ]; then
  bench batch32 290 --models "$zoo" --p 1 --seconds 1 --backend webgpu
  stamp "the same with Dawn zero-filling workgroup memory (GRADWIRE_WEBGPU_ZERO_WORKGROUP=1)"
  GRADWIRE_WEBGPU_ZERO_WORKGROUP=1 bench zerofill 110 --models resnet,transformer,lstm --p 1 --seconds 1 --backend webgpu
  bench batch256 70 --models cnn,resnet --p 1 --seconds 1 --batch 256 --backend webgpu
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv >> "$out/survey.txt" 2>&1
  left=$(( ${GPU_BENCH_BUDGET:-520} - ($(date +%s) - t0) ))
  if [ "$left" -gt 45 ]; then
    stamp "bench allreduce --p 8,4 on $(nproc) cores (deadline $left s)"
    timeout -k 5 "$left" node bench/main.ts allreduce --no-payload-sweep --p 8,4 --sizes 4K,256K,4M,64M,256M --transports direct > "$out/allreduce.txt" 2>&1
    echo "exit $?" >> "$out/allreduce.txt"
    grep -E "^summary|exit" "$out/allreduce.txt"
  fi
  stamp "done"
  exit 0
fi
if [ "${GPU_BENCH_AB:-}" = 2 ]; then
  bench batch32 290 --models "$zoo" --p 1 --seconds 1 --backend webgpu
  bench batch256 110 --models cnn,lenet,resnet,mobilenet --p 1 --seconds 1 --batch 256 --backend webgpu
  for round in 1 2; do
    bench "new-transformer-$round" 30 --models transformer --p 1 --seconds 1 --backend webgpu --python /bin/false
    [ -f .gpu/old/bench/main.ts ] && ( cd .gpu/old && bench "old-transformer-$round" 30 --models transformer --p 1 --seconds 1 --backend webgpu --python /bin/false )
  done
  GRADWIRE_WEBGPU_CONV_FILTER=tfjs bench tfjsfilter32 40 --models cnn,lenet --p 1 --seconds 1 --backend webgpu --python /bin/false
  bench newfilter32 40 --models cnn,lenet --p 1 --seconds 1 --backend webgpu --python /bin/false
  stamp "done"
  exit 0
fi
if [ -n "${GPU_BENCH_AB:-}" ]; then
  bench batch32 290 --models "$zoo" --p 1 --seconds 1 --backend webgpu
  bench batch256 110 --models cnn,lenet,resnet,mobilenet --p 1 --seconds 1 --batch 256 --backend webgpu
  stamp "A/B: tfjs's filter gradient (GRADWIRE_WEBGPU_CONV_FILTER=tfjs), no PyTorch"
  GRADWIRE_WEBGPU_CONV_FILTER=tfjs bench tfjsfilter32 60 --models cnn,lenet,resnet --p 1 --seconds 1 --backend webgpu --python /bin/false
  GRADWIRE_WEBGPU_CONV_FILTER=tfjs bench tfjsfilter256 50 --models cnn,lenet,resnet --p 1 --seconds 1 --batch 256 --backend webgpu --python /bin/false
  if [ -f .gpu/old/bench/main.ts ]; then
    stamp "A/B: the tree at ${GPU_BENCH_OLD:-.gpu/old} (tfjs's filter gradient there too), no PyTorch"
    ( cd .gpu/old && bench old32 70 --models resnet,transformer,lstm --p 1 --seconds 1 --backend webgpu --python /bin/false
      bench old256 40 --models resnet --p 1 --seconds 1 --batch 256 --backend webgpu --python /bin/false )
  fi
  stamp "done"
  exit 0
fi
if [ -n "${GPU_BENCH_ZOO:-}" ]; then
  bench batch32 280 --models "$zoo" --p 1 --seconds 1 --backend webgpu
  bench batch256 80 --models cnn,resnet,mobilenet --p 1 --seconds 1 --batch 256 --backend webgpu
  stamp "done"
  exit 0
fi
if [ -n "${GPU_BENCH_SHORT:-}" ]; then
  bench gradwire32 240 --models "${GPU_BENCH_MODELS:-cnn,mlp,resnet}" --p 1 --seconds 1 --backend webgpu
  stamp "done"
  exit 0
fi
bench quick 75 --models mlp --p 1 --seconds 0.2 --warmup 5 --backend webgpu || { stamp "the check failed: see $out/quick.txt"; exit 1; }
if [ -z "${GPU_BENCH_QUICK:-}" ]; then
  # Does it learn on the GPU: the zoo's CNN, one webgpu worker, held-out accuracy per epoch.
  stamp "zoo cnn on one webgpu worker, 3 epochs (deadline 60 s)"
  timeout -k 5 60 node examples/zoo/main.ts --model cnn --workers 1 --epochs 3 --backend webgpu > "$out/accuracy.txt" 2>&1
  echo "exit $?" >> "$out/accuracy.txt"
  grep -i -E "accuracy|parameters|exit" "$out/accuracy.txt" | tail -n 6
  bench batch32 260 --models "$zoo" --p 1 --seconds 1.5 --backend webgpu
  bench batch256 100 --models cnn,resnet,transformer --p 1 --seconds 1.5 --batch 256 --backend webgpu
  bench share2 90 --models cnn,resnet --p 2 --seconds 1.5 --batch 256 --backend webgpu --gpu-share 0.5
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv >> "$out/survey.txt" 2>&1
  recording 150
  # With the time left under GPU_BENCH_BUDGET (s), the all-reduce against gloo at p = 8 on this
  # machine's cores (not a GPU figure: the 2-core machines cannot run 8 ranks).
  left=$(( ${GPU_BENCH_BUDGET:-560} - ($(date +%s) - t0) ))
  if [ "$left" -gt 60 ]; then
    stamp "bench allreduce --p 8 (deadline $left s)"
    timeout -k 5 "$left" node bench/main.ts allreduce --no-payload-sweep --p 8 --sizes 4K,4M,64M --transports direct > "$out/allreduce.txt" 2>&1
    echo "exit $?" >> "$out/allreduce.txt"
    tail -n 12 "$out/allreduce.txt"
  fi
fi
stamp "done"
