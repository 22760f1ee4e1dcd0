#!/usr/bin/env bash
# test_gemm_bench.sh MOK_GEMM_BENCH: bad arguments exit 2 with a message naming the option, before
# any GPU is touched; without a GPU a valid command exits 3 (nothing measured).
set -u
bench=$1
expect() {  # expect CODE PATTERN ARGS...
  local want=$1 pattern=$2
  shift 2
  local out code
  out=$("$bench" "$@" 2>&1)
  code=$?
  [[ $code == "$want" ]] || { echo "mok-gemm-bench $*: exit $code, expected $want"; echo "$out"; exit 1; }
  [[ $out == *$pattern* ]] || { echo "mok-gemm-bench $*: output lacks '$pattern'"; echo "$out"; exit 1; }
}
expect 2 "multiple of 256" --H 300
expect 2 "multiple of 256" --I 200
expect 2 "--wgrad-rows" --wgrad-rows 100
expect 2 "--epilogue" --epilogue bogus
expect 2 "--M" --M 5
expect 0 "tile engine" --help
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  expect 3 "no CUDA device" --modes fwd1
fi
echo "mok-gemm-bench: argument checks OK"
