#!/usr/bin/env bash
# test_bench_ab.sh BENCH_AB: tools/bench-ab.sh against a stand-in for mok-bench (no GPU needed):
# alternation (and -x's reversed even rounds), per-round figures, medians over rounds (odd and even counts), candidates against
# their bases round by round (two labels, or -p pairs), a failing variant (exit 1, named), bad
# usage (exit 2, nothing run; also an output folder it cannot write in, and a fused figure that is
# not a number), the nvidia-smi columns from busy samples only, an interrupted A/B (no sampler
# left; the finished runs' summary after a SIGTERM), and --help to a full disk (exit 2).
set -u
ab=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
w=$(printf %q "$work")  # $work quoted for the command strings bench-ab.sh hands to bash -c
fail() { echo "FAIL: $*"; exit 1; }
# The stand-in prints mok-bench's two 'fused' lines; its forward time is the next value of $2
# (a comma list), one per call, counted in a file so that alternation shows in the values.
cat > "$work/fake" <<'FAKE'
#!/usr/bin/env bash
count=$1; shift
n=$(cat "$count" 2> /dev/null || echo 0); echo $((n + 1)) > "$count"
IFS=, read -r -a v <<< "$1"
echo "# mok-bench stand-in"
echo "fused forward               ${v[$n]}     320.01     40.7%        347"
echo "fused backward              $2     373.35     47.4%        578"
FAKE
chmod +x "$work/fake"
out=$("$ab" -n 4 -o "$work/o1" A "$w/fake $w/a 5.0,3.0,4.0,9.0 6.5" B "$w/fake $w/b 1.0,1.0,2.0,2.0 7.25" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "two good variants: exit $rc: $out"
grep -q "^round 3 A .*fwd *4.0 ms" <<< "$out" || fail "round 3 of A should read 4.0: $out"
grep -q "^A *fwd 4.5 ms  bwd 6.5 ms" <<< "$out" || fail "A's median over 4 rounds should be 4.5 (even count): $out"
grep -q "^B *fwd 1.5 ms  bwd 7.25 ms" <<< "$out" || fail "B's median should be 1.5: $out"
# Two labels compare as a pair: per-round changes -80, -66.7, -50, -77.8% (median of four: -72.2%);
# forward + backward 11.5 / 9.5 / 10.5 / 15.5 against 8.25 / 8.25 / 9.25 / 9.25 ms: -28.3, -13.2,
# -11.9, -40.3% (median -20.7%).
grep -q "^B against A: fwd -72.2%, faster in 4 of 4; bwd +11.5%, faster in 0 of 4; fwd+bwd -20.7%, faster in 4 of 4$" <<< "$out" ||
  fail "B against A, round by round, expected: $out"
order=$(grep '^round' <<< "$out" | awk '{ printf "%s%s ", $2, $3 }')
[[ $order == "1A 1B 2A 2B 3A 3B 4A 4B " ]] || fail "runs should alternate A, B each round: $order"
[[ $(ls "$work/o1"/*_r*.txt | wc -l) -eq 8 ]] || fail "one output file per run expected in $work/o1"
# -x: even rounds in reverse order; each label keeps its own values and the comparison its pairing.
out=$("$ab" -n 4 -x -o "$work/o8" A "$w/fake $w/xa 5.0,3.0,4.0,9.0 6.5" B "$w/fake $w/xb 1.0,1.0,2.0,2.0 7.25" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "-x: exit $rc: $out"
order=$(grep '^round' <<< "$out" | awk '{ printf "%s%s ", $2, $3 }')
[[ $order == "1A 1B 2B 2A 3A 3B 4B 4A " ]] || fail "-x should reverse the even rounds: $order"
grep -q "^A *fwd 4.5 ms  bwd 6.5 ms" <<< "$out" || fail "-x: A's median should still be 4.5: $out"
grep -q "^B against A: fwd -72.2%, faster in 4 of 4; bwd +11.5%, faster in 0 of 4; fwd+bwd -20.7%, faster in 4 of 4$" <<< "$out" ||
  fail "-x: B against A, round by round, expected: $out"
grep -q "even rounds in reverse order" <<< "$out" || fail "-x: the header should say so: $out"
out=$("$ab" -n 3 -o "$work/o2" A "$w/fake $w/c 3.0,1.0,2.0 1" broken "false" 2>&1)
rc=$?
[[ $rc -eq 1 ]] || fail "a failing variant should give exit 1, got $rc: $out"
grep -q "round 2 broken: FAILED" <<< "$out" || fail "the failing variant should be named per round: $out"
grep -q "^A *fwd 2.0 ms" <<< "$out" || fail "A's median over 3 rounds should be 2.0 (odd count): $out"
grep -q "^broken against A: fwd -; bwd -$" <<< "$out" || fail "a pair without a good round compares nothing: $out"
# -p: four labels as two (base, candidate) pairs, each compared with its own base only.
out=$("$ab" -n 2 -o "$work/o5" -p q1 "$w/fake $w/f 2,2 4" q2 "$w/fake $w/g 1,3 4" \
  d1 "$w/fake $w/h 2,2 4" d2 "$w/fake $w/i 2.2,2.2 3" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "-p with two pairs: exit $rc: $out"
grep -q "^q2 against q1: fwd +0.0%, faster in 1 of 2; bwd +0.0%, faster in 0 of 2; fwd+bwd +0.0%, faster in 1 of 2$" <<< "$out" ||
  fail "q2 against q1: $out"
grep -q "^d2 against d1: fwd +10.0%, faster in 0 of 2; bwd -25.0%, faster in 2 of 2; fwd+bwd -13.3%, faster in 2 of 2$" <<< "$out" ||
  fail "d2 against d1: $out"
[[ $(grep -c "^[^#].* against " <<< "$out") -eq 2 ]] || fail "-p should compare within pairs only, two lines: $out"
# Labels compare as strings (1 and 1.0 are two variants); a backward figure only one side printed
# leaves the backward without a comparison.
cat > "$work/fwdonly" <<'FWD'
#!/usr/bin/env bash
echo "fused forward               $1     320.01     40.7%        347"
FWD
chmod +x "$work/fwdonly"
out=$("$ab" -n 2 -o "$work/o6" 1 "$w/fake $w/j 4,4 5" 1.0 "$w/fwdonly 2" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "forward-only candidate: exit $rc: $out"
grep -q "^1 *fwd 4 ms  bwd 5 ms .*(2 rounds)" <<< "$out" || fail "labels 1 and 1.0 should not mix: $out"
grep -q "^1.0 against 1: fwd -50.0%, faster in 2 of 2; bwd -$" <<< "$out" || fail "no backward comparison expected: $out"
for args in "A x" "-n 0 A x B y" "-n A x B y" "-q A x B y" "a%b x B y" "A x B ''" "-p A x B y C z" "A x A y"; do
  eval "set -- $args"
  out=$("$ab" -o "$work/o3" "$@" 2>&1)
  rc=$?
  [[ $rc -eq 2 ]] || fail "bad usage '$args' should give exit 2, got $rc: $out"
  [[ ! -e $work/o3 ]] || fail "bad usage '$args' should run nothing (created $work/o3)"
done
# An output folder that exists but takes no files: exit 2 naming it, before any run.
if [[ -d /proc ]] && ! : 2> /dev/null > /proc/bench-ab-probe; then
  out=$("$ab" -n 1 -o /proc A "touch $w/ran" B "touch $w/ran" 2>&1)
  rc=$?
  [[ $rc -eq 2 && $out == *"cannot write '/proc/summary.tsv'"* ]] || fail "-o /proc: expected exit 2 naming the folder, got $rc: $out"
  [[ ! -e $work/ran ]] || fail "-o /proc: a run started before the folder was checked"
fi
# A fused figure that is not a number is no time: the run is named, not shown as +inf%.
out=$("$ab" -n 1 -o "$work/o10" A "$w/fake $w/k 2.0 3.0" B "$w/fake $w/l abc 3.0" 2>&1)
rc=$?
[[ $rc -eq 2 ]] || fail "a non-numeric figure: expected exit 2, got $rc: $out"
grep -q "^round 1 B: FAILED: its fused figures ('abc', '3.0') are not times in ms" <<< "$out" ||
  fail "a non-numeric figure should be named: $out"
grep -q "inf" <<< "$out" && fail "a non-numeric figure compared as a number: $out"
# With an nvidia-smi on PATH (a stand-in printing four samples: two busy, two idle), the clock,
# power and temperature columns come from the busy samples only.
mkdir -p "$work/bin"
cat > "$work/bin/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
printf '%s\n' "345, 80.0, 70, 0" "1980, 500.0, 60, 100" "1800, 480.0, 62, 95" "1410, 90.0, 41, 10"
exec sleep 30
SMI
chmod +x "$work/bin/nvidia-smi"
out=$(PATH="$work/bin:$PATH" "$ab" -n 1 -o "$work/o4" A "sleep 0.5; $w/fake $w/d 2.0 3.0" B "sleep 0.5; $w/fake $w/e 1.0 3.0" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "runs with a stand-in nvidia-smi: exit $rc: $out"
grep -Eq "^round 1 A .*SM +1890 MHz +490.0 W +max 62 C" <<< "$out" || fail "clock, power, temperature should average the busy samples only: $out"
# Ctrl-C (SIGINT to the process group) stops the run and the clock sampler with it: a stand-in
# nvidia-smi records its pid; bench-ab.sh runs in its own group with SIGINT at its default action
# (as from a terminal), and after the interrupt no sampler may be left.
mkdir -p "$work/bin2"
cat > "$work/bin2/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
echo $$ > "$SMI_PID_FILE"
trap '' INT  # like a background job of a non-interactive shell
exec sleep 30
SMI
chmod +x "$work/bin2/nvidia-smi"
export SMI_PID_FILE=$work/smi.pid
PATH="$work/bin2:$PATH" python3 - "$ab" "$work/o7" <<'PY' &
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setsid()
os.execvp(sys.argv[1], [sys.argv[1], "-n", "1", "-o", sys.argv[2], "A", "sleep 20", "B", "sleep 20"])
PY
abpid=$!
for _ in $(seq 100); do [[ -s $SMI_PID_FILE ]] && break; sleep 0.05; done
[[ -s $SMI_PID_FILE ]] || fail "the stand-in sampler never started"
sleep 0.2
kill -INT -- "-$abpid"
wait "$abpid"
rc=$?
smi=$(cat "$SMI_PID_FILE")
for _ in $(seq 20); do kill -0 "$smi" 2> /dev/null || break; sleep 0.05; done  # a moment to be reaped
if kill -0 "$smi" 2> /dev/null; then kill -9 "$smi"; fail "the nvidia-smi sampler outlived an interrupted bench-ab.sh"; fi
[[ $rc -eq 130 ]] || fail "an interrupted bench-ab.sh should exit 130, got $rc"
# A timeout's SIGTERM (to bench-ab.sh alone, as `timeout` sends it) in the second round: the runs
# that finished still get their medians and comparison, and the exit status is 143.
cat > "$work/slow" <<'SLOW'
#!/usr/bin/env bash
# The stand-in, one second slower from its second call on, so that the test can stop round 2.
n=$(cat "$1" 2> /dev/null || echo 0)
[[ $n -ge 1 ]] && sleep 1
exec "$(dirname "$0")/fake" "$@"
SLOW
chmod +x "$work/slow"
"$ab" -n 3 -o "$work/o9" A "$w/fake $w/m 4,4,4 5" B "$w/slow $w/n 2,2,2 5" > "$work/o9.out" 2>&1 &
abpid=$!
rows() { [[ -f $work/o9/summary.tsv ]] && wc -l < "$work/o9/summary.tsv" || echo 0; }
for _ in $(seq 100); do [[ $(rows) -ge 3 ]] && break; sleep 0.05; done
[[ $(rows) -ge 3 ]] || fail "round 1 never finished: $(cat "$work/o9.out")"
kill -TERM "$abpid"
wait "$abpid"
rc=$?
out=$(cat "$work/o9.out")
[[ $rc -eq 143 ]] || fail "a bench-ab.sh stopped by SIGTERM should exit 143, got $rc: $out"
grep -q "^# interrupted: the summary covers the runs that finished$" <<< "$out" || fail "an interrupted A/B should say so: $out"
grep -q "^A *fwd 4 ms  bwd 5 ms" <<< "$out" || fail "A's median over the finished rounds expected: $out"
grep -q "^B against A: fwd -50.0%, faster in 1 of 1; bwd +0.0%, faster in 0 of 1; fwd+bwd -22.2%, faster in 1 of 1$" <<< "$out" ||
  fail "B against A over round 1 expected: $out"
# A SIGTERM to the script alone (not its group) ends it at once and stops the running command
# (it used to wait for the command, which went on running).
start=$(date +%s)
# The command is compound (its shell stays, with a child): the child must stop too.
"$ab" -n 2 -o "$work/o10" A "sleep 31 & echo \$! > '$work/o10.child'; wait; echo 'fused forward 1.0 x'" \
  B 'echo "fused forward 1.0 x"' > "$work/o10.out" 2>&1 &
abpid=$!
for _ in $(seq 50); do [[ -s $work/o10.child ]] && break; sleep 0.1; done
kill -TERM "$abpid"
wait "$abpid"
rc=$?
[[ $rc -eq 143 && $(($(date +%s) - start)) -le 8 ]] || fail "SIGTERM to bench-ab.sh alone: expected 143 at once, got $rc"
child=$(cat "$work/o10.child" 2> /dev/null)
[[ -n $child ]] || fail "the command never started"
# Alive: a process that exists and is not a zombie waiting to be reaped (/proc, no procps needed).
alive() { local st; st=$(awk '{ print $3 }' "/proc/$1/stat" 2> /dev/null) && [[ -n $st && $st != Z ]]; }
for _ in $(seq 20); do alive "$child" || break; sleep 0.05; done
if alive "$child"; then kill -9 "$child"; fail "the running command's child outlived bench-ab.sh"; fi
help=$("$ab" --help 2>&1) || fail "--help should exit 0"
grep -q "Usage: tools/bench-ab.sh" <<< "$help" || fail "--help should print the usage: $help"
grep -q "set -u" <<< "$help" && fail "--help should print the opening comment only: $help"
source "$(dirname "$0")/expect_exit.sh"  # expect_unwritable
unwritable_says="cannot write the help" expect_unwritable "$ab" --help
[[ $expect_failed == 0 ]] || fail "--help > /dev/full (above)"
echo "bench-ab.sh: OK"
