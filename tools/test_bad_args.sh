#!/usr/bin/env bash
# test_bad_args.sh "PROGRAM:[SUBCOMMAND ]VALUE_OPTION" ...: the command-line convention
# (mok::cli::parse) on each program: an unknown option and a malformed value for VALUE_OPTION
# exit 2 with a message naming the option, and --help exits 0. None of it touches a GPU or
# writes a file.
# With MOK_BENCH=PATH (and MOK_BENCH_NCCL=ON or OFF: whether that build has NCCL), also
# mok-bench's --transport: a bad value, nccl with --trace, nccl in a build without NCCL and
# nccl with more ranks than GPUs exit 2 naming the fix (without a GPU the last exits 3, no GPU).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/expect_exit.sh"
for spec in "$@"; do
  prog=${spec%%:*}
  read -ra words <<< "${spec#*:}"  # [subcommand] option
  expect_exit "$prog" 2 "Run with --help" --no-such-option
  expect_exit "$prog" 2 "${words[-1]}" "${words[@]}" not-a-number
  expect_exit "$prog" 0 "Usage" --help
done
if [[ -n ${MOK_BENCH:-} ]]; then
  expect_exit "$MOK_BENCH" 2 "--transport" --transport bogus
  expect_exit "$MOK_BENCH" 2 "--trace" --transport nccl --trace
  if [[ ${MOK_BENCH_NCCL:-OFF} != ON ]]; then
    expect_exit "$MOK_BENCH" 3 "this build has no NCCL" --transport nccl --preset tiny --R 1
  elif [[ ${CUDA_VISIBLE_DEVICES-all} != "" ]] && command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    expect_exit "$MOK_BENCH" 2 "lower --R" --transport nccl --preset tiny --R 4096
  else
    expect_exit "$MOK_BENCH" 3 "CUDA device" --transport nccl --preset tiny --R 4096
  fi
fi
[[ $expect_failed == 0 ]] && echo "bad-argument exit codes OK for $#${MOK_BENCH:+ and mok-bench --transport}"
exit $expect_failed
