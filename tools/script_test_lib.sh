# script_test_lib.sh: sourced by the tests of the Python tools (test_sass_spills.sh,
# test_ncu_phases.sh), after they set tool=PATH_OF_THE_TOOL. Gives a temporary directory $work
# (removed on exit), fail MESSAGE (prints FAIL: MESSAGE, exits 1), and
# run_rc WANT WHAT ARGS...: python3 "$tool" ARGS, its stdout and stderr into $out; fails the test,
#   naming WHAT, unless it exits WANT. run_ok WHAT ARGS... is run_rc 0.
set -u
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run_rc() {
  local want=$1 what=$2
  shift 2
  out=$(python3 "$tool" "$@" 2>&1)
  local rc=$?
  [[ $rc == "$want" ]] || fail "$what: exit $rc, expected $want: $out"
}
run_ok() { run_rc 0 "$@"; }
