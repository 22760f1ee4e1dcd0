#!/usr/bin/env python3
"""check_fp8_ml_dtypes.py: the spec's 8-bit float conversions against ml_dtypes.

For float8_e4m3fn, float8_e5m2 and float8_e8m0fnu: every one of the 256 codes decoded, and the
encoding of every bf16-representable float32 plus several million random float32 bit patterns,
compared bitwise (NaN against NaN counts as a match; differing NaN codes are reported).

    python3 check_fp8_ml_dtypes.py --tool build/reference/test/xcheck/mok-spec-tool [--seed S] [--n N]

The random patterns come from a fresh seed each run (printed; --seed S repeats a run).

Exit codes: 0 all agree, 1 a mismatch (the first ones are printed), 2 tool failure, 77 numpy or
ml_dtypes missing.
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:
    print(f"check_fp8_ml_dtypes: skipped: {e}", file=sys.stderr)
    sys.exit(77)

FORMATS = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu"}


def run_tool(tool, cmd, data, out_dtype, tmp):
    src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    data.tofile(src)
    r = subprocess.run([tool, cmd, src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"check_fp8_ml_dtypes: {tool} {cmd} failed: {r.stderr.strip()}", file=sys.stderr)
        sys.exit(2)
    return np.fromfile(dst, dtype=out_dtype)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tool", required=True)
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default: fresh, printed)")
    p.add_argument("--n", type=int, default=4_000_000, help="random float32 patterns")
    a = p.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"check_fp8_ml_dtypes: seed={seed} ml_dtypes={ml_dtypes.__version__} numpy={np.__version__}")
    rng = np.random.default_rng(seed)
    bf16_floats = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    rand = rng.integers(0, 1 << 32, size=a.n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    inputs = np.concatenate([bf16_floats, rand]).astype(np.float32)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for cmd, name in FORMATS.items():
            t = getattr(ml_dtypes, name)
            codes = np.arange(256, dtype=np.uint8)
            want_dec = codes.view(t).astype(np.float32)
            got_dec = run_tool(a.tool, cmd + "d", codes, np.float32, tmp)
            both_nan = np.isnan(want_dec) & np.isnan(got_dec)
            bad_dec = np.nonzero((want_dec.view(np.uint32) != got_dec.view(np.uint32)) & ~both_nan)[0]
            want = inputs.astype(t).view(np.uint8)
            got = run_tool(a.tool, cmd, inputs, np.uint8, tmp)
            nan_w = np.isnan(want.view(t).astype(np.float32))
            nan_g = np.isnan(got.view(t).astype(np.float32))
            bad = np.nonzero((want != got) & ~(nan_w & nan_g))[0]
            nan_code_diff = int(np.count_nonzero((want != got) & nan_w & nan_g))
            print(f"{name}: 256 codes decoded, {len(bad_dec)} differ; {inputs.size} floats encoded, "
                  f"{len(bad)} differ ({nan_code_diff} NaN inputs with another NaN code)")
            for i in bad_dec[:5]:
                print(f"  decode 0x{codes[i]:02x}: ml_dtypes {want_dec[i]!r}, spec {got_dec[i]!r}")
            for i in bad[:8]:
                print(f"  encode {inputs[i]!r} (0x{inputs.view(np.uint32)[i]:08x}): ml_dtypes 0x{want[i]:02x}, spec 0x{got[i]:02x}")
            failed = failed or len(bad) > 0 or len(bad_dec) > 0
    print(f"FAIL (seed={seed})" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
