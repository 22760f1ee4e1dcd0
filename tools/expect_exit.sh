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
