#!/usr/bin/env bash
# test_bad_args.sh "PROGRAM:[SUBCOMMAND ]VALUE_OPTION" ...: the command-line convention
# (mok::cli::parse) on each program: an unknown option and a malformed value for VALUE_OPTION
# exit 2 with a message naming the option, and --help exits 0. None of it writes a file.
# With MOK_GOLDEN=PATH, also mok-golden's own refusals (exit 2, one line, no file left): -o -, a
# write past ulimit -f or into a folder it may not write, and a layer too large for ulimit -v.
# With MOK_BENCH=PATH (and MOK_BENCH_NCCL=ON or OFF: whether that build has NCCL), also
# mok-bench's --transport: a bad value exits 2 (as do a bad --gather, --x-rows,
# --swiglu, --fwd-comm-sms, --group-rows, --passes, --timing (and queued with nccl) or --case, a --case with a preset or with an --R that does
# not divide its tokens or is below 1, and a --sustain-ms below 100 other than 0; --show-config prints the
# cases' layers with overrides and exits 0, also for nccl with --trace, or 2 for an invalid layer or routing), nccl in
# a build without NCCL
# exits 3 (environment missing), and nccl with more ranks than GPUs exits 2 naming the fix where
# a GPU is usable, 3 naming the missing GPU where none is (this last case initialises CUDA).
# Also checked before the GPU (exit 2, the option named): block counts the kernel would refuse,
# an empty --file, an unknown --preset, a missing --python or MOK_TORCH_BASELINE, a --torch that
# is a directory, sizes whose product overflows; --help lists the presets (mok-refbench's too),
# and a report that cannot be written (/dev/full, or a pipe whose reader has gone) exits 2. With
# MOK_BENCH_ATOMICS=PATH, that program calls itself mok-bench-atomics and exits 2 into a closed
# pipe; with MOK_REFBENCH=PATH, its report to /dev/full or a closed pipe exits 2.
# The PyTorch script's ranges and help, and mok-setup --help to /dev/full, are checked too.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/expect_exit.sh"
for spec in "$@"; do
  prog=${spec%%:*}
  read -ra words <<< "${spec#*:}"  # [subcommand] option
  expect_exit "$prog" 2 "Run with --help" --no-such-option
  expect_exit "$prog" 2 "${words[-1]}" "${words[@]}" not-a-number
  expect_exit "$prog" 0 "Usage" --help
done
if [[ -n ${MOK_GOLDEN:-} ]]; then
  # mok-golden: stored end-to-end bounds and bound terms need the oracle, so --no-bounds excludes them;
  # nothing written.
  out_h5=$(mktemp -u "${TMPDIR:-/tmp}/mok-bad-args-XXXXXX.h5")
  expect_exit "$MOK_GOLDEN" 2 "excludes" --no-bounds --end-to-end-bounds -o "$out_h5"
  expect_exit "$MOK_GOLDEN" 2 "excludes" --no-bounds --bound-terms -o "$out_h5"
  # Routing values out of range name the value and the range; more hot experts than the layer has
  # is refused before the run's header line (nothing else printed), naming E.
  expect_exit "$MOK_GOLDEN" 2 "is -1; it must be in (0, 8]" --preset tiny --routing zipf:-1 -o "$out_h5"
  expect_exit "$MOK_GOLDEN" 2 "factor F in [1, 1e12]" --preset tiny --routing hot:2:-1 -o "$out_h5"
  expect_exit "$MOK_GOLDEN" 2 "factor F in [1, 1e12]" --preset tiny --routing hot:8:1e308 -o "$out_h5"
  # A layer rule broken names the layer asked for; --help's ranges are the real limits.
  expect_exit "$MOK_GOLDEN" 2 "divisible by config.R (ranks): experts are placed in equal contiguous blocks (the layer asked for: H=64 I=32 Is=32 E=3 K=2 R=2 T=8" --preset tiny --E 3 -o "$out_h5"
  expect_exit "$MOK_GOLDEN" 0 "--K INT:INT in [1 - 64]" --help
  expect_exit "$MOK_GOLDEN" 0 "mok-golden: writing $out_h5 (54 datasets, " --preset tiny -o "$out_h5"  # before the write
  rm -f "$out_h5"
  # A memory estimate past 2^64 bytes is printed as such (the cast to uint64_t said "0 bytes").
  expect_exit "$MOK_GOLDEN" 2 "needs at least 1.15e+13 GiB of memory" --E 1048576 --H 16777216 --I 16777216 --R 1 \
    --K 1 --Is 0 -o "$out_h5"
  expect_exit "$MOK_GOLDEN" 2 "'abc' is not a number" --preset tiny --routing zipf:abc -o "$out_h5"
  msg=$("$MOK_GOLDEN" --preset tiny --E 8 --routing hot:9 -o "$out_h5" 2>&1)
  code=$?
  if [[ $code != 2 || $msg != *"9 hot experts but the layer has E = 8"* || $(wc -l <<< "$msg") != 1 ]]; then
    echo "mok-golden --routing hot:9 with E = 8: expected exit 2 and one line naming E, got $code: $msg"; expect_failed=1
  fi
  [[ -e $out_h5 ]] && { echo "mok-golden wrote $out_h5 on a usage error"; expect_failed=1; rm -f "$out_h5"; }
  # Standard output is no HDF5 file: refused, and no file named '-' appears (found by audit, 2026-12).
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/mok-bad-args-XXXXXX")
  (cd "$scratch" && expect_exit "$MOK_GOLDEN" 2 "-o -: an HDF5 file needs a file it can seek in" --preset tiny -o - &&
     [[ $expect_failed == 0 ]]) || expect_failed=1
  [[ -e $scratch/- ]] && { echo "mok-golden -o - wrote a file named '-'"; expect_failed=1; }
  # A write the system refuses is one line naming the file, the system's reason and the fix, and
  # leaves no file, temporary or not (found by audit, 2026-12: HDF5's text over two lines). Past
  # a file-size limit (ulimit -f, in KiB):
  # What is left of mok-golden's stderr without its progress lines (the layer, the timings).
  past_progress() { grep -vE '^mok-golden: ([a-z0-9-]+ H=[0-9]+ |emulated forward|oracle bounds in |writing )' <<< "$1"; }
  msg=$( (ulimit -f 100; "$MOK_GOLDEN" --preset small -o "$scratch/limited.h5") 2>&1)
  code=$?
  msg=$(past_progress "$msg")
  if [[ $code != 2 || $msg == *$'\n'* ||
        $msg != "mok-golden: $scratch/limited.h5: cannot write the file: File too large"*"raise the limit"* ]]; then
    echo "mok-golden past ulimit -f: expected exit 2 naming the file, the reason and the fix, got $code: $msg"; expect_failed=1
  fi
  leftovers=$(ls -A "$scratch")
  [[ -n $leftovers ]] && { echo "mok-golden left files behind: $leftovers"; expect_failed=1; }
  # Where it may not create files (root passes the up-front check and HDF5 meets EACCES).
  if [[ -d /sys ]]; then
    msg=$("$MOK_GOLDEN" --preset tiny -o /sys/mok-bad-args.h5 2>&1)
    code=$?
    msg=$(past_progress "$msg")
    if [[ $code != 2 || $msg == *$'\n'* || $msg != "mok-golden: /sys/mok-bad-args.h5: "*"a directory you can write to"* ]]; then
      echo "mok-golden -o /sys/...: expected exit 2 and one line naming the file and the fix, got $code: $msg"; expect_failed=1
    fi
  fi
  # A layer too large for the memory here (ulimit -v, in KiB) is refused before any work, with the
  # fix (found by audit, 2026-12: a bare "cannot allocate" from deep inside).
  msg=$( (ulimit -v 2000000; "$MOK_GOLDEN" --preset tiny --H 16384 --I 16384 -o "$scratch/huge.h5") 2>&1)
  code=$?
  if [[ $code != 2 || $msg != *"needs at least 84.0 GiB of memory"*"lower --H, --I, --Is, --E or --T"* || $(wc -l <<< "$msg") != 1 ]]; then
    echo "mok-golden --H 16384 --I 16384 under ulimit -v: expected exit 2 and one line with the fix, got $code: $msg"
    expect_failed=1
  fi
  rm -rf "$scratch"
fi
# The PyTorch baseline script checks its arguments before importing torch (exit 2, no GPU needed).
torch_script=$(dirname "${BASH_SOURCE[0]}")/moe_torch_baseline.py
if command -v python3 > /dev/null; then
  expect_exit python3 2 "--routing must be uniform or zipf:S" "$torch_script" --routing zipf:abc
  expect_exit python3 2 "--routing must be uniform or zipf:S" "$torch_script" --routing zipf:-1
  expect_exit python3 2 "--reps must be at least 1" "$torch_script" --reps 0
  expect_exit python3 2 "--Is must be from 0" "$torch_script" --Is -1
  expect_exit python3 2 "--H must be from 1 to 16777216" "$torch_script" --H 1000000000000000000000000000000
  expect_exit python3 2 "--seed must be from 0 to 2^64 - 1" "$torch_script" --seed 18446744073709551616
  expect_exit python3 2 "--seed must be from 0 to 2^64 - 1" "$torch_script" --seed -1
  expect_exit python3 2 "--K must be at most --E" "$torch_script" --K 9 --E 8
  expect_exit python3 0 "hidden size, 1 to 16777216" "$torch_script" --help
  expect_unwritable python3 "$torch_script" --help
fi
expect_unwritable "$(dirname "${BASH_SOURCE[0]}")/mok-setup" --help
if [[ -n ${MOK_REFBENCH:-} ]]; then
  expect_exit "$MOK_REFBENCH" 0 "tiny, small, dsv3-mini, qwen3-mini" --help
  # Its progress (a line per stage, on stderr) is not part of the failure's one line.
  refbench_progress='^mok-refbench: (tiny, [0-9]+ repetitions|[a-z +()-]+: median )'
  progress_lines=$refbench_progress expect_unwritable "$MOK_REFBENCH" --preset tiny -r 1
  progress_lines=$refbench_progress expect_closed_pipe "$MOK_REFBENCH" --preset tiny -r 1
  expect_exit "$MOK_REFBENCH" 0 "mok-refbench: end-to-end oracle: median" --preset tiny -r 1  # a line per stage
fi
if [[ -n ${MOK_BENCH_ATOMICS:-} ]]; then
  expect_exit "$MOK_BENCH_ATOMICS" 0 "mok-bench-atomics: time the fused" --help
  expect_exit "$MOK_BENCH_ATOMICS" 2 "mok-bench-atomics: --blocks-per-rank 1" --blocks-per-rank 1
  expect_closed_pipe "$MOK_BENCH_ATOMICS" --show-config  # its own main ignores SIGPIPE too
fi
if [[ -n ${MOK_BENCH:-} ]]; then
  expect_exit "$MOK_BENCH" 2 "--transport" --transport bogus
  expect_exit "$MOK_BENCH" 2 "--gather" --gather sideways
  expect_exit "$MOK_BENCH" 2 "--swiglu" --swiglu sideways
  expect_exit "$MOK_BENCH" 2 "--fwd-comm-sms" --fwd-comm-sms many
  expect_exit "$MOK_BENCH" 2 "--group-rows" --group-rows 0
  expect_exit "$MOK_BENCH" 2 "--gather-stores" --gather-stores 5
  expect_exit "$MOK_BENCH" 2 "--gather-batch" --gather-batch 0
  expect_exit "$MOK_BENCH" 2 "--x-rows" --x-rows sideways
  expect_exit "$MOK_BENCH" 2 "--group-rows" --group-rows 65
  expect_exit "$MOK_BENCH" 2 "--passes" --passes backward
  expect_exit "$MOK_BENCH" 2 "--timing" --timing never_mind
  expect_exit "$MOK_BENCH" 2 "times the virtual transport only" --case qwen3 --timing queued --transport nccl
  expect_exit "$MOK_BENCH" 2 "--sustain-ms" --sustain-ms -5
  expect_exit "$MOK_BENCH" 2 "--sustain-ms" --sustain-ms 50
  expect_exit "$MOK_BENCH" 2 "--case" --case dsv4
  expect_exit "$MOK_BENCH" 2 "--case" --case dsv3 --preset tiny
  expect_exit "$MOK_BENCH" 2 "--case" --case dsv3 --file any.h5
  expect_exit "$MOK_BENCH" 2 "not in range 1" --case dsv3 --R -8
  expect_exit "$MOK_BENCH" 2 "does not divide" --case dsv3 --R 3
  # --show-config resolves the layer without a GPU: the cases, R splitting the tokens, overrides.
  expect_exit "$MOK_BENCH" 0 "H=7168 I=2048 Is=2048 E=32 K=8 R=8 T=1024 (G=8192" --case dsv3 --R 8 --show-config
  expect_exit "$MOK_BENCH" 0 "H=2048 I=768 Is=0 E=128 K=8 R=1 T=16384" --case qwen3 --show-config
  expect_exit "$MOK_BENCH" 0 "E=32 K=8 R=1 T=256 (G=256" --case small --show-config
  expect_exit "$MOK_BENCH" 0 "R=8 T=300 (G=2400" --case dsv3 --R 8 --T 300 --show-config
  expect_exit "$MOK_BENCH" 2 "divisible" --case dsv3 --R 8 --E 30 --show-config
  expect_exit "$MOK_BENCH" 0 "H=4096 I=1024 Is=0 E=32 K=8 R=1 T=8192" --case dsv3 --H 4096 --I 1024 --Is 0 --show-config
  expect_exit "$MOK_BENCH" 2 "routing" --case dsv3 --routing sideways --show-config
  expect_exit "$MOK_BENCH" 0 "R=1 T=8192" --case dsv3 --transport nccl --trace --show-config
  # Usage is checked before the GPU: exit 2 on any machine (found by review, 2026-12-05).
  expect_exit "$MOK_BENCH" 2 "not a valid layer" --H 24
  # A layer whose inputs cannot fit in host memory: exit 2 before the GPU (it said 3 without one).
  expect_exit "$MOK_BENCH" 2 "of host memory for its inputs alone" --H 16777216 --I 16777216 --E 1048576 --R 1 --K 1 \
    --T 1 --show-config
  expect_exit "$MOK_BENCH" 2 "--H: Value 15 not in range 16 to 16777216" --H 15  # --help's ranges are the real ones
  expect_exit "$MOK_BENCH" 2 "unknown routing" --routing bogus
  expect_exit "$MOK_BENCH" 2 "no such file" --file /nonexistent/golden.h5
  expect_exit "$MOK_BENCH" 2 "--torch" --torch /nonexistent/baseline.py
  expect_exit "$MOK_BENCH" 2 "not in range" --case dsv3 --R 0 --show-config
  expect_exit "$MOK_BENCH" 2 "excludes" --file fixtures/tiny-uniform.h5 --H 256 --show-config
  expect_exit "$MOK_BENCH" 2 "hot experts but the layer has 64" --routing hot:100 --show-config
  src_h5=$(dirname "${BASH_SOURCE[0]}")/../fixtures/tiny-uniform.h5
  # Block counts the kernel refuses (kernel/include/mok/kernel/block_counts.hpp), checked from the options (found by audit,
  # 2026-12: they reached the GPU check, and --show-config took them).
  expect_exit "$MOK_BENCH" 2 "--blocks-per-rank 1: each rank needs at least 2 blocks" --blocks-per-rank 1
  expect_exit "$MOK_BENCH" 2 "--blocks-per-rank 1: each rank needs at least 2 blocks" --blocks-per-rank 1 --show-config
  expect_exit "$MOK_BENCH" 2 "--comm-sms 100 with --blocks-per-rank 10" --comm-sms 100 --blocks-per-rank 10
  expect_exit "$MOK_BENCH" 2 "--fwd-comm-sms 100 with --blocks-per-rank 10" --fwd-comm-sms 100 --blocks-per-rank 10 --show-config
  expect_exit "$MOK_BENCH" 0 "R=8 T=64" --blocks-per-rank 10 --comm-sms 9 --fwd-comm-sms 9 --show-config
  expect_exit "$MOK_BENCH" 2 "--file is empty" --file ''
  expect_exit "$MOK_BENCH" 2 "--preset" --preset bogus --file "$src_h5" --show-config
  expect_exit "$MOK_BENCH" 0 "tiny, small, dsv3-mini, qwen3-mini" --help
  # The PyTorch baseline's interpreter and script, before the GPU; a directory is no script.
  expect_exit "$MOK_BENCH" 2 "--python '/nonexistent/python': no such file" --python /nonexistent/python
  expect_exit "$MOK_BENCH" 2 "--python '': is empty" --python ''
  expect_exit "$MOK_BENCH" 2 "--torch /tmp: is a directory" --torch /tmp
  MOK_TORCH_BASELINE=/nonexistent/baseline.py expect_exit "$MOK_BENCH" 2 "MOK_TORCH_BASELINE=/nonexistent/baseline.py: no such file"
  # Sizes past the spec's limits are refused by their ranges (mok::cli::layer_size_range), before
  # any product of them is formed (R * T past 2^63 once wrapped to G=0).
  out=$("$MOK_BENCH" --T 1099511627776 --show-config 2>&1)
  code=$?
  if [[ $code != 2 || $out != *"--T: Value 1099511627776 not in range 1 to 16777216"* ]]; then
    echo "mok-bench with --T past 2^24: expected exit 2 naming --T's range, got $code: $out"; expect_failed=1
  fi
  expect_unwritable "$MOK_BENCH" --show-config
  expect_closed_pipe "$MOK_BENCH" --show-config
  # A golden of another numerics profile is "not supported here" (3), as in mok-verify and mok-sim.
  if python3 -c 'import h5py' 2> /dev/null; then
    other_h5=$(mktemp -u "${TMPDIR:-/tmp}/mok-bad-args-XXXXXX.h5")
    cp "$src_h5" "$other_h5"
    python3 -c 'import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["profile"] = np.bytes_(b"bf16-v9"); f["config"].attrs["profile"] = np.bytes_(b"bf16-v9")' "$other_h5"
    expect_exit "$MOK_BENCH" 3 "bf16-v9" --file "$other_h5" --show-config
    rm -f "$other_h5"
  fi
  if [[ ${MOK_BENCH_NCCL:-OFF} != ON ]]; then
    expect_exit "$MOK_BENCH" 3 "this build has no NCCL" --transport nccl --preset tiny --R 1
  else
    # A valid layer with more ranks than any machine has GPUs (an invalid one is refused earlier).
    out=$("$MOK_BENCH" --transport nccl --preset tiny --R 64 --E 64 2>&1)
    code=$?
    if ! { [[ $code == 2 && $out == *"lower --R"* ]] || [[ $code == 3 && $out == *CUDA* ]]; }; then
      echo "mok-bench --transport nccl --R 64 --E 64: exit $code, expected 2 naming --R (or 3 naming CUDA without a usable GPU)"
      echo "$out" | head -5
      expect_failed=1
    fi
  fi
fi
[[ $expect_failed == 0 ]] && echo "bad-argument exit codes OK for $#${MOK_BENCH:+ and mok-bench --transport}"
exit $expect_failed
