#!/usr/bin/env bash
# One device call (lent H200, torch 2.11): the sliding-window anchors at 32k re-timed on the
# twelfth session's code (attention unchanged since the tenth). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 400 python3 benchmarks/attn_bench.py --seq 32768 --variants stock --budget-s 90 > "$OUT/attn.log" 2>&1
echo "attn rc=$?"; tail -14 "$OUT/attn.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
