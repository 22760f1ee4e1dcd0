#!/usr/bin/env python3
"""Cross-checks mok::spec::mma_bf16_step (kHopperBf16Mma, through mok-spec-tool) against MMA-Sim.

MMA-Sim (Microsoft, PyPI `mmasim`, arXiv 2511.10909) models NVIDIA tensor-core arithmetic bit for
bit. This script simulates random Hopper `wgmma.m64nNk16.f32.bf16.bf16` instructions (D = A*B + C,
A [64,16], B [16,N], C [64,N]) with MMA-Sim, flattens every output element D[i,j] into one
mok-spec-tool `mma` record {C[i,j], A[i,:], B[:,j]} and compares the results bitwise (NaNs too).
Random instructions draw their values from several profiles (narrow exponent ranges for
cancellation and alignment, the full exponent range, tiny values with subnormals, near-overflow
values, raw bit patterns, sprinkled zeros/Inf/NaN); crafted single-element cases cover
cancellation, the 2^-25 alignment boundary, truncation toward zero, subnormals, zero signs,
overflow, NaN and Inf. Mismatches are classified by the edge rule they exercise.

Instructions are simulated in batches through the same MMA-Sim code path that
`WGMMA.__call__(A, B, C)` uses (`dpa` on row/column vectors broadcast over [64, N]); a sample of
instructions is also run through `__call__` one by one to confirm the batching changes nothing.
Exit codes: 0 all match, 1 mismatches (first ones printed), 2 usage or tool failure,
77 torch or mmasim missing (ctest SKIP_RETURN_CODE).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
    import mmasim
    import mmasim.nv_ptx as nv_ptx
except ImportError as e:
    print(f"SKIP: {e} (needs numpy, torch and mmasim)")
    sys.exit(77)

K = 16
M = 64
RECORD = np.dtype([("acc", "<u4"), ("a", "<u2", (K,)), ("b", "<u2", (K,))])  # 68 bytes, packed
assert RECORD.itemsize == 68
N_CHOICES = [8, 16, 24, 32, 64, 128, 256]
N_WEIGHTS = [0.55, 0.15, 0.08, 0.08, 0.07, 0.04, 0.03]

FLT_MAX_BITS = 0x7F7FFFFF


# ---------------------------------------------------------------------------- value generation
def bf16_bits(rng, shape, profile):
    """Random bf16 bit patterns (uint16) following one value profile."""
    n = int(np.prod(shape))
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 15
    mant = rng.integers(0, 128, n, dtype=np.uint32)
    if profile == "narrow":  # one scale, a few binades: cancellation, alignment, truncation
        centre = rng.integers(100, 155)
        width = rng.choice([0, 1, 2, 4, 8, 16])
        ef = np.clip(centre + rng.integers(-width, width + 1, n), 1, 254)
    elif profile == "wide":  # most of the exponent range, products mostly below overflow
        ef = rng.integers(1, 191, n)
    elif profile == "tiny":  # products near and below 2^-133, subnormal inputs (exponent field 0)
        ef = rng.integers(0, rng.integers(8, 75), n)
    elif profile == "huge":  # products near and past the fp32 overflow threshold
        ef = rng.integers(180, 255, n)
    elif profile == "raw":  # any 16-bit pattern, NaN and Inf included
        return rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16).reshape(shape)
    else:
        raise ValueError(profile)
    bits = sign | (ef.astype(np.uint32) << 7) | mant
    return bits.astype(np.uint16).reshape(shape)


def sprinkle_specials(rng, bits, rate):
    """Replaces a fraction of elements with +-0, +-Inf, NaN or a subnormal."""
    flat = bits.reshape(-1)
    hit = np.flatnonzero(rng.random(flat.size) < rate)
    kinds = rng.integers(0, 6, hit.size)
    sign = (rng.integers(0, 2, hit.size) << 15).astype(np.uint16)
    vals = np.select(
        [kinds <= 1, kinds == 2, kinds == 3, kinds == 4],
        [np.zeros(hit.size, np.uint16), np.full(hit.size, 0x7F80, np.uint16),
         np.full(hit.size, 0x7FC0, np.uint16),
         rng.integers(0x7F81, 0x8000, hit.size).astype(np.uint16)],
        rng.integers(1, 0x80, hit.size).astype(np.uint16)).astype(np.uint16)
    flat[hit] = vals | sign
    return bits


def f32_bits(rng, shape, profile, centre_exp):
    """Random accumulator bit patterns (uint32)."""
    n = int(np.prod(shape))
    sign = rng.integers(0, 2, n, dtype=np.uint64).astype(np.uint32) << 31
    mant = rng.integers(0, 1 << 23, n, dtype=np.uint64).astype(np.uint32)
    if profile == "zero":
        return (sign * rng.integers(0, 2, n).astype(np.uint32)).reshape(shape)
    if profile == "matched":  # the products' scale: the accumulator competes for the max exponent
        ef = np.clip(centre_exp + 127 + rng.integers(-4, 5, n), 1, 254)
    elif profile == "wide":
        ef = rng.integers(0, 255, n)
    elif profile == "subnormal":
        ef = np.zeros(n, np.int64)
    elif profile == "raw":
        return rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).reshape(shape)
    else:
        raise ValueError(profile)
    return (sign | (ef.astype(np.uint32) << 23) | mant).reshape(shape)


def random_instruction_batch(rng, num, n):
    """num random instructions of shape m64nNk16: (A [num,64,16], B [num,16,N], C [num,64,N])."""
    a_prof = rng.choice(["narrow", "wide", "tiny", "huge", "raw"], p=[0.66, 0.12, 0.14, 0.04, 0.04])
    b_prof = a_prof if rng.random() < 0.7 else rng.choice(["narrow", "wide", "tiny", "huge"])
    a = bf16_bits(rng, (num, M, K), a_prof)
    b = bf16_bits(rng, (num, K, n), b_prof)
    rate = rng.choice([0.0, 0.0, 0.001, 0.01, 0.1])
    if rate > 0:
        sprinkle_specials(rng, a, rate)
        sprinkle_specials(rng, b, rate)
    # Typical product exponent: lets "matched" accumulators sit at the products' scale.
    ea = ((a.astype(np.int64) >> 7) & 0xFF) - 127
    eb = ((b.astype(np.int64) >> 7) & 0xFF) - 127
    centre = int(np.median(ea)) + int(np.median(eb))
    c_prof = rng.choice(["zero", "matched", "wide", "subnormal", "raw"], p=[0.25, 0.45, 0.1, 0.1, 0.1])
    c = f32_bits(rng, (num, M, n), c_prof, centre)
    return a, b, c, f"A:{a_prof} B:{b_prof} C:{c_prof} specials:{rate}"


# ---------------------------------------------------------------------------- crafted cases
def bf(x):
    return int(torch.tensor([x], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def f32(x):
    return int(np.array([x], np.float32).view(np.uint32)[0])


def crafted_records():
    """Single-element problems (name, acc_bits, a[16], b[16]) on the model's edges."""
    cases = []

    def add(name, acc, pairs):
        a = [0] * K
        b = [0] * K
        for i, (x, y) in enumerate(pairs):
            a[i] = x if isinstance(x, int) else bf(x)
            b[i] = y if isinstance(y, int) else bf(y)
        cases.append((name, acc if isinstance(acc, int) else f32(acc), a, b))

    one = 1.0
    # Alignment boundary: with E = 0 the unit is 2^-25; smaller terms drop entirely.
    add("keep 2^-25 below 1", 0.0, [(one, one), (2.0 ** -13, 2.0 ** -12)])
    add("drop 2^-26 below 1", 0.0, [(one, one), (2.0 ** -13, 2.0 ** -13)])
    add("cancel keeps 2^-25", 0.0, [(one, one), (-one, one), (2.0 ** -13, 2.0 ** -12)])
    add("cancel drops 2^-26", 0.0, [(one, one), (-one, one), (2.0 ** -13, 2.0 ** -13)])
    add("(1+2^-23)+2^-24+2^-25", f32(1.0 + 2.0 ** -23), [(2.0 ** -12, 2.0 ** -12), (2.0 ** -12, 2.0 ** -13)])
    add("negative term truncates toward zero", 1.0, [(-(1 + 2 ** -7), 2.0 ** -20)])
    add("sum truncates toward zero (neg)", -1.0, [(-(1 + 2 ** -7), 2.0 ** -17), (-(1 + 2 ** -7), 2.0 ** -17)])
    add("unnormalised product exponent 1.5*1.5", 0.0, [(1.5, 1.5), (2.0 ** -24, 1.5)])
    add("unnormalised product 1.99*1.99 + tiny", 0.0, [(1.9921875, 1.9921875), (2.0 ** -25, 1.0)])
    add("accumulator dominates", 2.0 ** 30, [(1.0, 1.0)] * 16)
    add("accumulator tiny vs products", 2.0 ** -30, [(1.0, 1.0)] * 16)
    add("sixteen equal products", 0.0, [(1.0078125, 1.0078125)] * 16)
    add("alternating cancellation", 0.0, [(1.0 if i % 2 else -1.0, 1.0 + i / 128.0) for i in range(16)])
    # Subnormal inputs (bf16 exponent field 0) and subnormal results.
    add("subnormal a * normal b", 0.0, [(0x0001, bf(1.0))])
    add("subnormal a * subnormal b", 0.0, [(0x0040, 0x0040)])
    add("subnormal products sum", 0.0, [(0x007F, bf(2.0 ** 100))] * 16)
    add("subnormal accumulator", 0x00000001, [(0x0001, bf(2.0 ** 126))])
    add("subnormal result", 0.0, [(2.0 ** -75, 2.0 ** -74)])
    add("subnormal result truncated", 0.0, [(1.5 * 2.0 ** -75, 2.0 ** -74)])
    # Zero exponent rule: an exact zero term may take part in the max exponent.
    add("zero acc, 2^-149 - 2^-170", 0.0, [(2.0 ** -75, 2.0 ** -74), (-(2.0 ** -85), 2.0 ** -85)])
    add("nonzero acc, 2^-149 - 2^-170", f32(2.0 ** -149), [(2.0 ** -75, 2.0 ** -74), (-(2.0 ** -85), 2.0 ** -85)])
    add("zero acc, all products tiny", 0.0, [(2.0 ** -70, 1.25 * 2.0 ** -70)] * 16)
    # Zero signs.
    add("+0 acc, all products +0", 0.0, [(0.0, 1.0)])
    add("-0 acc, all products -0", f32(-0.0), [(-0.0, 1.0)] * 16)
    add("-0 acc, no products", f32(-0.0), [])
    add("+0 acc, -0 products", 0.0, [(-0.0, 1.0)] * 16)
    add("exact cancellation", 0.0, [(1.0, 1.0), (-1.0, 1.0)])
    add("negative underflow to zero", 0.0, [(-(2.0 ** -80), 2.0 ** -80)])
    add("negative underflow, -0 acc", f32(-0.0), [(-(2.0 ** -80), 2.0 ** -80)])
    # Overflow.
    add("product sum overflows", 0.0, [(2.0 ** 127, 2.0)] * 2)
    add("acc FLT_MAX + product", FLT_MAX_BITS, [(2.0 ** 104, 1.0)])
    add("acc -FLT_MAX - product", 0xFF7FFFFF, [(-(2.0 ** 104), 1.0)])
    add("single huge product", 0.0, [(2.0 ** 100, 2.0 ** 100)])
    add("huge products cancel", 0.0, [(2.0 ** 100, 2.0 ** 100), (-(2.0 ** 100), 2.0 ** 100)])
    add("acc FLT_MAX exactly", FLT_MAX_BITS, [(1.0, 1.0)])
    # NaN and Inf.
    add("NaN a", 0.0, [(0x7FC0, bf(1.0))])
    add("negative NaN a", 0.0, [(0xFFC1, bf(1.0))])
    add("NaN acc", 0xFFC00001, [(1.0, 1.0)])
    add("Inf * 0", 0.0, [(0x7F80, 0x0000)])
    add("Inf - Inf", 0.0, [(0x7F80, bf(1.0)), (0x7F80, bf(-1.0))])
    add("Inf + finite", 0.0, [(0x7F80, bf(1.0)), (1.0, 1.0)])
    add("-Inf acc + finite", 0xFF800000, [(1.0, 1.0)])
    add("Inf acc - Inf product", 0x7F800000, [(0xFF80, bf(1.0))])
    add("Inf product + huge finite", 0.0, [(0x7F80, bf(1.0)), (2.0 ** 127, 2.0 ** 127)])
    return cases


# ---------------------------------------------------------------------------- running
def mmasim_elements(op, a_bits, b_bits, c_bits):
    """MMA-Sim dpa over element vectors: a,b [..., 16] uint16, c [...] uint32 -> uint32 bits."""
    a = torch.from_numpy(a_bits.astype(np.int16)).view(torch.bfloat16)
    b = torch.from_numpy(b_bits.astype(np.int16)).view(torch.bfloat16)
    c = torch.from_numpy(c_bits.astype(np.int32)).view(torch.float32)
    d = op.dpa(a, b, c)
    return d.view(torch.int32).numpy().astype(np.uint32)


def mmasim_instructions(op, a, b, c):
    """MMA-Sim for a batch of instructions, exactly as WGMMA.__call__ broadcasts them."""
    num, m, _ = a.shape
    n = b.shape[2]
    a_vec = np.broadcast_to(a[:, :, None, :], (num, m, n, K))
    b_vec = np.broadcast_to(np.transpose(b, (0, 2, 1))[:, None, :, :], (num, m, n, K))
    return mmasim_elements(op, np.ascontiguousarray(a_vec), np.ascontiguousarray(b_vec), c), a_vec, b_vec


def mmasim_call_one(op, a, b, c):
    at = torch.from_numpy(a.astype(np.int16)).view(torch.bfloat16)
    bt = torch.from_numpy(b.astype(np.int16)).view(torch.bfloat16)
    ct = torch.from_numpy(c.astype(np.int32)).view(torch.float32)
    return op(at, bt, ct).view(torch.int32).numpy().astype(np.uint32)


def run_tool(tool, acc, a, b, workdir):
    rec = np.empty(acc.size, RECORD)
    rec["acc"] = acc.reshape(-1)
    rec["a"] = a.reshape(-1, K)
    rec["b"] = b.reshape(-1, K)
    src = os.path.join(workdir, "in.mma")
    dst = os.path.join(workdir, "out.f32")
    rec.tofile(src)
    proc = subprocess.run([tool, "mma", src, dst], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"ERROR: {tool} failed ({proc.returncode}): {proc.stderr.strip()}")
        sys.exit(2)
    out = np.fromfile(dst, dtype="<u4")
    if out.size != acc.size:
        print(f"ERROR: {tool} wrote {out.size} results for {acc.size} records")
        sys.exit(2)
    return out


def classify(acc, a, b, ours, theirs):
    """Names the edge rule one mismatching element exercises."""
    if ours == 0x80000000 and theirs == 0:
        return "zero-sign (ours -0, MMA-Sim +0)"
    if (ours & 0x7FFFFFFF) == FLT_MAX_BITS and (theirs & 0x7FFFFFFF) == 0x7F800000:
        return "overflow (ours FLT_MAX, MMA-Sim Inf)"
    ea = np.maximum((a.astype(np.int64) >> 7) & 0xFF, 1) - 127
    eb = np.maximum((b.astype(np.int64) >> 7) & 0xFF, 1) - 127
    zero_prod = ((a & 0x7FFF) == 0) | ((b & 0x7FFF) == 0)
    acc_zero = (acc & 0x7FFFFFFF) == 0
    exps = list((ea + eb)[~zero_prod])
    if not acc_zero:
        exps.append(max(int((acc >> 23) & 0xFF), 1) - 127)
    if (acc_zero or zero_prod.any()) and exps and max(exps) < -133:
        return "zero-term exponent (MMA-Sim e_zero=-133 joins the max)"
    return "other"


def describe(acc, a, b):
    pairs = " ".join(f"{int(x):04X}*{int(y):04X}" for x, y in zip(a, b) if (x | y) & 0x7FFF)
    return f"acc=0x{int(acc):08X} products[{pairs or 'all zero'}]"


class Tally:
    def __init__(self, max_print):
        self.total = 0
        self.bad = 0
        self.kinds = np.zeros(5, np.int64)  # MMA-Sim outputs: normal, subnormal, zero, Inf, NaN
        self.classes = {}
        self.max_print = max_print
        self.printed = 0

    def add(self, label, acc, a, b, ours, theirs, names=None):
        acc, a, b = acc.reshape(-1), a.reshape(-1, K), b.reshape(-1, K)
        ours, theirs = ours.reshape(-1), theirs.reshape(-1)
        self.total += ours.size
        mag = theirs & 0x7FFFFFFF
        kind = np.select([mag > 0x7F800000, mag == 0x7F800000, mag == 0, mag < 0x00800000], [4, 3, 2, 1], 0)
        self.kinds += np.bincount(kind, minlength=5)
        bad = np.flatnonzero(ours != theirs)
        self.bad += bad.size
        for i in bad:
            cls = classify(acc[i], a[i], b[i], ours[i], theirs[i])
            self.classes[cls] = self.classes.get(cls, 0) + 1
            if self.printed < self.max_print:
                self.printed += 1
                name = names[i] if names is not None else label
                print(f"  MISMATCH [{name}] {describe(acc[i], a[i], b[i])}: ours=0x{int(ours[i]):08X} "
                      f"mmasim=0x{int(theirs[i]):08X} -> {cls}")
        return bad.size


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True, help="path to mok-spec-tool")
    ap.add_argument("--n", type=int, default=100_000, help="random wgmma instructions (default 1e5)")
    ap.add_argument("--seed", type=int, default=None, help="RNG seed (default: fresh, printed)")
    ap.add_argument("--max-print", type=int, default=12)
    ap.add_argument("--chunk-elements", type=int, default=1 << 20,
                    help="output elements simulated per batch (memory vs. speed)")
    ap.add_argument("--call-sample", type=int, default=50,
                    help="instructions also run one by one through WGMMA.__call__")
    args = ap.parse_args()
    if args.n < 0 or args.chunk_elements < M * 256:
        ap.error("--n must be >= 0 and --chunk-elements >= 64*256")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"check_mma_mmasim: seed={seed} instructions={args.n} mmasim={getattr(mmasim, '__version__', '2.x')} "
          f"torch={torch.__version__}")
    rng = np.random.default_rng(seed)
    ops = {n: nv_ptx.WGMMA("Hopper", f"m64n{n}k16.f32.bf16.bf16") for n in N_CHOICES}

    t0 = time.time()
    with tempfile.TemporaryDirectory() as workdir:
        # Crafted single-element cases.
        cases = crafted_records()
        c_acc = np.array([c[1] for c in cases], np.uint32)
        c_a = np.array([c[2] for c in cases], np.uint16)
        c_b = np.array([c[3] for c in cases], np.uint16)
        theirs = mmasim_elements(ops[8], c_a, c_b, c_acc)
        ours = run_tool(args.tool, c_acc, c_a, c_b, workdir)
        crafted = Tally(len(cases))
        crafted.add("crafted", c_acc, c_a, c_b, ours, theirs, names=[c[0] for c in cases])
        print(f"crafted: {crafted.total} cases, {crafted.total - crafted.bad} match, {crafted.bad} mismatch")

        # Random instructions, grouped by N into batches.
        shapes = rng.choice(N_CHOICES, size=args.n, p=N_WEIGHTS)
        rand = Tally(args.max_print)
        per_shape = {}
        call_checked = call_bad = 0
        for n in N_CHOICES:
            count = int(np.count_nonzero(shapes == n))
            per_shape[n] = count
            per_batch = max(1, args.chunk_elements // (M * n) // 8)  # 8 value profiles per chunk
            done = 0
            while done < count:
                for _ in range(8):
                    num = min(per_batch, count - done)
                    if num == 0:
                        break
                    a, b, c, label = random_instruction_batch(rng, num, n)
                    theirs, a_vec, b_vec = mmasim_instructions(ops[n], a, b, c)
                    ours = run_tool(args.tool, c, a_vec, b_vec, workdir)
                    rand.add(f"m64n{n}k16 {label}", c, a_vec, b_vec, ours, theirs)
                    if call_checked < args.call_sample:
                        one = mmasim_call_one(ops[n], a[0], b[0], c[0])
                        call_checked += 1
                        call_bad += int(np.count_nonzero(one.reshape(-1) != theirs.reshape(num, -1)[0]))
                    done += num
        shape_txt = " ".join(f"n{n}:{per_shape[n]}" for n in N_CHOICES)
        print(f"random: {args.n} instructions ({shape_txt}), {rand.total} output elements, "
              f"{rand.total - rand.bad} match, {rand.bad} mismatch")
        k = rand.kinds
        print(f"  MMA-Sim outputs: normal {k[0]}, subnormal {k[1]}, zero {k[2]}, Inf {k[3]}, NaN {k[4]}")
        print(f"WGMMA.__call__ vs batched dpa: {call_checked} instructions, {call_bad} elements differ")
        for tally, name in ((crafted, "crafted"), (rand, "random")):
            for cls, cnt in sorted(tally.classes.items(), key=lambda kv: -kv[1]):
                print(f"  {name} mismatches by rule: {cls}: {cnt}")
    print(f"time {time.time() - t0:.1f}s")
    num_bad = crafted.bad + rand.bad + call_bad
    print("PASS" if num_bad == 0 else f"FAIL ({num_bad} mismatches, seed={seed})")
    return 0 if num_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
