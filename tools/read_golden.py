#!/usr/bin/env python3
"""read_golden.py: read a mok golden file (HDF5 schema mok-golden v1) with h5py.

    python3 tools/read_golden.py fixtures/tiny-uniform.h5          # list every dataset
    python3 tools/read_golden.py fixtures/tiny-uniform.h5 --check  # also recompute one value
    python3 tools/read_golden.py --help

bf16 tensors are stored as uint16 bit patterns with a `dtype` attribute of "bfloat16". With
PyTorch: torch.from_numpy(a.view("int16")).view(torch.bfloat16). Without it, the float32
value of a bf16 pattern is (bits << 16) viewed as float32, as done below.
Exit codes: 0 ok, 1 check failed, 2 bad file (not the schema; the message names the attribute or
dataset) or output that cannot be written, 77 h5py/numpy missing.
"""
import argparse
from fractions import Fraction
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the module below
import checked_stdout  # noqa: E402

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"read_golden.py: skipped: {e}", file=sys.stderr)
    sys.exit(77)

# /config's sizes: (lowest, highest), the ranges of mok::spec::LayerConfig::validate (its other
# rules, multiples of 16, E divisible by R, R*T*K in int32, are left to mok-verify's reader).
CONFIG_RANGES = {"H": (1, 1 << 24), "I": (1, 1 << 24), "Is": (0, 1 << 24), "E": (1, 1 << 20), "K": (1, 64),
                 "R": (1, 4096), "T": (1, 1 << 24)}
REGENERATE = "regenerate the file with mok-golden"


class BadFile(Exception):
    pass


def scalar(v):
    """An attribute stored as a one-element array (another writer's choice) as that element, as
    the C++ reader takes it; any other value as it is."""
    if isinstance(v, np.ndarray) and v.size == 1:
        return v.reshape(-1)[0]
    return v


def text_attr(v):
    """An attribute's value as text, or None when it is not one string."""
    v = scalar(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None


def dataset(f, name):
    """f[name], which must be a dataset (not a group)."""
    obj = f[name]
    if not isinstance(obj, h5py.Dataset):
        raise BadFile(f"/{name} is a group, not a dataset; {REGENERATE}")
    return obj


def read(ds):
    try:
        return ds[()]
    except (OSError, TypeError, ValueError) as e:
        raise BadFile(f"{ds.name}: cannot read it ({e}); {REGENERATE}")


def load_bf16(ds):
    """A bf16 dataset (uint16 bit patterns, dtype attribute "bfloat16") as float32 (exact)."""
    # Either byte order (h5py reads big-endian data into native values).
    if ds.dtype.kind != "u" or ds.dtype.itemsize != 2 or text_attr(ds.attrs.get("dtype")) != "bfloat16":
        raise BadFile(f"{ds.name} must be bf16 (uint16 bit patterns with dtype = \"bfloat16\"), but it is "
                      f"{ds.dtype} with dtype = {ds.attrs.get('dtype')!r}; {REGENERATE}")
    return (read(ds).astype(np.uint32) << 16).view(np.float32)


def load_float(ds):
    if ds.dtype.kind != "f":
        raise BadFile(f"{ds.name} must hold floating-point numbers, but it is {ds.dtype}; {REGENERATE}")
    return read(ds)


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
        if "unable to lock file" in str(e) or "errno = 11" in str(e):
            return fail(f"{a.file}: is open for writing in another program ({e}); close it there, or read it with "
                        f"HDF5_USE_FILE_LOCKING=FALSE")
        return fail(f"{a.file}: not an HDF5 file or truncated ({e}); make goldens with mok-golden")
    try:
        with f:
            return inspect(f, a.check)
    except BadFile as e:
        return fail(f"{a.file}: {e}")
    except (OSError, TypeError, ValueError, KeyError) as e:  # what h5py cannot read
        return fail(f"{a.file}: not readable as a mok golden file ({type(e).__name__}: {e}); {REGENERATE}")


def inspect(f, check):
    if text_attr(f.attrs.get("format")) != "mok-golden":
        raise BadFile("not a mok golden file (no format = \"mok-golden\" attribute)")
    if "config" not in f or not isinstance(f["config"], h5py.Group):
        raise BadFile(f"group /config is missing; {REGENERATE}")
    cfg = {}
    for k, v in f["config"].attrs.items():
        if k not in CONFIG_RANGES:
            continue
        try:
            # A bool (True is an int in Python), a string ("64") or a float (64.0) is not a stored
            # integer: the C++ reader refuses them too.
            v = scalar(v)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise ValueError(v)
            cfg[k] = int(v)
        except (TypeError, ValueError, OverflowError):
            raise BadFile(f"/config attribute {k} is {v!r}, not an integer; {REGENERATE}")
        lo, hi = CONFIG_RANGES[k]
        if not lo <= cfg[k] <= hi:
            raise BadFile(f"/config attribute {k} is {cfg[k]}, outside [{lo}, {hi}]; {REGENERATE}")
    missing = [k for k in CONFIG_RANGES if k not in cfg]
    if missing:
        raise BadFile(f"/config lacks {', '.join(missing)}; {REGENERATE}")
    if cfg["K"] > cfg["E"]:
        raise BadFile(f"/config has K = {cfg['K']} above E = {cfg['E']}; {REGENERATE}")
    seed = scalar(f.attrs.get("seed", -1))
    if "seed" in f.attrs:
        if not (np.ndim(seed) == 0 and isinstance(seed, (int, np.integer)) and 0 <= int(seed) < 1 << 64):
            raise BadFile(f"root attribute seed is {seed!r}, not a whole number from 0 to 2^64 - 1; {REGENERATE}")
    print("config:", cfg, "routing:", text_attr(f.attrs.get("routing")), "seed:", int(seed))

    datasets = []
    f.visititems(lambda name, obj: datasets.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    width = max((len(name) for name, _ in datasets), default=0)
    for name, obj in datasets:
        d = obj.attrs.get("dtype", "?")
        print(f"  /{name:{width}s} {str(obj.shape):18s} {d.decode() if isinstance(d, bytes) else d}")
    if check:
        return check_one(f, cfg)
    return 0


def round_f32(exact):
    """The float32 nearest to a Fraction, ties to even (one rounding, as an FMA rounds)."""
    near = np.float32(float(exact))  # within an ulp of the answer (two roundings at most)
    candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
    def key(c):
        even = int(np.array([c], dtype=np.float32).view(np.uint32)[0]) & 1
        return (abs(Fraction(float(c)) - exact), even)
    return min((c for c in candidates if np.isfinite(c)), key=key)


def check_one(f, cfg):
    """Recomputes one combined output element from the stored expert outputs y, the router weights
    and the shared expert's output: acc = s; acc = fma(w, y, acc); bf16."""
    need = ["inputs/topk_experts", "inputs/router_weights", "intermediates/y", "outputs/output"]
    lacking = [n for n in need if n not in f]
    if lacking:
        raise BadFile(f"--check needs /{', /'.join(lacking)} (a file made without --no-intermediates)")
    # The shapes the check indexes: [G, K], [G, K], [G, K, H], [G, H] (and [G, H]).
    G, K, H = cfg["R"] * cfg["T"], cfg["K"], cfg["H"]
    want_shapes = {"inputs/topk_experts": (G, K), "inputs/router_weights": (G, K),
                   "intermediates/y": (G, K, H), "outputs/output": (G, H)}
    if "intermediates/shared_out" in f:
        want_shapes["intermediates/shared_out"] = (G, H)
    elif cfg["Is"] > 0:
        raise BadFile(f"--check needs /intermediates/shared_out: the layer has a shared expert (Is = {cfg['Is']}); "
                      f"{REGENERATE}")
    ds = {name: dataset(f, name) for name in want_shapes}
    for name, shape in want_shapes.items():
        if ds[name].shape != shape:
            raise BadFile(f"/{name} has shape {ds[name].shape}, expected {shape} from /config "
                          f"(G = R*T = {G}, K = {K}, H = {H}); {REGENERATE}")
    if ds["inputs/topk_experts"].dtype.kind not in "iu":
        raise BadFile(f"/inputs/topk_experts must hold integers (expert indices, -1 for none), but it is "
                      f"{ds['inputs/topk_experts'].dtype}; {REGENERATE}")
    topk = read(ds["inputs/topk_experts"])
    if topk.size and (topk.max() >= cfg["E"] or topk.min() < -1):
        raise BadFile(f"/inputs/topk_experts holds {topk.max() if topk.max() >= cfg['E'] else topk.min()}, "
                      f"outside [-1, E) with E = {cfg['E']}; {REGENERATE}")
    w = load_float(ds["inputs/router_weights"])
    y = load_bf16(ds["intermediates/y"])
    out = load_bf16(ds["outputs/output"])
    s = load_float(ds["intermediates/shared_out"]) if "intermediates/shared_out" in ds else None
    t, h = min(3, G - 1), min(5, H - 1)
    acc = np.float32(s[t, h]) if s is not None else np.float32(0.0)
    for k in range(K):
        if topk[t, k] >= 0:
            # fma(w, y, acc): the exact w*y + acc (fractions), rounded once to float32
            acc = round_f32(Fraction(float(acc)) + Fraction(float(w[t, k])) * Fraction(float(y[t, k, h])))
    bits = np.array([acc], dtype=np.float32).view(np.uint32)[0]
    rne = ((int(bits) + 0x7FFF + ((int(bits) >> 16) & 1)) >> 16) << 16
    want = np.array([rne], dtype=np.uint32).view(np.float32)[0]
    if want != out[t, h]:
        print(f"check failed: output[{t},{h}] = {out[t, h]}, recomputed {want}", file=sys.stderr)
        return 1
    print(f"check ok: output[{t},{h}] = {out[t, h]} recomputed from y, w and s")
    return 0


if __name__ == "__main__":
    checked_stdout.run("read_golden.py", main, sys.argv)
