#!/usr/bin/env bash
# One device call (lent H200): where the host's time per forward+backward goes when autograd runs the
# backward on its device thread (the default) and on the calling thread; the forward kernel alone
# vs through attention(), queued. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 benchmarks/window_profile.py --seq 8192 32768 --cprofile-calls 20 > "$OUT/profile.log" 2>&1
grep -A30 "^variant" "$OUT/profile.log"; grep "forward queued" "$OUT/profile.log"; tail -4 "$OUT/profile.log"
