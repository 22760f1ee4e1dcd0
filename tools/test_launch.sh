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
echo "mok-launch: environments, failure propagation and timeout OK"
