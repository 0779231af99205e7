#!/usr/bin/env bash
# One device call (lent H200): the window kernel's no-host-wait check alone and in 4 processes
# at once (as pytest -n 4 ran it), with and without the gradients reset between calls.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 120 python3 benchmarks/gpu/exp/window_host_wait.py --tag solo --calls 10 2>&1 | tail -4
for i in 1 2 3 4; do
  timeout 200 python3 benchmarks/gpu/exp/window_host_wait.py --tag "par$i" --calls 10 > "$OUT/par$i.log" 2>&1 &
done
wait; cat "$OUT"/par*.log | grep "^\[" | tail -24
for i in 1 2 3 4; do
  timeout 200 python3 benchmarks/gpu/exp/window_host_wait.py --tag "reset$i" --calls 10 --reset-grads > "$OUT/reset$i.log" 2>&1 &
done
wait; cat "$OUT"/reset*.log | grep "^\[" | tail -24
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels -k "host_wait or seen_as or test_attention_window" 2>&1 | tail -3
