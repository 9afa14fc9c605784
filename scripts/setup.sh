#!/usr/bin/env bash
# Installs what gradwire needs and this machine lacks, and says what it found and what it
# installed: Node >= 22.19 (npm's "node" package into /usr/local when the node on PATH is older),
# nats-server (apt-get, or brew), the npm packages (npm ci, when node_modules is missing or older
# than package-lock.json); with --test also what the test suite uses (chromium, openssl,
# promtool). Runs as root, through sudo, or as a user who can write /usr/local. When it cannot do
# something it ends with one line saying what and why, and exits 1. The README's first command
# and .ci/run call it.
#
#   bash scripts/setup.sh [--test] [--check]
#     --test    also chromium (the HTML report's rendering tests), openssl (a TLS test) and
#               promtool (Prometheus' linter, run over the dashboard's /metrics)
#     --check   install nothing: say what is there, and fail on the first thing missing
set -uo pipefail
cd "$(dirname "$0")/.."

tests=0 check=0
for arg in "$@"; do
  case "$arg" in
    --test) tests=1 ;;
    --check) check=1 ;;
    -h|--help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "setup: unknown option \"$arg\" (known: --test, --check)"; exit 2 ;;
  esac
done

log=$(mktemp "${TMPDIR:-/tmp}/gradwire-setup-XXXXXX")
say() { echo "setup: $*"; }
# The failed command's last log lines, then the one line that says what failed.
fail() {
  if [ -s "$log" ]; then tail -n 15 "$log" | sed 's/^/  | /'; fi
  echo "setup: $*"
  exit 1
}

is_root() { [ "$(id -u)" = 0 ]; }
# Runs a command as root: directly when we are root, else through sudo (keeping PATH, so that sudo
# finds the npm and node we found).
as_root() {
  if is_root; then "$@"; else sudo env "PATH=$PATH" "$@"; fi
}
can_be_root() { is_root || command -v sudo >/dev/null 2>&1; }

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    as_root apt-get update >>"$log" 2>&1 || return 1
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" >>"$log" 2>&1
}
# Installs a system package with apt-get or brew; returns 1 when there is neither or it fails.
system_install() {
  if command -v apt-get >/dev/null 2>&1 && can_be_root; then apt_install "$@"
  elif command -v brew >/dev/null 2>&1; then brew install "$@" >>"$log" 2>&1
  else return 1
  fi
}

# --- Node >= 22.19 ----------------------------------------------------------------------------
# bin/check-node.js is the same check every npm script and the CLI run first.
node_ok() { [ -n "$1" ] && [ -x "$1" ] && "$1" bin/check-node.js >/dev/null 2>&1; }

path_node=$(command -v node 2>/dev/null || true)
if node_ok "$path_node"; then
  say "node $("$path_node" --version) ($path_node): already there"
else
  if [ -n "$path_node" ]; then found="$("$path_node" --version 2>/dev/null) at $path_node"; else found="no node on PATH"; fi
  if node_ok /usr/local/bin/node; then
    say "node $(/usr/local/bin/node --version) (/usr/local/bin/node): already there"
  else
    [ "$check" = 1 ] && fail "Node >= 22.19 is missing (found $found): \"bash scripts/setup.sh\" installs it"
    command -v npm >/dev/null 2>&1 || fail "cannot install Node 22: there is no npm to install it with (found $found); get Node >= 22.19 from https://nodejs.org"
    if [ -w /usr/local/bin ] && [ -w /usr/local/lib ]; then install_node=(npm install -g --prefix /usr/local node@22)
    elif can_be_root; then install_node=(as_root npm install -g --prefix /usr/local node@22)
    else fail "cannot install Node 22 into /usr/local: not root, no sudo, and /usr/local is not writable (found $found)"
    fi
    say "installing Node 22 (found $found) ..."
    "${install_node[@]}" >>"$log" 2>&1 || fail "could not install Node 22 with \"npm install -g --prefix /usr/local node@22\" (found $found; log: $log)"
    node_ok /usr/local/bin/node || fail "\"npm install -g --prefix /usr/local node@22\" left no Node >= 22.19 in /usr/local/bin (log: $log)"
    say "node $(/usr/local/bin/node --version): installed in /usr/local/bin (found $found)"
  fi
  hash -r
  # Whoever runs the next command (npm run demo) finds `node` through this same PATH.
  node_ok "$(command -v node 2>/dev/null || true)" \
    || fail "Node $(/usr/local/bin/node --version) is in /usr/local/bin, but this PATH does not find it first (found $found): put /usr/local/bin first (export PATH=/usr/local/bin:\$PATH) and run this again"
fi

# --- nats-server ------------------------------------------------------------------------------
# Where gradwire looks for it (core/nats-server.ts): $NATS_SERVER_BIN, else PATH, /usr/sbin, /usr/local/bin.
find_nats() {
  if [ -n "${NATS_SERVER_BIN:-}" ]; then [ -x "$NATS_SERVER_BIN" ] && echo "$NATS_SERVER_BIN"; return; fi
  command -v nats-server 2>/dev/null && return
  for d in /usr/sbin /usr/local/bin; do [ -x "$d/nats-server" ] && echo "$d/nats-server" && return; done
  return 0
}
nats=$(find_nats)
if [ -n "$nats" ]; then
  say "nats-server $("$nats" --version 2>&1 | grep -o 'v[0-9][0-9.]*' | head -1) ($nats): already there"
else
  [ -n "${NATS_SERVER_BIN:-}" ] && fail "NATS_SERVER_BIN=$NATS_SERVER_BIN is not an executable file: fix or unset it"
  [ "$check" = 1 ] && fail "nats-server is missing: \"bash scripts/setup.sh\" installs it"
  say "installing nats-server ..."
  system_install nats-server \
    || fail "could not install nats-server (apt-get or brew, as root or through sudo); get a release from https://github.com/nats-io/nats-server/releases and put it on PATH, or set NATS_SERVER_BIN"
  nats=$(find_nats)
  [ -n "$nats" ] || fail "the nats-server package installed no nats-server binary where gradwire looks (PATH, /usr/sbin, /usr/local/bin)"
  say "nats-server $("$nats" --version 2>&1 | grep -o 'v[0-9][0-9.]*' | head -1) ($nats): installed"
fi

# --- what the tests use: chromium, openssl, promtool ------------------------------------------
# Not fatal: without chromium the report rendering tests and the webgpu tests (they train on its
# SwiftShader Vulkan driver) fail, without openssl the read pool's TLS test is skipped, without
# promtool the dashboard's /metrics lint test fails; each says so.
if [ "$tests" = 1 ]; then
  chromium=""
  for c in "${CHROMIUM_BIN:-}" /usr/bin/chromium /usr/bin/chromium-browser /usr/bin/google-chrome; do
    if [ -n "$c" ] && [ -x "$c" ]; then chromium=$c; break; fi
  done
  if [ -n "$chromium" ]; then
    say "$("$chromium" --version 2>/dev/null | head -1) ($chromium): already there"
  elif [ "$check" = 1 ]; then
    say "chromium is missing: the report rendering and webgpu tests will fail"
  else
    say "installing chromium ..."
    if system_install chromium && [ -x /usr/bin/chromium ]; then say "$(/usr/bin/chromium --version 2>/dev/null | head -1): installed"
    else say "could not install chromium (log: $log): the report rendering and webgpu tests will fail"
    fi
  fi
  if command -v openssl >/dev/null 2>&1; then
    say "$(openssl version | cut -d' ' -f1-2) ($(command -v openssl)): already there"
  elif [ "$check" = 1 ]; then
    say "openssl is missing: the read pool's TLS test will be skipped"
  else
    say "installing openssl ..."
    if system_install openssl; then say "$(openssl version | cut -d' ' -f1-2): installed"
    else say "could not install openssl (log: $log): the read pool's TLS test will be skipped"
    fi
  fi
  # Debian's and Homebrew's prometheus package carries promtool. On a machine with systemd, Debian
  # also starts the Prometheus server (and node exporter) it brings along: only promtool is
  # wanted, so those are stopped and disabled again.
  if command -v promtool >/dev/null 2>&1; then
    say "$(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3) ($(command -v promtool)): already there"
  elif [ "$check" = 1 ]; then
    say "promtool is missing: the dashboard's /metrics lint test will fail"
  else
    say "installing promtool (the prometheus package) ..."
    if system_install prometheus && command -v promtool >/dev/null 2>&1; then
      say "$(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3): installed"
      if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
        as_root systemctl disable --now prometheus prometheus-node-exporter >>"$log" 2>&1 || true
        say "stopped and disabled the prometheus and prometheus-node-exporter services the package started (only promtool is used)"
      fi
    else say "could not install promtool (log: $log): the dashboard's /metrics lint test will fail"
    fi
  fi
fi

# --- npm packages -----------------------------------------------------------------------------
# npm writes node_modules/.package-lock.json at the end of every install: missing or older than
# package-lock.json or package.json means node_modules does not match them.
hidden=node_modules/.package-lock.json
if [ -L node_modules ]; then
  # Another checkout's packages (a worktree sharing them): npm ci would empty that folder.
  say "npm packages: node_modules links to $(readlink node_modules): left as it is"
elif [ -f "$hidden" ] && ! [ package-lock.json -nt "$hidden" ] && ! [ package.json -nt "$hidden" ]; then
  say "npm packages: node_modules matches package-lock.json"
else
  [ "$check" = 1 ] && fail "npm packages: node_modules is missing or older than package-lock.json: run \"npm ci\""
  say "installing the npm packages (npm ci) ..."
  npm ci --no-audit --no-fund >>"$log" 2>&1 || fail "npm ci failed (log: $log)"
  added=$(grep -o 'added [0-9]* packages' "$log" | tail -1)
  say "npm packages: ${added:-installed} from package-lock.json"
fi

rm -f "$log"
say "ready: node $(node --version), nats-server at $nats"
