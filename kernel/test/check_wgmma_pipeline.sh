#!/usr/bin/env bash
# check_wgmma_pipeline.sh BUILD_DIR [OBJECT...]: compiles the layer kernels' sources again for
# sm_90a with ptxas's report (-Xptxas -v), exactly as BUILD_DIR's Ninja build compiles them, and
# fails when ptxas serialized the kernels' wgmma (its advisory C7510: "wgmma.mma_async instructions
# are serialized due to ...").
#
# Why: a serialized kernel waits for every wgmma before issuing the next, and runs its passes
# 15-34% slower with the same bits, so no functional test notices. It happened to two builds in
# the forty-first session, when the item loop's lambda grew past nvcc's inlining limit and was
# called instead of inlined (a call inside the wgmma pipeline); the lambdas are now marked
# always_inline (kernel/README.md, "Build"). Every build now fails on the advisory (the kernel
# targets' compiler launcher, kernel/wgmma-guard.sh); this script is the on-demand report (ctest
# label slow) of each kernel's registers, stack frame and spills, with the same check.
#
# OBJECT: object files of BUILD_DIR's kernel library to check, as Ninja names them (default: the
# deterministic kernel, kernel/CMakeFiles/mok_kernel.dir/src/layer.cu.o, and where built the
# atomics variant's that mok-bench-atomics times, kernel/CMakeFiles/mok_kernel_atomics.dir/src/layer.cu.o:
# -DMOK_ATOMICS_VARIANT=ON). Prints each kernel's ptxas line (registers, stack frame, spills).
# Exit 0: no serialization; 1: serialized (the kernels named); 77: nothing to check (a build
# without CUDA or sm_90a, or a generator other than Ninja); 2: bad arguments.
set -u
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  [[ $# -ge 1 ]] && exit 0 || exit 2
fi
build=$1
shift
[[ -f $build/CMakeCache.txt ]] || { echo "check_wgmma_pipeline: $build: not a CMake build directory (no CMakeCache.txt); give the build directory, e.g. build" >&2; exit 2; }
[[ -f $build/build.ninja ]] || { echo "SKIP: $build is not a Ninja build (the compile commands come from ninja -t commands)"; exit 77; }
grep -q '^MOK_ENABLE_CUDA:[A-Z]*=\(ON\|AUTO\)' "$build/CMakeCache.txt" || { echo "SKIP: $build builds without CUDA"; exit 77; }
objects=("$@")
if [[ ${#objects[@]} -eq 0 ]]; then
  objects=(kernel/CMakeFiles/mok_kernel.dir/src/layer.cu.o kernel/CMakeFiles/mok_kernel_atomics.dir/src/layer.cu.o)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
commands=$(ninja -C "$build" -t commands 2>/dev/null) || { echo "check_wgmma_pipeline: ninja -C $build -t commands failed; is ninja installed?" >&2; exit 2; }
checked=0 bad=0
for obj in "${objects[@]}"; do
  # the command that makes this object: the line whose -o names it
  cmd=$(grep -E -- "-o ${obj//./\\.}( |\$)" <<<"$commands" | head -1)
  if [[ -z $cmd ]]; then
    # the atomics object exists only in some builds; a named object must exist
    [[ $# -eq 0 && $obj == *atomics* ]] && continue
    echo "check_wgmma_pipeline: $build has no compile command for $obj (ninja -t commands); name an object of its kernel library" >&2
    exit 2
  fi
  grep -q "arch=compute_90a" <<<"$cmd" || { echo "SKIP: $obj is not built for sm_90a (MOK_CUDA_ARCHS)"; continue; }
  # one sm_90a cubin, no dependency file (ninja's depfile stays untouched), ptxas's report
  cmd=$(sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ --generate-code=[^ ]+//g; s/ -c / -cubin -arch=sm_90a /' <<<"$cmd")
  cmd=$(sed -E "s# -o ${obj//./\\.}( |\$)# -o $work/k.cubin #" <<<"$cmd")
  t0=$SECONDS
  # the guard in the command would delete the cubin on C7510: this script reports it instead
  (cd "$build" && export MOK_ALLOW_WGMMA_SERIALIZATION=1 && eval "$cmd -Xptxas -v") > "$work/ptxas.txt" 2>&1 || {
    echo "check_wgmma_pipeline: compiling $obj failed:" >&2
    tail -n 20 "$work/ptxas.txt" >&2
    exit 2
  }
  checked=$((checked + 1))
  echo "== $obj ($((SECONDS - t0)) s)"
  # each kernel's entry line and the resource line after it
  grep -q "Compiling entry function '_ZN3mok6kernel6device" "$work/ptxas.txt" || echo "  (no layer kernel in this object)"
  grep -A3 "Compiling entry function '_ZN3mok6kernel6device" "$work/ptxas.txt" | grep -E "Compiling entry|registers|spill" |
    sed -E "s/.*Compiling entry function '([^']+)'.*/  \1/; s/^ptxas info +: +/    /"
  if grep -q "C7510\|mma_async instructions are serialized" "$work/ptxas.txt"; then
    bad=1
    echo "FAIL: ptxas serialized wgmma in $obj:"
    grep "C7510\|mma_async instructions are serialized" "$work/ptxas.txt" | sed 's/^/  /'
    echo "  A call inside the wgmma pipeline (a lambda or function no longer inlined, say) makes every"
    echo "  wgmma wait for the previous one. Find the call (nvdisasm -c of the cubin: CALL.REL in the"
    echo "  kernel) and inline it (__forceinline__, or __attribute__((always_inline)) on a lambda)."
  fi
done
[[ $checked -gt 0 ]] || { echo "SKIP: nothing built for sm_90a to check"; exit 77; }
[[ $bad -eq 0 ]] && echo "PASS: wgmma pipelined in every sm_90a kernel checked"
exit $bad
