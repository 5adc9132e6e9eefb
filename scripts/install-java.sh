#!/usr/bin/env bash
# Install a Java runtime for Spark (pyspark 4 needs Java 17 or 21): the Debian package
# openjdk-17-jre-headless. Idempotent: does nothing but print the version when `java`
# (or $JAVA_HOME/bin/java) already runs at version 17 or newer. Needs root (or sudo) for
# apt-get. `./run test` and `./run demo` call it.
set -euo pipefail

java_bin=java
if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
  java_bin="$JAVA_HOME/bin/java"
fi

major() {
  # `java -version` prints e.g. 'openjdk version "17.0.15" 2025-04-15' on stderr.
  { "$java_bin" -version 2>&1 || true; } | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

found=$(major)
if [ -z "$found" ] || [ "$found" -lt 17 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "Spark needs Java >= 17 (found: ${found:-none}) and this is not root (and no sudo):" \
      "install openjdk-17-jre-headless or set JAVA_HOME" >&2
    exit 1
  fi
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y openjdk-17-jre-headless
  java_bin=java
  found=$(major)
fi
echo "java $found ($(command -v "$java_bin" || echo "$java_bin"))"
