#!/usr/bin/env bash
# One device call (lent H200): the window kernel's and stock flex's forward and f+b per call in bursts of 20 to 1280 queued
# calls after an idle moment, with the SM clock and power sampled every 20 ms beside it (read-only
# nvidia-smi queries): does a call get slower the longer the GPU has been busy? Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 20 > "$OUT/clocks.csv" &
SMI=$!
timeout 240 python3 benchmarks/window_forward_gaps.py --seq 32768 --rounds 0 --bursts 20 80 320 1280 2>&1 | tee "$OUT/bursts.log" | tail -9
kill $SMI
python3 - "$OUT/clocks.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))[1:]
sm = [int(r[1].split()[0]) for r in rows if len(r) > 3 and r[1].strip()[0].isdigit()]
pw = [float(r[3].split()[0]) for r in rows if len(r) > 3 and r[3].strip()[0].isdigit()]
busy = [(s, p) for s, p in zip(sm, pw) if p > 200]
print(f"clock samples {len(sm)}; while drawing > 200 W: {len(busy)} samples, SM MHz min/median/max "
      f"{min(s for s, _ in busy) if busy else 0}/{sorted(s for s, _ in busy)[len(busy)//2] if busy else 0}/"
      f"{max(s for s, _ in busy) if busy else 0}, power max {max(pw) if pw else 0:.0f} W")
PY
