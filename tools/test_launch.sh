#!/usr/bin/env bash
# test_launch.sh MOK_LAUNCH: mok-launch gives every rank its environment (its GPU from the
# launcher's CUDA_VISIBLE_DEVICES, or r when unset), refuses more ranks than listed GPUs, and
# propagates failures, timeouts and signals.
set -u
launch=$1
unset CUDA_VISIBLE_DEVICES  # the caller's list (a CI runner's) must not change what is expected
out=$("$launch" -n 3 -- bash -c 'echo "$MOK_RANK/$MOK_WORLD_SIZE/${#MOK_NCCL_ID}/$CUDA_VISIBLE_DEVICES/$NCCL_NVLS_ENABLE"' | sort)
want=$'0/3/256/0/0\n1/3/256/1/0\n2/3/256/2/0'
[[ $out == "$want" ]] || { echo "unexpected rank environments:"; echo "$out"; exit 1; }
# With CUDA_VISIBLE_DEVICES set, rank r gets its r-th entry, and never a GPU it does not list.
out=$(CUDA_VISIBLE_DEVICES=4,5 "$launch" -n 2 -- bash -c 'echo "$MOK_RANK/$CUDA_VISIBLE_DEVICES"' | sort)
[[ $out == $'0/4\n1/5' ]] || { echo "CUDA_VISIBLE_DEVICES=4,5: unexpected rank GPUs:"; echo "$out"; exit 1; }
for list in "4,5" ""; do
  msg=$(CUDA_VISIBLE_DEVICES=$list "$launch" -n 3 -- true 2>&1)
  code=$?
  [[ $code == 2 && $msg == *"CUDA_VISIBLE_DEVICES"* ]] ||
    { echo "CUDA_VISIBLE_DEVICES='$list' -n 3: expected exit 2 naming CUDA_VISIBLE_DEVICES, got $code: $msg"; exit 1; }
done
msg=$("$launch" -n 2 -- bash -c 'exit $((MOK_RANK == 1 ? 7 : 0))' 2>&1)
code=$?
[[ $code == 7 ]] || { echo "expected exit 7 from the failing rank, got $code"; exit 1; }
[[ $msg == *"rank 1 exited with 7"* ]] || { echo "the failure message does not name rank 1: $msg"; exit 1; }
"$launch" -n 1 --timeout 1 -- sleep 30
code=$?
[[ $code == 124 ]] || { echo "expected 124 on timeout, got $code"; exit 1; }
# A signal to the launcher reaches every rank: none is left running after it (each rank writes
# its pid, the launcher gets SIGTERM, then no pid may still exist). The directory reaches the
# ranks through the environment, so a path with spaces stays one word.
dir=$(mktemp -d)
RANK_DIR=$dir "$launch" -n 2 -- bash -c 'echo $$ > "$RANK_DIR/rank$MOK_RANK"; exec sleep 30' &
lpid=$!
for _ in $(seq 100); do [[ -s $dir/rank0 && -s $dir/rank1 ]] && break; sleep 0.05; done
for f in "$dir"/rank0 "$dir"/rank1; do
  [[ -s $f ]] || { echo "rank pid file $f never appeared"; kill -9 "$lpid"; exit 1; }
done
kill -TERM "$lpid"
wait "$lpid"
code=$?
[[ $code == 143 ]] || { echo "expected 128+15 after SIGTERM, got $code"; exit 1; }
for f in "$dir"/rank0 "$dir"/rank1; do
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then echo "rank pid $pid outlived the launcher"; kill -9 "$pid"; exit 1; fi
done
rm -rf "$dir"
for bad in -1 nan; do
  "$launch" -n 1 --timeout "$bad" -- true 2>/dev/null
  code=$?
  [[ $code == 2 ]] || { echo "--timeout $bad: expected exit 2, got $code"; exit 1; }
done
echo "mok-launch: environments, GPU lists, failure propagation, timeout, signals and bad timeouts OK"
