#!/usr/bin/env bash
# Install etcd 3.4 (Debian package `etcd-server`) for bench/coord.py, which drives a
# three-member etcd cluster on loopback as the baseline. Idempotent: does nothing but print
# the version when `etcd` is already on PATH. Needs root (or sudo) for apt-get.
set -euo pipefail

if ! command -v etcd >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "etcd is not installed and this is not root (and no sudo): install etcd-server" >&2
    exit 1
  fi
  $sudo apt-get update
  # The package starts no service in a container; on a host with systemd it would enable
  # etcd.service, which bench/coord.py does not use (it starts its own members).
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y etcd-server
fi

etcd --version
