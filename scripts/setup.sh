#!/usr/bin/env bash
# One-shot, idempotent set-up for a fresh machine: Debian packages the tests need (when root),
# then this project with its test and mpi extras (Open MPI and mpi4py). torch is pinned to the CPU wheel on the machine.
# Quiet when everything works; a failed step exits non-zero, names the step and shows its output.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

# step WHAT CMD...: run CMD with its output kept aside; on failure name WHAT and show the output.
step() {
  local what=$1 log rc=0
  shift
  log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "setup.sh: $what failed (exit $rc): $*" >&2
    tail -n 60 "$log" | sed 's/^/  | /' >&2
    rm -f "$log"
    exit "$rc"
  fi
  rm -f "$log"
}

missing=()
while read -r pkg cmd; do
  [ -z "$pkg" ] || [ "${pkg:0:1}" = "#" ] && continue
  command -v "${cmd:-$pkg}" >/dev/null 2>&1 || missing+=("$pkg:${cmd:-$pkg}")
done < scripts/apt-packages.txt

# The Debian packages install in the background, beside pip and the C++ build (nothing those need
# comes from them); the script waits for them before it ends, and fails if they failed.
apt_pid=""
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=("${missing[@]%%:*}")
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (
      step "apt-get update" apt-get update -q
      step "apt-get install of ${pkgs[*]}" \
        env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"
      for entry in "${missing[@]}"; do
        command -v "${entry#*:}" >/dev/null 2>&1 \
          || { echo "setup.sh: Debian package ${entry%%:*} installed but its command ${entry#*:} is still missing" >&2; exit 1; }
      done
    ) &
    apt_pid=$!
    trap 'wait' EXIT  # a failed step below still leaves apt-get to finish, not half-way
  else
    echo "setup.sh: warning: not installing Debian packages ${pkgs[*]} (needs root and apt-get);" \
      "the tests that need them skip" >&2
  fi
fi

step "pip install of torch==2.13.0 and this project with its test extras" \
  python3 -m pip install -q "torch==2.13.0" -e ".[test,mpi]"
step "checking the install (torch 2.13.0 and the project's packages import)" \
  python3 -c 'import torch, torchcomms.control, launcher, kernels
v = torch.__version__.split("+")[0]
assert v == "2.13.0", f"torch {torch.__version__} is installed, the project pins 2.13.0"'
step "building the c10d backend wrapper and the gloo guard (torchcomms/csrc) into their cache" \
  python3 -m torchcomms.csrc.build
# Bytecode for the source tree (scripts/byte_compile.sh says why: ~50 ms of CPU a rank here)
step "byte-compiling the project's packages, tests, benchmarks and examples" \
  bash scripts/byte_compile.sh
if [ -n "$apt_pid" ]; then
  wait "$apt_pid" || exit $?
fi
