#!/usr/bin/env bash
# Install headless Chromium and its WebDriver for the console's browser test
# (tests/cluster/test_console_browser.py): the Debian packages chromium and
# chromium-driver. Idempotent: does nothing but print the versions when both run. Needs
# root (or sudo) for apt-get. `./run test` calls it.
set -euo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

if ! have; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "the console's browser test needs chromium and chromium-driver and this is not" \
      "root (and no sudo): install them with apt-get" >&2
    exit 1
  fi
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends \
    chromium chromium-driver
fi
have || { echo "chromium/chromium-driver still missing after apt-get install" >&2; exit 1; }
echo "$(chromium --version 2>/dev/null | head -n 1), $(chromedriver --version | head -n 1)"
