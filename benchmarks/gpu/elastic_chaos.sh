#!/usr/bin/env bash
# Issue 24's chaos acceptance in repeat mode on the lent machine's 16 host cores (GPU unused),
# oversubscribed: WORKERS jobs at once (each 4 or 6 ranks plus its replacements) beside BUSY
# spinning processes. Cases: 2 x 2 and 3 x 2 killed at a random step and instant, and a
# replacement killed in the middle of its heal (tests/fsdp2/test_elastic.py, TC_ELASTIC_REPEAT).
# One call:
#   run(command="bash benchmarks/gpu/elastic_chaos.sh", carry=[".whl"])
# The pytest log is $OUT/chaos.log; a failed case's job log is in its assertion message.
source "$(dirname "$0")/prelude.sh"
REPEAT=${REPEAT:-10} WORKERS=${WORKERS:-4} BUSY=${BUSY:-8}
pids=()
for _ in $(seq 1 "$BUSY"); do python3 -c "while True: pass" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
{ uptime; nproc; echo "repeat=$REPEAT workers=$WORKERS busy=$BUSY"; } | tee "$OUT/host.txt"
TC_ELASTIC_REPEAT=$REPEAT timeout "${LIMIT_S:-560}" python3 -m pytest -q -p no:cacheprovider -n "$WORKERS" \
  --timeout 400 tests/fsdp2/test_elastic.py -k repeat > "$OUT/chaos.log" 2>&1
rc=$?
uptime | tee -a "$OUT/host.txt"
echo "chaos rc=$rc"; grep -E "passed|failed|FAILED|ERROR" "$OUT/chaos.log" | tail -20
exit $rc
