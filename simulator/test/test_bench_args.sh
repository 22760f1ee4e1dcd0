#!/usr/bin/env bash
# test_bench_args.sh MOK_SIM_BENCH: mok-sim-bench's command line and output convention without
# running a layer: --help exits 0 and lists the cases; a malformed number, an extra argument or an
# unknown case exits 2 naming it; help that cannot be written (/dev/full, or a pipe whose reader
# has gone) exits 2 with one line, not 0 or 141.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/expect_exit.sh"
bench=$1
expect_exit "$bench" 0 "usage: mok-sim-bench nvl72|racksN" --help
expect_exit "$bench" 0 "Exit codes" -h
expect_exit "$bench" 2 "RATE_QUANTUM_NS '5us' must be a whole number" nvl72 5us
expect_exit "$bench" 2 "THREADS '0' must be a whole number from 1" racks2 0 0
expect_exit "$bench" 2 "TRIALS '-3' must be a whole number from 1" mc -3
expect_exit "$bench" 2 "usage: mok-sim-bench" nvl72 0 1 extra
expect_exit "$bench" 2 "unknown case 'racks'" racks
expect_exit "$bench" 2 "unknown case 'racks65'" racks65
expect_unwritable "$bench" --help
expect_closed_pipe "$bench" --help
exit $expect_failed
