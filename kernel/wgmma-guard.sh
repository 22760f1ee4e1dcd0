#!/usr/bin/env bash
# wgmma-guard.sh COMPILER ARGS...: the CUDA compiler launcher of the kernel's targets
# (CUDA_COMPILER_LAUNCHER, kernel/CMakeLists.txt). Runs the compile, passes its output through, and
# fails it when ptxas reports that it serialized wgmma (advisory C7510: "wgmma.mma_async
# instructions are serialized due to ..."), removing the object so the next build compiles again.
#
# Why: a serialized kernel waits for each wgmma before issuing the next. Its bits are the same, so
# no functional test notices, but its passes run 15-34% slower (the forty-first session measured
# two such builds before anyone saw why). ptxas prints the advisory and exits 0; in a Ninja build
# the line scrolls by unread. The usual cause is a call left inside the wgmma pipeline: a lambda
# or function that grew past nvcc's inlining limit (kernel/README.md, "Build").
#
# MOK_ALLOW_WGMMA_SERIALIZATION=1 in the build's environment keeps the object and only warns (to
# time a serialized build on purpose). Exit codes: the compiler's own; 1 when ptxas serialized
# wgmma; 2 on bad use (no compiler given).
set -u
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  [[ $# -ge 1 ]] && exit 0 || exit 2
fi
log=$(mktemp "${TMPDIR:-/tmp}/wgmma-guard.XXXXXX") || { echo "wgmma-guard: cannot make a temporary file in ${TMPDIR:-/tmp}" >&2; exit 2; }
trap 'rm -f "$log"' EXIT
# stdout and stderr both go to stderr, in order (nvcc's diagnostics; the build reads no stdout)
"$@" > "$log" 2>&1
rc=$?
cat "$log" >&2
[[ $rc -ne 0 ]] && exit $rc
grep -q 'C7510\|mma_async instructions are serialized' "$log" || exit 0
# the object (after -o) and the source (the argument after -c, as CMake writes it)
obj='' src='' prev=''
for a in "$@"; do
  [[ $prev == -o ]] && obj=$a
  [[ $prev == -c ]] && src=$a
  prev=$a
done
if [[ ${MOK_ALLOW_WGMMA_SERIALIZATION:-0} == 1 ]]; then
  echo "wgmma-guard: WARNING: ptxas serialized wgmma in ${src:-this compile}; kept (MOK_ALLOW_WGMMA_SERIALIZATION=1)" >&2
  exit 0
fi
[[ -n $obj ]] && rm -f -- "$obj"
{
  echo "wgmma-guard: error: ptxas serialized wgmma in ${src:-this compile} (C7510 above); ${obj:-the object} removed."
  echo "  Every wgmma now waits for the one before it: same bits, 15-34% slower passes. The usual cause"
  echo "  is a call inside the wgmma pipeline: find CALL.REL in the kernel (cuobjdump -sass, or"
  echo "  nvdisasm -c of the cubin) and inline the callee (__forceinline__, or"
  echo "  __attribute__((always_inline)) on a lambda). To build it anyway, for timing on purpose:"
  echo "  MOK_ALLOW_WGMMA_SERIALIZATION=1 in the build's environment (kernel/README.md, \"Build\")."
} >&2
exit 1
