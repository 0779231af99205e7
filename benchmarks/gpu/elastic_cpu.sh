#!/usr/bin/env bash
# The elastic FSDP claim (issue 24: survivors' stall <= 1 s and >= 10x shorter than torchrun's
# restart; heal <= 2x one state send) on the lent machine's 16 host cores, GPU unused: the 4
# ranks and the 2 replacement processes each have a core, as on a training node, which the
# project's 2 shared cores cannot give (there the replacements' start competes with the
# survivors' recovery). One call:
#   run(command="bash benchmarks/gpu/elastic_cpu.sh", carry=[".whl"])
# JSON and the runs' logs under $OUT.
source "$(dirname "$0")/prelude.sh"
{ uptime; nproc; python3 -c 'import torch; print("torch", torch.__version__)'; } | tee -a "$OUT/host.txt"
for i in $(seq 1 "${RUNS:-2}"); do
  t0=$(date +%s)
  timeout "${LIMIT_S:-200}" python3 benchmarks/elastic_bench.py --limit-s 180 > "$OUT/elastic_$i.json" 2> "$OUT/elastic_$i.err"
  echo "elastic_bench run $i rc=$? in $(( $(date +%s) - t0 )) s"
  python3 - "$OUT/elastic_$i.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
o, t = d["ours"], d["torchrun"]
print({k: d.get(k) for k in ("stall_ratio", "stopped_ratio", "heal_over_state_send", "load_before", "load_after")})
print("ours", {k: v for k, v in o.items() if k != "heal_parts"}, o.get("heal_parts"))
print("torchrun", t)
PY
  logs=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['logs'])" "$OUT/elastic_$i.json" 2>/dev/null) \
    && mkdir -p "$OUT/logs_$i" && cp "$logs"/* "$OUT/logs_$i/" 2>/dev/null
  uptime | tee -a "$OUT/host.txt"
done
