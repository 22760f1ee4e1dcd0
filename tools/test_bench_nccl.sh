#!/usr/bin/env bash
# test_bench_nccl.sh MOK_BENCH [MOK_LAUNCH]: mok-bench --transport nccl at R=1 on the tiny preset
# (one thread per GPU, and with MOK_LAUNCH one process per GPU) runs, says which transport ran
# and how its times were taken, reports the fused passes and the cuBLAS baseline, and prints the
# rank's --trace tables (a traced forward and backward after the timed passes). Exits 3
# (ctest: skipped) where no GPU is usable, saying so.
set -u
bench=$1
launch=${2:-}
args=(--transport nccl --preset tiny --R 1 --reps 3 --warmup 1 --torch "" --trace)
check() {  # check WHAT OUTPUT PATTERN...
  local what=$1 out=$2
  shift 2
  for p in "$@"; do
    if [[ $out != *"$p"* ]]; then
      echo "$what: output lacks '$p'"; echo "$out"; exit 1
    fi
  done
}
out=$("$bench" "${args[@]}" 2>&1)
code=$?
if [[ $code == 3 ]]; then
  echo "skipped: mok-bench found no usable GPU ($out)"; exit 3
fi
[[ $code == 0 ]] || { echo "mok-bench ${args[*]}: exit $code"; echo "$out"; exit 1; }
check "one thread per GPU" "$out" "# transport nccl: R=1, one rank per GPU (one thread each" "SLOWEST RANK" \
  "fused forward" "fused backward" "unfused forward" "fused / unfused speed" \
  "# trace forward, rank 0:" "# trace backward, rank 0:" "mark: reduction done"
echo "$out"
if [[ -n $launch ]]; then
  out=$("$launch" -n 1 -- "$bench" "${args[@]}" 2>&1)
  code=$?
  [[ $code == 0 ]] || { echo "mok-launch -n 1 -- mok-bench ${args[*]}: exit $code"; echo "$out"; exit 1; }
  check "one process per GPU" "$out" "(one process each, started by mok-launch)" "SLOWEST RANK" "fused forward" \
    "# trace forward, rank 0:" "# trace backward, rank 0:"
  echo "$out"
fi
echo "mok-bench --transport nccl --R 1: OK"
