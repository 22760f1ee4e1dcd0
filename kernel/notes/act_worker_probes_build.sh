#!/usr/bin/env bash
# act_worker_probes_build.sh BUILD_DIR OUT_DIR: builds the act worker's variants of mok-bench for the
# A/B that separates the 384-thread instance's ~7% (thirty-seventh session; kernel/README.md, "Left
# from the thirty-seventh session"), one after another in BUILD_DIR (a CUDA build of this checkout,
# e.g. build-gpu), and leaves stripped binaries in OUT_DIR/{worker,idle,sleepy,gone}/mok-bench:
#   worker  act_worker_rejected.patch (plain instance by default, --swiglu worker for the worker)
#   idle    + act_worker_probe_idle.patch   (run 4's idle instance)
#   sleepy  + act_worker_probe_sleepy.patch (the worker's wait for a job sleeps between tests)
#   gone    + act_worker_probe_gone.patch   (idle, and the worker warps leave at once)
# Run every variant but the plain one with --swiglu worker. The working tree must be clean; it is
# restored (git checkout, the patch's new file removed) however the script ends.
# Exit 0 built, 1 a build failed, 2 bad usage or a dirty tree.
set -u
[[ $# -eq 2 && $1 != -* ]] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; [[ ${1:-} == --help ]] && exit 0; exit 2; }
build=$1 out=$2
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel) || exit 2
notes=$root/kernel/notes
[[ -f $build/build.ninja ]] || { echo "act_worker_probes_build.sh: '$build' is not a configured (Ninja) build directory" >&2; exit 2; }
[[ -z $(git -C "$root" status --porcelain --untracked-files=no) ]] ||
  { echo "act_worker_probes_build.sh: the working tree of $root has changes; commit or set them aside first" >&2; exit 2; }
restore() {
  git -C "$root" checkout -q -- kernel tools
  rm -f "$root/kernel/device/block.cuh"
}
trap restore EXIT
mkdir -p "$out" || exit 2
for v in worker idle sleepy gone; do
  restore
  git -C "$root" apply "$notes/act_worker_rejected.patch" || exit 1
  case $v in
    idle | sleepy | gone) git -C "$root" apply "$notes/act_worker_probe_$v.patch" || exit 1 ;;
  esac
  echo "== $v: building mok-bench in $build"
  ninja -C "$build" tools/mok-bench > "$out/build_$v.log" 2>&1 || { echo "build of $v failed: $out/build_$v.log" >&2; exit 1; }
  mkdir -p "$out/$v" && strip -o "$out/$v/mok-bench" "$build/tools/mok-bench" || exit 1
done
echo "built: $(ls -d "$out"/*/ | tr '\n' ' ')"
