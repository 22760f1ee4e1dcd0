#!/usr/bin/env python3
"""test_read_golden.py FIXTURE: read_golden.py refuses malformed goldens with exit 2 and a message
naming the attribute or dataset (not a traceback): a /config attribute that is not an integer or
out of range (also without --check), a root format or seed of the wrong type, and, for --check,
datasets of the wrong shape or type, or groups in their place. The unmodified copy passes, as do
big-endian bf16 data and attributes stored as one-element arrays (as the C++ reader takes them); a
file open for writing elsewhere is named as locked; output that cannot be written (/dev/full), the
help's too, exits 2. Exit 77 (skipped) without h5py/numpy."""
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
fixture = sys.argv[1]


def run(path, *args, check=True, stdout=subprocess.DEVNULL):
    p = subprocess.run([sys.executable, os.path.join(here, "read_golden.py"), path, *args] + (["--check"] if check else []),
                       stdout=stdout, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stderr


def regroup(f, name):
    del f[name]
    f.create_group(name)


def replace(f, name, data):
    attrs = dict(f[name].attrs)
    del f[name]
    f[name] = data
    for k, v in attrs.items():
        f[name].attrs[k] = v


failures = 0
with tempfile.TemporaryDirectory() as tmp:
    good = os.path.join(tmp, "good.h5")
    shutil.copy(fixture, good)
    code, err = run(good)
    if code != 0:
        print(f"the unmodified copy: exit {code}: {err}")
        failures += 1
    cases = {
        "config_H_text": (lambda f: f["config"].attrs.__setitem__("H", np.bytes_(b"sixty-four")), "attribute H"),
        "config_H_fraction": (lambda f: f["config"].attrs.__setitem__("H", np.float64(64.7)), "attribute H"),
        "y_shape": (lambda f: replace(f, "intermediates/y", np.zeros((2, 1, 3), np.uint16)), "/intermediates/y"),
        "output_1d": (lambda f: replace(f, "outputs/output", np.zeros((7,), np.uint16)), "/outputs/output"),
        "format_ints": (lambda f: f.attrs.__setitem__("format", np.array([1, 2])), "format"),
        "seed_text": (lambda f: f.attrs.__setitem__("seed", "abc"), "seed is 'abc'"),
        "seed_array": (lambda f: f.attrs.__setitem__("seed", np.array([1, 2])), "attribute seed"),
        "y_group": (lambda f: regroup(f, "intermediates/y"), "/intermediates/y is a group"),
        "shared_group": (lambda f: regroup(f, "intermediates/shared_out"), "/intermediates/shared_out is a group"),
        "y_text": (lambda f: replace(f, "intermediates/y", np.full(f["intermediates/y"].shape, b"x", "S1")),
                   "/intermediates/y must be bf16"),
        "y_float32": (lambda f: (replace(f, "intermediates/y", np.zeros(f["intermediates/y"].shape, np.float32)),
                                 f["intermediates/y"].attrs.__delitem__("dtype")), "/intermediates/y must be bf16"),
        "output_dtype_ints": (lambda f: f["outputs/output"].attrs.__setitem__("dtype", np.array([1, 2, 3])),
                              "/outputs/output must be bf16"),
        "weights_compound": (lambda f: replace(f, "inputs/router_weights", np.zeros(
            f["inputs/router_weights"].shape, [("a", "f4"), ("b", "i4")])), "/inputs/router_weights must hold floating"),
        "topk_nan": (lambda f: replace(f, "inputs/topk_experts", np.full(f["inputs/topk_experts"].shape, np.nan)),
                     "/inputs/topk_experts must hold integers"),
        "topk_past_E": (lambda f: replace(f, "inputs/topk_experts", np.full(f["inputs/topk_experts"].shape, 99, np.int32)),
                        "/inputs/topk_experts holds 99"),
        # found by the forty-ninth session's audit: a bool or a string of digits was read as a number,
        # and a shared expert's missing output gave "check failed" (exit 1)
        "config_H_bool": (lambda f: f["config"].attrs.__setitem__("H", np.bool_(True)), "not an integer"),  # repr: True or np.True_ by numpy version
        "config_H_digits": (lambda f: f["config"].attrs.__setitem__("H", "64"), "attribute H is '64', not an integer"),
        "shared_out_missing": (lambda f: f.__delitem__("intermediates/shared_out"),
                               "--check needs /intermediates/shared_out"),
        # without --check too
        "config_R_negative": (lambda f: f["config"].attrs.__setitem__("R", np.int64(-2)), "attribute R is -2", False),
        "config_T_zero": (lambda f: f["config"].attrs.__setitem__("T", np.int64(0)), "attribute T is 0", False),
    }
    # found by the fiftieth session's audit: a float config attribute was accepted (the C++ reader
    # refuses it)
    cases["config_H_float"] = (lambda f: f["config"].attrs.__setitem__("H", np.float64(64.0)), "not an integer", False)
    for name, (mutate, needle, *check) in cases.items():
        path = os.path.join(tmp, name + ".h5")
        shutil.copy(fixture, path)
        with h5py.File(path, "r+") as f:
            mutate(f)
        code, err = run(path, check=check[0] if check else True)
        if code != 2 or needle not in err or "Traceback" in err:
            print(f"{name}: expected exit 2 naming {needle}, got exit {code}: {err}")
            failures += 1
    # Files the C++ reader takes (fiftieth session's audit): big-endian bf16 data, attributes stored
    # as one-element arrays; and a file open for writing elsewhere is named as locked.
    def big_endian_y(f):
        y = f["intermediates/y"][()]
        replace(f, "intermediates/y", y.astype(">u2"))

    def array_attrs(f):
        f.attrs["format"] = np.array([b"mok-golden"])
        f.attrs["seed"] = np.array([f.attrs["seed"]], np.uint64)
        f["config"].attrs["H"] = np.array([f["config"].attrs["H"]], np.int64)
    for name, mutate in (("big_endian_y", big_endian_y), ("array_attrs", array_attrs)):
        path = os.path.join(tmp, name + ".h5")
        shutil.copy(fixture, path)
        with h5py.File(path, "r+") as f:
            mutate(f)
        code, err = run(path)
        if code != 0:
            print(f"{name}: expected exit 0 (the C++ reader takes it), got exit {code}: {err}")
            failures += 1
    locked = os.path.join(tmp, "locked.h5")
    shutil.copy(fixture, locked)
    with h5py.File(locked, "r+"):
        code, err = run(locked, check=False)
    if os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() != "FALSE" and (
            code != 2 or "open for writing in another program" not in err):
        print(f"a file open for writing here: expected exit 2 naming the lock, got exit {code}: {err}")
        failures += 1
    # Standard output that cannot be written is an error, not a traceback or a silent 0.
    if os.path.exists("/dev/full"):
        for args in ((good,), ("--help",)):
            with open("/dev/full", "w") as full:
                code, err = run(*args, check=False, stdout=full)
            if code != 2 or "cannot write to standard output" not in err or "Traceback" in err:
                print(f"{' '.join(args)} > /dev/full: expected exit 2 and a message, got exit {code}: {err}")
                failures += 1
# The FMA's one rounding: 1 + 2^-24 + 2^-60 lies just above the half-way point between the float32s
# 1 and 1 + 2^-23; a sum in float64 (1 + 2^-24, a tie) then float32 (ties to even: 1) rounds twice.
sys.path.insert(0, here)
import read_golden  # noqa: E402
from fractions import Fraction  # noqa: E402
got = read_golden.round_f32(Fraction(1) + Fraction(1, 2**24) + Fraction(1, 2**60))
if got != np.float32(1 + 2**-23):
    print(f"round_f32(1 + 2^-24 + 2^-60) = {got!r}, expected 1 + 2^-23 (one rounding)")
    failures += 1
if read_golden.round_f32(Fraction(1) + Fraction(1, 2**24)) != np.float32(1):
    print("round_f32 of an exact tie must go to the even float32 (1)")
    failures += 1
print("read_golden.py: bad files refused" if failures == 0 else f"{failures} case(s) failed")
sys.exit(1 if failures else 0)
