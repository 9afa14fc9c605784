#!/usr/bin/env bash
# Packs what a bare GPU machine needs to run gradwire's GPU benchmark (scripts/gpu-bench.sh) into
# .gpu/ (git-ignored through .git/info/exclude): this machine's node binary and nats-server
# (xz), the runtime part of node_modules (no dev tools, types, source maps, other platforms'
# Dawn builds, or tfjs's browser bundles), and the Vulkan loader and GL dispatch libraries from
# Debian's packages. About 50 MB in all, so that it travels with a copy of the working tree.
#
#   bash scripts/gpu-pack.sh        # then run scripts/gpu-bench.sh there, with .gpu carried
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/bin:$PATH:/usr/sbin"
[ -d node_modules/webgpu/dist/linux-x64 ] || { echo "gpu-pack: node_modules lacks webgpu's linux-x64 build: npm install webgpu first" >&2; exit 1; }
mkdir -p .git/info .gpu/gl
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
node_bin=$(readlink -f "$(command -v node)")
nats_bin=$(command -v nats-server)
xz -T2 -6 -c "$node_bin" > .gpu/node.xz
xz -T2 -6 -c "$nats_bin" > .gpu/nats-server.xz
dev='typescript|@rolldown|rolldown|vite|vitest|@vitest|typedoc|@shikijs|lightningcss|lightningcss-linux-x64-gnu|core-js|fast-check|@types|markdown-it|lunr|@oxc-project|yaml|@gerrit0|@jridgewell|minimatch|postcss|chai|pure-rand|tinybench|why-is-node-running|magic-string|estree-walker|expect-type|linkify-it|mdurl|uc.micro|entities|punycode.js|@webgpu'
{
  find node_modules -type f -not -name "*.map" -not -name "*.d.ts" -not -name "*.d.mts" -not -name "*.d.cts" -not -name "*.md" -not -name "*.ts" \
    | grep -v -E "^node_modules/($dev)/" \
    | grep -v -E '^node_modules/@tensorflow/[^/]+/(src/|dist/[^/]+/|dist/[^/]*\.js$|wasm-out/)' \
    | grep -v -E '^node_modules/webgpu/dist/(darwin|win32|linux-arm64)' \
    | grep -v -E '^node_modules/bintrees/test/'
  # tfjs: only the bundles Node loads (package.json "main") and the wasm binaries.
  find node_modules/@tensorflow -path "*/dist/*.node.js" -o -path "*/dist/*.wasm"
} | sort -u > .gpu/files.txt
tar -cf - -T .gpu/files.txt | xz -T2 -6 > .gpu/node_modules.tar.xz
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/gradwire-apt-amd64'
if ! ls .gpu/gl/libvulkan1_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/gradwire-apt-amd64/partial
  apt-get $o update >/dev/null
  (cd .gpu/gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 2>/dev/null)
fi
du -sh .gpu/node.xz .gpu/nats-server.xz .gpu/node_modules.tar.xz .gpu/gl
