#!/usr/bin/env bash
# test_bad_args.sh "PROGRAM:[SUBCOMMAND ]VALUE_OPTION" ...: the command-line convention
# (mok::cli::parse) on each program: an unknown option and a malformed value for VALUE_OPTION
# exit 2 with a message naming the option, and --help exits 0. None of it touches a GPU or
# writes a file.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/expect_exit.sh"
for spec in "$@"; do
  prog=${spec%%:*}
  read -ra words <<< "${spec#*:}"  # [subcommand] option
  expect_exit "$prog" 2 "Run with --help" --no-such-option
  expect_exit "$prog" 2 "${words[-1]}" "${words[@]}" not-a-number
  expect_exit "$prog" 0 "Usage" --help
done
[[ $expect_failed == 0 ]] && echo "bad-argument exit codes OK for $#"
exit $expect_failed
