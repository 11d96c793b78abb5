#!/usr/bin/env bash
# Table 1 as docs/results.md reports it, in one resumable run (a GPU: minutes; this 2-core CPU:
# days). Steps, most needed first:
#   1. Table 1 at n = 64 per regime, cell and reference rows, at table1.DEFAULT_BUDGETS;
#   2. the budget sweep of every Monte Carlo row, cell and reference players (pure regime);
#   2b. the sweep's extension to 512 coalitions / 4,096 masks (MultiSHAP over cells and over
#      patches, DIME over cells), reusing the 128 / 1,024 runs of step 2 (on a CPU, PIECE=1
#      saves the MultiSHAP and DIME rows one sample at a time: `--piece`): none of them settled
#      within one point below the largest budget of step 2 (docs/table1_default/convergence.txt);
#      every run of the step is shipped (docs/table1_default/convergence_more.txt, from the
#      CPU), so table1_device.sh, seeded from docs/table1_default, skips it;
#   3. MultiSHAP's open choices one at a time over ViLT's patches (the reference row's
#      sensitivity table, pure regime, n = 32, 16 coalitions: the budget of the CPU fill run in
#      docs/results.md, whose three fills it repeats), with the objects floor beside it;
#   4. `gridvqa bench explainers` (throughput against the raw forward, also at reference
#      granularity);
#   5. the sweep's next step over cells, MultiSHAP at 2,048 coalitions (reusing the 128 runs of
#      step 2 and the 512 runs of step 2b, so Table 1's budget is compared with the largest):
#      MultiSHAP over cells did not settle from 128 to 512 either
#      (docs/table1_default/convergence_more.txt); a CPU ran it one sample per piece over
#      several sessions (11 to 19 min a sample here), and all its runs are shipped
#      (docs/table1_default/convergence_2048.txt), so seeded from there it is skipped;
#   6. MultiSHAP over cells with the coalitions' sizes stratified (`--multishap-sampling
#      stratified`, the reference's stratified_sampling=True) at 32, 128, 256 and 512
#      coalitions: what the reference's sampling buys against step 5's i.i.d. runs on the same
#      samples (experiments/compare_parts.py); shipped too
#      (docs/table1_default/convergence_stratified.txt);
#   7. the sweep's next step of DIME over cells, 16,384 masks (the main run only: its
#      per-sample scores were steady at 1,024 and 4,096, its mean still rose 1.7 points), reusing
#      the 1,024 / 4,096 runs; on a CPU one sample per piece (about 11 min a sample here, 10,987
#      s in all); shipped (docs/table1_default/convergence_dime16384.txt: both RMAs settled at
#      4,096), so seeded from there it is skipped. The DIME and MultiSHAP parts of steps 2-7
#      were drawn before the per-feature keys of the masks and coalitions (MASK_DRAWS of
#      gridvqa_jax.explain.dime and gridvqa_jax.explain.multishap): a resumed step refuses
#      them, and a run from scratch draws anew;
#   8. Table 1's cell rows of DIME and MultiSHAP at the budgets where the sweeps found both RMAs
#      settled (DIME 4,096 masks: step 7; MultiSHAP 512 coalitions, stratified: step 6, and
#      again with the new draws), n = N per regime, each in its own run (`--explainers dime
#      objects`, `--explainers multishap objects`: the row at position 0, so its key is the one
#      of the CPU runs of that command, whose finished parts or pieces (PIECE=1) can be copied
#      into OUT_DIR/parts/table1_settled_*). Which budgets Table 1 reports is the owner's choice
#      (docs/results.md, "Budgets"); this step measures the settled ones beside the defaults.
# Usage: experiments/table1_full.sh OUT_DIR [N]   (N defaults to 64)
# Stopped midway (a timeout, a lost machine), the same command resumes: finished steps are
# skipped (OUT_DIR/<step>.done), and a step in progress reuses every explainer x regime it had
# finished (`gridvqa explain --parts OUT_DIR/parts`, saved with the settings they belong to). So
# under a per-command limit, `timeout 540 experiments/table1_full.sh OUT` repeated until it
# prints "wrote OUT" does the whole run (on the `device` tool's GPU: experiments/table1_device.sh).
set -euo pipefail
out=${1:?usage: experiments/table1_full.sh OUT_DIR [N]}
n=${2:-64}
mkdir -p "$out"
step() {  # step NAME COMMAND...: run once; its stdout in OUT/NAME.log, wall time in NAME.time
  local name=$1
  shift
  [[ -e "$out/$name.done" ]] && return 0
  # a stopped step published nothing (its --out folder is a temporary one); its parts stay
  rm -rf "${out:?}/$name" "$out/$name".tmp-*
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f "%e s wall, %M KB peak" -o "$out/$name.time" "$@" > "$out/$name.log"
  else  # no GNU time (the device machine's image): wall seconds only
    local t0=$SECONDS
    "$@" > "$out/$name.log"
    echo "$((SECONDS - t0)) s wall" > "$out/$name.time"
  fi
  touch "$out/$name.done"
}
step table1 gridvqa explain --regimes --n "$n" --players both --json --no-progress --figures 2 \
  --parts "$out/parts/table1" --out "$out/table1"
step convergence gridvqa explain --regimes --n 16 --explainers objects --convergence \
  --reliability-n 8 --convergence-budgets multishap=8,32,128 dime=64,256,1024 \
  multishap_ref=8,32,128 dime_ref=64,256,1024 --json --no-progress \
  --parts "$out/parts/convergence_run" --out "$out/convergence"
step convergence_more gridvqa explain --regimes --n 16 --explainers objects --convergence \
  --reliability-n 8 --convergence-budgets multishap=128,512 multishap_ref=128,512 \
  dime=1024,4096 --json --no-progress --figures 0 ${PIECE:+--piece "$PIECE"} \
  --parts "$out/parts/convergence_run" --out "$out/convergence_more"
step sensitivity gridvqa explain --regimes --n 32 --explainers objects --players reference \
  --sensitivity --multishap-samples 16 --json --no-progress --figures 0 \
  --parts "$out/parts/sensitivity_run" --out "$out/sensitivity"
step bench gridvqa bench explainers --json
step convergence_2048 gridvqa explain --regimes --n 16 --explainers objects --convergence \
  --reliability-n 8 --convergence-budgets multishap=128,512,2048 --json --no-progress --figures 0 \
  --piece "${PIECE:-1}" --parts "$out/parts/convergence_run" --out "$out/convergence_2048"
step convergence_stratified gridvqa explain --regimes --n 16 --explainers objects --convergence \
  --reliability-n 8 --multishap-sampling stratified --convergence-budgets multishap=32,128,256,512 \
  --json --no-progress --figures 0 --piece "${PIECE:-1}" --parts "$out/parts/convergence_run" \
  --out "$out/convergence_stratified"
step convergence_dime16384 gridvqa explain --regimes --n 16 --explainers objects --convergence \
  --reliability-n 0 --convergence-budgets dime=1024,4096,16384 --json --no-progress --figures 0 \
  --piece "${PIECE:-1}" --parts "$out/parts/convergence_run" --out "$out/convergence_dime16384"
step table1_settled_dime gridvqa explain --regimes --n "$n" --explainers dime objects \
  --players cells --dime-samples 4096 --json --no-progress --figures 0 ${PIECE:+--piece "$PIECE"} \
  --parts "$out/parts/table1_settled_dime" --out "$out/table1_settled_dime"
step table1_settled_multishap gridvqa explain --regimes --n "$n" --explainers multishap objects \
  --players cells --multishap-samples 512 --multishap-sampling stratified --json --no-progress \
  --figures 0 ${PIECE:+--piece "$PIECE"} --parts "$out/parts/table1_settled_multishap" \
  --out "$out/table1_settled_multishap"
echo "wrote $out"
