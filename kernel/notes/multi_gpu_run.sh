#!/bin/bash
# Prepared in the twenty-third session (2026-12-05), not yet run (no machine with several GPUs has
# been lent so far): the first calls on nvidia-h200-x2, -x4 or -x8, for issue 6. Two stages, one
# device call each (each under ten minutes on eight GPUs, estimated from single-GPU logs):
#   STAGE=checks  every output at physical R = 2, 4, 8 (as many as there are GPUs) equals the golden
#                 files bit for bit, with one thread per GPU and with one process per GPU
#                 (mok-launch), and the determinism matrix across physical ranks;
#   STAGE=bench   layer times with one rank per GPU against the same R on one GPU (virtual ranks),
#                 qwen3 and dsv3, uniform and zipf:1.2 routing.
# Build here first (Release, sm_90a), as kernel/notes/grid_constant_params_run.sh's header says for
# gpu-run/binM, and add the launcher and the golden writer:
#   ninja -C build-gpu mok-bench mok-verify mok-launch mok-golden test_kernel
#   cp build-gpu/tools/{mok-bench,mok-launch,mok-golden,mok-gpu-probe} build-gpu/verify/mok-verify build-gpu/kernel/test/test_kernel gpu-run/binM/
#   ../shared/tools/gpu-pack gpu-run; rm -f gpu-run/.libs/libcublas*
# Device call (carry ["gpu-run"]; kind nvidia-h200-x8, or x4 / x2):
#   source gpu-run/gpu-env.sh; export PATH=$PATH:/usr/local/cuda/bin LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
#   STAGE=checks bash kernel/notes/multi_gpu_run.sh 2>&1 | tee $OUT/multi_checks.txt
# NVLink multicast stays off (the machines have it off; NCCL_NVLS_ENABLE=0 below as well).
# STAGE=bench also runs mok-gpu-probe --peer 1: the per-SM NVLink parameters the simulator assumes
# (remote store window and load rate; simulator/VALIDATION.md says the MoK comparison turns on them).
# The dispatch and combine times per rank come from the kernel's per-block trace (mok-bench --trace,
# with --transport nccl since the thirty-second session: one table per rank, marks "gathering done"
# for the dispatch and "reduction starts" for the last combine arrival, from each GPU's own clock);
# the trace files land in $OUT/trace_*.txt. Achieved NVLink bandwidth = the rows a rank gathers
# (routing) x H x 2 bytes over its gathering span; that arithmetic is left to the reader of the logs.
set -u
BIN=${BIN:-gpu-run/binM}
OUT=${OUT:-/tmp/multi}
STAGE=${STAGE:-checks}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "=== $(date -u +%T) $N GPUs; stage $STAGE; binaries $BIN"
if [[ $N -lt 2 ]]; then
  echo "needs two or more GPUs (nvidia-smi lists $N); nothing run"
  exit 3
fi
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
RANKS=()
for r in 2 4 8; do [[ $r -le $N ]] && RANKS+=("$r"); done
case $STAGE in
checks)
  # Goldens with their R (fixtures/recipes.txt; the machine has no h5dump to read it): tiny (2),
  # small (4), and with eight GPUs an R = 8 one written here (14 MB, 2 s of CPU; kept off $OUT).
  FILES=(fixtures/tiny-uniform.h5:2 fixtures/tiny-noshared-hot.h5:2 fixtures/small-zipf.h5:4)
  if [[ $N -ge 8 ]]; then
    "$BIN/mok-golden" --preset small --R 8 --E 32 --T 32 --routing zipf:1.2 --empty-slots 0.05 --seed 9 \
      -o /tmp/small-r8.h5 2>&1 | tail -1
    FILES+=(/tmp/small-r8.h5:8)
  fi
  for entry in "${FILES[@]}"; do
    f=${entry%:*} R=${entry##*:}
    [[ $R -le $N ]] || continue
    echo "--- $(date -u +%T) $f (R = $R): one thread per GPU, then one process per GPU"
    "$BIN/mok-verify" run "$f" --backend cuda --transport nccl 2>&1 | tail -2
    "$BIN/mok-launch" -n "$R" -- "$BIN/mok-verify" run "$f" --backend cuda --transport nccl 2>&1 | tail -2
  done
  echo "--- $(date -u +%T) determinism across physical ranks (configurations above $N ranks are skipped)"
  "$BIN/mok-verify" determinism fixtures/small-zipf.h5 --runs 5 --ranks 1,2,4,8 --comm-sms 1,2 \
    --minibatch 128,64 --transport nccl 2>&1 | tail -4
  echo "--- $(date -u +%T) the same matrix on one GPU (virtual ranks), for the hashes"
  "$BIN/mok-verify" determinism fixtures/small-zipf.h5 --runs 2 --ranks 1,2,4,8 --comm-sms 1,2 \
    --minibatch 128,64 2>&1 | tail -2
  ;;
bench)
  A="--reps 10 --warmup 3 --no-baseline --sustain-ms 0"
  for c in qwen3 dsv3; do
    for routing in uniform zipf:1.2; do
      for R in "${RANKS[@]}"; do
        echo "--- $(date -u +%T) $c $routing R=$R: one rank per GPU, then R virtual ranks on one GPU"
        "$BIN/mok-bench" --case "$c" --routing "$routing" --R "$R" --transport nccl $A 2>&1 |
          grep -E "transport|SLOWEST|fused (forward|backward)|rror"
        "$BIN/mok-bench" --case "$c" --routing "$routing" --R "$R" $A 2>&1 | grep -E "fused (forward|backward)|rror"
      done
    done
  done
  echo "--- $(date -u +%T) NVLink parameters of the simulator (mok-gpu-probe --peer 1, added in the twenty-seventh session):"
  echo "    one SM's remote load / store rate against bytes in flight, every SM pushing and pulling, the flag hand-off"
  "$BIN/mok-gpu-probe" --peer 1 --reps 3 --mib 256 2>&1 | tee "$OUT/gpu_probe_peer.txt"
  "$BIN/mok-gpu-probe" --peer 1 --reps 3 --mib 256 --json > "$OUT/gpu_probe_peer.json" 2>&1
  R=${RANKS[-1]}
  for c in qwen3 dsv3; do
    for routing in uniform zipf:1.2; do
      echo "--- $(date -u +%T) $c $routing R=$R traced (one table per rank in $OUT/trace_${c}_${routing/:/-}.txt)"
      "$BIN/mok-bench" --case "$c" --routing "$routing" --R "$R" --transport nccl --reps 3 --warmup 1 --no-baseline \
        --sustain-ms 0 --trace > "$OUT/trace_${c}_${routing/:/-}.txt" 2>&1
      grep -E "^# trace|gathering done|reduction starts|rror" "$OUT/trace_${c}_${routing/:/-}.txt" | head -n 40
    done
  done
  echo "--- $(date -u +%T) qwen3 uniform R=$R as one process per GPU (mok-launch)"
  "$BIN/mok-launch" -n "$R" -- "$BIN/mok-bench" --case qwen3 --R "$R" --transport nccl $A 2>&1 |
    grep -E "transport|SLOWEST|fused (forward|backward)|rror"
  ;;
*)
  echo "STAGE must be checks or bench, not '$STAGE'"
  exit 2
  ;;
esac
echo "=== $(date -u +%T) done"
