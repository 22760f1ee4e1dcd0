# expect_exit.sh: sourced by the tools' argument tests.
# expect_exit PROGRAM CODE PATTERN ARGS...: runs PROGRAM ARGS, and on an exit code other than
# CODE or an output (stdout and stderr) without PATTERN prints why and sets expect_failed=1.
expect_failed=0
expect_exit() {
  local prog=$1 want=$2 pattern=$3
  shift 3
  local out code
  out=$("$prog" "$@" 2>&1)
  code=$?
  if [[ $code != "$want" ]]; then
    echo "$(basename "$prog") $*: exit $code, expected $want"; echo "$out" | head -5; expect_failed=1
  elif [[ $out != *"$pattern"* ]]; then
    echo "$(basename "$prog") $*: output lacks '$pattern'"; echo "$out" | head -5; expect_failed=1
  fi
}
# expect_unwritable PROGRAM ARGS...: with standard output on /dev/full (a full disk), PROGRAM ARGS
# must exit 2 with one line saying it cannot write (no traceback or second failure after it;
# skipped where there is no /dev/full). The line must hold $unwritable_says, "cannot write" unless
# set for the call (`unwritable_says="cannot write the help" expect_unwritable PROG --help`).
# Progress lines on stderr matching $progress_lines (an extended regex, set for the call) are left
# out before the check.
expect_unwritable() {
  [[ -w /dev/full ]] || return 0
  local prog=$1
  shift
  local out code
  out=$("$prog" "$@" 2>&1 > /dev/full)
  code=$?
  [[ -n ${progress_lines:-} ]] && out=$(grep -vE "$progress_lines" <<< "$out")
  if [[ $code != 2 || $out != *"${unwritable_says:-cannot write}"* || $out == *$'\n'* ]]; then
    echo "$(basename "$prog") $* > /dev/full: exit $code, expected 2 and one line saying '${unwritable_says:-cannot write}'"
    echo "$out" | head -5; expect_failed=1
  fi
}
# expect_closed_pipe PROGRAM ARGS...: with standard output a pipe whose reader has gone (as in
# `PROGRAM ARGS | head -1` once head has ended) and SIGPIPE at its default (Python's subprocess
# restores it, whatever this shell inherited), PROGRAM ARGS must exit 2 with one line saying it
# cannot write ($unwritable_says and $progress_lines, as above), not end by SIGPIPE without a word (141). Skipped where
# there is no python3.
expect_closed_pipe() {
  command -v python3 > /dev/null || return 0
  local prog=$1
  shift
  local out code
  out=$(python3 -c 'import os, subprocess, sys
r, w = os.pipe()
os.close(r)
rc = subprocess.run(sys.argv[1:], stdout=w).returncode
sys.exit(128 - rc if rc < 0 else rc)' "$prog" "$@" 2>&1)
  code=$?
  [[ -n ${progress_lines:-} ]] && out=$(grep -vE "$progress_lines" <<< "$out")
  if [[ $code != 2 || $out != *"${unwritable_says:-cannot write}"* || $out == *$'\n'* ]]; then
    echo "$(basename "$prog") $* > a closed pipe: exit $code, expected 2 and one line saying '${unwritable_says:-cannot write}'"
    echo "$out" | head -5; expect_failed=1
  fi
}
