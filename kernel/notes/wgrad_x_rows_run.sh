#!/bin/bash
# wgrad_x_rows_run.sh DIR: the device side of the run the thirty-eighth session could not make (run 1 of the thirty-ninth).
# DIR holds main/, z/ and clean/ from wgrad_x_rows_build.sh (stripped test_kernel, mok-verify,
# mok-bench, mok-launch); run from the repository root on the GPU machine (fixtures/ and tools/
# are read from there), output to stdout. Checks on z and clean, then `bench-ab.sh -x` of main,
# z and clean on qwen3, both passes, and one traced run of each for the weight gradients' span.
# About 150 s on an H100. Example (device call, carry ["gpu-run"]):
#   tar xJf gpu-run/bins.tar.xz -C gpu-run && source gpu-run/gpu-env.sh &&
#   bash kernel/notes/wgrad_x_rows_run.sh gpu-run 2>&1 | tee $OUT/wgrad.txt
set -u
D=${1:?usage: wgrad_x_rows_run.sh DIR}; F=$PWD/fixtures
date; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
run() { local name=$1; shift; local t0=$SECONDS; timeout 100 "$@" > /tmp/t.txt 2>&1; local rc=$?; echo "=== $name: exit $rc ($((SECONDS - t0)) s)"; tail -n 2 /tmp/t.txt; }
for v in z clean; do
  M=$D/$v
  echo "##### checks on $v"
  run test_kernel $M/test_kernel
  grep -E "FAILED|Failure" /tmp/t.txt | head -20
  run verify.cuda_determinism $M/mok-verify determinism $F/small-zipf.h5 --runs 2 --ranks 1,2,4,8 --comm-sms 1,2
  run verify.determinism_qwen3 $M/mok-verify determinism $F/qwen3-micro.h5 --runs 2 --ranks 1,2,4 --comm-sms 1,2
  run verify.determinism_items_own $M/mok-verify determinism $F/dsv3-micro-zipf.h5 --runs 1 --ranks 1,2,4 --comm-sms 1 --items own
  for f in $F/*.h5; do run "e2e $(basename $f)" $M/mok-verify run $f --backend cuda --end-to-end; done
  timeout 100 bash tools/test_bench_nccl.sh $M/mok-bench $M/mok-launch > /tmp/nccl.txt 2>&1; echo "=== tools.bench_nccl: exit $?"; tail -1 /tmp/nccl.txt
done
Q="--case qwen3 --reps 10 --no-baseline --sustain-ms 0"
echo "=== $(date -u +%T) qwen3 both passes: main, z, clean"
timeout 200 bash tools/bench-ab.sh -x -n 5 -o /tmp/ab_wgrad main "$D/main/mok-bench $Q" z "$D/z/mok-bench $Q" clean "$D/clean/mok-bench $Q" 2>&1 | grep -vE "^#"
for v in main clean; do
  echo "--- traced $v (backward: weight gradients from 'reduction done' to 'end')"
  timeout 40 $D/$v/mok-bench $Q --trace 2>&1 | grep -E "^(mark: reduction done|mark: end|fused)"
done
echo "=== $(date -u +%T) done"
