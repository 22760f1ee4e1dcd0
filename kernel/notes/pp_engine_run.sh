#!/bin/bash
# Prepared in the twenty-seventh session (2026-12-05); run in the twenty-eighth on an H100 (ping-pong 51% of peak,
# rejected: BENCHMARKS.md, twenty-eighth session; log kernel/notes/bench_v28_run_1_h100_pp_e2e_targets.txt): the engine bench's ping-pong variant
# (mok-gemm-bench's pp_kernel) with turns; the first version, without them, hung on the H200 (BENCHMARKS.md,
# twenty-seventh session). Each bench runs under a timeout and line-buffered, so that a hang costs a minute and
# shows how far it got. About two minutes of device time.
# Build here first: ninja -C build-gpu tools/mok-gemm-bench; mkdir -p gpu-run/binO; cp build-gpu/tools/mok-gemm-bench gpu-run/binO/
#   ../shared/tools/gpu-pack gpu-run; rm -f gpu-run/.libs/libcublas*
# Device call (carry ["gpu-run"]): source gpu-run/gpu-env.sh; bash kernel/notes/pp_engine_run.sh 2>&1 | tee $OUT/pp.txt
# Read: the "ping-pong" line of each mode against the "ws ms" column (the warp-specialised engine) and cuBLAS;
# bits must read "same".
B=${BIN:-gpu-run/binO}
echo "=== $(date -u +%T) dsv3 shapes"
timeout 60 stdbuf -oL $B/mok-gemm-bench --M 16384 --H 7168 --I 2048 --modes fwd2,bwd1 --reps 10; echo "exit $?"
echo "=== $(date -u +%T) qwen3 shapes"
timeout 45 stdbuf -oL $B/mok-gemm-bench --M 32768 --H 2048 --I 768 --modes fwd1,fwd2 --reps 10; echo "exit $?"
date -u
