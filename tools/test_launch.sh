#!/usr/bin/env bash
# test_launch.sh MOK_LAUNCH: mok-launch gives every rank its environment (its GPU from the
# launcher's CUDA_VISIBLE_DEVICES, or r when unset), refuses more ranks than listed GPUs and lists
# with a repeated, empty or invalid entry, and propagates failures, timeouts and signals; a rank
# that ignores the SIGTERM after another's failure is killed, with the processes it started.
set -u
launch=$1
unset CUDA_VISIBLE_DEVICES  # the caller's list (a CI runner's) must not change what is expected
out=$("$launch" -n 3 -- bash -c 'echo "$MOK_RANK/$MOK_WORLD_SIZE/${#MOK_NCCL_ID}/$CUDA_VISIBLE_DEVICES/$NCCL_NVLS_ENABLE"' | sort)
want=$'0/3/256/0/0\n1/3/256/1/0\n2/3/256/2/0'
[[ $out == "$want" ]] || { echo "unexpected rank environments:"; echo "$out"; exit 1; }
# On a machine with one or two GPUs, -n 3 names the ranks that will find none (a note: it still runs).
ngpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
if [[ $ngpu -ge 1 && $ngpu -lt 3 ]]; then
  msg=$("$launch" -n 3 -- true 2>&1)
  code=$?
  [[ $code == 0 && $msg == *"note: -n 3 gives rank r GPU r (0..2), but this machine has $ngpu CUDA device(s)"* ]] ||
    { echo "-n 3 on $ngpu GPU(s): expected exit 0 and a note naming the missing GPUs, got $code: $msg"; exit 1; }
fi
# Without any GPU (no driver, as in CI) the note says so rather than nothing.
if [[ $ngpu == 0 ]]; then
  msg=$("$launch" -n 2 -- true 2>&1)
  code=$?
  [[ $code == 0 && $msg == *"note: this machine has no usable CUDA device"* ]] ||
    { echo "-n 2 without a GPU: expected exit 0 and a note, got $code: $msg"; exit 1; }
fi
# With CUDA_VISIBLE_DEVICES set, rank r gets its r-th entry, and never a GPU it does not list.
out=$(CUDA_VISIBLE_DEVICES=4,5 "$launch" -n 2 -- bash -c 'echo "$MOK_RANK/$CUDA_VISIBLE_DEVICES"' | sort)
[[ $out == $'0/4\n1/5' ]] || { echo "CUDA_VISIBLE_DEVICES=4,5: unexpected rank GPUs:"; echo "$out"; exit 1; }
for list in "4,5" ""; do
  msg=$(CUDA_VISIBLE_DEVICES=$list "$launch" -n 3 -- true 2>&1)
  code=$?
  [[ $code == 2 && $msg == *"CUDA_VISIBLE_DEVICES"* ]] ||
    { echo "CUDA_VISIBLE_DEVICES='$list' -n 3: expected exit 2 naming CUDA_VISIBLE_DEVICES, got $code: $msg"; exit 1; }
done
for list in 0,0 0,,1 -1; do
  msg=$(CUDA_VISIBLE_DEVICES=$list "$launch" -n 1 -- true 2>&1)
  code=$?
  [[ $code == 2 && $msg == *"CUDA_VISIBLE_DEVICES='$list' has "* ]] ||
    { echo "CUDA_VISIBLE_DEVICES='$list': expected exit 2 naming the list and its bad entry, got $code: $msg"; exit 1; }
done
# An unknown option before -- is named alone (not with the command after --).
# Every spelling of the launcher's own options is read past, values attached or not.
for pre in "-n 2" "-n2" "--np=2" "--np 2 --timeout 30" "-n 2 --timeout=30 --kill-after 2" "-n2 --kill-after=2"; do
  # shellcheck disable=SC2086
  msg=$("$launch" $pre --bogus -- true 2>&1)
  code=$?
  [[ $code == 2 && $msg == *"not expected: --bogus"$'\n'* ]] ||
    { echo "$pre --bogus -- true: expected exit 2 naming --bogus, got $code: $msg"; exit 1; }
done
msg=$("$launch" -n 2 -x -- true 2>&1)
[[ $? == 2 && $msg == *"not expected: -x"$'\n'* ]] || { echo "-n 2 -x -- true: expected exit 2 naming -x: $msg"; exit 1; }
msg=$("$launch" -n 2 -- bash -c 'exit $((MOK_RANK == 1 ? 7 : 0))' 2>&1)
code=$?
[[ $code == 7 ]] || { echo "expected exit 7 from the failing rank, got $code"; exit 1; }
[[ $msg == *"rank 1 exited with 7"* ]] || { echo "the failure message does not name rank 1: $msg"; exit 1; }
# A failed rank stops the others; one that ignores SIGTERM is killed --kill-after seconds later,
# with its whole process group (the sleep it started in the background too).
dir=$(mktemp -d)
alive() { local st; st=$(awk '{ print $3 }' "/proc/$1/stat" 2> /dev/null) && [[ -n $st && $st != Z ]]; }
start=$SECONDS
RANK_DIR=$dir timeout 20 "$launch" -n 2 --kill-after 1 -- sh -c 'if [ "$MOK_RANK" = 0 ]; then sleep 1; exit 5; fi
  trap "" TERM; sleep 30 & echo $! > "$RANK_DIR/child"; wait' > /dev/null 2> "$dir/err"
code=$?
elapsed=$((SECONDS - start))
child=$(cat "$dir/child" 2> /dev/null)
for _ in $(seq 40); do [[ -n $child ]] && alive "$child" || break; sleep 0.05; done  # a moment to be reaped
if [[ -n $child ]] && alive "$child"; then kill -9 "$child"; echo "the sleep a rank started outlived the launcher"; exit 1; fi
[[ $code == 5 && $elapsed -le 8 ]] ||
  { echo "a failed rank, a peer ignoring SIGTERM: expected exit 5 within 8 s, got $code after $elapsed s: $(cat "$dir/err")"; exit 1; }
grep -q "killing them" "$dir/err" || { echo "the kill after SIGTERM is not reported: $(cat "$dir/err")"; exit 1; }
rm -rf "$dir"
"$launch" -n 1 --timeout 1 -- sleep 30
code=$?
[[ $code == 124 ]] || { echo "expected 124 on timeout, got $code"; exit 1; }
# A timeout sends SIGTERM first, so that a rank can clean up (it was SIGKILL at once).
dir=$(mktemp -d)
RANK_DIR=$dir "$launch" -n 1 --timeout 1 -- bash -c 'trap "echo cleaned > \"\$RANK_DIR/c\"; exit 1" TERM; sleep 30 & wait' \
  2> /dev/null
code=$?
[[ $code == 124 && -s $dir/c ]] || { echo "timeout: expected 124 and the rank's SIGTERM clean-up, got $code"; exit 1; }
rm -rf "$dir"
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
  for opt in --timeout --kill-after; do
    "$launch" -n 1 "$opt" "$bad" -- true 2>/dev/null
    code=$?
    [[ $code == 2 ]] || { echo "$opt $bad: expected exit 2, got $code"; exit 1; }
  done
done
echo "mok-launch: environments, GPU lists, failure propagation and escalation, timeout, signals and bad times OK"
