#!/usr/bin/env bash
# Re-measure every planner number the README reports, as two single-threaded streams (one per core).
# Needs the stored baseline runs: results/planners (benchmarks/planners.py --time-budget 20) and
# results/robustness[/seedS] (benchmarks/robustness.py --seed S); arachne is re-planned against them.
# Logs: results/logs/<name>.txt.  Usage: bash benchmarks/suite.sh   (about 35 min on 2 cores)
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python}
LOGS=results/logs
mkdir -p "$LOGS"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

run() {  # name, command...
  local name=$1; shift
  echo "== $name: $*" >&2
  "$@" > "$LOGS/$name.txt" 2>&1 || echo "!! $name failed (exit $?), see $LOGS/$name.txt" >&2
}

stream_a() {
  run quality $PY benchmarks/arachne_eval.py quality --rerun-arachne
  for s in 0 1 2 3 4 5 6 7 8 9 10 11 12 14 15 16 17 18 19 20 21; do
    if [ "$s" = 0 ]; then old=results/robustness; else old=results/robustness/seed$s; fi
    run robustness$s $PY benchmarks/robustness.py --seed $s --planners arachne --reuse $old/runs.json \
      --out results/robustness-r3/seed$s
  done
  for s in 22 23 24 25; do  # fresh hold-outs whose baselines got 20 s each
    run robustness$s-b20 $PY benchmarks/robustness.py --seed $s --budget 20 --planners arachne \
      --reuse results/robustness/seed$s-b20/runs.json --out results/robustness-r3/seed$s-b20
  done
  run planner_options_stored $PY benchmarks/planner_options.py results/robustness/seed{0,1,2,3,4,5,26,27,28,29}/runs.json \
    results/robustness/odd10{0,1,2,3,4,5,6,7,8}/runs.json --out results/planner_options/stored  # the stored runs
  for s in 100 101 102 103 104; do  # node sizes 1 to 8 (odd sizes too)
    run robustness-odd$s $PY benchmarks/robustness.py --seed $s --node-sizes 1,2,3,4,5,6,7,8 --planners arachne \
      --reuse results/robustness/odd$s/runs.json --out results/robustness-r3/odd$s
  done
  run robustness_summary_odd $PY benchmarks/robustness.py --summarize results/robustness-r3/odd10{0,1,2,3,4}/runs.json
  run robustness_summary012 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{0,1,2}/runs.json
  run robustness_summary34 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{3,4}/runs.json
  run robustness_summary5678 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{5,6,7,8}/runs.json
  run robustness_summary910 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{9,10}/runs.json
  run robustness_summary1112 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{11,12}/runs.json
  run robustness_summary1415 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{14,15}/runs.json
  run robustness_summary1617 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{16,17}/runs.json
  run robustness_summary1819 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{18,19}/runs.json
  run robustness_summary2021 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{20,21}/runs.json
  run robustness_summary2223b20 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{22,23}-b20/runs.json
  run robustness_summary2425b20 $PY benchmarks/robustness.py --summarize results/robustness-r3/seed{24,25}-b20/runs.json
  run target_sweep $PY benchmarks/target_sweep.py
  run replan_spot $PY benchmarks/replan_trace.py --trace spot
  run replan_grow $PY benchmarks/replan_trace.py --trace grow
}

stream_b() {
  run latency $PY benchmarks/arachne_eval.py latency --baselines sailor,flashflex,metis,amp,megatron --budget 30
  run optimality $PY benchmarks/arachne_eval.py optimality --oracle-budget 60
  run ablation8 $PY benchmarks/arachne_eval.py ablation --k 8 --out results/arachne_eval/k8
  run ablation24 $PY benchmarks/arachne_eval.py ablation
  run generalise $PY benchmarks/arachne_eval.py generalise --budget 10 --teacher-budget 30
}

date > "$LOGS/start.txt"
stream_a & a=$!
stream_b & b=$!
wait $a $b
run split_speed $PY benchmarks/split_speed.py results/robustness/seed3/runs.json  # alone: wall-time ratios
run sweep_latency_odd $PY benchmarks/sweep_latency.py results/robustness/odd10{3,4}/runs.json
run work_clock $PY benchmarks/work_clock.py check  # alone: it loads every core on purpose
date > "$LOGS/done.txt"
echo "logs in $LOGS" >&2
