#!/bin/bash
# Ran in the twenty-fourth session (2026-12-05) with SHORT=1: kernel/notes/bench_v24_run_1_grid_constant.txt;
# the two diffs then landed as commits 4751f77..bfc3657 and left kernel/notes (git show 4751f77 etc.).
# The fixture line below was fixed after that run: mok-verify run takes one file, and the glob was refused.
# Prepared in the twenty-second session (2026-12-04), not yet run: one device call that checks
# kernel/notes/grid_constant_params.diff (binG) and that diff with kernel/notes/smem_space.diff on
# top (binS), and times binS against main in the same sitting.
#
# Build here first (two trees, Release, sm_90a, with the atomics variant as BENCHMARKS.md's runs):
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_ENABLE_CUDA=ON -DMOK_CUDA_ARCHS=90a -DMOK_ATOMICS_VARIANT=ON
#   ninja -C build-gpu mok-bench mok-verify test_kernel            -> copy the three to gpu-run/binM (main)
#   git apply kernel/notes/grid_constant_params.diff && ninja -C build-gpu mok-bench mok-verify test_kernel
#                                                                   -> copy to gpu-run/binG
#   git apply kernel/notes/smem_space.diff && ninja -C build-gpu mok-bench mok-verify test_kernel
#                                                                   -> copy to gpu-run/binS, then git checkout kernel
#   ../shared/tools/gpu-pack gpu-run; rm -f gpu-run/.libs/libcublas*   (keeps the carried tree under 64 MiB)
# Device call (carry ["gpu-run"], about 9 minutes; SHORT=1 skips the traces and the small case):
#   source gpu-run/gpu-env.sh; export PATH=$PATH:/usr/local/cuda/bin LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
#   MOK_FIXTURES_DIR=$PWD/fixtures bash kernel/notes/grid_constant_params_run.sh 2>&1 | tee $OUT/s22.txt
# What it decides: whether the candidates keep every bit (test_kernel, the five fixtures, the determinism
# matrix), launches at all (a 25,504-byte cooperative-launch parameter), and whether it is faster than main on the
# qwen3 and dsv3 forwards and on both passes (medians over three alternating rounds, tools/bench-ab.sh -p).
# If binS wins, a later call can split it (binG against binS) before landing one or both.
set -u
M=gpu-run/binM
S=gpu-run/binS   # the candidate timed and fully checked: both diffs
OUT=${OUT:-/tmp/s22}
mkdir -p "$OUT"
echo "=== $(date -u +%T) checks: binG (grid-constant parameters alone), test_kernel only"
gpu-run/binG/test_kernel 2>&1 | tail -2
echo "=== $(date -u +%T) checks of the candidate (binS)"
$S/test_kernel 2>&1 | tail -3
for f in fixtures/*.h5; do echo "$f: $($S/mok-verify run $f --backend cuda 2>&1 | grep -E 'PASSED|FAILED|rror' | head -1)"; done
$S/mok-verify determinism fixtures/small-zipf.h5 --runs 5 --ranks 1,2,4,8 --comm-sms 1,2 --minibatch 128,64 2>&1 | tail -2
# The NCCL transport's launch path (one rank, this GPU), as tools/test_bench_nccl.sh runs it.
$S/mok-bench --transport nccl --preset tiny --R 1 --reps 3 --warmup 1 --torch "" 2>&1 | grep -E "transport|fused (forward|backward)|rror"
echo "=== $(date -u +%T) traces (qwen3 forward): per-item time outside the GEMM sums"
[ "${SHORT:-0}" = 1 ] && echo "(SHORT=1: traces skipped)"
for b in $([ "${SHORT:-0}" = 1 ] || echo binM binS); do
  echo "--- $b"
  gpu-run/$b/mok-bench --case qwen3 --no-baseline --sustain-ms 0 --passes forward --reps 3 --trace 2>&1 |
    grep -E "^mark: (plan|gather|last GEMM|reduction)|^sum: phase|fused forward" | head -12
  echo "--- $b, R = 8 (peers read through the constant cache: watch the publish sums)"
  gpu-run/$b/mok-bench --case qwen3 --R 8 --no-baseline --sustain-ms 0 --reps 3 --trace 2>&1 |
    grep -E "^sum: (phase|publish)|fused (forward|backward)" | head -12
done
echo "=== $(date -u +%T) A/B against main, three rounds"
A="--reps 10 --no-baseline --sustain-ms 0"
bash tools/bench-ab.sh -n 3 -p -o "$OUT/ab" \
  mqf "$M/mok-bench --case qwen3 $A --passes forward" sqf "$S/mok-bench --case qwen3 $A --passes forward" \
  mdf "$M/mok-bench --case dsv3 $A --passes forward" sdf "$S/mok-bench --case dsv3 $A --passes forward" \
  mq "$M/mok-bench --case qwen3 $A" sq "$S/mok-bench --case qwen3 $A" \
  md "$M/mok-bench --case dsv3 $A" sd "$S/mok-bench --case dsv3 $A" 2>&1 | tail -16
echo "=== $(date -u +%T) small (latency), both builds, with the baselines once"
if [ "${SHORT:-0}" = 1 ]; then echo "(SHORT=1: small skipped)"; echo "=== $(date -u +%T) done"; exit 0; fi
$S/mok-bench --case small --reps 20 2>&1 | tail -12
$M/mok-bench --case small --reps 20 --no-baseline --sustain-ms 0 2>&1 | grep -E "fused"
echo "=== $(date -u +%T) done"
