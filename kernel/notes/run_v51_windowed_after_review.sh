# session 51: the first GPU run owed for the windowed transports after the reviews (a9eefc7 onward). Run from the repository root with M pointing at the built binaries (test_kernel, mok-verify), $OUT a folder for logs.
set -u
M=gpu-run/main; F=$PWD/fixtures
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.txt 2>&1; local rc=$?; echo "=== $name: exit $rc ($((SECONDS - t0)) s)"; tail -n 3 $OUT/$name.txt; }
step split 120 $M/test_kernel --gtest_filter='*Split*:*Nccl*'
grep -E "FAILED|Failure|OK \]|NOTE|Expected|Which is|split rack rank" $OUT/split.txt | head -40
step test_kernel 150 $M/test_kernel --gtest_filter='-*Split*'
grep -E "FAILED|OK \]|PASSED" $OUT/test_kernel.txt | tail -20
for f in $F/*.h5; do
  n=$(basename $f .h5); t0=$SECONDS
  timeout 60 $M/mok-verify run $f --backend cuda --transport split > /tmp/v_$n.txt 2>&1; echo "=== verify split $n: exit $? ($((SECONDS - t0)) s)"; grep -E "PASS|FAIL|differ" /tmp/v_$n.txt | tail -1
done
cat /tmp/v_*.txt > $OUT/verify_split.txt
step det_split 100 $M/mok-verify determinism $F/small-zipf.h5 --runs 2 --ranks 1,2,4,8 --comm-sms 1,2 --transport split
step det_virtual 60 $M/mok-verify determinism $F/small-zipf.h5 --runs 2 --ranks 1,2,4 --comm-sms 1,2
date
