#!/usr/bin/env python3
"""read_golden.py: read a mok golden file (HDF5 schema mok-golden v1) with h5py.

    python3 tools/read_golden.py fixtures/tiny-uniform.h5          # list every dataset
    python3 tools/read_golden.py fixtures/tiny-uniform.h5 --check  # also recompute one value

bf16 tensors are stored as uint16 bit patterns with a `dtype` attribute of "bfloat16". With
PyTorch: torch.from_numpy(a.view("int16")).view(torch.bfloat16). Without it, the float32
value of a bf16 pattern is (bits << 16) viewed as float32, as done below.
Exit codes: 0 ok, 1 check failed, 2 bad file, 77 h5py/numpy missing.
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"read_golden.py: skipped: {e}", file=sys.stderr)
    sys.exit(77)


def load(ds):
    """A dataset as numpy; bf16 comes back as float32 (exact)."""
    a = ds[()]
    if ds.attrs.get("dtype") in (b"bfloat16", "bfloat16"):
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with h5py.File(argv[1], "r") as f:
        if f.attrs.get("format") not in (b"mok-golden", "mok-golden"):
            print(f"{argv[1]}: not a mok golden file", file=sys.stderr)
            return 2
        cfg = {k: int(v) for k, v in f["config"].attrs.items() if k in ("H", "I", "Is", "E", "K", "R", "T")}
        print("config:", cfg, "routing:", f.attrs["routing"], "seed:", int(f.attrs["seed"]))
        def show(name, obj):
            if isinstance(obj, h5py.Dataset):
                d = obj.attrs["dtype"]
                print(f"  /{name:32s} {str(obj.shape):18s} {d.decode() if isinstance(d, bytes) else d}")
        f.visititems(show)
        if "--check" in argv:
            # Recompute one combined output element from the stored expert outputs y, the router
            # weights and the shared expert's output: acc = s; acc = fma(w, y, acc); bf16.
            topk, w = f["inputs/topk_experts"][()], f["inputs/router_weights"][()]
            y = load(f["intermediates/y"])
            s = f["intermediates/shared_out"][()] if "intermediates/shared_out" in f else None
            out = load(f["outputs/output"])
            t, h = 3, 5
            acc = np.float64(s[t, h]) if s is not None else 0.0
            for k in range(cfg["K"]):
                if topk[t, k] >= 0:
                    # w*y is exact in float64; the float64 sum then float32 equals fma(w, y, acc)
                    # except in rare double-rounding cases (not this element of the fixtures)
                    acc = np.float32(acc + np.float64(w[t, k]) * np.float64(y[t, k, h]))
            bits = np.array([acc], dtype=np.float32).view(np.uint32)[0]
            rne = ((int(bits) + 0x7FFF + ((int(bits) >> 16) & 1)) >> 16) << 16
            want = np.array([rne], dtype=np.uint32).view(np.float32)[0]
            if want != out[t, h]:
                print(f"check failed: output[{t},{h}] = {out[t, h]}, recomputed {want}", file=sys.stderr)
                return 1
            print(f"check ok: output[{t},{h}] = {out[t, h]} recomputed from y, w and s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
