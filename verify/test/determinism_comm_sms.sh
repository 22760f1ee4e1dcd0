#!/usr/bin/env bash
# A --comm-sms above what a rank's blocks allow is refused before any configuration runs (exit 2,
# naming the flag, R and the blocks a rank has), not when its configuration's turn comes.
# Usage: determinism_comm_sms.sh MOK_VERIFY FIXTURE. Exit 77 (skip) where there is no GPU (exit 3).
set -u
verify=$1 fixture=$2
out=$("$verify" determinism "$fixture" --runs 1 --ranks 1,2 --comm-sms 1,4000 2>&1)
code=$?
[[ $code == 3 ]] && { echo "no GPU or no CUDA kernel here: $out" | head -2; exit 77; }
fail=0
[[ $code == 2 ]] || { echo "exit $code, expected 2"; fail=1; }
[[ $out == *"--comm-sms 4000 at R=1 each rank has "*" blocks on this GPU"*"--comm-sms takes 1.."* ]] ||
  { echo "the message does not name --comm-sms 4000, R and the blocks a rank has"; fail=1; }
[[ $out == *"run 1 of"* ]] && { echo "a configuration ran before the refusal"; fail=1; }
[[ $fail == 0 ]] || echo "$out" | head -5
exit $fail
