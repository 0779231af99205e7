#!/usr/bin/env bash
# One device call: find which chunked-Gluon-forward cases fault (each case in its own process).
source "$(dirname "$0")/prelude.sh"
for c in "1000 100 1 0 128" "1000 100 2 0 128" "1000 100 4 0 128" "4096 256 2 0 128" "4096 256 2 0 64" "1000 100 2 4 128" "256 64 2 0 128" "128 64 2 0 128"; do
  echo "case $c: $(timeout 60 python3 benchmarks/gpu/exp/gluon_chunk_repro.py $c 2>&1 | tail -1 | cut -c1-150)"
done
which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null
CS=$(which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$CS" ] && timeout 200 $CS --print-limit 5 python3 benchmarks/gpu/exp/gluon_chunk_repro.py 256 64 2 0 128 2>&1 | head -40
