#!/usr/bin/env bash
# test_ncu_phases.sh NCU_PHASES: tools/ncu-phases.py on a made-up kernel (no GPU, no ncu): a
# source file whose __global__ body has two trace marks and two calls inside a segment, its SASS
# with inlining line info (chains of //## lines per instruction, a non-inlined helper outside the
# body), and ncu's CSV source page for it and a second kernel. Checks the segment and call shares,
# the stall reasons, the per-line listing, the kernel filter and the comparison with a base
# profile (--base); then bad inputs: exit 2, the file named (a negative count; a source path that
# is a FIFO or a device); standard output that cannot be written (a full disk, a closed pipe): exit 2.
tool=$1
source "$(dirname "$0")/script_test_lib.sh"  # $work, fail, run_ok, run_rc

# Line numbers matter: the kernel's body is lines 5-12, its trace marks are on lines 7 and 10.
cat > "$work/k.cuh" <<'SRC'
// line 1
__device__ void helper() {}   // line 2
__device__ int phase_a() { return 1; }  // line 3
__device__ int phase_b() { return 2; }  // line 4
__global__ void toy_kernel(const int* p) {
  int x = p[0];
  trace_mark(P, kTrLoaded);
  run([&] { return phase_a(); },
      [&] { return phase_b(); });
  trace_mark(P, kTrDone);
  store(x);
}
__global__ void other_kernel() {}
SRC
f="$work/k.cuh"
cat > "$work/k.sass" <<SASS
//--------------------- .text._Z10toy_kernelPKi --------------------------
.text._Z10toy_kernelPKi:
	//## File "$f", line 6
        /*0000*/                   LDG.E R2, desc[UR4][R2.64] ;
	//## File "$f", line 7
        /*0008*/                   CS2R R8, SR_CLOCKLO ;
	//## File "$f", line 3 inlined at "$f", line 8
	//## File "$f", line 8
        /*0010*/                   IMAD R4, R2, R2, RZ ;
        /*0020*/                   IMAD R5, R4, R2, RZ ;
	//## File "$f", line 4 inlined at "$f", line 9
	//## File "$f", line 9 inlined at "$f", line 8
	//## File "$f", line 8
        /*0030*/                   IADD3 R6, R5, 0x1, RZ ;
	//## File "$f", line 11
        /*0040*/                   STG.E desc[UR4][R2.64], R6 ;
	//## File "$f", line 2
        /*0050*/                   RET.REL.NODEC R20 0x0 ;
.text._Z12other_kernelv:
	//## File "$f", line 13
        /*0000*/                   EXIT ;
SASS
hdr='"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","# Samples","stall_long_sb","stall_wait","stall_barrier","stall_long_sb (Not Issued)"'
cat > "$work/k.csv" <<CSV
"Kernel Name","toy_kernel(const int *)",
$hdr
"0x7f0000001000","      LDG.E R2, desc[UR4][R2.64] ;","8","8","8","8","0","0","10"
"0x7f0000001008","      CS2R R8, SR_CLOCKLO ;","2","2","2","2","0","0","90"
"0x7f0000001010","      IMAD R4, R2, R2, RZ ;","30","30","30","0","30","0","0"
"0x7f0000001020","      IMAD R5, R4, R2, RZ ;","20","20","20","0","10","10","0"
"0x7f0000001030","      IADD3 R6, R5, 0x1, RZ ;","25","25","25","0","0","25","0"
"0x7f0000001040","      STG.E desc[UR4][R2.64], R6 ;","10","10","10","10","0","0","10"
"0x7f0000001050","      RET.REL.NODEC R20 0x0 ;","5","5","5","0","5","0","0"
"Kernel Name","other_kernel()",
$hdr
"0x7f0000002000","      EXIT ;","4","4","4","0","4","0","0"
CSV

run_ok "good input" --csv "$work/k.csv" --sass "$work/k.sass" --lines 2
grep -q "^## toy_kernel(const int \*): 100 samples" <<< "$out" || fail "toy kernel's 100 samples: $out"
grep -q "body: k.cuh lines 5-12" <<< "$out" || fail "the body is lines 5-12: $out"
# Segments: lines 6 and 7 (the trace_mark line itself: 8 + 2) up to kTrLoaded; lines 8-9 (75)
# between the marks; line 11 (10) after. The Not-Issued columns (10 and 90 there) do not count.
grep -Eq "^ +10\.0%  entry\.\.Loaded +long_sb 100%$" <<< "$out" || fail "entry..Loaded 10%: $out"
grep -Eq "^ +2\.0%    k\.cuh:7  trace_mark\(P, kTrLoaded\); +long_sb 100%$" <<< "$out" || fail "the mark's own line: $out"
grep -Eq "^ +75\.0%  Loaded\.\.Done +wait 53%, barrier 47%$" <<< "$out" || fail "Loaded..Done 75%, wait 40 / barrier 35: $out"
grep -Eq "^ +10\.0%  Done\.\.end " <<< "$out" || fail "Done..end 10%: $out"
grep -Eq "^ +5\.0%  outside the body \(no inlining chain back to it\)" <<< "$out" || fail "the helper outside the body: $out"
# Calls inside Loaded..Done: the innermost body line of each chain (line 8: 50, line 9: 25).
grep -Eq "^ +50\.0%    k\.cuh:8  run\(\[&\] \{ return phase_a\(\); \}," <<< "$out" || fail "call at line 8, 50%: $out"
grep -Eq "^ +25\.0%    k\.cuh:9  \[&\] \{ return phase_b\(\); \}\);" <<< "$out" || fail "call at line 9, 25%: $out"
grep -Eq "^ +50\.0%        k\.cuh:3$" <<< "$out" || fail "line 3 (phase_a) holds line 8's samples: $out"
grep -Eq "^ +25\.0%        k\.cuh:4$" <<< "$out" || fail "line 4 (phase_b) holds line 9's samples: $out"
grep -q "^## other_kernel(): 4 samples" <<< "$out" || fail "second kernel: $out"
run_ok "--kernel other" --csv "$work/k.csv" --sass "$work/k.sass" --kernel other --lines 0
grep -q "toy_kernel" <<< "$out" && fail "--kernel other still shows toy_kernel: $out"
grep -q "^## other_kernel" <<< "$out" || fail "--kernel other: $out"

# --base: a second profile of the same binary; per segment, call and line: base, this, difference.
sed -e 's/"0x7f0000001010","      IMAD R4, R2, R2, RZ ;","30"/"0x7f0000001010","      IMAD R4, R2, R2, RZ ;","70"/' "$work/k.csv" > "$work/k2.csv"
run_ok "--base" --csv "$work/k2.csv" --base "$work/k.csv" --sass "$work/k.sass" --kernel toy --lines 1
grep -q "against the base profile: 100 -> 140 samples (+40.0%)" <<< "$out" || fail "--base totals: $out"
grep -Eq "^ +75 +115 +\+40  Loaded\.\.Done$" <<< "$out" || fail "--base segment line: $out"
grep -Eq "^ +50 +90 +\+40    k\.cuh:8 " <<< "$out" || fail "--base call line: $out"
grep -Eq "^ +50 +90 +\+40        k\.cuh:3$" <<< "$out" || fail "--base source line: $out"
grep -Eq "^ +10 +10 +\+0  entry\.\.Loaded$" <<< "$out" || fail "--base unchanged segment: $out"
# largest difference first (Loaded..Done, +40), then ties by the larger count, then by name
segs=$(grep -E "^ +[0-9]+ +[0-9]+ +[-+][0-9]+  [A-Za-z]" <<< "$out" | awk '{print $4}' | tr '\n' ' ')
[[ "$segs" == "Loaded..Done Done..end entry..Loaded outside " ]] || fail "--base order: '$segs': $out"

# Bad inputs: exit 2, the file and the fix named.
expect2() {  # expect2 WHAT PATTERN ARGS...
  local what=$1 pat=$2; shift 2
  local o rc
  o=$(timeout 20 python3 "$tool" "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "$what: exit $rc, expected 2: $o"
  grep -q -- "$pat" <<< "$o" || fail "$what: message should match '$pat': $o"
}
expect2 "missing CSV" "nope.csv: cannot read" --csv "$work/nope.csv" --sass "$work/k.sass"
expect2 "missing SASS" "nope.sass: cannot read" --csv "$work/k.csv" --sass "$work/nope.sass"
sed 's/Warp Stall Sampling (All Samples)/Something Else/' "$work/k.csv" > "$work/nosamples.csv"
expect2 "no samples column" "nosamples.csv: .*--section SourceCounters" --csv "$work/nosamples.csv" --sass "$work/k.sass"
grep -v "//##" "$work/k.sass" > "$work/noline.sass"
expect2 "no line info" "noline.sass: no line information.*-lineinfo" --csv "$work/k.csv" --sass "$work/noline.sass"
expect2 "no matching kernel" "no kernel name contains 'absent'" --csv "$work/k.csv" --sass "$work/k.sass" --kernel absent
echo '"Address","Source"' > "$work/nokernel.csv"
expect2 "no kernel rows" "nokernel.csv: no 'Kernel Name' row" --csv "$work/nokernel.csv" --sass "$work/k.sass"
expect2 "negative --lines" "--lines must be 0 or more" --csv "$work/k.csv" --sass "$work/k.sass" --lines -1
expect2 "missing --sass" "required" --csv "$work/k.csv"
grep -v "other_kernel\|EXIT" "$work/k.csv" > "$work/onlytoy.csv"
expect2 "--base without the kernel" "onlytoy.csv: no kernel 'other_kernel()'" --csv "$work/k.csv" --base "$work/onlytoy.csv" --sass "$work/k.sass"
expect2 "missing --base" "nope2.csv: cannot read" --csv "$work/k.csv" --base "$work/nope2.csv" --sass "$work/k.sass"
cat "$work/k.csv" "$work/k.csv" > "$work/twice.csv"
expect2 "--base with a kernel twice" "twice.csv: kernel .* appears more than once" --csv "$work/k.csv" --base "$work/twice.csv" --sass "$work/k.sass"
sed 's/"0x7f0000001040","      STG.E desc\[UR4\]\[R2.64\], R6 ;","10"/"0x7f0000001040","      STG.E desc[UR4][R2.64], R6 ;","1,5"/' "$work/k.csv" > "$work/comma.csv"
expect2 "non-integer samples" "comma.csv: address 0x7f0000001040: a sample count that is not an integer" --csv "$work/comma.csv" --sass "$work/k.sass"
sed 's/"0x7f0000001020","      IMAD R5, R4, R2, RZ ;","20","20","20","0","10"/"0x7f0000001020","      IMAD R5, R4, R2, RZ ;","20","20","20","0","-10"/' "$work/k.csv" > "$work/negative.csv"
expect2 "negative sample count" "negative.csv: address 0x7f0000001020: a negative sample count (-10 at line 6, column 'stall_wait')" --csv "$work/negative.csv" --sass "$work/k.sass"
# Source paths come from the line information: only regular files are read (a FIFO would block).
mkfifo "$work/fifo.cuh"
for src in "$work/fifo.cuh" /dev/zero; do
  sed "s|$f|$src|" "$work/k.sass" > "$work/special.sass"
  expect2 "source path $src" "$src: named by the SASS's line information but not a regular file" --csv "$work/k.csv" --sass "$work/special.sass"
done
source "$(dirname "$0")/expect_exit.sh"  # expect_unwritable, expect_closed_pipe
unwritable_says="cannot write to standard output" expect_unwritable python3 "$tool" --csv "$work/k.csv" --sass "$work/k.sass"
unwritable_says="cannot write to standard output" expect_unwritable python3 "$tool" --help
# A reader that has gone (`| head` once head has ended): exit 2 too, as tools/README.md says.
unwritable_says="cannot write to standard output" expect_closed_pipe python3 "$tool" --csv "$work/k.csv" --sass "$work/k.sass"
[[ $expect_failed == 0 ]] || fail "standard output on /dev/full or a closed pipe (above)"
sed "s|$f|$work/moved/k.cuh|" "$work/k.sass" > "$work/moved.sass"
expect2 "sources not where the line info says" "__global__ definition is in none of the files.*moved/k.cuh.*build machine" --csv "$work/k.csv" --sass "$work/moved.sass"
# a declaration before the definition is not taken for the body
{ echo "__global__ void toy_kernel(const int* p);"; cat "$work/k.cuh"; } > "$work/k2.cuh"
sed "s|$f|$work/k2.cuh|; s/line \([0-9]*\)/line \1+1/" "$work/k.sass" | python3 -c '
import re, sys
print(re.sub(r"line (\d+)\+1", lambda m: "line %d" % (int(m.group(1)) + 1), sys.stdin.read()), end="")' > "$work/k2.sass"
run_ok "declaration before the body" --csv "$work/k.csv" --sass "$work/k2.sass" --kernel toy --lines 0
grep -q "body: k2.cuh lines 6-13" <<< "$out" || fail "the declaration on line 1 taken for the body: $out"
echo "ok"
