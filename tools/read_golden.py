#!/usr/bin/env python3
"""read_golden.py: read a mok golden file (HDF5 schema mok-golden v1) with h5py.

    python3 tools/read_golden.py fixtures/tiny-uniform.h5          # list every dataset
    python3 tools/read_golden.py fixtures/tiny-uniform.h5 --check  # also recompute one value
    python3 tools/read_golden.py --help

bf16 tensors are stored as uint16 bit patterns with a `dtype` attribute of "bfloat16". With
PyTorch: torch.from_numpy(a.view("int16")).view(torch.bfloat16). Without it, the float32
value of a bf16 pattern is (bits << 16) viewed as float32, as done below.
Exit codes: 0 ok, 1 check failed, 2 bad file, 77 h5py/numpy missing.
"""
import argparse
import os
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


def fail(msg):
    print(f"read_golden.py: {msg}", file=sys.stderr)
    return 2


def main(argv):
    p = argparse.ArgumentParser(
        prog="read_golden.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a golden file (mok-golden v1, HDF5), e.g. fixtures/tiny-uniform.h5")
    p.add_argument("--check", action="store_true",
                   help="recompute one output element from the stored y, router weights and shared output")
    try:
        a = p.parse_args(argv[1:])
    except SystemExit as e:  # argparse: exit 0 after --help, 2 on bad usage
        return int(e.code or 0)
    if not os.path.exists(a.file):
        return fail(f"{a.file}: no such file")
    if not os.path.isfile(a.file):
        return fail(f"{a.file}: not a regular file (a directory?); give a golden file")
    try:
        f = h5py.File(a.file, "r")
    except OSError as e:
        return fail(f"{a.file}: not an HDF5 file or truncated ({e}); make goldens with mok-golden")
    with f:
        if f.attrs.get("format") not in (b"mok-golden", "mok-golden"):
            return fail(f"{a.file}: not a mok golden file (no format = \"mok-golden\" attribute)")
        if "config" not in f:
            return fail(f"{a.file}: group /config is missing; regenerate the file with mok-golden")
        cfg = {}
        for k, v in f["config"].attrs.items():
            if k not in ("H", "I", "Is", "E", "K", "R", "T"):
                continue
            try:
                as_float = float(v)
                if not as_float.is_integer():
                    raise ValueError(v)
                cfg[k] = int(as_float)
            except (TypeError, ValueError, OverflowError):
                return fail(f"{a.file}: /config attribute {k} is {v!r}, not an integer; regenerate the file with "
                            f"mok-golden")
        missing = [k for k in ("H", "I", "Is", "E", "K", "R", "T") if k not in cfg]
        if missing:
            return fail(f"{a.file}: /config lacks {', '.join(missing)}; regenerate the file with mok-golden")
        print("config:", cfg, "routing:", f.attrs.get("routing"), "seed:", int(f.attrs.get("seed", -1)))

        def show(name, obj):
            if isinstance(obj, h5py.Dataset):
                d = obj.attrs.get("dtype", "?")
                print(f"  /{name:32s} {str(obj.shape):18s} {d.decode() if isinstance(d, bytes) else d}")
        f.visititems(show)
        if a.check:
            # Recompute one combined output element from the stored expert outputs y, the router
            # weights and the shared expert's output: acc = s; acc = fma(w, y, acc); bf16.
            need = ["inputs/topk_experts", "inputs/router_weights", "intermediates/y", "outputs/output"]
            lacking = [n for n in need if n not in f]
            if lacking:
                return fail(f"{a.file}: --check needs /{', /'.join(lacking)} (a file made without "
                            f"--no-intermediates)")
            topk, w = f["inputs/topk_experts"][()], f["inputs/router_weights"][()]
            y = load(f["intermediates/y"])
            s = f["intermediates/shared_out"][()] if "intermediates/shared_out" in f else None
            out = load(f["outputs/output"])
            # The shapes the check indexes: [G, K], [G, K], [G, K, H], [G, H] (and [G, H]).
            G, K, H = cfg["R"] * cfg["T"], cfg["K"], cfg["H"]
            want_shapes = {"inputs/topk_experts": (G, K), "inputs/router_weights": (G, K),
                           "intermediates/y": (G, K, H), "outputs/output": (G, H)}
            if s is not None:
                want_shapes["intermediates/shared_out"] = (G, H)
            for name, shape in want_shapes.items():
                if f[name].shape != shape:
                    return fail(f"{a.file}: /{name} has shape {f[name].shape}, expected {shape} from /config "
                                f"(G = R*T = {G}, K = {K}, H = {H}); regenerate the file with mok-golden")
            t, h = min(3, out.shape[0] - 1), min(5, out.shape[1] - 1)
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
