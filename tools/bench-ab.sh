#!/usr/bin/env bash
# bench-ab.sh: compare mok-bench runs (two builds, or two flag sets) in one sitting, alternating.
#
# Usage: tools/bench-ab.sh [-n ROUNDS] [-o DIR] [-p] [-x] LABEL_A 'COMMAND_A' LABEL_B 'COMMAND_B' [LABEL 'COMMAND' ...]
#
# Runs every COMMAND (a mok-bench or mok-bench-atomics command line, quoted as one argument) once
# per round, in the order given, ROUNDS times (default 3), so that drift over the sitting hits
# every variant alike. With -x, even rounds run the commands in the reverse order, so that no
# variant always runs first or always runs right after another (on a power-capped GPU the run
# before sets the clock a run starts at; the thirty-fourth session's A/B, base always first,
# could not tell a change's effect from running second). For each run it prints the fused forward and backward times that mok-bench
# reports (medians over its own --reps) and, where nvidia-smi exists, the mean SM clock, mean
# board power and peak temperature over the 100 ms samples taken while the GPU was busy (GPU
# utilisation of at least 50%: the passes, not the process's host set-up); at the end, per
# label, the median over rounds of each figure. Every run's full output goes to DIR (default: a
# new directory under /tmp), one file per run. Exit 0 when every run succeeded, 1 when one failed
# (its file says why), 2 on bad usage (also a DIR it cannot write in, or a run whose fused figure
# is not a number: the command is not a mok-bench). Interrupted (SIGINT, or the SIGTERM of a `timeout` around it),
# it stops the clock sampler, prints the medians and comparisons over the runs that finished (the
# run under way when the signal came is not counted) and exits 130 / 143.
#
# Comparisons: with two labels, or with -p (labels in pairs: base, candidate, base, candidate,
# ...), each candidate is set against its base round by round: the median over rounds of the
# change (candidate / base - 1) and in how many rounds the candidate was faster, forward,
# backward and, where both printed a backward, the two together (a change that moves work from
# one pass to the other shows there). A round counts where both runs succeeded (for the backward
# and the sum: where both printed a backward).
#
# Example (the forward's gate/up epilogue, fragments against staged, qwen3 shapes; a change to the
# forward alone, so its forwards are timed back to back, without the backward between them):
#   Q="build/tools/mok-bench --H 2048 --I 768 --Is 0 --E 128 --K 8 --R 1 --T 16384 --reps 10 --no-baseline --passes forward"
#   tools/bench-ab.sh -n 3 fragments "$Q" staged "$Q --swiglu staged"
# Two builds on two shapes, paired:
#   tools/bench-ab.sh -p q-old "old/mok-bench $QARGS" q-new "new/mok-bench $QARGS" d-old "..." d-new "..."
set -u
usage() {  # --help: this file's opening comment, exit 0 (2 when it cannot be written)
  local text
  text=$(awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0")
  printf '%s\n' "$text" 2> /dev/null || { echo "bench-ab.sh: cannot write the help to standard output" >&2; exit 2; }
  exit 0
}
rounds=3
dir=""
pairs=0
cross=0
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    -n) [[ $# -ge 2 && $2 =~ ^[1-9][0-9]{0,3}$ && $2 -le 1000 ]] || { echo "bench-ab.sh: -n needs a round count from 1 to 1000" >&2; exit 2; }
        rounds=$2; shift 2 ;;
    -o) [[ $# -ge 2 && -n $2 ]] || { echo "bench-ab.sh: -o needs a directory (not empty)" >&2; exit 2; }
        dir=$2; shift 2 ;;
    -p) pairs=1; shift ;;
    -x) cross=1; shift ;;
    -h|--help) usage ;;
    *) echo "bench-ab.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 4 || $(($# % 2)) -ne 0 ]]; then
  echo "bench-ab.sh: give at least two LABEL 'COMMAND' pairs (got $# arguments; see --help)" >&2
  exit 2
fi
if [[ $pairs == 1 && $(($# % 4)) -ne 0 ]]; then
  echo "bench-ab.sh: -p pairs the labels (base, candidate, ...): give an even number of LABEL 'COMMAND' pairs (got $(($# / 2)))" >&2
  exit 2
fi
labels=()
cmds=()
while [[ $# -gt 0 ]]; do
  [[ $1 != -* ]] || { echo "bench-ab.sh: '$1' after the LABEL 'COMMAND' pairs: options go before them (see --help)" >&2; exit 2; }
  [[ $1 =~ ^[A-Za-z0-9._+-]+$ ]] || { echo "bench-ab.sh: label '$1' must be letters, digits or ._+- only" >&2; exit 2; }
  [[ -n $2 ]] || { echo "bench-ab.sh: the command for label '$1' is empty" >&2; exit 2; }
  for seen in ${labels[@]+"${labels[@]}"}; do
    [[ $seen != "$1" ]] || { echo "bench-ab.sh: label '$1' is given twice (each run's output file is named by its label)" >&2; exit 2; }
  done
  labels+=("$1")
  cmds+=("$2")
  shift 2
done
[[ -n $dir ]] || dir=$(mktemp -d /tmp/bench-ab.XXXXXX)
mkdir -p "$dir" 2> /dev/null || { echo "bench-ab.sh: cannot create '$dir'; give -o a directory you can write to" >&2; exit 2; }
have_smi=0
command -v nvidia-smi > /dev/null 2>&1 && have_smi=1
summary=$dir/summary.tsv
# Written before any run: a folder that exists but takes no files (-o /proc) is found here.
{ printf 'round\tlabel\tfwd_ms\tbwd_ms\tsm_mhz\tpower_w\tmax_temp_c\n' > "$summary"; } 2> /dev/null ||
  { echo "bench-ab.sh: cannot write '$summary'; give -o a directory you can write to" >&2; exit 2; }
status=0
smi_pid=""
[[ ${#labels[@]} == 2 ]] && pairs=1
report() {  # medians over the rounds run so far, and the comparisons
  local label i
  echo "# medians over rounds"
  for label in "${labels[@]}"; do
    awk -F'\t' -v L="$label" '
      function median(a, n,   i, j, t) {
        if (n == 0) return "-"
        for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j - 1] > a[j]; --j) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
      }
      NR > 1 && $2 "" == L "" {  # as strings: labels 1 and 1.0 differ
        f[++nf] = $3
        if ($4 != "-") b[++nb] = $4
        if ($5 != "-") c[++nc] = $5
        if ($6 != "-") p[++np] = $6
      }
      END { printf "%-12s fwd %s ms  bwd %s ms  SM %s MHz  %s W  (%d rounds)\n", L, median(f, nf), median(b, nb), median(c, nc), median(p, np), nf }
    ' "$summary"
  done
  if [[ $pairs == 1 ]]; then
    echo "# candidate against base, round by round (median change; rounds faster)"
    for ((i = 0; i < ${#labels[@]}; i += 2)); do
      awk -F'\t' -v A="${labels[$i]}" -v B="${labels[$((i + 1))]}" '
        function median(a, n,   i, j, t) {
          for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j - 1] > a[j]; --j) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
          return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        function line(name, x, rounds,   r, n, w, d) {
          n = 0; w = 0
          for (r in rounds)
            if ((r, A) in x && (r, B) in x && x[r, A] > 0) { d[++n] = 100 * (x[r, B] / x[r, A] - 1); w += x[r, B] < x[r, A] }
          if (n == 0) return name " -"
          return sprintf("%s %+.1f%%, faster in %d of %d", name, median(d, n), w, n)
        }
        NR > 1 && ($2 "" == A "" || $2 "" == B "") {
          round[$1] = 1; f[$1, $2] = $3
          if ($4 != "-") { b[$1, $2] = $4; s[$1, $2] = $3 + $4 }
        }
        END {
          tot = line("fwd+bwd", s, round)
          printf "%s against %s: %s; %s%s\n", B, A, line("fwd", f, round), line("bwd", b, round),
                 tot == "fwd+bwd -" ? "" : "; " tot
        }
      ' "$summary"
    done
  fi
}
# An interrupt (Ctrl-C, a job's timeout) must not leave the clock sampler running, and the rounds
# already run still get their summary (a device call's time limit cut several A/Bs short).
on_signal() {
  [[ -n $smi_pid ]] && { kill "$smi_pid" 2> /dev/null; wait "$smi_pid" 2> /dev/null; }
  # The running command's process group (it and what it started) stops too: it is not in this
  # script's group, so neither a TERM to this script alone nor Ctrl-C reaches it otherwise.
  if [[ -n ${cmd_pid:-} ]]; then
    kill -TERM -- "-$cmd_pid" 2> /dev/null
    wait "$cmd_pid" 2> /dev/null
  fi
  echo "bench-ab.sh: interrupted; partial results in $dir" >&2
  if [[ $(wc -l < "$summary") -gt 1 ]]; then
    echo "# interrupted: the summary covers the runs that finished"
    report
  fi
  exit $((128 + $1))
}
cmd_pid=""
trap 'on_signal 2' INT
trap 'on_signal 15' TERM
echo "# bench-ab.sh: $rounds rounds of ${labels[*]}$([[ $cross == 1 ]] && echo ", even rounds in reverse order"); outputs in $dir"
for ((r = 1; r <= rounds; ++r)); do
  order=("${!labels[@]}")
  if [[ $cross == 1 && $((r % 2)) -eq 0 ]]; then
    order=()
    for ((k = ${#labels[@]} - 1; k >= 0; --k)); do order+=("$k"); done
  fi
  for i in "${order[@]}"; do
    label=${labels[$i]}
    out=$dir/${label}_r$r.txt
    smi_pid=""
    if [[ $have_smi == 1 ]]; then
      nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader,nounits -lms 100 \
        > "$dir/${label}_r$r.smi" 2> /dev/null &
      smi_pid=$!
    fi
    # In the background, in its own process group (set -m), and waited for: a signal to this
    # script is handled at once (a foreground command delays the trap until it ends), and
    # on_signal stops the command with everything it started (the group).
    set -m
    bash -c "${cmds[$i]}" > "$out" 2>&1 &
    cmd_pid=$!
    set +m
    wait "$cmd_pid"
    rc=$?
    cmd_pid=""
    [[ -n $smi_pid ]] && { kill "$smi_pid" 2> /dev/null; wait "$smi_pid" 2> /dev/null; }
    smi_pid=""
    fwd=$(awk '$1 == "fused" && $2 == "forward" { print $3; exit }' "$out")
    bwd=$(awk '$1 == "fused" && $2 == "backward" { print $3; exit }' "$out")
    clk=-
    pwr=-
    tmp=-
    if [[ -s $dir/${label}_r$r.smi ]]; then
      read -r clk pwr tmp < <(awk -F', *' 'NF >= 4 && $4 + 0 >= 50 { c += $1; p += $2; n++; if ($3 > t) t = $3 }
                                 END { if (n) printf "%.0f %.1f %d\n", c / n, p / n, t; else print "- - -" }' \
                                 "$dir/${label}_r$r.smi")
    fi
    if [[ $rc -ne 0 || -z $fwd ]]; then
      echo "round $r $label: FAILED (exit $rc; no 'fused forward' line?): see $out"
      [[ $status == 2 ]] || status=1
      continue
    fi
    number='^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$'
    if ! [[ $fwd =~ $number ]] || ! [[ -z $bwd || $bwd =~ $number ]]; then
      echo "round $r $label: FAILED: its fused figures ('$fwd', '${bwd:--}') are not times in ms; is the command a mok-bench? see $out"
      status=2
      continue
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$label" "$fwd" "${bwd:--}" "$clk" "$pwr" "$tmp" >> "$summary"
    printf 'round %d %-12s fwd %8s ms  bwd %8s ms  SM %5s MHz  %6s W  max %s C\n' "$r" "$label" "$fwd" "${bwd:--}" \
      "$clk" "$pwr" "$tmp"
  done
done
report
exit $status
