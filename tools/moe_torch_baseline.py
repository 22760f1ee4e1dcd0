#!/usr/bin/env python3
"""moe_torch_baseline.py: the MoE layer as a competent PyTorch user writes it, timed on the GPU.

route -> permute (stable sort by expert) -> torch._grouped_mm (gate, up) -> SwiGLU ->
torch._grouped_mm (down) -> weighted combine, plus the shared expert; backward by autograd.
It tries the weight layouts (separate gate/up or one fused [E, 2I, H] weight) and the combine
formulations (index_add_ scatter, or gather back to [T, K, H] and sum), keeps the fastest, and
prints per-stage forward times (CUDA events, median of --reps after --warmup) and the bf16
matrix peak measured in the same run (an 8192^3 torch.matmul).

    python3 tools/moe_torch_baseline.py --case dsv3 --routing uniform
    python3 tools/moe_torch_baseline.py --H 2048 --I 768 --Is 0 --E 128 --K 8 --T 16384 --json

Exit codes: 0 ran, 1 PyTorch failed while running (out of GPU memory, a CUDA error; the message
says which), 2 bad arguments (checked before torch is imported) or output that cannot be written,
3 no torch, no CUDA GPU or no torch._grouped_mm.
"""
import argparse
import json
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the module below
import checked_stdout  # noqa: E402

CASES = {  # H, I, Is, E (local experts on this GPU), K, T (tokens)
    "dsv3": (7168, 2048, 2048, 32, 8, 8192),
    "qwen3": (2048, 768, 0, 128, 8, 16384),
    "small": (7168, 2048, 2048, 32, 8, 256),
    "dsv3-mini": (512, 128, 128, 64, 8, 512),
}


# Per size option: (lowest, highest, what it is): the ranges of mok-bench's layers
# (LayerConfig::validate; T here is the whole layer's tokens, R * T there, so its routed slots
# T * K must fit in int32). Only the ranges: the multiple-of-16 rule for H, I and Is is not
# restated, since this script needs none of it (mok-bench starts it only for layers it accepts).
SIZES = {"H": (1, 1 << 24, "hidden size"), "I": (1, 1 << 24, "routed experts' intermediate size"),
         "Is": (0, 1 << 24, "shared expert's intermediate size (0: none)"), "E": (1, 1 << 20, "experts"),
         "K": (1, 64, "experts per token (top-k), at most E"), "T": (1, (1 << 31) - 1, "tokens")}


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), help="preset shape (overridden by explicit sizes; default dsv3-mini)")
    for name, (lo, hi, what) in SIZES.items():
        p.add_argument(f"--{name}", type=int, help=f"{what}, {lo} to {hi} (default: the case's)")
    p.add_argument("--routing", default="uniform", help="uniform or zipf:S with S in (0, 8] (default uniform)")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions, 1 to 1000000; the median is reported "
                   "(default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first, 0 to 1000000 (default 3)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the inputs, 0 to 2^64 - 1 (default 1)")
    p.add_argument("--no-backward", action="store_true", help="time forwards only")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = p.parse_args()
    H, I, Is, E, K, T = CASES[a.case or "dsv3-mini"]
    a.H, a.I, a.Is, a.E, a.K, a.T = (getattr(a, n) if getattr(a, n) is not None else v
                                     for n, v in zip(("H", "I", "Is", "E", "K", "T"), (H, I, Is, E, K, T)))
    for name, (lo, hi, what) in SIZES.items():
        if not lo <= getattr(a, name) <= hi:
            p.error(f"--{name} must be from {lo} to {hi} (got {getattr(a, name)})")
    if a.K > a.E:
        p.error(f"--K must be at most --E (got K = {a.K}, E = {a.E})")
    if a.T * a.K > (1 << 31) - 1:
        p.error(f"--T times --K (routed slots) must fit in int32 (got {a.T} * {a.K}); lower --T")

    def zipf_exponent(text):
        try:
            return float(text)
        except ValueError:
            return float("nan")
    if not (a.routing == "uniform" or (a.routing.startswith("zipf:") and 0 < zipf_exponent(a.routing[5:]) <= 8)):
        p.error(f"--routing must be uniform or zipf:S with S in (0, 8], e.g. zipf:1.2 (got {a.routing!r})")
    if not 1 <= a.reps <= 1000000:
        p.error(f"--reps must be at least 1 and at most 1000000 (got {a.reps})")
    if not 0 <= a.warmup <= 1000000:
        p.error(f"--warmup must be from 0 to 1000000 (got {a.warmup})")
    if not 0 <= a.seed < 1 << 64:
        p.error(f"--seed must be from 0 to 2^64 - 1 (got {a.seed})")
    return a


def main():
    a = parse()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"moe_torch_baseline: {e}", file=sys.stderr)
        return 3
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
        print("moe_torch_baseline: needs a CUDA GPU and torch._grouped_mm", file=sys.stderr)
        return 3
    try:
        return run_layer(a, torch, F)
    except torch.cuda.OutOfMemoryError as e:
        print(f"moe_torch_baseline: out of GPU memory ({str(e).splitlines()[0]}); lower --T, --H, --I or --E",
              file=sys.stderr)
    except Exception as e:  # a CUDA error, or a torch without what this script uses
        print(f"moe_torch_baseline: PyTorch failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
    return 1


def run_layer(a, torch, F):
    """Builds the layer's inputs, times the variants and prints the report; returns 0."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    bf = torch.bfloat16
    H, I, Is, E, K, T = a.H, a.I, a.Is, a.E, a.K, a.T

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(bf)

    x = randn(T, H).requires_grad_()
    w_gate = randn(E, I, H, scale=H ** -0.5).requires_grad_()
    w_up = randn(E, I, H, scale=H ** -0.5).requires_grad_()
    w_down = randn(E, H, I, scale=I ** -0.5).requires_grad_()
    w_gu = torch.cat([w_gate.detach(), w_up.detach()], dim=1).requires_grad_()  # fused layout [E, 2I, H]
    shared = Is > 0
    if shared:
        w_sg = randn(Is, H, scale=H ** -0.5).requires_grad_()
        w_su = randn(Is, H, scale=H ** -0.5).requires_grad_()
        w_sd = randn(H, Is, scale=Is ** -0.5).requires_grad_()
    if a.routing == "uniform":
        probs = torch.ones(E, device=dev)
    else:
        s = float(a.routing[5:])
        probs = 1.0 / torch.arange(1, E + 1, device=dev, dtype=torch.float64) ** s
        probs = probs[torch.randperm(E, device=dev, generator=g)].float()
    topk = torch.multinomial(probs.expand(T, E), K, replacement=False, generator=g)
    logits = torch.randn(T, K, device=dev, generator=g)
    router_w = torch.softmax(logits, dim=-1).requires_grad_()
    d_out = randn(T, H)

    def layer(fused, combine, timing):
        evs = []

        def tick(name):
            if timing:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                evs.append((name, e))

        tick("start")
        flat = topk.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        token = order // K
        xs = x[token]
        tick("route+permute")
        if fused:
            h = torch._grouped_mm(xs, w_gu.transpose(1, 2), offs=offs)
            gt, up = h.split(I, dim=1)
        else:
            gt = torch._grouped_mm(xs, w_gate.transpose(1, 2), offs=offs)
            up = torch._grouped_mm(xs, w_up.transpose(1, 2), offs=offs)
        tick("grouped_mm gate/up")
        act = F.silu(gt) * up
        tick("swiglu")
        y = torch._grouped_mm(act, w_down.transpose(1, 2), offs=offs)
        tick("grouped_mm down")
        wsel = router_w.reshape(-1)[order]
        if combine == "index_add":
            out = torch.zeros(T, H, device=dev, dtype=torch.float32).index_add_(0, token, (y * wsel[:, None]).float())
        else:
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel(), device=dev)
            out = (y[inv].view(T, K, H).float() * router_w[..., None]).sum(1)
        tick("combine")
        if shared:
            out = out + ((F.silu(x @ w_sg.t()) * (x @ w_su.t())) @ w_sd.t()).float()
        tick("shared expert")
        return out.to(bf), evs

    def run(fused, combine, backward, timing=False):
        for p in (x, w_gate, w_up, w_down, w_gu, router_w) + ((w_sg, w_su, w_sd) if shared else ()):
            p.grad = None
        out, evs = layer(fused, combine, timing)
        if backward:
            out.backward(d_out)
        return evs

    def median_ms(fn):
        times = []
        for r in range(a.warmup + a.reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            if r >= a.warmup:
                times.append(s.elapsed_time(e))
        return statistics.median(times)

    # Measured bf16 peak in the same run.
    A = torch.randn(8192, 8192, device=dev, generator=g).to(bf)
    B = torch.randn(8192, 8192, device=dev, generator=g).to(bf)
    peak_ms = median_ms(lambda: A @ B)
    peak_tflops = 2 * 8192 ** 3 / (peak_ms * 1e-3) / 1e12
    del A, B

    variants = {}
    for fused in (False, True):
        for combine in ("index_add", "gather"):
            name = f"{'fused' if fused else 'separate'}-gate-up/{combine}"
            with torch.no_grad():
                variants[name] = median_ms(lambda: run(fused, combine, False))
    best = min(variants, key=variants.get)
    fused, combine = best.startswith("fused"), best.split("/")[1]
    fwd_ms = variants[best]
    both_ms = None if a.no_backward else median_ms(lambda: run(fused, combine, True))
    # Per-stage forward times of the fastest variant.
    per_stage = {}
    with torch.no_grad():
        for r in range(a.warmup + a.reps):
            evs = run(fused, combine, False, timing=True)
            torch.cuda.synchronize()
            if r >= a.warmup:
                for (n0, e0), (n1, e1) in zip(evs, evs[1:]):
                    per_stage.setdefault(n1, []).append(e0.elapsed_time(e1))
    per_stage = {k: statistics.median(v) for k, v in per_stage.items()}
    rows = T * K
    fwd_flops = 6.0 * rows * H * I + 6.0 * T * H * Is
    result = {
        "shape": {"H": H, "I": I, "Is": Is, "E": E, "K": K, "T": T, "routing": a.routing},
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
        "peak_bf16_tflops": peak_tflops, "variants_forward_ms": variants, "chosen": best,
        "forward_ms": fwd_ms, "forward_tflops": fwd_flops / (fwd_ms * 1e-3) / 1e12,
        "forward_backward_ms": both_ms,
        "forward_backward_tflops": None if both_ms is None else 3 * fwd_flops / (both_ms * 1e-3) / 1e12,
        "forward_stages_ms": per_stage,
    }
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"# PyTorch {torch.__version__} baseline on {result['gpu']}: H={H} I={I} Is={Is} E={E} K={K} T={T} "
              f"routing={a.routing}; measured bf16 peak {peak_tflops:.0f} TFLOP/s")
        for k, v in variants.items():
            print(f"  forward {k:32s} {v:9.3f} ms{'  <- fastest' if k == best else ''}")
        print(f"forward          {fwd_ms:9.3f} ms  {result['forward_tflops']:7.1f} TFLOP/s")
        if both_ms is not None:
            print(f"forward+backward {both_ms:9.3f} ms  {result['forward_backward_tflops']:7.1f} TFLOP/s")
        for k, v in per_stage.items():
            print(f"  stage {k:26s} {v:9.3f} ms")
    return 0


if __name__ == "__main__":
    checked_stdout.run("moe_torch_baseline", main)
