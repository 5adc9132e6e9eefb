#!/usr/bin/env bash
# Install FUSE 3 for the power-cut fault of `raftwal chaos --faults power` and its tests
# (raftwal/chaos/powerfs.py mounts a FUSE filesystem through mfusepy, which loads
# libfuse3 with ctypes): the Debian packages fuse3 (fusermount3) and libfuse3-3.
# Idempotent: does nothing but print what it found when both are there. Needs root (or
# sudo) for apt-get. `./run test` calls it; a machine without /dev/fuse still gets the
# packages, and the tests that need a mount skip saying why.
set -euo pipefail

have() {
  command -v fusermount3 >/dev/null 2>&1 &&
    { ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so\.3' ||
      ls /usr/lib/*/libfuse3.so.3 /lib/*/libfuse3.so.3 >/dev/null 2>&1; }
}

if ! have; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "the power-cut fault needs FUSE 3 (fuse3, libfuse3-3) and this is not root (and" \
      "no sudo): install them with apt-get" >&2
    exit 1
  fi
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y fuse3 libfuse3-3
fi
have || { echo "fuse3/libfuse3-3 still missing after apt-get install" >&2; exit 1; }
echo "fuse3 ($(command -v fusermount3)), /dev/fuse $([ -e /dev/fuse ] && echo present || echo absent)"
