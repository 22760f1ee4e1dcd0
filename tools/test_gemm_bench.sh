#!/usr/bin/env bash
# test_gemm_bench.sh MOK_GEMM_BENCH: bad arguments exit 2 with a message naming the option, before
# any GPU is touched; without a GPU a valid command exits 3 (nothing measured).
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
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  expect_exit "$bench" 3 "no CUDA device" --modes fwd1
fi
[[ $expect_failed == 0 ]] && echo "mok-gemm-bench: argument checks OK"
exit $expect_failed
