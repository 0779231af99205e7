#!/usr/bin/env bash
# One device call (lent H200): the tests that calls return while earlier GPU work still runs,
# first with the fused loss's old blocking copy put back (they must fail), then as committed.
source "$(dirname "$0")/prelude.sh"
cp kernels/lce/config.py "$OUT/config_fixed.py"
sed -i 's/torch.full((), float(num_classes), dtype=dtype, device=dev)/torch.tensor(float(num_classes), dtype=dtype, device=dev)/' kernels/lce/config.py
echo "old line back: $(grep -c 'torch.tensor(float(num_classes)' kernels/lce/config.py)"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lce_cuda.py -k never_makes_the_host_wait \
  > "$OUT/before.log" 2>&1
echo "before rc=$?"; grep -E "passed|failed" "$OUT/before.log" | sort | uniq -c | head -5
cp "$OUT/config_fixed.py" kernels/lce/config.py
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lce_cuda.py tests/kernels/test_attention_window_triton.py tests/kernels/test_host_wait_check.py tests/kernels/test_model.py \
  -k "never_makes_the_host_wait or seen_as" > "$OUT/after.log" 2>&1
echo "after rc=$?"; tail -3 "$OUT/after.log"
