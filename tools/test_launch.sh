#!/usr/bin/env bash
# test_launch.sh MOK_LAUNCH: mok-launch gives every rank its environment and propagates failures.
set -u
launch=$1
out=$("$launch" -n 3 -- bash -c 'echo "$MOK_RANK/$MOK_WORLD_SIZE/${#MOK_NCCL_ID}/$CUDA_VISIBLE_DEVICES/$NCCL_NVLS_ENABLE"' | sort)
want=$'0/3/256/0/0\n1/3/256/1/0\n2/3/256/2/0'
[[ $out == "$want" ]] || { echo "unexpected rank environments:"; echo "$out"; exit 1; }
"$launch" -n 2 -- bash -c 'exit $((MOK_RANK == 1 ? 7 : 0))'
code=$?
[[ $code == 7 ]] || { echo "expected exit 7 from the failing rank, got $code"; exit 1; }
"$launch" -n 1 --timeout 1 -- sleep 30
code=$?
[[ $code == 124 ]] || { echo "expected 124 on timeout, got $code"; exit 1; }
# A signal to the launcher reaches every rank: none is left running after it (each rank writes
# its pid, the launcher gets SIGTERM, then no pid may still exist).
dir=$(mktemp -d)
"$launch" -n 2 -- bash -c 'echo $$ > '"$dir"'/rank$MOK_RANK; exec sleep 30' &
lpid=$!
for _ in $(seq 100); do [[ -s $dir/rank0 && -s $dir/rank1 ]] && break; sleep 0.05; done
kill -TERM "$lpid"
wait "$lpid"
code=$?
[[ $code == 143 ]] || { echo "expected 128+15 after SIGTERM, got $code"; exit 1; }
for f in "$dir"/rank0 "$dir"/rank1; do
  if kill -0 "$(cat "$f")" 2>/dev/null; then echo "rank pid $(cat "$f") outlived the launcher"; kill -9 "$(cat "$f")"; exit 1; fi
done
rm -rf "$dir"
for bad in -1 nan; do
  "$launch" -n 1 --timeout "$bad" -- true 2>/dev/null
  code=$?
  [[ $code == 2 ]] || { echo "--timeout $bad: expected exit 2, got $code"; exit 1; }
done
echo "mok-launch: environments, failure propagation, timeout, signals and bad timeouts OK"
