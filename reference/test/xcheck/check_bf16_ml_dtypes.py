#!/usr/bin/env python3
"""Cross-checks mok::spec::bf16_from_f32_rne (through mok-spec-tool) against ml_dtypes, bitwise.

Inputs: every bf16 bit pattern widened to float32 (round trip), then several million float32 bit
patterns from every class: uniform random bits, ties and near-ties, subnormals, near-overflow,
zeros, Inf and NaN with random payloads. Results must match bit for bit; NaNs count as matching
when both sides are NaN, and whether their bit patterns also match is reported separately.
Exit codes: 0 pass, 1 mismatch (first mismatches printed), 2 usage or tool failure,
77 numpy or ml_dtypes missing (ctest SKIP_RETURN_CODE).
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
    print(f"SKIP: {e} (needs numpy and ml_dtypes)")
    sys.exit(77)


def all_bf16_as_f32():
    bits = np.arange(1 << 16, dtype=np.uint32)
    return (bits << 16).view(np.float32)


def random_f32_bits(rng, num):
    """num float32 bit patterns drawn over all classes, as uint32."""
    parts = []
    per = num // 7
    u32 = lambda n: rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    sign = lambda n: rng.integers(0, 2, size=n, dtype=np.uint32) << 31
    exp = lambda e: np.uint32(e) << 23
    # 1. uniform random bit patterns (hits NaN ~0.4%)
    parts.append(u32(num - 5 * per))
    # 2. exact ties: low 16 bits 0x8000, and neighbours 0x7FFF / 0x8001
    hi = u32(per) & np.uint32(0xFFFF0000)
    low = rng.choice(np.array([0x8000, 0x7FFF, 0x8001, 0x0000, 0xFFFF], dtype=np.uint32), size=per)
    parts.append(hi | low)
    # 3. subnormals (exponent field 0), including ties inside the subnormal range
    m = u32(per) & np.uint32(0x7FFFFF)
    m[: per // 4] = (m[: per // 4] & np.uint32(0x7F0000)) | np.uint32(0x8000)
    parts.append(sign(per) | m)
    # 4. near overflow: exponent field 0xFE, mantissa near its top (rounds to Inf or FLT_MAX_bf16)
    m = np.uint32(0x7FFFFF) - (u32(per) & np.uint32(0x1FFFF))
    parts.append(sign(per) | exp(0xFE) | m)
    # 5. smallest normals and the normal/subnormal boundary
    e = rng.integers(0, 3, size=per, dtype=np.uint32)
    parts.append(sign(per) | (e << 23) | (u32(per) & np.uint32(0x7FFFFF)))
    # 6. NaN with random payloads (quiet and signalling) and both signs
    m = u32(per) & np.uint32(0x7FFFFF)
    m[m == 0] = 1
    parts.append(sign(per) | exp(0xFF) | m)
    # 7. specials: +-0, +-Inf, +-FLT_MAX, +-smallest subnormal, bf16 max and its tie
    parts.append(np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
                           0x00000001, 0x80000001, 0x7F7F0000, 0x7F7F8000, 0x7F7F7FFF, 0x7F7E8000,
                           0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x00008000, 0x00018000],
                          dtype=np.uint32))
    return np.concatenate(parts)


def run_tool(tool, f32, workdir):
    src = os.path.join(workdir, "in.f32")
    dst = os.path.join(workdir, "out.u16")
    f32.astype("<f4").tofile(src)
    proc = subprocess.run([tool, "bf16", src, dst], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"ERROR: {tool} failed ({proc.returncode}): {proc.stderr.strip()}")
        sys.exit(2)
    return np.fromfile(dst, dtype="<u2")


def compare(name, f32, ours, max_print):
    with np.errstate(invalid="ignore"):
        theirs = f32.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan_ours = (ours & 0x7FFF) > 0x7F80
    nan_theirs = (theirs & 0x7FFF) > 0x7F80
    both_nan = nan_ours & nan_theirs
    bad = (ours != theirs) & ~both_nan
    nan_bits_differ = both_nan & (ours != theirs)
    in_bits = f32.view(np.uint32)
    num_nan = int(np.count_nonzero(nan_theirs | nan_ours))
    print(f"{name}: {f32.size} inputs, {f32.size - int(bad.sum())} match, {int(bad.sum())} mismatch; "
          f"NaN inputs/outputs {num_nan}, NaN bit patterns differ in {int(nan_bits_differ.sum())}")
    for i in np.flatnonzero(bad)[:max_print]:
        print(f"  MISMATCH in=0x{int(in_bits[i]):08X} ours=0x{int(ours[i]):04X} ml_dtypes=0x{int(theirs[i]):04X}")
    for i in np.flatnonzero(nan_bits_differ)[:max_print]:
        print(f"  NaN bits in=0x{int(in_bits[i]):08X} ours=0x{int(ours[i]):04X} ml_dtypes=0x{int(theirs[i]):04X}")
    return int(bad.sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True, help="path to mok-spec-tool")
    ap.add_argument("--n", type=int, default=8_000_000, help="random float32 inputs (default 8e6)")
    ap.add_argument("--seed", type=int, default=None, help="RNG seed (default: fresh, printed)")
    ap.add_argument("--max-print", type=int, default=10)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"check_bf16_ml_dtypes: seed={seed} ml_dtypes={ml_dtypes.__version__} numpy={np.__version__}")
    rng = np.random.default_rng(seed)

    num_bad = 0
    with tempfile.TemporaryDirectory() as workdir:
        # Every bf16 pattern round-trips (f32_from_bf16 is bits << 16; check ml_dtypes agrees).
        f32 = all_bf16_as_f32()
        widened = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
        widen_bad = int(np.count_nonzero(widened.view(np.uint32) != f32.view(np.uint32)))
        print(f"bf16->f32 widening: 65536 patterns, {widen_bad} differ from bits<<16")
        num_bad += widen_bad
        ours = run_tool(args.tool, f32, workdir)
        num_bad += compare("all bf16 patterns (f32->bf16)", f32, ours, args.max_print)
        nan_in = (np.arange(1 << 16) & 0x7FFF) > 0x7F80
        rt_bad = int(np.count_nonzero((ours != np.arange(1 << 16, dtype=np.uint16)) & ~nan_in))
        print(f"  round trip bf16->f32->bf16 identity on the {int((~nan_in).sum())} non-NaN patterns: "
              f"{rt_bad} differ")
        num_bad += rt_bad

        f32 = random_f32_bits(rng, args.n).view(np.float32)
        ours = run_tool(args.tool, f32, workdir)
        num_bad += compare("random float32 patterns (all classes)", f32, ours, args.max_print)

    print("PASS" if num_bad == 0 else f"FAIL ({num_bad} mismatches, seed={seed})")
    return 0 if num_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
