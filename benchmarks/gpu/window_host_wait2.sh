#!/usr/bin/env bash
# One device call (lent H200): is the window step's one waiting call CUDA's lazy module loading?
# The check with one warm-up call under the default (lazy) and eager module loading, then with two
# warm-ups; then the no-host-wait tests in 4 workers, as the full suite runs them.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 100 python3 benchmarks/gpu/exp/window_host_wait.py --tag lazy --calls 5 2>&1 | tail -2
CUDA_MODULE_LOADING=EAGER timeout 100 python3 benchmarks/gpu/exp/window_host_wait.py --tag eager --calls 5 2>&1 | tail -2
timeout 100 python3 benchmarks/gpu/exp/window_host_wait.py --tag lazy-2-warmups --warmups 2 --calls 5 2>&1 | tail -2
timeout 250 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_window_triton.py \
  tests/kernels/test_lce_cuda.py tests/kernels/test_host_wait_check.py tests/kernels/test_model.py -k "host_wait or seen_as" 2>&1 | tail -3
