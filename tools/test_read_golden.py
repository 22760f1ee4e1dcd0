#!/usr/bin/env python3
"""test_read_golden.py FIXTURE: read_golden.py refuses malformed goldens with exit 2 and a message
naming the attribute or dataset (not a traceback): a /config attribute that is not an integer,
and --check on intermediates/y or outputs/output of the wrong shape. The unmodified copy passes.
Exit 77 (skipped) without h5py/numpy."""
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


def run(path):
    p = subprocess.run([sys.executable, os.path.join(here, "read_golden.py"), path, "--check"],
                       capture_output=True, text=True)
    return p.returncode, p.stderr


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
    }
    for name, (mutate, needle) in cases.items():
        path = os.path.join(tmp, name + ".h5")
        shutil.copy(fixture, path)
        with h5py.File(path, "r+") as f:
            mutate(f)
        code, err = run(path)
        if code != 2 or needle not in err or "Traceback" in err:
            print(f"{name}: expected exit 2 naming {needle}, got exit {code}: {err}")
            failures += 1
print("read_golden.py: bad files refused" if failures == 0 else f"{failures} case(s) failed")
sys.exit(1 if failures else 0)
