#!/usr/bin/env bash
# Table 1 as docs/results.md reports it, in one run (a GPU: minutes; this 2-core CPU: hours):
#   1. the budget sweep of every Monte Carlo row, cell and reference players (pure regime);
#   2. Table 1 at n = 64 per regime, cell and reference rows, at table1.DEFAULT_BUDGETS;
#   3. `gridvqa bench explainers` (throughput against the raw forward, also at reference
#      granularity).
# Usage: experiments/table1_full.sh OUT_DIR [N]   (OUT_DIR must not exist; N defaults to 64)
set -euo pipefail
out=${1:?usage: experiments/table1_full.sh OUT_DIR [N]}
n=${2:-64}
if [[ -e "$out" ]]; then echo "table1_full.sh: $out exists; give a new directory" >&2; exit 2; fi
mkdir -p "$out"
/usr/bin/env time -f "%e s wall, %M KB peak" -o "$out/convergence.time" \
  gridvqa explain --regimes --n 16 --explainers objects --convergence --reliability-n 8 \
  --convergence-budgets multishap=8,32,128 dime=64,256,1024 multishap_ref=8,32,128 \
  dime_ref=64,256,1024 --json --no-progress --out "$out/convergence" > "$out/convergence.log"
/usr/bin/env time -f "%e s wall, %M KB peak" -o "$out/table1.time" \
  gridvqa explain --regimes --n "$n" --players both --json --no-progress --figures 2 \
  --out "$out/table1" > "$out/table1.log"
gridvqa bench explainers --json > "$out/bench_explainers.log"
echo "wrote $out"
