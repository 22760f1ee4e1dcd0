#!/usr/bin/env bash
# wgrad_x_rows_build.sh BUILD_DIR OUT_DIR: builds the binaries for the device run that the
# thirty-eighth session could not make and the thirty-ninth ran (kernel/README.md, thirty-ninth session):
# OUT_DIR/main/ from this checkout as it is, OUT_DIR/z/ with wgrad_x_rows_z_rejected.patch applied
# (the coalesced K-row copies) and OUT_DIR/clean/ with wgrad_x_rows_clean_rejected.patch (the same,
# written to land), each holding stripped test_kernel, mok-verify, mok-bench and
# mok-launch, one after another in BUILD_DIR (a configured CUDA build of this checkout, e.g.
# build-gpu). The working tree must be clean; it is restored however the script ends.
# Then: checks on z and clean (test_kernel, the determinism matrix with qwen3-micro.h5, the fixtures end to
# end) and `tools/bench-ab.sh -x` of main against z and clean on `--case qwen3 --reps 10 --no-baseline
# --sustain-ms 0` (both passes); kernel/notes/bench_v38_run_5_6_wgrad_x_rows.txt has the script.
# Exit 0 built, 1 a build failed, 2 bad usage or a dirty tree.
set -u
[[ $# -eq 2 && $1 != -* ]] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; [[ ${1:-} == --help ]] && exit 0; exit 2; }
build=$1 out=$2
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel) || exit 2
[[ -f $build/build.ninja ]] || { echo "wgrad_x_rows_build.sh: '$build' is not a configured (Ninja) build directory" >&2; exit 2; }
[[ -z $(git -C "$root" status --porcelain --untracked-files=no) ]] ||
  { echo "wgrad_x_rows_build.sh: the working tree of $root has changes; commit or set them aside first" >&2; exit 2; }
trap 'git -C "$root" checkout -q -- kernel' EXIT
mkdir -p "$out" || exit 2
for v in main z clean; do
  git -C "$root" checkout -q -- kernel
  case $v in
    z) git -C "$root" apply "$root/kernel/notes/wgrad_x_rows_z_rejected.patch" || exit 1 ;;
    clean) git -C "$root" apply "$root/kernel/notes/wgrad_x_rows_clean_rejected.patch" || exit 1 ;;
  esac
  echo "== $v: building in $build"
  ninja -C "$build" kernel/test/test_kernel verify/mok-verify tools/mok-bench tools/mok-launch > "$out/build_$v.log" 2>&1 ||
    { echo "build of $v failed: $out/build_$v.log" >&2; exit 1; }
  mkdir -p "$out/$v"
  for f in kernel/test/test_kernel verify/mok-verify tools/mok-bench tools/mok-launch; do
    strip -o "$out/$v/$(basename "$f")" "$build/$f" || exit 1
  done
done
echo "built: $out/main $out/z $out/clean"
