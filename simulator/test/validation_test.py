#!/usr/bin/env python3
"""validation_test.py MOK_SIM SIMULATOR_DIR WORK_DIR

Holds the model to what simulator/VALIDATION.md claims, so that a model change which moves a
published comparison fails here until the page is re-run and updated:
  - the DeepEP rows: the calibrated dispatch rows within 1 % of the measured figure, the combine
    predictions within 3 % (VALIDATION.md's table: -0.7 / -2.7 / +0.37 / -1.3 % today);
  - the Mixture-of-Kittens direction: pull's dispatch NVLink utilisation above push's at every
    skew of validation/mok_push_vs_pull.json;
  - the MoK shape with a 64 KiB store window ("The two unmeasured SM parameters together"): pull's
    advantage smaller at uniform routing than at exponent 0.6;
  - every shipped scenario (scenarios/, validation/) runs and a sweep writes its runs.csv.
Exit 0 when all hold, 1 otherwise (each failure printed with the figures).
"""
import csv
import io
import json
import os
import subprocess
import sys


def run(sim, args):
    p = subprocess.run([sim, "run", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"mok-sim run {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def rows(sim, args):
    return list(csv.DictReader(io.StringIO(run(sim, [*args, "--format", "csv"]))))


def main():
    sim, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    val = os.path.join(src, "validation")
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    # DeepEP rows: (file, column, measured GB/s, allowed relative error, role).
    deepep = [
        ("deepep_v1_h800_dispatch.json", "dispatch_recv_gbps", 153.0, 0.01, "A1 calibration"),
        ("deepep_v1_h800_combine.json", "combine_recv_gbps", 158.0, 0.03, "A2 prediction"),
        ("deepep_v2_b200_dispatch.json", "dispatch_recv_gbps", 726.0, 0.01, "B1 calibration"),
        ("deepep_v2_b200_combine.json", "combine_recv_gbps", 740.0, 0.03, "B2 prediction"),
    ]
    for name, col, measured, tol, role in deepep:
        got = float(rows(sim, [os.path.join(val, name)])[0][col])
        err = got / measured - 1
        check(abs(err) <= tol, f"{role} ({name}): {got:.1f} GB/s against {measured:.0f} measured, "
                               f"error {100 * err:+.2f} % (allowed {100 * tol:.0f} %)")

    def pull_over_push(name, extra):
        out = os.path.join(work, name)
        run(sim, [os.path.join(val, "mok_push_vs_pull.json"), "--set", "/plots=[]", *extra, "--out", out,
                  "--threads", "2"])
        with open(os.path.join(out, "runs.csv")) as f:
            util = {(r["/protocol/dispatch"], float(r["/workload/exponent"])): float(r["dispatch_nvlink_util"])
                    for r in csv.DictReader(f)}
        return {e: util[("pull", e)] / util[("push", e)] for (_, e) in util}

    ratio = pull_over_push("mok_preset", [])
    for e, r in sorted(ratio.items()):
        check(r > 1.0, f"MoK direction, exponent {e}: pull / push dispatch NVLink utilisation {r:.3f} > 1")
    window = json.dumps({"preset": "gb200-nvl72", "overrides": {"gpu.sm_store_inflight_bytes": 65536}})
    ratio64 = pull_over_push("mok_window64", ["--set", "/topology=" + window])
    check(ratio64[0.0] < ratio64[0.6],
          f"MoK shape with a 64 KiB store window: pull / push {ratio64[0.0]:.3f} at uniform < {ratio64[0.6]:.3f} at 0.6")

    # Every shipped scenario runs; a sweep writes runs.csv.
    for d in ("scenarios", "validation"):
        for name in sorted(os.listdir(os.path.join(src, d))):
            if not name.endswith(".json"):
                continue
            path = os.path.join(src, d, name)
            with open(path) as f:
                sweep = "sweep" in json.load(f)
            out = os.path.join(work, d + "_" + name[:-5])
            try:
                run(sim, [path, "--out", out, "--threads", "2"] if sweep else [path, "--format", "csv"])
                ok = not sweep or os.path.getsize(os.path.join(out, "runs.csv")) > 0
                check(ok, f"{d}/{name} runs" + (" and writes runs.csv" if sweep else ""))
            except (RuntimeError, OSError) as e:
                check(False, f"{d}/{name}: {e}")

    if failures:
        print(f"{len(failures)} validation claim(s) no longer hold; re-run simulator/VALIDATION.md and update it "
              "(or mend the model)")
        return 1
    print("every validation claim checked here holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
