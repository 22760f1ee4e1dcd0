#!/usr/bin/env bash
# A golden compressed with an HDF5 filter this build's HDF5 lacks (h5py's lzf) is intact: the
# reader says which filter is missing and how to rewrite the file (exit 2), instead of calling it
# truncated or corrupt. Usage: golden_missing_filter.sh MOK_VERIFY FIXTURE. Exit 77 (skip) without
# h5py, or where this HDF5 has lzf after all.
set -u
verify=$1 fixture=$2
out_h5=$(mktemp -u "${TMPDIR:-/tmp}/mok-lzf-XXXXXX.h5")
trap 'rm -f "$out_h5"' EXIT
python3 - "$fixture" "$out_h5" <<'PY'
import sys
try:
    import h5py
except ImportError:
    sys.exit(77)
src, dst = sys.argv[1], sys.argv[2]
with h5py.File(src, "r") as s, h5py.File(dst, "w") as d:
    for k, v in s.attrs.items():
        d.attrs[k] = v
    def copy(name, obj):
        if isinstance(obj, h5py.Group):
            g = d.require_group(name)
            for k, v in obj.attrs.items():
                g.attrs[k] = v
        else:
            ds = d.create_dataset(name, data=obj[()], compression="lzf")
            for k, v in obj.attrs.items():
                ds.attrs[k] = v
    s.visititems(copy)
PY
py=$?
[[ $py == 77 ]] && { echo "no h5py: skipped"; exit 77; }
[[ $py == 0 ]] || { echo "writing the lzf copy failed (exit $py)"; exit 1; }
out=$("$verify" run "$out_h5" --backend emulate 2>&1)
code=$?
if [[ $code == 0 ]]; then echo "this HDF5 reads lzf: nothing to check"; exit 77; fi
[[ $code == 2 && $out == *"compressed with the HDF5 filter lzf"*"HDF5_PLUGIN_PATH"* && $out != *"truncated or corrupt"* ]] && exit 0
echo "expected exit 2 naming the missing filter lzf and the plugin path, got $code:"; echo "$out" | head -4
exit 1
