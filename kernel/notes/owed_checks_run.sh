#!/bin/bash
# Prepared in the twenty-sixth session (2026-12-05, no device lent), not yet run: the GPU checks
# owed since the twenty-fifth session changed test and host code without a device, plus the new
# rows of mok-gpu-probe. One device call, about 4 minutes.
#
# What is owed (README's closing notes of sessions 25 and 26):
#   - test_kernel's own main() (exit 77 only without a GPU, 1 on any failure), expect_bitwise
#     requiring every output and gradient, the NCCL tests' "ranks not run" lines;
#   - the gpu ctests verify.cuda_fixture and verify.cuda_determinism (mok-verify on the kernel);
#   - mma_probe with --wgmma-count;
#   - the argument handling of mok-bench, mok-gemm-bench, mok-gpu-probe and mok-launch;
#   - mok-gpu-probe's new "one SM alone" rows (load-only / store-only from L2), which bound the
#     simulator's gpu.sm_load_gbps / gpu.sm_store_gbps (simulator/VALIDATION.md).
#
# Build here first (Release, sm_90a, as BENCHMARKS.md's runs; build-gpu itself is over the 64 MiB carry):
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_ENABLE_CUDA=ON -DMOK_CUDA_ARCHS=90a -DMOK_ATOMICS_VARIANT=ON
#   ninja -C build-gpu
#   rm -rf gpu-run/binO && mkdir -p gpu-run/binO && cp build-gpu/kernel/test/{test_kernel,mok-mma-probe,mok-recip-probe} \
#     build-gpu/verify/mok-verify build-gpu/tools/{mok-bench,mok-launch,mok-gpu-probe,mok-gemm-bench} gpu-run/binO/
#   ../shared/tools/gpu-pack gpu-run; rm -f gpu-run/.libs/libcublas*   (keeps the carried tree under 64 MiB)
# Device call (carry ["gpu-run"]):
#   source gpu-run/gpu-env.sh; export PATH=$PATH:/usr/local/cuda/bin LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
#   MOK_FIXTURES_DIR=$PWD/fixtures bash kernel/notes/owed_checks_run.sh 2>&1 | tee $OUT/owed.txt
set -u
B=gpu-run/binO
F=${MOK_FIXTURES_DIR:-fixtures}
rc_of() { "$@" > /tmp/owed_out.txt 2>&1; local rc=$?; tail -n 4 /tmp/owed_out.txt; echo "exit $rc: $*"; }
echo "=== $(date -u +%T) test_kernel (expect exit 0; 77 would mean no GPU seen)"
rc_of $B/test_kernel
echo "=== $(date -u +%T) mma_probe and recip_probe, as ctest runs them"
rc_of $B/mok-mma-probe --count 20000 --wgmma-count 20000
rc_of $B/mok-recip-probe
echo "=== $(date -u +%T) verify.cuda_fixture / verify.cuda_determinism, and every fixture"
rc_of $B/mok-verify run "$F/small-zipf.h5" --backend cuda
rc_of $B/mok-verify determinism "$F/small-zipf.h5" --runs 2 --ranks 1,2,4 --comm-sms 1,2
for f in "$F"/*.h5; do rc_of $B/mok-verify run "$f" --backend cuda; done
echo "=== $(date -u +%T) tools.bench_nccl (one rank through the NCCL transport)"
rc_of bash tools/test_bench_nccl.sh $B/mok-bench $B/mok-launch
echo "=== $(date -u +%T) argument handling on a GPU machine (each should exit 2 before touching the GPU)"
rc_of $B/mok-bench --case nosuch
rc_of $B/mok-bench --T 0
rc_of $B/mok-gemm-bench --modes nosuch
rc_of $B/mok-gpu-probe --mib 1
rc_of $B/mok-launch --timeout -1 -- true
rc_of $B/mok-gpu-probe --peer 1   # one GPU here: exit 3, naming the missing peer
echo "=== $(date -u +%T) mok-gpu-probe --reps 3 (the 'one SM alone' rows are new)"
$B/mok-gpu-probe --reps 3
echo "=== $(date -u +%T) done"
