#!/usr/bin/env python3
"""sass-spills: where a kernel's register spills sit, from its SASS.

`nvcc -Xptxas -v` says how many bytes a kernel spills; it does not say whether the spill stores
and reloads run once an item or once a K chunk. That is what decides whether they cost anything:
the forward kernel sits at 255 registers, and a change that adds a few bytes of spills to its
main loop is a different matter from one that adds them to an item's set-up (kernel/README.md,
"Build"). nvdisasm marks every spill store and reload `SpillRefill`; this tool places each one in
the smallest loop that holds it and says what kind of loop that is:

  main loop   the innermost loops that issue wgmma (HGMMA): the K-chunk loops; a spill here runs
              once a chunk, the costliest place;
  inner loop  a loop without HGMMA inside or beside the main loops (an epilogue's rows, a copy
              loop): runs once an iteration;
  item loop   a loop that holds a main loop (the per-item or per-tile loops): once an item;
  straight    in no loop: once a launch.

Loops are found from backward branches (a BRA whose target lies at or before it); a loop is the
address range from the target to the branch. Local loads and stores that nvdisasm does not mark
(indexed local arrays, such as a TMA descriptor copied to the stack) are counted apart.

Input: an nvdisasm listing of a cubin (`nvdisasm -c`, with or without `-g`/`-gi` line info).
Typical use, from a CUDA build directory (kernel/README.md, "Build", has the full command):

  nvcc ... -cubin -arch=sm_90a -o /tmp/l.cubin kernel/src/layer.cu
  nvdisasm -c /tmp/l.cubin > /tmp/l.sass
  tools/sass-spills.py /tmp/l.sass --kernel moe_backward
  tools/sass-spills.py /tmp/l.sass --list       # every spill access, with its loop

Exit status: 0 on success, 1 with --fail-main-loop when a spill sits in a main loop, 2 on bad
input (the message names the file and the fix) or output that cannot be written.
"""

import argparse
import re
import sys
from dataclasses import dataclass, field

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the module below
import checked_stdout  # noqa: E402

SECTION = re.compile(r"^\.text\.(\S+):\s*$")
LABEL = re.compile(r"^(\.L_x_\d+):")
INSTR = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;?\s*(\(\*.*\*\))?\s*;?\s*$")
BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+`\((\.L_x_\d+)\)")


class BadInput(Exception):
    pass


@dataclass
class Instr:
    addr: int
    text: str
    spill: bool


@dataclass
class Kernel:
    name: str
    instrs: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # label -> index of the next instruction


def parse(path):
    """The kernels (.text.* sections) of an nvdisasm listing, in file order."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise BadInput(f"{path}: cannot read it ({e.strerror}); give an nvdisasm listing (nvdisasm -c FILE.cubin > FILE.sass)")
    kernels = []
    cur = None
    for line in lines:
        m = SECTION.match(line)
        if m:
            cur = Kernel(m.group(1))
            kernels.append(cur)
            continue
        if cur is None:
            continue
        m = LABEL.match(line)
        if m:
            cur.labels[m.group(1)] = len(cur.instrs)
            continue
        m = INSTR.match(line)
        if m:
            text = m.group(2).strip().rstrip(";").strip()
            cur.instrs.append(Instr(int(m.group(1), 16), text, "SpillRefill" in (m.group(3) or "")))
    kernels = [k for k in kernels if k.instrs]
    if not kernels:
        raise BadInput(f"{path}: no code sections (.text.NAME: followed by /*addr*/ instructions); "
                       "this is not an nvdisasm listing: make one with nvdisasm -c FILE.cubin > FILE.sass")
    return kernels


def loops_of(k):
    """[(first, last)] instruction-index ranges of the kernel's loops, from backward branches."""
    loops = []
    for i, ins in enumerate(k.instrs):
        m = BRANCH.search(ins.text)
        if m and m.group(1) in k.labels:
            t = k.labels[m.group(1)]
            if t <= i:
                loops.append((t, i))
    return sorted(set(loops))


def classify(k):
    """Per spill access: (instruction, kind, loop) with kind as in the module's docstring."""
    loops = loops_of(k)
    hg = [i for i, ins in enumerate(k.instrs) if "HGMMA" in ins.text]
    has_hg = {lp: any(lp[0] <= h <= lp[1] for h in hg) for lp in loops}
    # main loops: hold an HGMMA and no smaller loop inside them holds one
    main = {lp for lp in loops if has_hg[lp] and not any(
        o != lp and has_hg[o] and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)}
    out = []
    for i, ins in enumerate(k.instrs):
        if not ins.spill:
            continue
        holding = [lp for lp in loops if lp[0] <= i <= lp[1]]
        if not holding:
            out.append((ins, "straight", None))
            continue
        lp = min(holding, key=lambda p: p[1] - p[0])
        if lp in main:
            kind = "main loop"
        elif has_hg[lp]:
            kind = "item loop"
        else:
            kind = "inner loop"
        out.append((ins, kind, lp))
    return out, loops, main


KINDS = ("main loop", "inner loop", "item loop", "straight")
LOOP_KINDS = __doc__[__doc__.index("  main loop"):__doc__.index("Loops are found")].rstrip() + "\n"


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\nEach spill store and reload is counted in the smallest loop "
        "holding it:\n\n" + LOOP_KINDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: nvdisasm -c /tmp/l.cubin > /tmp/l.sass && tools/sass-spills.py /tmp/l.sass --kernel moe_")
    ap.add_argument("sass", help="nvdisasm listing of a cubin (nvdisasm -c FILE.cubin > FILE.sass)")
    ap.add_argument("--kernel", default="", metavar="REGEX",
                    help="only kernels whose (mangled) name matches REGEX (default: all)")
    ap.add_argument("--list", action="store_true", help="also list every spill access with its loop")
    ap.add_argument("--fail-main-loop", action="store_true",
                    help="exit 1 when any selected kernel spills inside a main loop (a check for scripts)")
    args = ap.parse_args()
    try:
        rx = re.compile(args.kernel)
    except re.error as e:
        print(f"sass-spills: --kernel {args.kernel!r}: not a regular expression ({e})", file=sys.stderr)
        return 2
    try:
        kernels = parse(args.sass)
        chosen = [k for k in kernels if rx.search(k.name)]
        if not chosen:
            names = ", ".join(k.name for k in kernels[:8]) + (" ..." if len(kernels) > 8 else "")
            raise BadInput(f"{args.sass}: no kernel matches --kernel {args.kernel!r}; the listing has: {names}")
    except BadInput as e:
        print(f"sass-spills: {e}", file=sys.stderr)
        return 2
    hot = 0
    print(f"{'kernel':<60} {'instrs':>7} {'loops':>5} {'main':>4} {'spills':>6} "
          + " ".join(f"{k:>10}" for k in KINDS) + f" {'other LDL/STL':>13}")
    for k in chosen:
        acc, loops, mainl = classify(k)
        by = {kind: sum(1 for _, x, _ in acc if x == kind) for kind in KINDS}
        other = sum(1 for ins in k.instrs if not ins.spill and re.match(r"(@!?U?P\w+\s+)?(LDL|STL)\b", ins.text))
        hot += by["main loop"]
        name = k.name if len(k.name) <= 60 else k.name[:57] + "..."
        print(f"{name:<60} {len(k.instrs):>7} {len(loops):>5} {len(mainl):>4} {len(acc):>6} "
              + " ".join(f"{by[x]:>10}" for x in KINDS) + f" {other:>13}")
        if args.list:
            for ins, kind, lp in acc:
                where = "" if lp is None else (f" in {k.instrs[lp[0]].addr:#x}-{k.instrs[lp[1]].addr:#x}"
                                               f" ({lp[1] - lp[0] + 1} instrs)")
                print(f"    {ins.addr:#08x} {kind:<10}{where}  {ins.text}")
    return 1 if args.fail_main_loop and hot else 0


if __name__ == "__main__":
    checked_stdout.run("sass-spills", main)
