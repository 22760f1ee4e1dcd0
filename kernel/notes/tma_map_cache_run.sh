# The run the TMA-map cache needs (fortieth session; not run: the device time ran out). Binaries:
# gpu-run/main (main's kernel, with mok-bench --timing) and gpu-run/cache (main + tma_map_cache_unmeasured.patch).
# First: how much host time sits in main's timed passes (sync against queued, R = 8 and R = 1, one
# binary); then the cache's checks and its forwards alone against main.
set -u
M=gpu-run/cache; F=$PWD/fixtures
date; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for R in 8 1; do
  Q="--case qwen3 --R $R --reps 10 --no-baseline --sustain-ms 0 --passes forward"
  echo "=== $(date -u +%T) main, qwen3 R = $R forwards alone: --timing sync against queued"
  timeout 120 bash tools/bench-ab.sh -x -n 4 -o /tmp/ab_t$R sync "gpu-run/main/mok-bench $Q" queued "gpu-run/main/mok-bench $Q --timing queued" 2>&1 | grep -vE "^#"
done
run() { local name=$1; shift; local t0=$SECONDS; timeout 100 "$@" > /tmp/t.txt 2>&1; local rc=$?; echo "=== $name: exit $rc ($((SECONDS - t0)) s)"; tail -n 2 /tmp/t.txt; }
run test_kernel $M/test_kernel
grep -E "FAILED|Failure|^\[ +(OK|RUN) +\] Kernel.OneLayer" /tmp/t.txt | head -20
run verify.cuda_determinism $M/mok-verify determinism $F/small-zipf.h5 --runs 2 --ranks 1,2,4,8 --comm-sms 1,2
run verify.determinism_qwen3 $M/mok-verify determinism $F/qwen3-micro.h5 --runs 2 --ranks 1,2,4 --comm-sms 1,2
for f in $F/*.h5; do run "e2e $(basename $f)" $M/mok-verify run $f --backend cuda --end-to-end; done
timeout 60 bash tools/test_bench_nccl.sh $M/mok-bench $M/mok-launch > /tmp/nccl.txt 2>&1; echo "=== tools.bench_nccl: exit $?"; tail -1 /tmp/nccl.txt
for R in 8 1; do
  Q="--case qwen3 --R $R --reps 10 --no-baseline --sustain-ms 0 --passes forward"
  echo "=== $(date -u +%T) qwen3 R = $R forwards alone: main against cache"
  timeout 120 bash tools/bench-ab.sh -x -n 6 -o /tmp/ab_$R main "gpu-run/main/mok-bench $Q" cache "$M/mok-bench $Q" 2>&1 | grep -vE "^#"
done
echo "=== $(date -u +%T) done"
