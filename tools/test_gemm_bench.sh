#!/usr/bin/env bash
# test_gemm_bench.sh MOK_GEMM_BENCH: bad arguments exit 2 with a message naming the option, before
# any GPU is touched; --help shows the defaults; without a GPU a valid command exits 3 (nothing measured).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/expect_exit.sh"
bench=$1
expect_exit "$bench" 2 "multiple of 256" --H 300
expect_exit "$bench" 2 "multiple of 256" --I 200
expect_exit "$bench" 2 "--wgrad-rows" --wgrad-rows 100
expect_exit "$bench" 2 "--epilogue" --epilogue bogus
expect_exit "$bench" 2 "--fwd1-stores" --fwd1-stores half
expect_exit "$bench" 2 "--stagger-us" --stagger-us -3
expect_exit "$bench" 2 "--M" --M 5
expect_exit "$bench" 0 "tile engine" --help
# --help shows the defaults of the sizes and repetitions.
help=$("$bench" --help 2>&1)
for want in "--M INT:INT in [128 - 4194304]=16384" "--H INT:INT in [256 - 65536]=7168" "--I INT:INT in [128 - 65536]=2048" \
            "--wgrad-rows INT:INT in [64 - 4194304]=2048" "--reps INT:INT in [1 - 1000]=10" "--warmup INT:INT in [0 - 100]=3"; do
  [[ $help == *"$want"* ]] || { echo "mok-gemm-bench --help lacks '$want'"; expect_failed=1; }
done
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  expect_exit "$bench" 3 "no CUDA device" --modes fwd1
fi
[[ $expect_failed == 0 ]] && echo "mok-gemm-bench: argument checks OK"
exit $expect_failed
