#!/usr/bin/env bash
# test_bad_args.sh "PROGRAM:[SUBCOMMAND ]VALUE_OPTION" ...: the command-line convention
# (mok::cli::parse) on each program: an unknown option and a malformed value for VALUE_OPTION
# exit 2 with a message naming the option, and --help exits 0. None of it touches a GPU or
# writes a file.
set -u
fail=0
for spec in "$@"; do
  prog=${spec%%:*}
  read -ra words <<< "${spec#*:}"  # [subcommand] option
  opt=${words[-1]}
  name=$(basename "$prog")
  check() {  # check CODE PATTERN ARGS...
    local want=$1 pattern=$2
    shift 2
    local out code
    out=$("$prog" "$@" 2>&1)
    code=$?
    if [[ $code != "$want" ]]; then
      echo "$name $*: exit $code, expected $want"; echo "$out" | head -5; fail=1
    elif [[ $out != *"$pattern"* ]]; then
      echo "$name $*: output lacks '$pattern'"; echo "$out" | head -5; fail=1
    fi
  }
  check 2 "Run with --help" --no-such-option
  check 2 "$opt" "${words[@]}" not-a-number
  check 0 "Usage" --help
done
[[ $fail == 0 ]] && echo "bad-argument exit codes OK for $#"
exit $fail
