#!/usr/bin/env python3
"""ncu-phases: where a persistent kernel's warps spend their time, by phase and by source line.

Nsight Compute's warp-state sampling (section SourceCounters) counts, per SASS instruction, how
often a warp was found there and why it was not issuing. For a persistent kernel such as
moe_forward_kernel that is one long list; this tool folds it into the kernel's own phases:

  * every instruction is placed at its source line and the chain of inlined calls above it
    (nvdisasm -gi of a -lineinfo build);
  * the outermost frame of the chain is a line of the kernel's body, and the body's
    `trace_mark(P, kTrX)` calls cut it into segments (start..Planned, Planned..Gathered, ...);
  * inside a segment, the innermost frame that is still a line of the body tells apart the calls
    the segment makes (the forward's phase-1 and phase-2 lambdas, say).

It prints, per kernel: the share of samples and the leading stall reasons of each segment and
call, then the lines that hold the most samples inside each of them. Samples are warps found
at an instruction, so a share is a share of warp time (all 8 warps of a block live for the whole
kernel here, which makes it a share of the kernel's time too).

Inputs (see --help): the source page of an ncu report as CSV, and the SASS of the same binary
with inlining line info. Typical use, binary built with -lineinfo (`cmake --preset profile &&
cmake --build build-profile`, or -DCMAKE_CUDA_FLAGS=-lineinfo; paths below as for build/):

  ncu --clock-control none -k regex:'moe_(forward|backward)_kernel' -c 2 --section SourceCounters \\
      -o rep build/tools/mok-bench --H 2048 --I 768 --Is 0 --E 128 --K 8 --R 1 --T 16384 \\
      --reps 1 --warmup 0 --no-baseline --sustain-ms 0
  ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
  cuobjdump -xelf all build/tools/mok-bench   # one .cubin per object or image: layer.sm_90a.cubin,
                                              # or mok-bench.N.sm_90a.cubin (then the largest)
  nvdisasm -gi -c layer.sm_90a.cubin > layer.sass   # the cubin holding the kernels
  tools/ncu-phases.py --csv rep.csv --sass layer.sass

Exit status: 0 on success, 2 on bad input (the message names the file and the fix) or output that
cannot be written.
"""

import argparse
import collections
import csv
import dataclasses
import os
import re
import stat
import sys
import typing

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the module below
import checked_stdout  # noqa: E402

STALL_PREFIX = "stall_"
SAMPLES_COLUMN = "Warp Stall Sampling (All Samples)"


class InputError(Exception):
    pass


class Frame(typing.NamedTuple):
    """A source line: one frame of an instruction's chain of inlined calls."""
    file: str
    line: int


class Record(typing.NamedTuple):
    """One instruction's row of the CSV."""
    offset: int  # bytes from the kernel's first instruction in the CSV (the SASS's offsets)
    samples: int  # warps found at the instruction
    reasons: dict  # {stall reason without the stall_ prefix: samples}, nonzero counts only


@dataclasses.dataclass
class KernelRows:
    """One kernel's part of the CSV, as add_row files it."""
    name: str  # ncu's display name, e.g. "toy_kernel(const int *)"
    records: list = dataclasses.field(default_factory=list)  # [Record]
    header: typing.Optional[list] = None  # the column names of its "Address" row, once read
    first_address: typing.Optional[int] = None  # its first instruction's address, once read


class CallKey(typing.NamedTuple):
    """A call the body makes (the innermost frame that is a line of the body) in a segment."""
    segment: str
    call: Frame


def parse_sass(path):
    """Returns {function name: {offset: chain}}, chain = (Frame, ...) innermost first."""
    try:
        text = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read the SASS file ({e.strerror}); make it with nvdisasm -gi -c FILE.cubin")
    funcs = {}
    cur = None
    chain = []
    closed = False  # the chain was attached to an instruction; the next //## line starts a new one
    any_line_info = False
    loc_re = re.compile(r'//## File "([^"]+)", line (\d+)')
    label_re = re.compile(r"^\.text\.(\S+):$")
    insn_re = re.compile(r"^\s+/\*([0-9a-fA-F]{4,})\*/")
    for raw in text:
        s = raw.strip()
        m = label_re.match(s)
        if m:
            cur = funcs.setdefault(m.group(1), {})
            chain, closed = [], False
            continue
        m = loc_re.search(raw)
        if m:
            any_line_info = True
            if closed:
                chain, closed = [], False
            chain.append(Frame(m.group(1), int(m.group(2))))
            continue
        m = insn_re.match(raw)
        if m and cur is not None:
            cur[int(m.group(1), 16)] = tuple(chain)
            closed = True
    if not funcs:
        raise InputError(f"{path}: no function found (expected nvdisasm output with '.text.NAME:' labels; "
                         "run nvdisasm -gi -c on the cubin that holds the kernels)")
    if not any_line_info:
        raise InputError(f"{path}: no line information ('//## File ...' lines): build the binary with -lineinfo "
                         "(-DCMAKE_CUDA_FLAGS=-lineinfo) and disassemble with nvdisasm -gi")
    return funcs


def sample_count(path, line, addr, column, text):
    """A sample count of the CSV: a whole number, 0 or more."""
    try:
        v = int(text)
    except ValueError:
        raise InputError(f"{path}: address {addr}: a sample count that is not an integer ({text!r} at line {line}, "
                         f"column '{column}'); export the CSV again without --print-units or number formatting")
    if v < 0:
        raise InputError(f"{path}: address {addr}: a negative sample count ({v} at line {line}, column '{column}'); "
                         "export the CSV again from the ncu report")
    return v


def add_row(path, line, r, kernels):
    """Files one CSV row into kernels ([KernelRows]): a kernel's name, its column header, or an
    instruction."""
    if not r:
        return
    if r[0] == "Kernel Name":
        kernels.append(KernelRows(r[1] if len(r) > 1 else "?"))
        return
    if not kernels:
        return
    k = kernels[-1]
    if r[0] == "Address":
        k.header = r
        if SAMPLES_COLUMN not in r:
            raise InputError(f"{path}: no '{SAMPLES_COLUMN}' column: profile with --section SourceCounters")
        return
    if k.header is None:
        return
    try:
        addr = int(r[0], 16)
    except ValueError:
        return
    if k.first_address is None:
        k.first_address = addr
    rec = dict(zip(k.header, r))
    samples = sample_count(path, line, r[0], SAMPLES_COLUMN, rec.get(SAMPLES_COLUMN, "0") or "0")
    reasons = {}
    for h, v in rec.items():
        if h.startswith(STALL_PREFIX) and "(Not Issued)" not in h and v not in ("", "-"):
            n = sample_count(path, line, r[0], h, v)
            if n:
                reasons[h[len(STALL_PREFIX):]] = n
    k.records.append(Record(addr - k.first_address, samples, reasons))


def parse_csv(path):
    """Returns [(kernel display name, [Record])] in file order."""
    # Source lines can be long (inlined templates): no field limit.
    csv.field_size_limit(sys.maxsize)
    kernels = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh)
            for r in reader:
                add_row(path, reader.line_num, r, kernels)
    except csv.Error as e:
        raise InputError(f"{path}: not a CSV export of ncu ({e}); export it with "
                         "ncu -i REPORT --page source --csv --print-source sass")
    except OSError as e:
        raise InputError(f"{path}: cannot read the CSV file ({e.strerror}); export it with "
                         "ncu -i REPORT --page source --csv --print-source sass")
    if not kernels:
        raise InputError(f"{path}: no 'Kernel Name' row: export the source page with "
                         "ncu -i REPORT --page source --csv --print-source sass")
    return [(k.name, k.records) for k in kernels]


def match_function(display, funcs):
    """The mangled name in the SASS whose demangled base name appears in ncu's display name."""
    base = kernel_base(display)
    hits = [f for f in funcs if base in f]
    if len(hits) != 1:
        raise InputError(f"kernel '{display}': {len(hits)} functions of the SASS file match '{base}' "
                         f"(functions: {', '.join(sorted(funcs)[:6])}...); disassemble the cubin that holds it")
    return hits[0]


def kernel_base(display):
    m = re.search(r"(\w+)\s*\(", display)
    return m.group(1) if m else display


def body_of(chains, base):
    """The kernel's body: (file, first line, last line) of its __global__ definition, found in the
    files the outermost frames name (the definition line, then matching braces)."""
    files = collections.Counter(c[-1].file for c in chains if c)
    for f, _ in files.most_common():
        src = read_lines(f)
        if src is None:
            continue
        for n, text in enumerate(src, start=1):
            if "__global__" in text and re.search(r"\b" + re.escape(base) + r"\s*\(", text):
                depth, opened = 0, False
                for m in range(n, len(src) + 1):
                    for ch in src[m - 1].split("//")[0]:
                        if ch == ";" and not opened:
                            break  # a declaration, not the definition
                        if ch == "{":
                            depth, opened = depth + 1, True
                        elif ch == "}":
                            depth -= 1
                    else:
                        if opened and depth <= 0:
                            return f, n, m
                        continue
                    break
    return None, 0, -1


def read_lines(path):
    """A source file the line information names, or None where it does not exist here. Only
    regular files are read (a FIFO would block, /dev/zero never end)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise InputError(f"{path}: named by the SASS's line information but not a regular file; run the tool "
                             "where the build's sources are")
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return None


def segments(src_lines, first, last):
    """[(line, mark)] of trace_mark(P, kTrX) calls in the body's span, in order."""
    marks = []
    if src_lines is None:
        return marks
    for n in range(first, min(last, len(src_lines)) + 1):
        m = re.search(r"trace_mark\(\s*\w+\s*,\s*kTr(\w+)\s*\)", src_lines[n - 1])
        if m:
            marks.append((n, m.group(1)))
    return marks


def segment_name(line, marks):
    prev = "entry"
    for n, name in marks:
        if line <= n:
            return f"{prev}..{name}"
        prev = name
    return f"{prev}..end"


def snippet(src_lines, line, width=70):
    if src_lines is None or line - 1 >= len(src_lines):
        return ""
    s = " ".join(src_lines[line - 1].split())
    return s if len(s) <= width else s[: width - 3] + "..."


def short(frame):
    return f"{os.path.basename(frame.file)}:{frame.line}"


def top_reasons(counter, total, n=3):
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in counter.most_common(n) if v) if total else ""


class Fold:
    """One kernel's samples folded by segment, call and innermost line."""

    def __init__(self, kernel, records, fmap):
        if not records:
            raise InputError(f"kernel '{kernel}': the CSV holds no instruction rows with a hex address for it; "
                             "export it with ncu -i REPORT --page source --csv --print-source sass")
        chains = [fmap.get(r.offset, ()) for r in records]
        if not any(chains):
            raise InputError(f"kernel '{kernel}': no sampled address matches the SASS's line information; give the "
                             "SASS of the binary that was profiled (nvdisasm -gi -c of a build with line info)")
        self.body_file, self.first, self.last = body_of(chains, kernel_base(kernel))
        if self.body_file is None:
            files = sorted({c[-1].file for c in chains if c})
            raise InputError(f"kernel '{kernel}': its __global__ definition is in none of the files its line "
                             f"information names ({', '.join(files[:4]) or 'none'}): run the tool where those "
                             "paths exist (the build machine)")
        self.src = read_lines(self.body_file)
        marks = segments(self.src, self.first, self.last)
        self.total = sum(r.samples for r in records)
        self.seg = collections.Counter()
        self.seg_reasons = collections.defaultdict(collections.Counter)
        self.call = collections.Counter()  # {CallKey: samples}
        self.call_reasons = collections.defaultdict(collections.Counter)  # {CallKey: {reason: samples}}
        self.line = collections.defaultdict(collections.Counter)  # {CallKey: {innermost Frame: samples}}
        self.unplaced = 0
        for rec, chain in zip(records, chains):
            s = rec.samples
            if not s:
                continue
            if not chain:
                self.unplaced += s
                continue
            outer = chain[-1]
            seg = (segment_name(outer.line, marks) if self.in_body(outer)
                   else "outside the body (no inlining chain back to it)")
            # the innermost frame that is a line of the body: the call the segment makes
            key = CallKey(seg, next((fl for fl in chain if self.in_body(fl)), outer))
            self.seg[seg] += s
            self.seg_reasons[seg].update(rec.reasons)
            self.call[key] += s
            self.call_reasons[key].update(rec.reasons)
            self.line[key][chain[0]] += s

    def in_body(self, frame):
        return frame.file == self.body_file and self.first <= frame.line <= self.last

    def label(self, call):
        return f"{short(call)}  {snippet(self.src, call.line) if call.file == self.body_file else ''}"


def header(kernel, f, out):
    print(f"## {kernel}: {f.total} samples", file=out)
    if f.unplaced and f.total:
        print(f"   {100 * f.unplaced / f.total:.1f}% of samples at instructions without line information", file=out)
    print(f"   body: {os.path.basename(f.body_file or '?')} lines {f.first}-{f.last}; segments cut at its trace_mark calls",
          file=out)


def analyse(kernel, f, top_lines, out):
    header(kernel, f, out)
    if f.total == 0:
        print("   (no samples: was the kernel profiled with --section SourceCounters?)", file=out)
        return
    print("   share   segment / call (body line)                                                    stall reasons",
          file=out)
    for seg, v in f.seg.most_common():
        print(f"  {100 * v / f.total:5.1f}%  {seg:78s} {top_reasons(f.seg_reasons[seg], v)}", file=out)
        calls = sorted(((k, c) for k, c in f.call.items() if k.segment == seg), key=lambda kc: -kc[1])
        for key, c in calls:
            if c < 0.005 * f.total:
                continue
            print(f"  {100 * c / f.total:5.1f}%    {f.label(key.call):76s} {top_reasons(f.call_reasons[key], c)}",
                  file=out)
            if top_lines:
                for fl, lv in f.line[key].most_common(top_lines):
                    print(f"  {100 * lv / f.total:5.1f}%        {short(fl)}", file=out)


def compare(kernel, base, f, top_lines, out):
    """Samples of f against base (another profile of the same binary): per segment and call, and
    the lines whose samples grew most."""
    header(kernel, f, out)
    change = f"{100 * (f.total / base.total - 1):+.1f}%" if base.total else "n/a"
    print(f"   against the base profile: {base.total} -> {f.total} samples ({change}); "
          "columns: base, this, difference", file=out)
    # largest difference first; ties by the larger count, then by name (the same order every run)
    for seg in sorted(set(base.seg) | set(f.seg), key=lambda k: (-abs(f.seg[k] - base.seg[k]), -f.seg[k], k)):
        print(f"  {base.seg[seg]:9d} {f.seg[seg]:9d} {f.seg[seg] - base.seg[seg]:+9d}  {seg}", file=out)
        calls = sorted({k for k in set(base.call) | set(f.call) if k.segment == seg},
                       key=lambda k: (-abs(f.call[k] - base.call[k]), -f.call[k], k.call))
        for key in calls:
            d = f.call[key] - base.call[key]
            if abs(d) < 0.002 * max(f.total, 1):
                continue
            print(f"  {base.call[key]:9d} {f.call[key]:9d} {d:+9d}    {f.label(key.call)}", file=out)
            if top_lines:
                lines = set(base.line[key]) | set(f.line[key])
                for fl in sorted(lines, key=lambda x: (-abs(f.line[key][x] - base.line[key][x]), -f.line[key][x], x))[:top_lines]:
                    print(f"  {base.line[key][fl]:9d} {f.line[key][fl]:9d} {f.line[key][fl] - base.line[key][fl]:+9d}"
                          f"        {short(fl)}", file=out)


def main(argv):
    ap = argparse.ArgumentParser(
        prog="ncu-phases",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The kernel's source file is read from the path its line information names: run the tool "
        "where that path exists (the build machine), not where the profile was taken.",
    )
    ap.add_argument("--csv", required=True, help="ncu -i REPORT --page source --csv --print-source sass > FILE")
    ap.add_argument("--sass", required=True, help="nvdisasm -gi -c KERNELS.cubin > FILE (binary built with -lineinfo)")
    ap.add_argument("--lines", type=int, default=3, metavar="N",
                    help="also list the N source lines with the most samples under each call (default 3; 0: none)")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this text")
    ap.add_argument("--base", default="", metavar="CSV",
                    help="a second profile of the same binary (say R = 1 against R = 8): print, per segment, call and "
                    "line, its samples, this profile's and the difference, largest first")
    args = ap.parse_args(argv)
    if args.lines < 0:
        print("ncu-phases: --lines must be 0 or more", file=sys.stderr)
        return 2
    try:
        funcs = parse_sass(args.sass)
        kernels = parse_csv(args.csv)
        chosen = [(k, r) for k, r in kernels if args.kernel in k]
        if not chosen:
            raise InputError(f"{args.csv}: no kernel name contains '{args.kernel}' "
                             f"(kernels: {', '.join(k for k, _ in kernels)})")
        base = None
        if args.base:
            base_list = parse_csv(args.base)
            for path, lst in ((args.base, base_list), (args.csv, chosen)):
                names = [k for k, _ in lst]
                repeated = sorted({k for k in names if names.count(k) > 1})
                if repeated:
                    raise InputError(f"{path}: kernel '{repeated[0]}' appears more than once; with --base each "
                                     "profile must hold one launch of each kernel (ncu -c, -k)")
            base = dict(base_list)
        for name, records in chosen:
            fmap = funcs[match_function(name, funcs)]
            if base is None:
                analyse(name, Fold(name, records, fmap), args.lines, sys.stdout)
            elif name not in base:
                raise InputError(f"{args.base}: no kernel '{name}' (kernels: {', '.join(base)})")
            else:
                compare(name, Fold(name, base[name], fmap), Fold(name, records, fmap), args.lines, sys.stdout)
    except InputError as e:
        print(f"ncu-phases: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    checked_stdout.run("ncu-phases", main, sys.argv[1:])
