# session 40 run 14 (the session's run 8): TMA maps encoded again only when a tensor moved (cache):
# checks, then forwards alone against main (5b3e4f0's kernel), qwen3 at R = 8 and R = 1
set -u
M=gpu-run/cache; F=$PWD/fixtures
date; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
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
