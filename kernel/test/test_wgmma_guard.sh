#!/usr/bin/env bash
# test_wgmma_guard.sh GUARD [BUILD_DIR]: the compiler launcher kernel/wgmma-guard.sh, run around
# stand-in compilers (shell scripts that print what nvcc and ptxas print), and, given a Ninja build
# directory with CUDA, that its layer kernels really compile through it.
set -u
guard=$1
build=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# A stand-in compiler: writes its -o file, prints $MSG, exits $RC.
cat > "$work/cc" <<'EOF'
#!/usr/bin/env bash
prev=''
for a in "$@"; do [[ $prev == -o ]] && echo object > "$a"; prev=$a; done
[[ -n ${MSG:-} ]] && echo "$MSG" >&2
exit "${RC:-0}"
EOF
chmod +x "$work/cc"
serialized="ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to the presence of Extern calls in the function '_ZN3mok6kernel6device18moe_forward_kernelE'"
# run NAME: the guard around the stand-in compiling src.cu to o.o; sets out and code
run() {
  rm -f "$work/o.o"
  out=$("$guard" "$work/cc" -x cu -c "$work/src.cu" -o "$work/o.o" 2>&1)
  code=$?
}

MSG="ptxas info    : Used 168 registers" RC=0 run
[[ $code == 0 && -f $work/o.o && $out == *"Used 168 registers"* ]] || fail "a clean compile: exit $code, object $([[ -f $work/o.o ]] && echo kept || echo missing), output '$out'"

MSG=$serialized RC=0 run
[[ $code == 1 ]] || fail "a serialized compile: exit $code, expected 1"
[[ -f $work/o.o ]] && fail "a serialized compile kept its object"
[[ $out == *C7510* && $out == *"serialized wgmma in $work/src.cu"* && $out == *MOK_ALLOW_WGMMA_SERIALIZATION* ]] ||
  fail "a serialized compile's output lacks the advisory, the source or the way out: '$out'"

MSG=$serialized RC=0 MOK_ALLOW_WGMMA_SERIALIZATION=1 run
[[ $code == 0 && -f $work/o.o && $out == *WARNING* ]] || fail "MOK_ALLOW_WGMMA_SERIALIZATION=1: exit $code, object $([[ -f $work/o.o ]] && echo kept || echo missing), output '$out'"

MSG="src.cu(3): error: identifier \"x\" is undefined" RC=3 run
[[ $code == 3 && $out == *undefined* ]] || fail "a failing compile: exit $code (expected the compiler's 3), output '$out'"

# a failing compile that also printed the advisory keeps the compiler's exit code
MSG=$serialized RC=4 run
[[ $code == 4 ]] || fail "a failing compile with the advisory: exit $code, expected 4"

out=$("$guard" 2>&1); code=$?
[[ $code == 2 && $out == *COMPILER* ]] || fail "no compiler: exit $code, expected 2 and the usage, got '$out'"
out=$("$guard" --help 2>&1); code=$?
[[ $code == 0 && $out == *C7510* ]] || fail "--help: exit $code, output '$out'"

# The build itself: each layer kernel object's compile command goes through the guard.
if [[ -n $build && -f $build/build.ninja ]] && grep -q 'mok_kernel\.dir/src/layer\.cu\.o' "$build/build.ninja"; then
  commands=$(ninja -C "$build" -t commands 2>/dev/null) || fail "ninja -C $build -t commands failed"
  n=0
  for obj in kernel/CMakeFiles/mok_kernel.dir/src/layer.cu.o kernel/CMakeFiles/mok_kernel_atomics.dir/src/layer.cu.o \
             tools/CMakeFiles/mok-gemm-bench.dir/mok_gemm_bench.cu.o; do
    cmd=$(grep -E -- "-o ${obj//./\\.}( |\$)" <<<"$commands" | head -1)
    [[ -z $cmd ]] && continue
    n=$((n + 1))
    [[ $cmd == *wgmma-guard.sh* ]] || fail "$build compiles $obj without kernel/wgmma-guard.sh: ${cmd:0:200}"
  done
  [[ $n -gt 0 ]] || fail "$build builds CUDA but has no compile command for kernel/CMakeFiles/mok_kernel.dir/src/layer.cu.o"
  echo "checked $n compile command(s) of $build"
fi
[[ $failed == 0 ]] && echo PASS
exit $failed
