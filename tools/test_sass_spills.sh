#!/usr/bin/env bash
# test_sass_spills.sh SASS_SPILLS: tools/sass-spills.py on a made-up nvdisasm listing (no GPU, no
# nvdisasm): a kernel with an item loop around a K-chunk loop that issues HGMMA, an epilogue row
# loop without HGMMA, one spill access in each and one outside every loop; an indexed
# local load that is not a spill; a second kernel without spills. Checks the counts per loop kind,
# the listing, the kernel filter and --fail-main-loop; then bad inputs: exit 2, the file named;
# standard output that cannot be written (/dev/full): exit 2 with a message.
tool=$1
source "$(dirname "$0")/script_test_lib.sh"  # $work, fail, run_rc

cat > "$work/k.sass" <<'SASS'
	.target	sm_90a
//--------------------- .text._Z3toyv --------------------------
.text._Z3toyv:
        /*0000*/                   STL [R1+0x8], R4                          (*"SpillRefill"*);
.L_x_1:
        /*0010*/                   LDL R5, [R1+0x8]                          (*"SpillRefill"*);
        /*0020*/                   LDL.64 R6, [R1+0x10] ;
.L_x_2:
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R8+URZ], R9 ;
        /*0040*/                   LDL R10, [R1+0xc]                         (*"SpillRefill"*);
        /*0050*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR24].tnspA, R24, gsb0 ;
        /*0060*/               @P0 BRA `(.L_x_2) ;
.L_x_3:
        /*0070*/                   STL.64 [R1+0x20], R12                     (*"SpillRefill"*);
        /*0080*/                   STG.E desc[UR4][R2.64], R24 ;
        /*0090*/               @P2 BRA.U.ANY `(.L_x_3) ;
        /*00a0*/               @P3 BRA `(.L_x_1) ;
        /*00b0*/               @P4 BRA `(.L_x_4) ;
.L_x_4:
        /*00c0*/                   EXIT ;
//--------------------- .text._Z5otherv --------------------------
.text._Z5otherv:
        /*0000*/                   LDL R2, [R1] ;
        /*0010*/                   EXIT ;
SASS

# toy: 4 spill accesses (one per kind), 3 loops, 1 main loop, 1 other local load.
run_rc 1 "--fail-main-loop on a main-loop spill" "$work/k.sass" --fail-main-loop
line=$(grep "^_Z3toyv " <<<"$out") || fail "no line for _Z3toyv: $out"
read -r _ instrs loops mainl spills k_main k_inner k_item k_straight other <<<"$line"
[[ "$instrs $loops $mainl $spills" == "13 3 1 4" ]] || fail "instrs/loops/main/spills: $line"
[[ "$k_main $k_inner $k_item $k_straight $other" == "1 1 1 1 1" ]] || fail "per kind (main inner item straight other): $line"
grep -q "^_Z5otherv .* 0 *0 *0 *0 *0 *1$" <<<"$out" || fail "other kernel: $out"

run_rc 0 "--list --kernel toy" "$work/k.sass" --kernel toy --list
grep -q "_Z5otherv" <<<"$out" && fail "--kernel toy kept _Z5otherv: $out"
grep -Eq "0x000040 main loop  in 0x30-0x60 \(4 instrs\)  LDL R10" <<<"$out" || fail "main-loop access: $out"
grep -Eq "0x000070 inner loop in 0x70-0x90" <<<"$out" || fail "inner-loop access: $out"
grep -Eq "0x000010 item loop  in 0x10-0xa0" <<<"$out" || fail "item-loop access: $out"
grep -Eq "0x000000 straight +STL" <<<"$out" || fail "straight access: $out"
[[ $(grep -c "^    0x" <<<"$out") == 4 ]] || fail "--list lines: $out"

run_rc 0 "--fail-main-loop, kernel without spills" "$work/k.sass" --kernel other --fail-main-loop

# bad inputs: exit 2, a message naming the file or the option and the fix
run_rc 2 "missing file" "$work/none.sass"
grep -q "none.sass: cannot read it" <<<"$out" || fail "missing file message: $out"
printf 'hello\nworld\n' > "$work/text.txt"
run_rc 2 "not a listing" "$work/text.txt"
grep -q "text.txt: no code sections.*nvdisasm -c" <<<"$out" || fail "not-a-listing message: $out"
run_rc 2 "no kernel matches" "$work/k.sass" --kernel nomatch
grep -q "no kernel matches --kernel 'nomatch'; the listing has: _Z3toyv, _Z5otherv" <<<"$out" || fail "no-match message: $out"
run_rc 2 "bad regex" "$work/k.sass" --kernel "("
grep -q "not a regular expression" <<<"$out" || fail "bad regex message: $out"
run_rc 0 "--help" --help
grep -q "main loop" <<<"$out" || fail "--help does not explain the loop kinds: $out"
grep -q "item loop   a loop that holds a main loop" <<<"$out" || fail "--help should describe each loop kind: $out"
grep -q "see the top of this file" <<<"$out" && fail "--help should not send the reader to the source: $out"
source "$(dirname "$0")/expect_exit.sh"  # expect_unwritable
unwritable_says="cannot write to standard output" expect_unwritable python3 "$tool" "$work/k.sass"
unwritable_says="cannot write to standard output" expect_unwritable python3 "$tool" --help
[[ $expect_failed == 0 ]] || fail "standard output on /dev/full (above)"
echo "PASS"
