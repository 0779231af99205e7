#!/usr/bin/env bash
# One-shot, idempotent set-up for a fresh machine: Debian packages the tests need (when root),
# then this project with its test extras. torch is pinned to the CPU wheel on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  while read -r pkg cmd; do
    [ -z "$pkg" ] || [ "${pkg:0:1}" = "#" ] && continue
    command -v "${cmd:-$pkg}" >/dev/null 2>&1 || missing+=("$pkg")
  done < scripts/apt-packages.txt
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi
python3 -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[test]" 2>&1 \
  | grep -v -e "Running pip as the 'root' user" -e "^$" || true
python3 -m torchcomms.csrc.build  # compile the c10d backend wrapper (torchcomms/csrc) into its per-torch cache
