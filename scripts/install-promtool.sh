#!/usr/bin/env bash
# Install promtool for `promtool check rules` and `promtool test rules` on
# deploy/prometheus/ (tests/unit/test_deploy_rules.py): Debian's `prometheus` package ships
# it. Idempotent: does nothing but print the version when `promtool` already runs. Needs
# root (or sudo) for apt-get. `./run test` calls it. The package's own prometheus service is
# never started here (policy-rc.d is not touched: apt in containers does not start units).
set -euo pipefail

if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "the alert rules' checks need promtool (Debian package prometheus) and this is not" \
      "root (and no sudo): install it with apt-get" >&2
    exit 1
  fi
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends prometheus
fi
command -v promtool >/dev/null 2>&1 || { echo "promtool still missing after apt-get install" >&2; exit 1; }
echo "$(promtool --version 2>&1 | head -n 1) ($(command -v promtool))"
